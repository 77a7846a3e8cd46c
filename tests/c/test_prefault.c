/* test_prefault.c — fp8mix_prefault (prefault.c): a large output that is not
 * resident yet is mapped in whole, its contents unchanged, and the part of it
 * made of whole 2 MiB pages is marked for transparent huge pages; small or
 * already-resident buffers are left alone. */
#define _DEFAULT_SOURCE 1
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_SZ ((uintptr_t)1 << 21)

static size_t resident_pages(const uint8_t *p, size_t bytes)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = bytes / page, got = 0;
    unsigned char v[4096];
    for (size_t i = 0; i < n; i += sizeof v) {
        size_t m = n - i < sizeof v ? n - i : sizeof v;
        if (mincore((void *)(p + i * page), m * page, v) != 0) return 0;
        for (size_t k = 0; k < m; k++) got += v[k] & 1;
    }
    return got;
}

/* The THP mode of this kernel: 'a' always, 'm' madvise, 'n' never or unknown. */
static char thp_mode(void)
{
    char buf[128] = {0};
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return 'n';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    if (strstr(buf, "[always]")) return 'a';
    if (strstr(buf, "[madvise]")) return 'm';
    return 'n';
}

/* Whether /proc/self/smaps lists the mapping that holds addr with THPeligible 1. */
static int thp_eligible(uintptr_t addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) { /* a mapping's first line */
            in = addr >= lo && addr < hi;
            continue;
        }
        if (in && strncmp(line, "THPeligible:", 12) == 0) {
            found = atoi(line + 12) == 1;
            break;
        }
    }
    fclose(f);
    return found;
}

static void test_large_fresh_buffer(void)
{
    const size_t bytes = (size_t)6 << 20, page = (size_t)sysconf(_SC_PAGESIZE);
    /* 6 MiB + a page, so that the buffer (which starts 16 bytes in, as an allocator's
     * would) holds at least one whole, aligned 2 MiB page */
    uint8_t *map = mmap(NULL, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED, "mmap");
    if (map == MAP_FAILED) return;
    uint8_t *p = map + 16;
    memset(map, 0xA5, 64); /* the allocator's header and the buffer's first bytes */
    if (thp_mode() != 'a') /* (with THP always on, that write may have mapped a 2 MiB page) */
        CHECK(resident_pages(map, bytes + page) <= 1, "a fresh mapping is not resident");
    fp8mix_prefault(p, bytes, 2);
    size_t want = (bytes + page) / page;
    CHECK(resident_pages(map, bytes + page) >= want - 1, "prefault maps the buffer (%zu of %zu pages)",
          resident_pages(map, bytes + page), want);
    int same = 1;
    for (size_t i = 0; i < 64; i++) same &= map[i] == 0xA5;
    for (size_t i = 64; i < bytes; i += 4093) same &= map[i] == 0;
    CHECK(same, "prefault leaves the contents as they were");
    uintptr_t inner = ((uintptr_t)p + HUGE_SZ - 1) & ~(HUGE_SZ - 1);
    if (thp_mode() != 'n') {
        int e = thp_eligible(inner);
        CHECK(e == 1, "the whole 2 MiB pages of the buffer are marked for huge pages (THPeligible %d)", e);
    }
    munmap(map, bytes + page);
}

static void test_small_or_resident_left_alone(void)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), small = (size_t)1 << 19;
    uint8_t *map = mmap(NULL, small, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED, "mmap");
    if (map == MAP_FAILED) return;
    fp8mix_prefault(map, small, 1);
    CHECK(resident_pages(map, small) == 0, "a buffer under 1 MiB is not worth a syscall (%zu pages mapped)",
          resident_pages(map, small));
    munmap(map, small);

    /* resident at both ends: the check is two mincore calls, nothing is mapped */
    const size_t bytes = (size_t)4 << 20;
    map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(map != MAP_FAILED, "mmap");
    if (map == MAP_FAILED) return;
    map[0] = 1;
    map[bytes - 1] = 2;
    fp8mix_prefault(map, bytes, 1);
    CHECK(resident_pages(map, bytes) == 2 || thp_mode() == 'a',
          "a buffer resident at both ends is left alone (%zu pages mapped)", resident_pages(map, bytes));
    CHECK(map[0] == 1 && map[bytes - 1] == 2, "contents kept");
    munmap(map, bytes);
    (void)page;
}
#endif

int main(void)
{
#if defined(__linux__)
    test_large_fresh_buffer();
    test_small_or_resident_left_alone();
#endif
    fp8mix_prefault(NULL, (size_t)1 << 30, 1); /* a NULL buffer is ignored */
    return check_report("test_prefault");
}
