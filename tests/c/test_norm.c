/* test_norm.c — the fused producer casts (norm.c, act.c, fused_cast.c) against
 * references written in double precision from fp8mix.h's prose: LayerNorm /
 * RMSNorm statistics and values (zero-centered gamma, no gamma, bias), every
 * activation, and the FP8 bytes at every granularity, given scales, current
 * scaling and delayed scaling.  Bytes must also equal fp8mix_cast of the
 * produced values (same encoder and random words), be the same for every
 * thread count and ISA (each SIMD kernel bit for bit against the scalar one,
 * specials and tails included), and errors must write nothing. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fused.h"

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}
static float urand(void) { return (float)(rnd() % 2000001) / 1000000.0f - 1.0f; }

/* ---- references ---------------------------------------------------------------- */

static void ref_stats(const float *x, int64_t cols, int rms, double eps, double *mean, double *rstd)
{
    double s = 0.0, v = 0.0;
    for (int64_t j = 0; j < cols; j++) s += x[j];
    *mean = rms || cols == 0 ? 0.0 : s / (double)cols;
    for (int64_t j = 0; j < cols; j++) v += (x[j] - *mean) * (x[j] - *mean);
    *rstd = 1.0 / sqrt((cols ? v / (double)cols : 0.0) + eps);
}

/* The activations in float64, in their sigmoid forms (gelu's tanh form
 * 0.5 a (1 + tanh u) = a / (1 + exp(-2u)) loses everything to cancellation
 * for large negative a in any precision). *z: |the exponent's argument|,
 * which float32 evaluation carries with relative error ~2^-23: the result's
 * error grows with it. */
static double ref_act(fp8mix_act_kind k, double a, double b, double *z)
{
    double v, u = sqrt(2.0 / 3.14159265358979323846) * (a + 0.044715 * a * a * a);
    *z = 0.0;
    switch (k) {
    case FP8MIX_ACT_GELU: case FP8MIX_ACT_GEGLU: v = a / (1.0 + exp(-2.0 * u)); *z = fabs(2.0 * u); break;
    case FP8MIX_ACT_RELU: case FP8MIX_ACT_REGLU: v = a > 0 ? a : 0.0; break;
    case FP8MIX_ACT_SILU: case FP8MIX_ACT_SWIGLU: v = a / (1.0 + exp(-a)); break;
    case FP8MIX_ACT_QGELU: case FP8MIX_ACT_QGEGLU: v = a / (1.0 + exp(-1.702 * a)); *z = fabs(1.702 * a); break;
    default: v = a > 0 ? a * a : 0.0; break;
    }
    return k >= FP8MIX_ACT_GEGLU ? v * b : v;
}

/* How far a float32 activation may be from ref_act: a few ulp, plus the
 * exponent argument's rounding carried through exp; results below 1e-35 may
 * be 0 (exp's range ends at +-88). */
static double act_tol(double r, double z) { return fabs(r) * (5e-7 + 2e-7 * z) + 1e-35; }

/* Half the FP8 grid spacing at |v| (v already scaled). */
static double half_ulp(double v, fp8mix_format f)
{
    int mb = f == FP8MIX_E4M3 ? 3 : 2, emin = f == FP8MIX_E4M3 ? -6 : -14;
    int e = v == 0.0 ? emin : (int)floor(log2(fabs(v)));
    return ldexp(0.5, (e < emin ? emin : e) - mb);
}

/* Every byte of q (scale_inv per gran) decodes to the rounding of ref * scale
 * within half a step, allowing for the float32 values' own error tol[i]. */
static long bytes_vs_ref(const uint8_t *q, const float *sinv, fp8mix_granularity g, int64_t rows, int64_t cols,
                         const double *ref, const double *tol, fp8mix_format f)
{
    long bad = 0;
    double fmax = fp8mix_format_max(f);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double si = sinv[scale_index(g, i, j, cols)], v = ref[i * cols + j] / si;
            double d = fp8mix_decode_ref(q[i * cols + j], f);
            double lim = half_ulp(v, f) * 1.0001 + tol[i * cols + j] / si;
            if (fabs(v) > fmax + lim) bad += fabs(d) != fmax;  /* saturated */
            else bad += !(fabs(d - v) <= lim);
        }
    return bad;
}

/* ---- norm ---------------------------------------------------------------------- */

typedef struct norm_case {
    int64_t rows, cols;
    int rms, zc, has_g, has_b;
    fp8mix_granularity g;
    int given; /* scales given (else current scaling) */
} norm_case;

static fp8mix_fused_out make_out(fp8mix_granularity g, const float *scale, uint8_t *q, int64_t ld_q, float *sinv,
                                 float *amax, float *y, int64_t ld_y)
{
    fp8mix_fused_out o = {g, scale, 0, 0, 0.0f, q, ld_q, NULL, 1, sinv, amax, y, FP8MIX_F32, ld_y};
    return o;
}

static void run_norm_case(const norm_case *c, fp8mix_format f)
{
    int64_t R = c->rows, C = c->cols, n = R * C, ns = fp8mix_scale_count(c->g, R, C);
    float *x = malloc(sizeof(float) * (n + 1)), *y = malloc(sizeof(float) * (n + 1));
    float *gam = malloc(sizeof(float) * (C + 1)), *bet = malloc(sizeof(float) * (C + 1));
    float *mean = malloc(sizeof(float) * (R + 1)), *rstd = malloc(sizeof(float) * (R + 1));
    float *sinv = malloc(sizeof(float) * (ns + 1)), *am = malloc(sizeof(float) * (ns + 1));
    float *scale = malloc(sizeof(float) * (ns + 1)), *am2 = malloc(sizeof(float) * (ns + 1));
    double *ref = malloc(sizeof(double) * (n + 1)), *tol = malloc(sizeof(double) * (n + 1));
    uint8_t *q = malloc(n + 1), *q2 = malloc(n + 1);
    for (int64_t i = 0; i < R; i++) {
        float off = 3.0f * urand(), sc = ldexpf(1.0f, (int)(rnd() % 9) - 4);
        for (int64_t j = 0; j < C; j++) x[i * C + j] = off + sc * urand();
    }
    for (int64_t j = 0; j < C; j++) gam[j] = c->zc ? 0.3f * urand() : 1.0f + 0.5f * urand(), bet[j] = 0.2f * urand();
    for (int64_t t = 0; t < ns; t++) scale[t] = ldexpf(1.0f + urand() * 0.5f, (int)(rnd() % 5));
    fp8mix_norm_params np = {c->rms ? FP8MIX_NORM_RMS : FP8MIX_NORM_LAYER, 1e-5f, c->zc,
                             c->has_g ? gam : NULL, c->has_b ? bet : NULL, FP8MIX_F32};
    fp8mix_cast_opts o = {f, 1, FP8MIX_ROUND_NEAREST, 0, 0, 1};
    fp8mix_fused_out out = make_out(c->g, c->given ? scale : NULL, q, C, sinv, am, y, C);
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, R, C, C, &np, mean, rstd, 0, &out, &o) == FP8MIX_OK, "norm_cast");
    long bad_stats = 0, bad_v = 0;
    for (int64_t i = 0; i < R; i++) {
        double m, r;
        ref_stats(x + i * C, C, c->rms, 1e-5, &m, &r);
        bad_stats += fabs(mean[i] - m) > 1e-6 * (fabs(m) + 1.0) || fabs(rstd[i] - r) > 2e-7 * r;
        for (int64_t j = 0; j < C; j++) {
            double g = c->has_g ? (c->zc ? 1.0 + (double)gam[j] : gam[j]) : 1.0, b = c->has_b ? bet[j] : 0.0;
            double xc = x[i * C + j] - m, v = xc * r * g + b;
            ref[i * C + j] = v;
            tol[i * C + j] = 4e-7 * (fabs(xc * r * g) + fabs(b)) + 1e-6 * fabs(m) * r * fabs(g);
            bad_v += !(fabs(y[i * C + j] - v) <= tol[i * C + j]);
        }
    }
    CHECK(bad_stats == 0, "%ld rows' mean/rstd differ from float64 (R=%lld C=%lld)", bad_stats, (long long)R,
          (long long)C);
    CHECK(bad_v == 0, "%ld normalized values off (rms=%d zc=%d)", bad_v, c->rms, c->zc);
    long bad_q = bytes_vs_ref(q, sinv, c->g, R, C, ref, tol, f);
    CHECK(bad_q == 0, "%ld bytes off the float64 reference (gran %d given %d fmt %d)", bad_q, c->g, c->given, f);
    /* amax is fp8mix_amax of the produced values; current scales follow from it */
    fp8mix_amax(y, FP8MIX_F32, R, C, C, c->g, am2);
    long bad_a = 0;
    for (int64_t t = 0; t < ns; t++) {
        float s = c->given ? scale[t] : 0.0f;
        if (!c->given) fp8mix_compute_scale(&am2[t], 1, f, 0, 0, 0.0f, &s, NULL);
        bad_a += f32_bits(am[t]) != f32_bits(am2[t]) || sinv[t] != 1.0f / s;
    }
    CHECK(bad_a == 0, "%ld amax / scale_inv entries off", bad_a);
    /* the bytes are fp8mix_cast's of those values (same encoder, any thread count) */
    for (int64_t t = 0; t < ns; t++) scale[t] = 1.0f / sinv[t];
    fp8mix_cast(y, FP8MIX_F32, R, C, C, c->g, scale, q2, C, NULL, 1, NULL, &o);
    CHECK(memcmp(q, q2, (size_t)n) == 0, "bytes differ from fp8mix_cast of the produced values");
    free(x); free(y); free(gam); free(bet); free(mean); free(rstd); free(sinv); free(am); free(scale); free(am2);
    free(ref); free(tol); free(q); free(q2);
}

static void test_norm_cases(void)
{
    const int64_t shapes[][2] = {{1, 1}, {3, 7}, {17, 128}, {5, 300}, {130, 257}, {33, 1000}};
    const fp8mix_granularity grans[] = {FP8MIX_GRAN_TENSOR, FP8MIX_GRAN_ROW, FP8MIX_GRAN_BLOCK, FP8MIX_GRAN_BLOCK2D};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int k = 0; k < 8; k++) {
            norm_case c = {shapes[s][0], shapes[s][1], k & 1, (k >> 1) & 1, k != 6, !(k & 1), grans[(s + k) % 4],
                           (k >> 2) & 1};
            run_norm_case(&c, (k + (int)s) % 3 == 2 ? FP8MIX_E5M2 : FP8MIX_E4M3);
        }
}

/* ---- activations ------------------------------------------------------------- */

static void test_act_values(void)
{
    long bad = 0, bad_ref = 0;
    for (int k = FP8MIX_ACT_GELU; k <= FP8MIX_ACT_SREGLU; k++)
        for (int t = 0; t < 20000; t++) {
            float a = ldexpf(urand(), (int)(rnd() % 12) - 4), b = 2.0f * urand();
            double z, r = ref_act((fp8mix_act_kind)k, a, b, &z);
            float v = fp8mix_act_ref((fp8mix_act_kind)k, a, b);
            bad_ref += !(fabs(v - r) <= act_tol(r, z));
        }
    CHECK(bad_ref == 0, "%ld activation values off float64", bad_ref);
    /* special values: NaN stays NaN, relu(-0) is 0, the large-|a| limits */
    bad += !isnan(fp8mix_act_ref(FP8MIX_ACT_GELU, NAN, 0)) || !isnan(fp8mix_act_ref(FP8MIX_ACT_RELU, NAN, 0));
    bad += fp8mix_act_ref(FP8MIX_ACT_SILU, 100.0f, 0) != 100.0f || fp8mix_act_ref(FP8MIX_ACT_GELU, -100.0f, 0) != 0;
    bad += fp8mix_act_ref(FP8MIX_ACT_GELU, INFINITY, 0) != INFINITY;
    bad += fp8mix_act_ref(FP8MIX_ACT_SRELU, -3.0f, 0) != 0.0f || fp8mix_act_ref(FP8MIX_ACT_SRELU, 3.0f, 0) != 9.0f;
    CHECK(bad == 0, "special activation values");
    CHECK(fp8mix_act_gated(FP8MIX_ACT_SWIGLU) == 1 && fp8mix_act_gated(FP8MIX_ACT_SRELU) == 0 &&
          fp8mix_act_gated((fp8mix_act_kind)42) == -1, "gated kinds");
}

static void test_act_cast(void)
{
    enum { R = 45, F = 300 };
    float *h = malloc(sizeof(float) * R * 2 * F), *y = malloc(sizeof(float) * R * F);
    uint8_t *q = malloc(R * F), *q2 = malloc(R * F);
    double *ref = malloc(sizeof(double) * R * F), *tol = malloc(sizeof(double) * R * F);
    float sinv[R * 3], am[R * 3], sc[R * 3];
    for (int i = 0; i < R * 2 * F; i++) h[i] = 4.0f * urand();
    for (int k = FP8MIX_ACT_GELU; k <= FP8MIX_ACT_SREGLU; k++) {
        int gated = fp8mix_act_gated((fp8mix_act_kind)k);
        int64_t cin = gated ? 2 * F : F, ld = 2 * F; /* a strided input: every row 2F apart */
        fp8mix_granularity g = (fp8mix_granularity)(k % 4);
        fp8mix_cast_opts o = {k % 3 ? FP8MIX_E4M3 : FP8MIX_E5M2, 1, k % 2 ? FP8MIX_ROUND_STOCHASTIC : 0, 77, 1024, 1};
        fp8mix_fused_out out = make_out(g, NULL, q, F, sinv, am, y, F);
        CHECK(fp8mix_act_cast(h, FP8MIX_F32, R, cin, ld, (fp8mix_act_kind)k, &out, &o) == FP8MIX_OK, "act %d", k);
        long bad_v = 0;
        for (int i = 0; i < R; i++)
            for (int j = 0; j < F; j++) {
                double z, r = ref_act((fp8mix_act_kind)k, h[i * ld + j], gated ? h[i * ld + F + j] : 0.0, &z);
                ref[i * F + j] = r;
                tol[i * F + j] = act_tol(r, z);
                bad_v += !(fabs(y[i * F + j] - r) <= tol[i * F + j]);
            }
        CHECK(bad_v == 0, "act %d: %ld values off float64", k, bad_v);
        if (o.rounding == FP8MIX_ROUND_NEAREST)
            CHECK(bytes_vs_ref(q, sinv, g, R, F, ref, tol, o.fmt) == 0, "act %d: bytes off float64", k);
        int64_t ns = fp8mix_scale_count(g, R, F);
        for (int64_t t = 0; t < ns; t++) sc[t] = 1.0f / sinv[t];
        fp8mix_cast(y, FP8MIX_F32, R, F, F, g, sc, q2, F, NULL, 1, NULL, &o);
        CHECK(memcmp(q, q2, R * F) == 0, "act %d: bytes (rounding %d) are fp8mix_cast's of the values", k,
              o.rounding);
    }
    free(h); free(y); free(q); free(q2); free(ref); free(tol);
}

/* ---- invariance: threads, ISA, dtypes ------------------------------------------ */

static void test_threads_isa_dtypes(void)
{
    enum { R = 300, C = 520 };
    float *x = malloc(sizeof(float) * R * C), gam[C], mean[R], rstd[R], mean2[R], rstd2[R], s1[R * 5], s2[R * 5];
    uint16_t *xb = malloc(2 * R * C), *yb = malloc(2 * R * C);
    uint8_t *q1 = malloc(R * C), *q2 = malloc(R * C), *t1 = malloc(R * C);
    for (int i = 0; i < R * C; i++) x[i] = 2.0f * urand() + 0.5f, xb[i] = fp8mix_f32_to_bf16_ref(x[i]);
    for (int j = 0; j < C; j++) gam[j] = 1.0f + urand();
    fp8mix_norm_params np = {FP8MIX_NORM_LAYER, 1e-5f, 0, gam, NULL, FP8MIX_F32};
    const fp8mix_isa isas[] = {FP8MIX_ISA_SCALAR, FP8MIX_ISA_AVX2, FP8MIX_ISA_AVX512, FP8MIX_ISA_AVX512BF16};
    for (int gi = 0; gi < 4; gi++) {
        fp8mix_cast_opts o = {FP8MIX_E4M3, 1, gi & 1 ? FP8MIX_ROUND_STOCHASTIC : 0, 5, 8, 0};
        fp8mix_fused_out a = make_out((fp8mix_granularity)gi, NULL, q1, C, s1, NULL, NULL, 1);
        a.qt = t1;
        a.ld_qt = R;
        fp8mix_set_max_isa(FP8MIX_ISA_SCALAR);
        fp8mix_set_num_threads(1);
        fp8mix_norm_cast(x, FP8MIX_F32, R, C, C, &np, mean, rstd, 0, &a, &o);
        long bad = 0;
        for (int i = 0; i < R; i++)
            for (int j = 0; j < C; j++) bad += t1[j * R + i] != q1[i * C + j];
        CHECK(bad == 0, "qt is q transposed (gran %d)", gi);
        for (int k = 0; k < 4; k++) {
            fp8mix_set_max_isa(isas[k]);
            fp8mix_set_num_threads(k + 2);
            fp8mix_fused_out b = make_out((fp8mix_granularity)gi, NULL, q2, C, s2, NULL, NULL, 1);
            fp8mix_norm_cast(x, FP8MIX_F32, R, C, C, &np, mean2, rstd2, 0, &b, &o);
            CHECK(memcmp(q1, q2, R * C) == 0 && memcmp(s1, s2, sizeof(float) * fp8mix_scale_count(b.gran, R, C)) == 0
                  && memcmp(rstd, rstd2, sizeof rstd) == 0, "bytes differ at ISA %d / %d threads (gran %d)", k, k + 2,
                  gi);
        }
    }
    /* the activation casts too (gelu: the exponential path; swiglu: gated, strided) */
    for (int k = 0; k < 2; k++) {
        fp8mix_act_kind act = k ? FP8MIX_ACT_SWIGLU : FP8MIX_ACT_GELU;
        int64_t cin = k ? C : C / 2 * 2;
        fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
        for (int v = 0; v < 4; v++) {
            fp8mix_set_max_isa(isas[v]);
            fp8mix_set_num_threads(v + 1);
            fp8mix_fused_out b = make_out(FP8MIX_GRAN_BLOCK, NULL, v ? q2 : q1, C, v ? s2 : s1, NULL, NULL, 1);
            fp8mix_act_cast(x, FP8MIX_F32, R, cin, C, act, &b, &o);
            if (v)
                CHECK(memcmp(q1, q2, (size_t)(R * (k ? C / 2 : C))) == 0, "act %d bytes differ at ISA %d", act, v);
        }
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    fp8mix_set_num_threads(0);
    /* bf16 input and output: the statistics of the widened values, y rounded once */
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    fp8mix_fused_out b = {FP8MIX_GRAN_TENSOR, NULL, 0, 0, 0.0f, q2, C, NULL, 1, s2, NULL, yb, FP8MIX_BF16, C};
    CHECK(fp8mix_norm_cast(xb, FP8MIX_BF16, R, C, C, &np, mean2, rstd2, 0, &b, &o) == FP8MIX_OK, "bf16");
    long bad = 0;
    for (int i = 0; i < R; i++) {
        double m, r;
        float xr[C];
        for (int j = 0; j < C; j++) xr[j] = bf16_to_f32(xb[i * C + j]);
        ref_stats(xr, C, 0, 1e-5, &m, &r);
        bad += fabs(mean2[i] - m) > 1e-6 * (fabs(m) + 1) || fabs(rstd2[i] - r) > 2e-7 * r;
        for (int j = 0; j < C; j++) {
            float v = (xr[j] - mean2[i]) * rstd2[i] * gam[j];
            bad += yb[i * C + j] != fp8mix_f32_to_bf16_ref(v);
        }
    }
    CHECK(bad == 0, "bf16: %ld statistics / outputs off", bad);
    /* stats_given: a second cast at another granularity reuses them */
    fp8mix_fused_out c = make_out(FP8MIX_GRAN_BLOCK2D, NULL, q1, C, s1, NULL, NULL, 1);
    float keep = rstd2[7];
    rstd2[7] = 2.0f * keep;
    fp8mix_norm_cast(xb, FP8MIX_BF16, R, C, C, &np, mean2, rstd2, 1, &c, &o);
    CHECK(rstd2[7] == 2.0f * keep && fp8mix_decode_ref(q1[7 * C + 3], FP8MIX_E4M3) != 0.0f, "stats read, not written");
    free(x); free(xb); free(yb); free(q1); free(q2); free(t1);
}

/* ---- delayed scaling -------------------------------------------------------- */

static void test_delayed(void)
{
    enum { R = 40, C = 200 };
    float *x = malloc(sizeof(float) * R * C), *y = malloc(sizeof(float) * R * C), mean[R], rstd[R];
    uint8_t *q = malloc(R * C), *q2 = malloc(R * C);
    for (int i = 0; i < R * C; i++) x[i] = 3.0f * urand();
    float hist[8 * 6] = {0}, scale[6] = {1, 1, 1, 1, 1, 1}, hist2[8 * 6] = {0}, scale2[6] = {1, 1, 1, 1, 1, 1};
    int64_t steps[6] = {0}, steps2[6] = {0};
    fp8mix_delayed_state st = {hist, 8, 6, scale, steps}, st2 = {hist2, 8, 6, scale2, steps2};
    fp8mix_delayed_recipe rc = {4, FP8MIX_AMAX_MAX, 1, 0, 1};
    fp8mix_norm_params np = {FP8MIX_NORM_RMS, 1e-6f, 0, NULL, NULL, FP8MIX_F32};
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 1};
    for (int step = 0; step < 3; step++) {
        float sc[2], sc2[2], am = 0.0f, am2 = 0.0f;
        fp8mix_fused_out out = {FP8MIX_GRAN_TENSOR, NULL, 0, 0, 0.0f, q, C, NULL, 1, NULL, &am, y, FP8MIX_F32, C};
        CHECK(fp8mix_norm_cast_delayed(x, FP8MIX_F32, R, C, C, &np, mean, rstd, 0, &out, &st, 3, &rc, NULL, 1, &o,
                                       sc) == FP8MIX_OK, "delayed norm step %d", step);
        /* the same transitions as fp8mix_cast_delayed on the produced values */
        fp8mix_cast_delayed(y, FP8MIX_F32, R, C, C, q2, C, NULL, 1, &st2, 3, &rc, NULL, 1, &o, sc2, &am2);
        CHECK(memcmp(q, q2, R * C) == 0 && sc[0] == sc2[0] && sc[1] == sc2[1] && am == am2, "step %d", step);
        CHECK(memcmp(hist, hist2, sizeof hist) == 0 && memcmp(scale, scale2, sizeof scale) == 0 &&
              steps[3] == step + 1 && steps[0] == 0, "state after step %d", step);
        for (int i = 0; i < R * C; i++) x[i] *= 2.0f; /* the next step's values double: delayed lags */
    }
    /* a corrupted scale in the state is refused before anything is written */
    scale[3] = 0.0f;
    memset(q, 0xAB, R * C);
    fp8mix_fused_out out = {FP8MIX_GRAN_TENSOR, NULL, 0, 0, 0.0f, q, C, NULL, 1, NULL, NULL, NULL, FP8MIX_F32, 1};
    float sc[2];
    CHECK(fp8mix_norm_cast_delayed(x, FP8MIX_F32, R, C, C, &np, mean, rstd, 0, &out, &st, 3, &rc, NULL, 1, &o, sc) ==
          FP8MIX_ERR_BAD_SCALE && q[0] == 0xAB && steps[3] == 3, "bad state scale");
    out.gran = FP8MIX_GRAN_BLOCK;
    CHECK(fp8mix_act_cast_delayed(x, FP8MIX_F32, R, C, C, FP8MIX_ACT_GELU, &out, &st, 0, &rc, NULL, 1, &o, sc) ==
          FP8MIX_ERR_BAD_ARG, "delayed needs TENSOR");
    free(x); free(y); free(q); free(q2);
}

/* ---- SIMD kernels against the scalar ones, bit for bit ----------------------- */

static float special(void)
{
    static const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 88.7f, 88.8f, -87.3f,
                               -87.4f, 200.0f, -200.0f, 1e30f, -1e30f, 0.5f};
    return sp[rnd() % 16];
}

static int same_bits(const void *a, const void *b, size_t n) { return memcmp(a, b, n) == 0; }

static void test_kernels_bit_exact(void)
{
    enum { N = 300 };
    const fp8mix_fused_kernels *vars[3];
    int nv = 0;
#if FP8MIX_X86
    fp8mix_isa best = fp8mix_cpu_isa();
    static const fp8mix_fused_kernels k2 = {fp8mix_fused_widen__avx2, fp8mix_fused_lane_sums__avx2,
                                            fp8mix_fused_norm_apply__avx2, fp8mix_fused_act__avx2};
    static const fp8mix_fused_kernels k5 = {fp8mix_fused_widen__avx512, fp8mix_fused_lane_sums__avx512,
                                            fp8mix_fused_norm_apply__avx512, fp8mix_fused_act__avx512};
    if (best >= FP8MIX_ISA_AVX2) vars[nv++] = &k2;
    if (best >= FP8MIX_ISA_AVX512) vars[nv++] = &k5;
#endif
    long bad = 0, runs = 0;
    float a[N], b[N], g[N], o0[N], o1[N];
    uint16_t h[N];
    for (int trial = 0; trial < 400; trial++) {
        int64_t n = (int64_t)(rnd() % N);
        for (int64_t t = 0; t < n; t++) {
            a[t] = rnd() % 5 ? ldexpf(urand(), (int)(rnd() % 16) - 6) : special();
            b[t] = rnd() % 7 ? 2.0f * urand() : special();
            g[t] = 1.0f + urand();
            h[t] = (uint16_t)rnd();
        }
        for (int v = 0; v < nv; v++, runs++) {
            const fp8mix_fused_kernels *K = vars[v];
            fp8mix_act_kind k = (fp8mix_act_kind)(rnd() % 10);
            fp8mix_fused_act_ref(k, a, k >= FP8MIX_ACT_GEGLU ? b : NULL, n, o0);
            K->act(k, a, k >= FP8MIX_ACT_GEGLU ? b : NULL, n, o1);
            bad += !same_bits(o0, o1, sizeof(float) * (size_t)n);
            memcpy(o1, a, sizeof a); /* in place */
            K->act(k, o1, NULL, n, o1);
            fp8mix_fused_act_ref(k, a, NULL, n, o0);
            bad += !same_bits(o0, o1, sizeof(float) * (size_t)n);
            int use_g = trial & 1, use_b = trial & 2;
            fp8mix_fused_norm_apply_ref(a, n, 0.25f, 1.5f, use_g ? g : NULL, use_b ? b : NULL, o0);
            K->norm_apply(a, n, 0.25f, 1.5f, use_g ? g : NULL, use_b ? b : NULL, o1);
            bad += !same_bits(o0, o1, sizeof(float) * (size_t)n);
            double l0[8] = {1, 2, 3, 4, 5, 6, 7, 8}, l1[8] = {1, 2, 3, 4, 5, 6, 7, 8};
            fp8mix_fused_lane_sums_ref(a, n, trial & 4, 0.125, l0);
            K->lane_sums(a, n, trial & 4, 0.125, l1);
            for (int l = 0; l < 8; l++) /* NaN payloads of sums may differ; norm.c makes them canonical */
                bad += !(f32_bits((float)l0[l]) == f32_bits((float)l1[l]) || (isnan(l0[l]) && isnan(l1[l])));
            fp8mix_dtype dt = trial & 8 ? FP8MIX_BF16 : FP8MIX_F16;
            fp8mix_fused_widen_ref(h, dt, n, o0);
            K->widen(h, dt, n, o1);
            for (int64_t t = 0; t < n; t++) /* NaN payloads may differ (F16C quiets them); values may not */
                bad += !(f32_bits(o0[t]) == f32_bits(o1[t]) || (isnan(o0[t]) && isnan(o1[t])));
        }
    }
    CHECK(bad == 0, "%ld of %ld SIMD kernel runs differ from the scalar kernels", bad, runs);
    printf("test_norm: %d SIMD kernel variant(s) checked against scalar\n", nv);
}

/* ---- errors and edges --------------------------------------------------------- */

static void test_errors_and_edges(void)
{
    float x[12] = {1, 2, 3, 4, 5, 6, NAN, 1, 2, INFINITY, 0, 0}, mean[3] = {9, 9, 9}, rstd[3] = {9, 9, 9}, s[4];
    uint8_t q[12];
    memset(q, 0xCD, sizeof q);
    fp8mix_norm_params np = {FP8MIX_NORM_LAYER, 1e-5f, 0, NULL, NULL, FP8MIX_F32};
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 1};
    fp8mix_fused_out out = make_out(FP8MIX_GRAN_ROW, NULL, q, 4, s, NULL, NULL, 1);
    np.eps = -1.0f;
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 4, &np, mean, rstd, 0, &out, &o) == FP8MIX_ERR_BAD_ARG, "eps");
    np.eps = 1e-5f;
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 3, &np, mean, rstd, 0, &out, &o) == FP8MIX_ERR_BAD_SHAPE, "ld");
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 4, &np, NULL, rstd, 0, &out, &o) == FP8MIX_ERR_NULL_POINTER, "mean");
    out.margin = -1;
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 4, &np, mean, rstd, 0, &out, &o) == FP8MIX_ERR_BAD_ARG, "margin");
    out.margin = 0;
    float bad_scale[3] = {1.0f, -1.0f, 1.0f};
    out.scale = bad_scale;
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 4, &np, mean, rstd, 0, &out, &o) == FP8MIX_ERR_BAD_SCALE, "scale");
    out.scale = NULL;
    out.qt = q;
    out.q = NULL;
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 4, &np, mean, rstd, 0, &out, &o) == FP8MIX_ERR_BAD_ARG, "qt alone");
    out.q = q;
    out.qt = NULL;
    CHECK(fp8mix_act_cast(x, FP8MIX_F32, 3, 3, 4, FP8MIX_ACT_SWIGLU, &out, &o) == FP8MIX_ERR_BAD_SHAPE, "odd gated");
    CHECK(fp8mix_act_cast(x, FP8MIX_F32, 3, 4, 4, (fp8mix_act_kind)10, &out, &o) == FP8MIX_ERR_BAD_ENUM, "act kind");
    CHECK(mean[0] == 9 && rstd[0] == 9 && q[0] == 0xCD, "errors write nothing");
    /* non-finite rows give NaN bytes (inf_to_nan), finite rows are untouched by them */
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 3, 4, 4, &np, mean, rstd, 0, &out, &o) == FP8MIX_OK, "run");
    CHECK((q[4] & 0x7F) == 0x7F && (q[8] & 0x7F) == 0x7F && (q[0] & 0x7F) != 0x7F, "NaN rows");
    CHECK(isnan(rstd[1]) && isnan(rstd[2]) && rstd[0] > 0, "stats of non-finite rows");
    /* an empty result: statistics of empty rows, amax 0 */
    float a0 = 5.0f;
    fp8mix_fused_out e = make_out(FP8MIX_GRAN_TENSOR, NULL, q, 1, s, &a0, NULL, 1);
    CHECK(fp8mix_norm_cast(x, FP8MIX_F32, 2, 0, 1, &np, mean, rstd, 0, &e, &o) == FP8MIX_OK && a0 == 0.0f &&
          mean[0] == 0.0f && rstd[0] == (float)(1.0 / sqrt((double)1e-5f)) && s[0] == 1.0f, "empty rows");
}

int main(void)
{
    test_norm_cases();
    test_act_values();
    test_act_cast();
    test_threads_isa_dtypes();
    test_delayed();
    test_kernels_bit_exact();
    test_errors_and_edges();
    return check_report("test_norm");
}
