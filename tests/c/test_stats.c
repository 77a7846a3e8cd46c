/*
 * test_stats.c — fp8mix_quant_stats without Python: every entry against a
 * reference written here from the header's words (float64 math, its own
 * FP8 / float16 decoders, the documented summation order spelled out), every
 * SIMD variant bit-identical to the scalar kernel, thread-count independence,
 * the histogram's binade edges, bad scales (strict and bad_scale_as_one),
 * empty input and bad arguments.
 */
#include <stdlib.h>

#include "check.h"
#include "internal.h"
#include "stats_ref.h"

static const fp8mix_isa ISAS[] = {FP8MIX_ISA_SCALAR, FP8MIX_ISA_AVX2, FP8MIX_ISA_AVX512};
static const char *ISA_NAMES[] = {"scalar", "avx2", "avx512"};

/* ---- inputs ----------------------------------------------------------------- */

static uint32_t rng_state = 12345;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* A float32 that hits the interesting cases: specials, subnormals, the grid edges, wide magnitudes. */
static float interesting(void)
{
    static const float sp[] = {0.0f, -0.0f, 448.0f, 464.0f, 465.0f, 57344.0f, 59392.0f, 59393.0f, 0x1p-9f,
                               0x1p-10f, 0x1p-16f, 1e-45f, 0x1p-127f, FLT_MAX, -FLT_MAX, 1.0f};
    uint32_t k = rnd() % 16, u;
    if (k == 0) { u = rnd(); float f; memcpy(&f, &u, 4); return f; }
    if (k == 1) return sp[rnd() % 16];
    if (k == 2) return (rnd() & 1) ? INFINITY : -INFINITY;
    if (k == 3) return NAN;
    float m = (float)(rnd() % 100000) / 50000.0f - 1.0f;
    return ldexpf(m, (int)(rnd() % 60) - 40);
}

static uint16_t to_half_bits(float f, int xt)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return xt == FP8MIX_BF16 ? (uint16_t)(u >> 16) : fp8mix_f32_to_f16_ref(f);
}

typedef struct input {
    int64_t rows, cols, ld_x, ld_q;
    int xt, fmt, gran;
    void *x;
    uint8_t *q;
    float *sinv;
} input;

static input make_input(int64_t rows, int64_t cols, int xt, int fmt, int gran, int bad_scales)
{
    input in = {rows, cols, cols + (int64_t)(rnd() % 3), cols + (int64_t)(rnd() % 5), xt, fmt, gran, 0, 0, 0};
    size_t es = xt == FP8MIX_F32 ? 4 : 2;
    in.x = calloc((size_t)(rows * in.ld_x + 1), es);
    in.q = calloc((size_t)(rows * in.ld_q + 1), 1);
    int64_t ns = fp8mix_scale_count((fp8mix_granularity)gran, rows, cols);
    in.sinv = malloc((size_t)(ns + 1) * 4);
    static const float sv[] = {1.0f, 0.75f, 0x1p-20f, 3.1e-3f, 1e-40f /* subnormal */, 7.0e3f, 1e30f};
    for (int64_t t = 0; t < ns; t++) in.sinv[t] = sv[rnd() % 7];
    if (bad_scales)
        for (int64_t t = 0; t < ns; t += 3) in.sinv[t] = (t % 2) ? NAN : -(float)t;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            float v = interesting();
            if (xt == FP8MIX_F32) ((float *)in.x)[i * in.ld_x + j] = v;
            else ((uint16_t *)in.x)[i * in.ld_x + j] = to_half_bits(v, xt);
            in.q[i * in.ld_q + j] = (uint8_t)rnd(); /* every byte, NaN codes included */
        }
    return in;
}

static void free_input(input *in)
{
    free(in->x);
    free(in->q);
    free(in->sinv);
}

static fp8mix_status run(const input *in, fp8mix_isa isa, int threads, int bad_as_one, double *out)
{
    fp8mix_set_max_isa(isa);
    fp8mix_set_num_threads(threads);
    fp8mix_stats_opts o = {bad_as_one};
    return fp8mix_quant_stats(in->x, (fp8mix_dtype)in->xt, in->rows, in->cols, in->ld_x, in->q, in->ld_q,
                              (fp8mix_format)in->fmt, (fp8mix_granularity)in->gran, in->sinv, &o, out);
}

/* ---- tests ------------------------------------------------------------------ */

static long n_compared[3];

/* One input: the reference, every variant the CPU has, 1 and 3 threads. */
static void check_input(const input *in, int bad_as_one, const char *what)
{
    double ref[FP8MIX_STATS_N], got[FP8MIX_STATS_N], base[FP8MIX_STATS_N];
    sref_stats(in->x, in->xt, in->rows, in->cols, in->ld_x, in->q, in->ld_q, in->fmt, in->gran, in->sinv,
              bad_as_one, ref);
    CHECK(run(in, FP8MIX_ISA_SCALAR, 1, bad_as_one, base) == FP8MIX_OK, "%s: scalar status", what);
    for (int k = 0; k < FP8MIX_STATS_N; k++)
        CHECK(memcmp(&base[k], &ref[k], 8) == 0, "%s: entry %d %.17g, reference %.17g", what, k, base[k], ref[k]);
    for (int v = 0; v < 3; v++) {
        if (fp8mix_cpu_isa() < ISAS[v]) continue;
        for (int threads = 1; threads <= 3; threads += 2) {
            CHECK(run(in, ISAS[v], threads, bad_as_one, got) == FP8MIX_OK, "%s: status", what);
            CHECK(memcmp(got, base, sizeof got) == 0, "%s: %s with %d threads differs from scalar", what,
                  ISA_NAMES[v], threads);
        }
        n_compared[v]++;
    }
}

static void test_against_reference(void)
{
    static const int64_t shapes[][2] = {{1, 1}, {3, 15}, {2, 16}, {5, 17}, {7, 127}, {4, 128}, {130, 129},
                                        {65, 300}, {1, 1000}, {200, 33}};
    char what[96];
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int xt = 0; xt < 3; xt++)
            for (int fmt = 0; fmt < 2; fmt++)
                for (int gran = 0; gran < 4; gran++) {
                    input in = make_input(shapes[si][0], shapes[si][1], xt, fmt, gran, 0);
                    snprintf(what, sizeof what, "%lldx%lld xt %d fmt %d gran %d", (long long)in.rows,
                             (long long)in.cols, xt, fmt, gran);
                    check_input(&in, 0, what);
                    free_input(&in);
                }
    /* rows > 262144: tasks of more than 64 rows */
    input in = make_input(300001, 1, FP8MIX_F32, FP8MIX_E4M3, FP8MIX_GRAN_ROW, 0);
    check_input(&in, 0, "300001 rows");
    free_input(&in);
    /* every SIMD variant the CPU has was compared (and says so) */
    printf("test_stats: variants compared with the scalar kernel:");
    for (int v = 1; v < 3; v++) {
        if (n_compared[v]) printf(" %s (%ld inputs)", ISA_NAMES[v], n_compared[v]);
        CHECK(fp8mix_cpu_isa() < ISAS[v] || n_compared[v] > 0, "%s available but not compared", ISA_NAMES[v]);
    }
    printf("%s\n", n_compared[1] + n_compared[2] ? "" : " none (this CPU has no AVX2)");
}

static void test_bad_scales(void)
{
    for (int gran = 0; gran < 4; gran++) {
        input in = make_input(130, 260, FP8MIX_F32, FP8MIX_E5M2, gran, 1);
        double out[FP8MIX_STATS_N];
        for (int k = 0; k < FP8MIX_STATS_N; k++) out[k] = -7;
        CHECK(run(&in, FP8MIX_ISA_AVX512, 1, 0, out) == FP8MIX_ERR_BAD_SCALE, "strict: BAD_SCALE");
        CHECK(out[0] == -7, "strict: out untouched");
        check_input(&in, 1, "bad_scale_as_one");
        CHECK(run(&in, FP8MIX_ISA_AVX512, 1, 1, out) == FP8MIX_OK && out[FP8MIX_STATS_BAD_SCALES] > 0,
              "bad scales counted");
        free_input(&in);
    }
}

/* Binade edges: x = sinv * 2^k exactly is bin k; the float below it, bin k - 1. */
static void test_hist_edges(void)
{
    static const float sinvs[] = {1.0f, 0.3f, 1e-40f, 5.5e30f};
    for (int si = 0; si < 4; si++)
        for (int v = 0; v < 3; v++) {
            if (fp8mix_cpu_isa() < ISAS[v]) continue;
            float x[4];
            uint8_t q[4] = {0, 0, 0, 0};
            int k = 3;
            x[0] = ldexpf(sinvs[si], k);
            x[1] = nextafterf(x[0], 0.0f);
            x[2] = -x[0];
            x[3] = 0x1p-149f; /* the smallest subnormal */
            double out[FP8MIX_STATS_N];
            fp8mix_set_max_isa(ISAS[v]);
            CHECK(fp8mix_quant_stats(x, FP8MIX_F32, 1, 4, 4, q, 4, FP8MIX_E4M3, FP8MIX_GRAN_TENSOR, &sinvs[si],
                                     NULL, out) == FP8MIX_OK, "status");
            int b = k - FP8MIX_STATS_HIST_MIN_LOG2;
            double *h = out + FP8MIX_STATS_HIST;
            int bs = (int)floor(log2(0x1p-149 / sinvs[si])) - FP8MIX_STATS_HIST_MIN_LOG2;
            bs = bs < 0 ? 0 : bs > 63 ? 63 : bs;
            double want_b = 2 + (bs == b), want_b1 = 1 + (bs == b - 1);
            CHECK(h[b] == want_b && h[b - 1] == want_b1, "%s sinv %g: bins %g %g", ISA_NAMES[v], sinvs[si], h[b],
                  h[b - 1]);
            double total = 0;
            for (int t = 0; t < FP8MIX_STATS_HIST_BINS; t++) total += h[t];
            CHECK(total == 4 && h[bs] >= 1, "%s: subnormal x in bin %d", ISA_NAMES[v], bs);
        }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
}

static void test_empty_and_errors(void)
{
    double out[FP8MIX_STATS_N];
    float one = 1.0f, x = 1.0f;
    uint8_t q = 0x38;
    CHECK(fp8mix_quant_stats(NULL, FP8MIX_F32, 0, 5, 5, NULL, 5, FP8MIX_E4M3, FP8MIX_GRAN_BLOCK, NULL, NULL, out) ==
              FP8MIX_OK, "empty ok");
    CHECK(out[FP8MIX_STATS_NUMEL] == 0 && isinf(out[FP8MIX_STATS_MIN_NONZERO]) &&
              isinf(out[FP8MIX_STATS_SCALE_INV_MIN]) && out[FP8MIX_STATS_SCALE_INV_MAX] == 0 &&
              out[FP8MIX_STATS_MAX_FINITE] == 0 && out[FP8MIX_STATS_HIST] == 0, "empty values");
    CHECK(fp8mix_quant_stats(&x, FP8MIX_F32, 1, 1, 1, &q, 1, FP8MIX_E4M3, 0, &one, NULL, NULL) ==
              FP8MIX_ERR_NULL_POINTER, "out NULL");
    CHECK(fp8mix_quant_stats(&x, FP8MIX_F32, 1, 1, 1, &q, 1, (fp8mix_format)2, 0, &one, NULL, out) ==
              FP8MIX_ERR_BAD_ENUM, "format");
    CHECK(fp8mix_quant_stats(&x, (fp8mix_dtype)3, 1, 1, 1, &q, 1, FP8MIX_E4M3, 0, &one, NULL, out) ==
              FP8MIX_ERR_BAD_ENUM, "dtype");
    CHECK(fp8mix_quant_stats(&x, FP8MIX_F32, 1, 1, 1, &q, 1, FP8MIX_E4M3, (fp8mix_granularity)5, &one, NULL, out) ==
              FP8MIX_ERR_BAD_ENUM, "granularity");
    CHECK(fp8mix_quant_stats(&x, FP8MIX_F32, 1, 2, 1, &q, 2, FP8MIX_E4M3, 0, &one, NULL, out) == FP8MIX_ERR_BAD_SHAPE,
          "ld < cols");
    CHECK(fp8mix_quant_stats(&x, FP8MIX_F32, 1, 1, 1, NULL, 1, FP8MIX_E4M3, 0, &one, NULL, out) ==
              FP8MIX_ERR_NULL_POINTER, "q NULL");
    CHECK(fp8mix_quant_stats(&x, FP8MIX_F32, 1, 1, 1, &q, 1, FP8MIX_E4M3, 0, &one, NULL, out) == FP8MIX_OK &&
              out[FP8MIX_STATS_PIVOT] == 1 && out[FP8MIX_STATS_SUM1] == 0 && out[FP8MIX_STATS_NOISE] == 0 &&
              out[FP8MIX_STATS_HIST - FP8MIX_STATS_HIST_MIN_LOG2] == 1, "1.0 -> 0x38");
}

int main(void)
{
    test_against_reference();
    test_bad_scales();
    test_hist_edges();
    test_empty_and_errors();
    fp8mix_set_num_threads(0);
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    return check_report("test_stats");
}
