/*
 * ukernel_peak.c — each GEMM microkernel of the C core this CPU runs, timed alone with
 * its panels in L1 (kc = 256, the blocked driver's K step), so that its rate can be set
 * beside the FMA peak that isa_limits.c measures (built and run by bench_isa_limits.py
 * against build/core/libfp8mix_core.a; not part of the library).
 *
 * Prints one line per kernel: "ukernel NAME MR NR GFLOPS" (GFLOP/s of thread CPU time,
 * the best of 7 runs of 20000 calls).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gemm_internal.h"

static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(void)
{
    const fp8mix_gemm_ukernel *uks[8];
    int n = fp8mix_gemm_ukernels(uks, 8);
    const int64_t kc = 256;
    for (int u = 0; u < n; u++) {
        const fp8mix_gemm_ukernel *uk = uks[u];
        size_t abytes = (size_t)kc * (size_t)uk->mr * 4, bbytes = (size_t)kc * (size_t)uk->nr * 4;
        uint32_t *a = aligned_alloc(64, abytes), *b = aligned_alloc(64, bbytes);
        float *c = aligned_alloc(64, (size_t)uk->mr * (size_t)uk->nr * 4 + 64);
        if (!a || !b || !c) return 1;
        /* small normal values: float32 1/1024 steps, or bf16 pairs of (1, 1) */
        for (size_t i = 0; i < abytes / 4; i++) a[i] = uk->bf16 ? 0x3f803f80u : 0x3a800000u + (uint32_t)(i % 7);
        for (size_t i = 0; i < bbytes / 4; i++) b[i] = uk->bf16 ? 0x3f803f80u : 0x3a800000u + (uint32_t)(i % 5);
        memset(c, 0, (size_t)uk->mr * (size_t)uk->nr * 4);
        const int calls = strcmp(uk->name, "f32_4x16__scalar") == 0 ? 500 : 20000;
        double best = 1e30;
        for (int r = 0; r < 7; r++) {
            double t0 = cpu_now();
            for (int it = 0; it < calls; it++) uk->fn(kc, a, b, c, uk->nr, 1, NULL);
            double t = cpu_now() - t0;
            if (t < best) best = t;
        }
        printf("ukernel %s %d %d %.4g\n", uk->name, uk->mr, uk->nr,
               2.0 * uk->mr * uk->nr * (double)kc * calls / best / 1e9);
        free(a);
        free(b);
        free(c);
    }
    return 0;
}
