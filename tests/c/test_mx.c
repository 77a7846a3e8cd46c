/*
 * test_mx.c — MX blocks (FP8MIX_GRAN_MX, fp8mix_quantize_mx, MX GEMM scales)
 * against a reference written here from the OCP Microscaling Formats v1.0 spec
 * (sec. 5 / 6.3): 32-element blocks, shared scale X = 2^e with e in
 * [-127, 127], e = floor(log2(amax)) - emax_elem ("floor"; emax_elem 8 for
 * E4M3, 15 for E5M2) or NVIDIA's "rceil" (the smallest power of two with
 * amax / X <= fp8_max), elements x / X rounded to nearest even, saturating.
 * The reference decodes FP8 from the bit formulas and encodes by searching
 * the nearest code, in float64, sharing nothing with the core but the API.
 * Covered: both formats and rules, zeros, subnormal and huge blocks, NaN /
 * inf, blocks cut by the tensor edge, margin, bf16 / f16 inputs, the
 * transposed quantisation, stochastic rounding of qt vs q of the transpose,
 * every ISA and thread count bit-exact, dequantize, statistics, the GEMM
 * (exact float32 order and float64 bound, every layout) and bad arguments.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gemm_internal.h"

/* ---- the reference, from the spec ---------------------------------------- */

static double ref_decode(uint8_t c, int e5m2)
{
    int mb = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7;
    int sign = c >> 7, ex = (c >> mb) & (e5m2 ? 31 : 15), man = c & ((1 << mb) - 1);
    if (e5m2 && ex == 31) return man ? NAN : (sign ? -INFINITY : INFINITY);
    if (!e5m2 && ex == 15 && man == 7) return NAN;
    double v = ex == 0 ? ldexp(man, 1 - bias - mb) : ldexp((1 << mb) + man, ex - bias - mb);
    return sign ? -v : v;
}

static double ref_max(int e5m2) { return e5m2 ? 57344.0 : 448.0; }

/* Nearest code to v (ties to the even code), saturating; NaN to the NaN code. */
static uint8_t ref_encode(double v, int e5m2)
{
    if (isnan(v)) return e5m2 ? 0x7E : 0x7F;
    int neg = signbit(v);
    double a = fabs(v) > ref_max(e5m2) ? ref_max(e5m2) : fabs(v);
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c < 128; c++) {
        double d = ref_decode((uint8_t)c, e5m2);
        if (isnan(d) || isinf(d)) continue;
        double dist = fabs(d - a);
        if (dist < bd || (dist == bd && (c & 1) == 0)) {
            bd = dist;
            best = c;
        }
    }
    return (uint8_t)(best | (neg ? 0x80 : 0));
}

/* The block exponent: floor(log2(amax)) from frexp, rceil by exact doubling. */
static int ref_exponent(float amax, int e5m2, int floor_rule, int margin)
{
    if (isnan(amax) || isinf(amax)) return 0; /* fp8mix's documented choice (the spec's NaN scale) */
    if (amax == 0.0f) return -127;
    int E;
    frexp(amax, &E); /* amax = f 2^E, f in [0.5, 1) */
    int emax = e5m2 ? 15 : 8, e = (E - 1) - emax;
    if (!floor_rule)
        while ((double)amax > ref_max(e5m2) * ldexp(1.0, e)) e++;
    e += margin;
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

/* Reference MX quantisation of rows x cols float32 (row-major). */
static void ref_quantize(const float *x, int64_t rows, int64_t cols, int e5m2, int floor_rule, int margin,
                         uint8_t *q, float *sinv)
{
    int64_t nkb = (cols + 31) / 32;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t b = 0; b < nkb; b++) {
            int64_t j0 = b * 32, j1 = j0 + 32 < cols ? j0 + 32 : cols;
            float amax = 0.0f;
            int nan = 0;
            for (int64_t j = j0; j < j1; j++) {
                float a = fabsf(x[i * cols + j]);
                if (isnan(a)) nan = 1;
                else if (a > amax) amax = a;
            }
            int e = ref_exponent(nan ? NAN : amax, e5m2, floor_rule, margin);
            sinv[i * nkb + b] = (float)ldexp(1.0, e);
            for (int64_t j = j0; j < j1; j++) {
                float y = (float)ldexp((double)x[i * cols + j], -e); /* x * 2^-e, to float32 (the core's rule) */
                q[i * cols + j] = ref_encode(y, e5m2);
            }
        }
}

/* ---- data ------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

/* Blocks of very different magnitudes, and the special blocks the spec names. */
static void fill(float *x, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t blk = (i * 7 + j / 32) % 9;
            double v = (urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 12) - 6);
            switch (blk) {
            case 0: v *= 1e-3; break;
            case 1: v = 0.0; break;                    /* an all-zero block */
            case 2: v *= 1e-40; break;                 /* subnormal float32 inputs */
            case 3: v *= 1e30; break;
            case 4: v = (j % 5 == 0) ? 3e38 : v; break; /* near FLT_MAX */
            default: break;
            }
            x[i * cols + j] = (float)v;
        }
}

static const fp8mix_cast_opts OPTS_E4 = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};

static fp8mix_cast_opts opts_of(int e5m2)
{
    fp8mix_cast_opts o = OPTS_E4;
    o.fmt = e5m2 ? FP8MIX_E5M2 : FP8MIX_E4M3;
    return o;
}

/* ---- tests ----------------------------------------------------------------- */

static void test_exponent_rule(void)
{
    /* rceil: 448 fits 2^0, just above needs 2^1; floor: 256 .. 511 give 0 */
    CHECK(fp8mix_mx_exponent(448.0f, FP8MIX_E4M3, FP8MIX_MX_RCEIL, 0, 0) == 0, "448 rceil");
    CHECK(fp8mix_mx_exponent(nextafterf(448.0f, 1e9f), FP8MIX_E4M3, FP8MIX_MX_RCEIL, 0, 0) == 1, "448+ rceil");
    CHECK(fp8mix_mx_exponent(511.0f, FP8MIX_E4M3, FP8MIX_MX_FLOOR, 0, 0) == 0, "511 floor");
    CHECK(fp8mix_mx_exponent(512.0f, FP8MIX_E4M3, FP8MIX_MX_FLOOR, 0, 0) == 1, "512 floor");
    CHECK(fp8mix_mx_exponent(0.0f, FP8MIX_E4M3, FP8MIX_MX_RCEIL, 0, 0) == -127, "zero");
    CHECK(fp8mix_mx_exponent(FLT_MAX, FP8MIX_E5M2, FP8MIX_MX_RCEIL, 0, 0) == 113, "FLT_MAX e5m2");
    CHECK(fp8mix_mx_exponent(1.0f, FP8MIX_E4M3, FP8MIX_MX_RCEIL, 3, 0) == -5, "margin");
    CHECK(fp8mix_mx_exponent(1e-30f, FP8MIX_E4M3, FP8MIX_MX_RCEIL, 0, 1.0f) == -8, "epsilon");
    /* every exponent and a spread of mantissas against the reference */
    for (int e5 = 0; e5 < 2; e5++)
        for (int fl = 0; fl < 2; fl++)
            for (uint32_t u = 1; u < 0x7F800000u; u += 0x000F1235u) {
                float a;
                memcpy(&a, &u, 4);
                int got = fp8mix_mx_exponent(a, e5 ? FP8MIX_E5M2 : FP8MIX_E4M3, fl ? FP8MIX_MX_FLOOR : FP8MIX_MX_RCEIL,
                                             0, 0);
                int want = ref_exponent(a, e5, fl, 0);
                CHECK(got == want, "exponent of %a (e5m2=%d floor=%d): %d, want %d", a, e5, fl, got, want);
            }
}

static void check_against_ref(const float *x, int64_t rows, int64_t cols, int e5m2, int floor_rule, int margin)
{
    int64_t nkb = (cols + 31) / 32, nkbt = (rows + 31) / 32, n = rows * cols;
    uint8_t *q = malloc((size_t)n), *qr = malloc((size_t)n), *qt = malloc((size_t)n), *qtr = malloc((size_t)n);
    float *s = malloc(sizeof(float) * (size_t)(rows * nkb)), *sr = malloc(sizeof(float) * (size_t)(rows * nkb));
    float *st = malloc(sizeof(float) * (size_t)(cols * nkbt)), *str = malloc(sizeof(float) * (size_t)(cols * nkbt));
    float *xt = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) xt[j * rows + i] = x[i * cols + j];
    fp8mix_cast_opts o = opts_of(e5m2);
    fp8mix_mx_rule rule = floor_rule ? FP8MIX_MX_FLOOR : FP8MIX_MX_RCEIL;
    fp8mix_status stt = fp8mix_quantize_mx(x, FP8MIX_F32, rows, cols, cols, rule, margin, 0.0f, q, cols, s, qt, rows,
                                           st, NULL, &o);
    CHECK(stt == FP8MIX_OK, "quantize_mx: %d", stt);
    ref_quantize(x, rows, cols, e5m2, floor_rule, margin, qr, sr);
    ref_quantize(xt, cols, rows, e5m2, floor_rule, margin, qtr, str);
    long bad = 0;
    for (int64_t t = 0; t < n; t++) bad += q[t] != qr[t];
    for (int64_t t = 0; t < rows * nkb; t++) bad += f32_bits(s[t]) != f32_bits(sr[t]);
    for (int64_t t = 0; t < n; t++) bad += qt[t] != qtr[t];
    for (int64_t t = 0; t < cols * nkbt; t++) bad += f32_bits(st[t]) != f32_bits(str[t]);
    CHECK(bad == 0, "%lldx%lld e5m2=%d floor=%d margin=%d: %ld bytes/scales differ from the spec reference",
          (long long)rows, (long long)cols, e5m2, floor_rule, margin, bad);
    free(q); free(qr); free(qt); free(qtr); free(s); free(sr); free(st); free(str); free(xt);
}

static void test_quantize_vs_spec(void)
{
    int64_t shapes[][2] = {{1, 1}, {3, 32}, {37, 70}, {64, 96}, {33, 31}};
    for (int sh = 0; sh < 5; sh++) {
        int64_t r = shapes[sh][0], c = shapes[sh][1];
        float *x = malloc(sizeof(float) * (size_t)(r * c));
        fill(x, r, c);
        for (int e5 = 0; e5 < 2; e5++)
            for (int fl = 0; fl < 2; fl++) check_against_ref(x, r, c, e5, fl, sh == 2 ? 2 : 0);
        free(x);
    }
}

static void test_nonfinite(void)
{
    float x[64];
    for (int j = 0; j < 64; j++) x[j] = (float)(j - 30) * 0.25f;
    x[3] = NAN;
    x[40] = INFINITY;
    uint8_t q[64], qr[64];
    float s[2], sr[2];
    fp8mix_status st = fp8mix_quantize_mx(x, FP8MIX_F32, 1, 64, 64, FP8MIX_MX_RCEIL, 0, 0.0f, q, 64, s, NULL, 0, NULL,
                                          NULL, &OPTS_E4);
    ref_quantize(x, 1, 64, 0, 0, 0, qr, sr);
    CHECK(st == FP8MIX_OK && memcmp(q, qr, 64) == 0 && s[0] == 1.0f && s[1] == 1.0f, "NaN / inf blocks");
    CHECK((q[3] & 0x7F) == 0x7F && q[40] == 0x7E, "NaN stays NaN, inf saturates: %02x %02x", q[3], q[40]);
    fp8mix_cast_opts o = OPTS_E4;
    o.inf_to_nan = 1;
    fp8mix_quantize_mx(x, FP8MIX_F32, 1, 64, 64, FP8MIX_MX_RCEIL, 0, 0.0f, q, 64, s, NULL, 0, NULL, NULL, &o);
    CHECK(q[40] == 0x7F, "inf_to_nan: %02x", q[40]);
}

/* bf16 / f16 inputs widen exactly: the same bytes as their float32 values. */
static void test_half_inputs(void)
{
    enum { R = 5, C = 77 };
    float x[R * C], xw[R * C];
    uint16_t hb[R * C], hh[R * C];
    fill(x, R, C);
    for (int t = 0; t < R * C; t++) {
        x[t] = fminf(fmaxf(x[t], -60000.0f), 60000.0f);
        hb[t] = fp8mix_f32_to_bf16_ref(x[t]);
        hh[t] = fp8mix_f32_to_f16_ref(x[t]);
    }
    for (int dt = 1; dt <= 2; dt++) {
        for (int t = 0; t < R * C; t++) xw[t] = dt == 1 ? bf16_to_f32(hb[t]) : fp8mix_f16_to_f32_ref(hh[t]);
        uint8_t q[R * C], qr[R * C], qt[R * C], qtr[R * C];
        float s[R * 3], sr[R * 3], st[C], str[C];
        fp8mix_quantize_mx(dt == 1 ? (void *)hb : (void *)hh, (fp8mix_dtype)dt, R, C, C, FP8MIX_MX_RCEIL, 0, 0.0f, q,
                           C, s, qt, R, st, NULL, &OPTS_E4);
        fp8mix_quantize_mx(xw, FP8MIX_F32, R, C, C, FP8MIX_MX_RCEIL, 0, 0.0f, qr, C, sr, qtr, R, str, NULL, &OPTS_E4);
        CHECK(memcmp(q, qr, sizeof q) == 0 && memcmp(s, sr, sizeof s) == 0 && memcmp(qt, qtr, sizeof qt) == 0 &&
                  memcmp(st, str, sizeof st) == 0, "dtype %d", dt);
    }
}

/* qt equals q of the contiguous transpose, stochastic rounding included; every
 * ISA and thread count gives the same bytes; the other entry points agree. */
static void test_transpose_isa_threads_entry_points(void)
{
    enum { R = 70, C = 130 };
    static float x[R * C], xt[R * C];
    fill(x, R, C);
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) xt[j * R + i] = x[i * C + j];
    fp8mix_cast_opts o = OPTS_E4;
    o.rounding = FP8MIX_ROUND_STOCHASTIC;
    o.seed = 1234;
    o.offset = 8;
    static uint8_t q0[R * C], qt0[R * C], q1[R * C], qt1[R * C];
    static float s0[R * 5], st0[C * 3], st1[C * 3];
    fp8mix_set_max_isa(FP8MIX_ISA_SCALAR);
    fp8mix_set_num_threads(1);
    fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, FP8MIX_MX_RCEIL, 0, 0.0f, q0, C, s0, qt0, R, st0, NULL, &o);
    fp8mix_quantize_mx(xt, FP8MIX_F32, C, R, R, FP8MIX_MX_RCEIL, 0, 0.0f, q1, R, st1, NULL, 0, NULL, NULL, &o);
    CHECK(memcmp(qt0, q1, sizeof q1) == 0 && memcmp(st0, st1, sizeof st1) == 0, "qt == q of the transpose (SR)");
    for (int isa = FP8MIX_ISA_AVX2; isa <= FP8MIX_ISA_AVX512BF16; isa++)
        for (int th = 1; th <= 3; th += 2) {
            fp8mix_set_max_isa((fp8mix_isa)isa);
            fp8mix_set_num_threads(th);
            for (int fl = 0; fl < 2; fl++) {
                static uint8_t a[R * C], at[R * C], b[R * C], bt[R * C];
                static float sa[R * 5], sat[C * 3], sb[R * 5], sbt[C * 3];
                fp8mix_mx_rule rule = fl ? FP8MIX_MX_FLOOR : FP8MIX_MX_RCEIL;
                fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, rule, 0, 0.0f, a, C, sa, at, R, sat, NULL, &o);
                fp8mix_isa was = fp8mix_active_isa();
                fp8mix_set_max_isa(FP8MIX_ISA_SCALAR);
                fp8mix_set_num_threads(1);
                fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, rule, 0, 0.0f, b, C, sb, bt, R, sbt, NULL, &o);
                CHECK(memcmp(a, b, sizeof a) == 0 && memcmp(at, bt, sizeof at) == 0 && memcmp(sa, sb, sizeof sa) == 0
                          && memcmp(sat, sbt, sizeof sat) == 0, "isa %s threads %d rule %d", fp8mix_isa_name(was),
                      th, fl);
                fp8mix_set_max_isa((fp8mix_isa)isa);
                fp8mix_set_num_threads(th);
            }
        }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    fp8mix_set_num_threads(0);
    /* quantize_current(GRAN_MX) is rceil; cast with its scales and dequantize agree */
    static uint8_t qc[R * C], qx[R * C];
    static float sc[R * 5], sx[R * 5], am[R * 5], scale[R * 5], deq[R * C];
    fp8mix_quantize_current(x, FP8MIX_F32, R, C, C, FP8MIX_GRAN_MX, 0, 0, 0.0f, qc, C, NULL, 0, sc, am, &OPTS_E4);
    fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, FP8MIX_MX_RCEIL, 0, 0.0f, qx, C, sx, NULL, 0, NULL, NULL, &OPTS_E4);
    CHECK(memcmp(qc, qx, sizeof qc) == 0 && memcmp(sc, sx, sizeof sc) == 0, "quantize_current(MX) == rceil");
    float amr[R * 5];
    fp8mix_amax(x, FP8MIX_F32, R, C, C, FP8MIX_GRAN_MX, amr);
    CHECK(memcmp(am, amr, sizeof am) == 0, "block amax");
    for (int t = 0; t < R * 5; t++) scale[t] = 1.0f / sx[t];
    fp8mix_cast(x, FP8MIX_F32, R, C, C, FP8MIX_GRAN_MX, scale, q1, C, NULL, 0, NULL, &OPTS_E4);
    CHECK(memcmp(q1, qx, sizeof q1) == 0, "cast with the MX scales");
    fp8mix_dequantize(qx, FP8MIX_E4M3, R, C, C, FP8MIX_GRAN_MX, sx, deq, FP8MIX_F32, C);
    long bad = 0;
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) {
            double want = ref_decode(qx[i * C + j], 0) * (double)sx[i * 5 + j / 32];
            bad += !(deq[i * C + j] == (float)want || (isnan(want) && isnan(deq[i * C + j])));
        }
    CHECK(bad == 0, "dequantize: %ld differ", bad);
    double stats[FP8MIX_STATS_N];
    CHECK(fp8mix_quant_stats(x, FP8MIX_F32, R, C, C, qx, C, FP8MIX_E4M3, FP8MIX_GRAN_MX, sx, NULL, stats) == FP8MIX_OK
              && stats[FP8MIX_STATS_NUMEL] == R * C, "quant_stats accepts MX");
    /* bad arguments */
    CHECK(fp8mix_cast(x, FP8MIX_F32, R, C, C, FP8MIX_GRAN_MX, scale, q1, C, qt1, R, NULL, &OPTS_E4) ==
              FP8MIX_ERR_BAD_ARG, "cast+transpose refused for MX");
    CHECK(fp8mix_quantize_current(x, FP8MIX_F32, R, C, C, FP8MIX_GRAN_MX, 0, 0, 0.0f, qc, C, qt1, R, sc, NULL,
                                  &OPTS_E4) == FP8MIX_ERR_BAD_ARG, "quantize_current+transpose refused for MX");
    CHECK(fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, (fp8mix_mx_rule)2, 0, 0.0f, qc, C, sc, NULL, 0, NULL, NULL,
                             &OPTS_E4) == FP8MIX_ERR_BAD_ENUM, "rule");
    CHECK(fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, FP8MIX_MX_RCEIL, 127, 0.0f, qc, C, sc, NULL, 0, NULL, NULL,
                             &OPTS_E4) == FP8MIX_ERR_BAD_ARG, "margin");
    CHECK(fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C, FP8MIX_MX_RCEIL, 0, 0.0f, qc, C, NULL, NULL, 0, NULL, NULL,
                             &OPTS_E4) == FP8MIX_ERR_NULL_POINTER, "scale_inv NULL");
    CHECK(fp8mix_quantize_mx(x, FP8MIX_F32, R, C, C - 1, FP8MIX_MX_RCEIL, 0, 0.0f, qc, C, sc, NULL, 0, NULL, NULL,
                             &OPTS_E4) == FP8MIX_ERR_BAD_SHAPE, "ld");
    CHECK(fp8mix_scale_count(FP8MIX_GRAN_MX, 3, 65) == 9, "scale count");
}

/* ---- GEMM ------------------------------------------------------------------ */

static void test_gemm(void)
{
    enum { M = 9, N = 13, K = 75 };
    static float a[M * K], b[N * K];
    for (int t = 0; t < M * K; t++) /* blocks of unlike magnitude, products well inside float32 */
        a[t] = (float)((urand() * 2 - 1) * ldexp(1.0, ((t % K) / 32) * 9 - 12 + t / K));
    a[5] = 0.0f;
    for (int t = 0; t < N * K; t++) b[t] = (float)((urand() * 2 - 1) * ldexp(1.0, (int)(urand() * 8) - 4));
    static uint8_t qa[M * K], qb[N * K], qbkn[K * N], qakm[K * M];
    static float sa[M * 3], sb[N * 3], out[M * N], out2[M * N], bias[N];
    fp8mix_quantize_mx(a, FP8MIX_F32, M, K, K, FP8MIX_MX_RCEIL, 0, 0.0f, qa, K, sa, NULL, 0, NULL, NULL, &OPTS_E4);
    fp8mix_cast_opts o5 = opts_of(1);
    fp8mix_quantize_mx(b, FP8MIX_F32, N, K, K, FP8MIX_MX_RCEIL, 0, 0.0f, qb, K, sb, NULL, 0, NULL, NULL, &o5);
    for (int j = 0; j < N; j++) bias[j] = (float)j - 6.5f;
    for (int p = 0; p < K; p++) {
        for (int j = 0; j < N; j++) qbkn[p * N + j] = qb[j * K + p];
        for (int i = 0; i < M; i++) qakm[p * M + i] = qa[i * K + p];
    }
    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = qa; g.fmt_a = FP8MIX_E4M3; g.lda = K;
    g.b = qb; g.fmt_b = FP8MIX_E5M2; g.ldb = K; g.b_layout = FP8MIX_B_NK;
    g.scale_a = sa; g.scale_a_kind = FP8MIX_MM_SCALE_MX;
    g.scale_b = sb; g.scale_b_kind = FP8MIX_MM_SCALE_MX;
    g.bias = bias; g.bias_t = FP8MIX_F32;
    g.out = out; g.out_t = FP8MIX_F32; g.ldo = N;
    CHECK(fp8mix_gemm(&g) == FP8MIX_OK, "gemm");
    long bad_exact = 0, bad_bound = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f; /* the documented float32 order */
            double ref = 0.0, mag = 0.0;
            for (int kb = 0; kb < 3; kb++) {
                float part = 0.0f;
                int p1 = kb * 32 + 32 < K ? kb * 32 + 32 : K;
                for (int p = kb * 32; p < p1; p += 2) {
                    if (p + 1 < p1) part = part + (float)ref_decode(qa[i * K + p + 1], 0) *
                                                      (float)ref_decode(qb[j * K + p + 1], 1);
                    part = part + (float)ref_decode(qa[i * K + p], 0) * (float)ref_decode(qb[j * K + p], 1);
                }
                acc = acc + part * (sa[i * 3 + kb] * sb[j * 3 + kb]);
                for (int p = kb * 32; p < p1; p++) {
                    double t = ref_decode(qa[i * K + p], 0) * sa[i * 3 + kb] * ref_decode(qb[j * K + p], 1) *
                               sb[j * 3 + kb];
                    ref += t;
                    mag += fabs(t);
                }
            }
            acc = acc + bias[j];
            bad_exact += f32_bits(acc) != f32_bits(out[i * N + j]);
            bad_bound += fabs(out[i * N + j] - (ref + bias[j])) > (K + 2) * ldexp(mag + fabs(bias[j]), -24);
        }
    CHECK(bad_exact == 0, "MX GEMM vs the documented float32 order: %ld differ", bad_exact);
    CHECK(bad_bound == 0, "MX GEMM vs float64: %ld beyond K * 2^-24", bad_bound);
    /* other layouts and thread counts: the same bits */
    g.b = qbkn; g.ldb = N; g.b_layout = FP8MIX_B_KN;
    g.a = qakm; g.lda = M; g.a_layout = FP8MIX_A_KM;
    g.out = out2;
    fp8mix_set_num_threads(3);
    CHECK(fp8mix_gemm(&g) == FP8MIX_OK && memcmp(out, out2, sizeof out) == 0, "layouts / threads");
    CHECK(fp8mix_gemm_ref(&g) == FP8MIX_OK && memcmp(out, out2, sizeof out) == 0, "gemm_ref");
    fp8mix_set_num_threads(0);
    g.scale_b_kind = FP8MIX_MM_SCALE_TENSOR;
    CHECK(fp8mix_gemm(&g) == FP8MIX_ERR_BAD_ARG, "MX mixed with TENSOR");
    g.scale_b_kind = FP8MIX_MM_SCALE_MX;
    g.accum = FP8MIX_ACCUM_FP22;
    CHECK(fp8mix_gemm(&g) == FP8MIX_ERR_UNSUPPORTED, "MX with FP22");
    g.accum = FP8MIX_ACCUM_FP32;
    sb[4] = 0.0f;
    CHECK(fp8mix_gemm(&g) == FP8MIX_ERR_BAD_SCALE, "bad scale");
}

int main(void)
{
    test_exponent_rule();
    test_quantize_vs_spec();
    test_nonfinite();
    test_half_inputs();
    test_transpose_isa_threads_entry_points();
    test_gemm();
    return check_report("test_mx");
}
