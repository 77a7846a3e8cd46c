/*
 * isa_limits.c — what this CPU's wide dot-product instructions could give an exact FP8
 * GEMM (built and run by bench_isa_limits.py; not part of the library).
 *
 *   isa_limits fma      float32 FMA throughput, ymm and zmm (instructions / s)
 *   isa_limits dpbf16   AVX512_BF16 vdpbf16ps zmm throughput (instructions / s)
 *   isa_limits amx      AMX-BF16 tdpbf16ps: how often its sums differ, bit for bit, from
 *                       float32 sums of the same exact products in three orders
 *                       (fp8mix's canonical pair order: odd element first, each add
 *                       rounded; even first; each pair's sum rounded once), and its
 *                       throughput
 *
 * Each mode prints one line "key value ..." that the Python side parses.  Every FP8
 * value is exact in bf16 and every product of two is exact in float32, so an IEEE
 * unit that rounds after each add must agree with one of the orders bit for bit.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <immintrin.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); /* CPU time: preemption on a shared host is not counted */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#define CHAINS 12 /* independent accumulators: more than latency x ports */
#define REPS 20000000L
#define EACH(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
/* keeps every accumulator in a register, live, each iteration */
#define KEEP(c) __asm__ volatile("" ::c(a[0]), c(a[1]), c(a[2]), c(a[3]), c(a[4]), c(a[5]), c(a[6]), c(a[7]), \
                                   c(a[8]), c(a[9]), c(a[10]), c(a[11]))

__attribute__((target("avx2,fma"))) static double fma_ymm_rate(void)
{
    __m256 a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = _mm256_set1_ps(1.0f + (float)i * 1e-7f);
    const __m256 x = _mm256_set1_ps(1.0000001f), y = _mm256_set1_ps(0.9999999f);
    double t0 = now();
    for (long r = 0; r < REPS; r++) {
#define F(i) a[i] = _mm256_fmadd_ps(a[i], x, y);
        EACH(F)
#undef F
        KEEP("x");
    }
    double t = now() - t0;
    float s = 0.0f, o[8];
    for (int i = 0; i < CHAINS; i++) {
        _mm256_storeu_ps(o, a[i]);
        s += o[0];
    }
    return s != s ? 0.0 : (double)REPS * CHAINS / t;
}

__attribute__((target("avx512f"))) static double fma_zmm_rate(void)
{
    __m512 a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_set1_ps(1.0f + (float)i * 1e-7f);
    const __m512 x = _mm512_set1_ps(1.0000001f), y = _mm512_set1_ps(0.9999999f);
    double t0 = now();
    for (long r = 0; r < REPS; r++) {
#define F(i) a[i] = _mm512_fmadd_ps(a[i], x, y);
        EACH(F)
#undef F
        KEEP("v");
    }
    double t = now() - t0;
    float s = 0.0f, o[16];
    for (int i = 0; i < CHAINS; i++) {
        _mm512_storeu_ps(o, a[i]);
        s += o[0];
    }
    return s != s ? 0.0 : (double)REPS * CHAINS / t;
}

__attribute__((target("avx512f,avx512bf16"))) static double dpbf16_rate(void)
{
    __m512 a[CHAINS];
    for (int i = 0; i < CHAINS; i++) a[i] = _mm512_setzero_ps();
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80); /* (1, 1) */
    double t0 = now();
    for (long r = 0; r < REPS / 4; r++) {
#define F(i) a[i] = _mm512_dpbf16_ps(a[i], x, x);
        EACH(F)
#undef F
        KEEP("v");
    }
    double t = now() - t0;
    float s = 0.0f, o[16];
    for (int i = 0; i < CHAINS; i++) {
        _mm512_storeu_ps(o, a[i]);
        s += o[0];
    }
    return s != s ? 0.0 : (double)(REPS / 4) * CHAINS / t;
}

/* ---- AMX ---- */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed)) tile_config;

static uint16_t to_bf16(float f) /* exact: f is an FP8 value */
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static uint32_t bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

/* A random E4M3-range value: sign, exponent -9 .. 8, 3 mantissa bits; some zeros. */
static float fp8_value(void)
{
    if (rnd() % 17 == 0) return 0.0f;
    float v = ldexpf(1.0f + (float)(rnd() % 8) / 8.0f, (int)(rnd() % 18) - 9);
    return (rnd() & 1) ? -v : v;
}

#define KD 256 /* k depth of one trial: 8 tile steps of 32 */

__attribute__((target("amx-tile,amx-bf16"))) static int amx_run(int trials, long *elems, long bad[3],
                                                                   double *gflops)
{
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 1;
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 3; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    static float af[16][KD], bf[KD][16], c[16][16], init[16][16];
    static uint16_t at[KD / 32][16][32], bt[KD / 32][16][32];
    *elems = 0;
    bad[0] = bad[1] = bad[2] = 0;
    for (int tr = 0; tr < trials; tr++) {
        for (int m = 0; m < 16; m++)
            for (int k = 0; k < KD; k++) af[m][k] = fp8_value();
        for (int k = 0; k < KD; k++)
            for (int n = 0; n < 16; n++) bf[k][n] = fp8_value();
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) c[m][n] = init[m][n] = (tr & 1) ? 1000.0f * fp8_value() : 0.0f;
        for (int s = 0; s < KD / 32; s++) {
            for (int m = 0; m < 16; m++)
                for (int k = 0; k < 32; k++) at[s][m][k] = to_bf16(af[m][32 * s + k]);
            for (int q = 0; q < 16; q++)
                for (int n = 0; n < 16; n++) {
                    bt[s][q][2 * n] = to_bf16(bf[32 * s + 2 * q][n]);
                    bt[s][q][2 * n + 1] = to_bf16(bf[32 * s + 2 * q + 1][n]);
                }
        }
        _tile_loadd(0, c, 64);
        for (int s = 0; s < KD / 32; s++) {
            _tile_loadd(1, at[s], 64);
            _tile_loadd(2, bt[s], 64);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, c, 64);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                float odd = init[m][n], even = init[m][n], pair = init[m][n];
                for (int q = 0; q < KD / 2; q++) {
                    float p0 = af[m][2 * q] * bf[2 * q][n], p1 = af[m][2 * q + 1] * bf[2 * q + 1][n];
                    odd += p1;
                    odd += p0;
                    even += p0;
                    even += p1;
                    pair += (float)((double)p0 + (double)p1);
                }
                bad[0] += bits(c[m][n]) != bits(odd);
                bad[1] += bits(c[m][n]) != bits(even);
                bad[2] += bits(c[m][n]) != bits(pair);
                (*elems)++;
            }
    }
    /* throughput: 4 accumulators from 2 x 2 operand tiles, the operands in L1 */
    for (int t = 0; t < 8; t++) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, at[0], 64);
    _tile_loadd(5, at[1], 64);
    _tile_loadd(6, bt[0], 64);
    _tile_loadd(7, bt[1], 64);
    const long n = 2000000;
    double t0 = now();
    for (long i = 0; i < n; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, c, 64);
    double t = now() - t0;
    _tile_release();
    *gflops = 4.0 * (double)n * 16 * 16 * 32 * 2 / t / 1e9;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: isa_limits fma|fma512|dpbf16|amx\n");
        return 2;
    }
    if (!strcmp(argv[1], "fma")) {
        printf("fma_ymm %.4g\n", fma_ymm_rate());
    } else if (!strcmp(argv[1], "fma512")) {
        printf("fma_zmm %.4g\n", fma_zmm_rate());
    } else if (!strcmp(argv[1], "dpbf16")) {
        printf("dpbf16_zmm %.4g\n", dpbf16_rate());
    } else if (!strcmp(argv[1], "amx")) {
        long elems, bad[3];
        double gf;
        if (amx_run(400, &elems, bad, &gf)) {
            printf("amx refused\n");
            return 0;
        }
        printf("amx %ld %ld %ld %ld %.4g\n", elems, bad[0], bad[1], bad[2], gf);
    } else {
        fprintf(stderr, "isa_limits: unknown mode '%s'\n", argv[1]);
        return 2;
    }
    return 0;
}
