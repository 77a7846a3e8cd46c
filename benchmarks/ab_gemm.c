/*
 * ab_gemm.c — two or more builds of the C core's GEMM in one process, call by call
 * (built and run by bench_ab.py; not part of the library).
 *
 * Each argument after the shape is a shared library of a whole C core (dlopen'ed
 * RTLD_LOCAL, so each keeps its own symbols, dispatch and thread pool).  Every round calls
 * each library's fp8mix_gemm once with per-tensor scales and once with MX scales (powers
 * of two, as MX quantisation makes them) on the same E4M3 operands, so that the noise of a
 * shared machine (another tenant's load moves a GEMM's speed by 20-30% within seconds)
 * hits both builds alike; the ratios are taken per round, then their median.
 *
 *   ab_gemm M K N THREADS ROUNDS LAYOUT LIB...
 * LAYOUT: fwd (A row-major, B as N x K), dgrad (B as K x N) or wgrad (A stored K-major,
 * a transposed view, and B as K x N): the operand layouts of a Linear step's GEMMs.
 * prints one line per library: "ab NAME tensor GFLOPS mx GFLOPS t_ratio q1 q3 mx_ratio
 * mx_over_tensor q1 q3" (ratios against the first library; quartiles of the per-round
 * ratios).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fp8mix.h"

#define MAX_LIBS 8
#define MAX_ROUNDS 1000

typedef fp8mix_status (*gemm_fn)(const fp8mix_gemm_args *);
typedef void (*threads_fn)(int);

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median and quartiles of n values (sorted in place). */
static void quartiles(double *v, int n, double *q1, double *med, double *q3)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    *q1 = v[n / 4];
    *med = v[n / 2];
    *q3 = v[(3 * n) / 4];
}

static double t[2][MAX_LIBS][MAX_ROUNDS];

int main(int argc, char **argv)
{
    if (argc < 8) {
        fprintf(stderr, "usage: %s M K N THREADS ROUNDS LAYOUT LIB...\n", argv[0]);
        return 2;
    }
    int64_t M = atoll(argv[1]), K = atoll(argv[2]), N = atoll(argv[3]);
    int threads = atoi(argv[4]), rounds = atoi(argv[5]), nl = argc - 7;
    const char *layout = argv[6];
    int kn = strcmp(layout, "fwd") != 0, km = strcmp(layout, "wgrad") == 0;
    if (M < 1 || K < 1 || N < 1 || rounds < 1 || rounds > MAX_ROUNDS || nl > MAX_LIBS ||
        (kn && strcmp(layout, "dgrad") != 0 && !km)) {
        fprintf(stderr, "ab_gemm: bad shape, rounds (1..%d), layout (fwd, dgrad, wgrad) or library count (<= %d)\n",
                MAX_ROUNDS, MAX_LIBS);
        return 2;
    }
    char **libs = argv + 7;
    gemm_fn gemm[MAX_LIBS];
    for (int l = 0; l < nl; l++) {
        void *h = dlopen(libs[l], RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            fprintf(stderr, "ab_gemm: %s\n", dlerror());
            return 1;
        }
        gemm[l] = (gemm_fn)dlsym(h, "fp8mix_gemm");
        threads_fn set_threads = (threads_fn)dlsym(h, "fp8mix_set_num_threads");
        if (!gemm[l] || !set_threads) {
            fprintf(stderr, "ab_gemm: %s lacks fp8mix_gemm or fp8mix_set_num_threads\n", libs[l]);
            return 1;
        }
        set_threads(threads);
    }
    int64_t nkb = (K + 31) / 32;
    uint8_t *a = malloc((size_t)(M * K)), *b = malloc((size_t)(N * K));
    float *out = malloc(sizeof(float) * (size_t)(M * N));
    float *sa = malloc(sizeof(float) * (size_t)(M * nkb)), *sb = malloc(sizeof(float) * (size_t)(N * nkb));
    if (!a || !b || !out || !sa || !sb) return 1;
    uint32_t x = 12345u;
    for (int64_t i = 0; i < M * K + N * K; i++) { /* finite E4M3 bytes: no NaN code */
        x = x * 1664525u + 1013904223u;
        uint8_t v = (uint8_t)(x >> 24);
        if ((v & 0x7F) == 0x7F) v ^= 0x01;
        if (i < M * K) a[i] = v; else b[i - M * K] = v;
    }
    for (int64_t i = 0; i < M * nkb; i++) sa[i] = (i % 3) ? 0.5f : 0.25f;
    for (int64_t i = 0; i < N * nkb; i++) sb[i] = (i % 5) ? 2.0f : 1.0f;
    fp8mix_gemm_args g[2];
    for (int mx = 0; mx < 2; mx++) {
        memset(&g[mx], 0, sizeof g[mx]);
        g[mx].m = M, g[mx].n = N, g[mx].k = K;
        g[mx].a = a, g[mx].fmt_a = FP8MIX_E4M3, g[mx].lda = km ? M : K;
        g[mx].a_layout = km ? FP8MIX_A_KM : FP8MIX_A_MK;
        g[mx].b = b, g[mx].fmt_b = FP8MIX_E4M3, g[mx].ldb = kn ? N : K;
        g[mx].b_layout = kn ? FP8MIX_B_KN : FP8MIX_B_NK;
        g[mx].scale_a = sa, g[mx].scale_b = sb;
        g[mx].scale_a_kind = g[mx].scale_b_kind = mx ? FP8MIX_MM_SCALE_MX : FP8MIX_MM_SCALE_TENSOR;
        g[mx].out = out, g[mx].out_t = FP8MIX_F32, g[mx].ldo = N, g[mx].accum = FP8MIX_ACCUM_FP32;
    }
    for (int mx = 0; mx < 2; mx++) /* warm-up: workspaces, dispatch */
        for (int l = 0; l < nl; l++)
            if (gemm[l](&g[mx]) != FP8MIX_OK) return 1;
    for (int r = 0; r < rounds; r++)
        for (int mx = 0; mx < 2; mx++)
            for (int l = 0; l < nl; l++) {
                double t0 = now();
                gemm[l](&g[mx]);
                t[mx][l][r] = now() - t0;
            }
    double flop = 2.0 * (double)M * (double)N * (double)K;
    for (int l = 0; l < nl; l++) {
        double vt[MAX_ROUNDS], vm[MAX_ROUNDS], rt[MAX_ROUNDS], rm[MAX_ROUNDS], rmt[MAX_ROUNDS], q1, q3, dummy;
        double mt, mm, rtm, rmm, rmtm, rt1, rt3, rmt1, rmt3;
        for (int r = 0; r < rounds; r++) {
            vt[r] = t[0][l][r], vm[r] = t[1][l][r];
            rt[r] = t[0][0][r] / t[0][l][r];
            rm[r] = t[1][0][r] / t[1][l][r];
            rmt[r] = t[0][l][r] / t[1][l][r];
        }
        quartiles(vt, rounds, &q1, &mt, &q3);
        quartiles(vm, rounds, &q1, &mm, &q3);
        quartiles(rt, rounds, &rt1, &rtm, &rt3);
        quartiles(rm, rounds, &dummy, &rmm, &dummy);
        quartiles(rmt, rounds, &rmt1, &rmtm, &rmt3);
        printf("ab %s %.1f %.1f %.3f %.3f %.3f %.3f %.3f %.3f %.3f\n", libs[l], flop / mt * 1e-9,
               flop / mm * 1e-9, rtm, rt1, rt3, rmm, rmtm, rmt1, rmt3);
    }
    free(a), free(b), free(out), free(sa), free(sb);
    return 0;
}
