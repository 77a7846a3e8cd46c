/*
 * prefault.c — fault in a large output buffer before the kernels write it.
 *
 * Why: a caller's fresh output (torch allocates every result; large blocks
 * come straight from mmap) is not mapped yet, and its first touch costs one
 * page fault per 4 KiB page: about 2.4 ms for 4 MiB on a Xeon, 2.0 ms on a
 * Zen 3 EPYC (both KVM guests), as much as the cast that fills it.  Linux's
 * MADV_POPULATE_WRITE maps a range in one call at about 60% of that cost, and
 * the workers split the range between them.  Before that, the whole 2 MiB
 * pages inside the buffer are marked MADV_HUGEPAGE: where transparent huge
 * pages are on "madvise" (a common default) each is then one fault and one
 * clear instead of 512 faults (4 MiB touched by page: 2.0 ms; as 2 MiB pages:
 * 0.12-0.4 ms, EPYC).  The first partial 2 MiB of a buffer stays in 4 KiB
 * pages (the allocator's header shares it), so a 4 MiB output gains about
 * half of that.  A buffer that is already resident (the allocator reused it)
 * is detected with mincore on its first and last pages and left alone, so
 * the check costs a few microseconds.  The contents are never changed.
 * Elsewhere (no Linux, an old kernel) this does nothing.
 */
#define _DEFAULT_SOURCE 1 /* madvise, mincore */

#include <stdatomic.h>
#include <stdint.h>

#include "internal.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define HAVE_POPULATE 1
#endif

#define PREFAULT_MIN ((size_t)1 << 20)     /* smaller buffers are not worth a syscall */
#define PREFAULT_CHUNK ((size_t)1 << 19)   /* bytes per task                         */

#ifdef HAVE_POPULATE
static atomic_int g_unsupported = 0; /* the kernel refused once: stop asking */

typedef struct prefault_job {
    uintptr_t lo, hi; /* page-aligned range */
} prefault_job;

static void prefault_task(void *ctx, int64_t t, int worker)
{
    (void)worker;
    const prefault_job *J = (const prefault_job *)ctx;
    uintptr_t a = J->lo + (uintptr_t)t * PREFAULT_CHUNK, b = a + PREFAULT_CHUNK < J->hi ? a + PREFAULT_CHUNK : J->hi;
    if (madvise((void *)a, b - a, MADV_POPULATE_WRITE) != 0) atomic_store(&g_unsupported, 1);
}

/* Ask for 2 MiB pages in the whole 2 MiB-aligned part of [lo, hi): one fault and one
 * clear per 2 MiB instead of 512 faults.  Only buffers that are not resident yet get
 * here; the flag changes no contents (a kernel without THP ignores it or refuses). */
static void huge_interior(uintptr_t lo, uintptr_t hi)
{
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)1 << 21;
    uintptr_t a = (lo + huge - 1) & ~(huge - 1), b = hi & ~(huge - 1);
    if (b > a) (void)madvise((void *)a, b - a, MADV_HUGEPAGE);
#else
    (void)lo;
    (void)hi;
#endif
}

static int resident(uintptr_t page)
{
    unsigned char v = 0;
    return mincore((void *)page, 1, &v) == 0 && (v & 1);
}
#endif

void fp8mix_prefault(void *p, size_t bytes, int workers)
{
#ifdef HAVE_POPULATE
    if (!p || bytes < PREFAULT_MIN || atomic_load_explicit(&g_unsupported, memory_order_relaxed)) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    prefault_job J = {((uintptr_t)p + page - 1) & ~(page - 1), ((uintptr_t)p + bytes) & ~(page - 1)};
    if (J.hi <= J.lo || (resident(J.lo) && resident(J.hi - page))) return;
    huge_interior(J.lo, J.hi);
    int64_t chunks = (int64_t)((J.hi - J.lo + PREFAULT_CHUNK - 1) / PREFAULT_CHUNK);
    fp8mix_parallel_for(chunks, workers, prefault_task, &J);
#else
    (void)p;
    (void)bytes;
    (void)workers;
#endif
}
