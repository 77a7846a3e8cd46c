/*
 * test_grouped_cast.c — the grouped per-tensor casts and the grouped-K GEMM of
 * grouped linear layers (mixture-of-experts experts):
 *   fp8mix_quantize_current_grouped / fp8mix_cast_grad_grouped: each group's
 *     bytes (q rows and qt columns), scale and amax against the scalar encoder
 *     applied here with the scale the header's rule gives that group alone;
 *     column sums added in row order in float32 here; pending slots;
 *   fp8mix_cast_delayed_grouped / fp8mix_delayed_flush_grouped: the roles
 *     role0 + g * role_step, first use from the group's amax, the record,
 *     empty groups recording nothing;
 *   fp8mix_gemm_grouped_k: each output bit for bit fp8mix_gemm of its K range
 *     and within the float64 bound, both A layouts, TENSOR / OUTER scales,
 *     bias, empty ranges;
 *   errors (bad offs, BLOCK in grouped-K): nothing written.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

static uint64_t st = 0x13198A2E03707344ull;
static uint32_t rnd(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (uint32_t)(st >> 32);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) / 16777216.0f; }

enum { ROWS = 70, COLS = 24, G = 5 };
static const int64_t sizes[G] = {9, 0, 31, 1, 29};

static void offsets(int64_t *offs)
{
    int64_t m = 0;
    for (int g = 0; g < G; g++) offs[g] = (m += sizes[g]);
}

static float scale_for(float amax, fp8mix_format fmt) /* the header's rule, margin 0, no pow2 */
{
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    return fp8mix_format_max(fmt) / amax;
}

/* each group's q rows and qt columns equal the scalar encoder at scale sc[g] */
static int bytes_match(const float *x, const uint8_t *q, const uint8_t *qt, const int64_t *offs, const float *sc,
                       fp8mix_format fmt)
{
    int ok = 1;
    int64_t r0 = 0;
    for (int g = 0; g < G; g++) {
        for (int64_t i = r0; i < offs[g]; i++)
            for (int64_t j = 0; j < COLS; j++) {
                uint8_t want = fp8mix_encode_ref(x[i * COLS + j] * sc[g], fmt, 1, FP8MIX_ROUND_NEAREST, 0);
                ok &= q[i * COLS + j] == want && qt[j * ROWS + i] == want;
            }
        r0 = offs[g];
    }
    return ok;
}

static void test_current_and_grad(void)
{
    int64_t offs[G];
    offsets(offs);
    float *x = malloc(sizeof(float) * ROWS * COLS);
    for (int64_t i = 0; i < ROWS; i++) { /* a different magnitude per row: groups get different scales */
        float mag = ldexpf(1.0f, (int)(i % 11) - 5);
        for (int64_t j = 0; j < COLS; j++) x[i * COLS + j] = frand(-mag, mag);
    }
    uint8_t q[ROWS * COLS], qt[ROWS * COLS];
    float sinv[G], amax[G], sc[G];
    fp8mix_cast_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = FP8MIX_E4M3;
    o.saturate = 1;
    fp8mix_status s = fp8mix_quantize_current_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, offs, 0, 0, 0.0f, q, COLS,
                                                      qt, ROWS, sinv, amax, &o);
    CHECK(s == FP8MIX_OK, "quantize_current_grouped status %d", s);
    int64_t r0 = 0;
    int amax_ok = 1, sinv_ok = 1;
    for (int g = 0; g < G; g++) {
        float a = 0.0f;
        for (int64_t i = r0 * COLS; i < offs[g] * COLS; i++) a = fmaxf(a, fabsf(x[i]));
        sc[g] = scale_for(a, FP8MIX_E4M3);
        amax_ok &= amax[g] == a;
        sinv_ok &= sinv[g] == 1.0f / sc[g];
        r0 = offs[g];
    }
    CHECK(amax_ok, "per-group amax");
    CHECK(sinv_ok, "per-group scale_inv = 1 / (448 / amax_g); an empty group 1");
    CHECK(bytes_match(x, q, qt, offs, sc, FP8MIX_E4M3), "current: each group's bytes are the encoder's at its scale");
    CHECK(sc[0] != sc[2], "(the groups really have different scales)");

    /* gradient: current scaling for group 0, delayed plans for the rest; pending slots and column sums */
    o.fmt = FP8MIX_E5M2;
    float plans[2 * G], pending[G * 8], colsum[G * COLS], gsinv[G], gamax[G];
    int64_t slots[G];
    for (int g = 0; g < G; g++) {
        plans[2 * g] = g == 0 ? 7.0f : ldexpf(1.0f, g + 3);
        plans[2 * g + 1] = g == 0 ? 1.0f : 0.0f;
        slots[g] = (g * 3) % 8;
    }
    for (int i = 0; i < G * 8; i++) pending[i] = -1.0f;
    pending[2 * 8 + slots[2]] = 1e30f; /* a larger amax already there is kept (max) */
    for (int i = 0; i < G * COLS; i++) colsum[i] = 99.0f;
    s = fp8mix_cast_grad_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, offs, q, COLS, qt, ROWS, plans, 0, 0, 0.0f,
                                 pending, 8, slots, &o, gsinv, gamax, colsum);
    CHECK(s == FP8MIX_OK, "cast_grad_grouped status %d", s);
    r0 = 0;
    int cs_ok = 1, pend_ok = 1, gs_ok = 1;
    for (int g = 0; g < G; g++) {
        float a = 0.0f;
        for (int64_t i = r0 * COLS; i < offs[g] * COLS; i++) a = fmaxf(a, fabsf(x[i]));
        sc[g] = g == 0 ? scale_for(a, FP8MIX_E5M2) : plans[2 * g];
        if (sizes[g]) gs_ok &= gsinv[g] == 1.0f / sc[g] && gamax[g] == a;
        for (int64_t j = 0; j < COLS; j++) {
            float sum = 0.0f;
            for (int64_t i = r0; i < offs[g]; i++) sum += x[i * COLS + j];
            cs_ok &= colsum[g * COLS + j] == sum;
        }
        for (int k = 0; k < 8; k++) {
            float want = k != slots[g] ? -1.0f : g == 2 ? 1e30f : sizes[g] ? a : -1.0f;
            pend_ok &= pending[g * 8 + k] == want;
        }
        r0 = offs[g];
    }
    CHECK(gs_ok, "grad: group 0 current scaling, the others their plan's scale");
    CHECK(cs_ok, "grad: column sums per group, rows in order (an empty group +0)");
    CHECK(pend_ok, "grad: each group's amax in its own slot (max with what is there; an empty group leaves it)");
    CHECK(bytes_match(x, q, qt, offs, sc, FP8MIX_E5M2), "grad: bytes at each group's scale");

    /* errors: bad plan in a late group, bad offs: nothing written */
    memset(q, 0xAB, sizeof q);
    plans[2 * 4] = -1.0f;
    CHECK(fp8mix_cast_grad_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, offs, q, COLS, NULL, ROWS, plans, 0, 0, 0.0f,
                                   NULL, 8, NULL, &o, gsinv, NULL, NULL) == FP8MIX_ERR_BAD_SCALE,
          "a bad plan scale in the last group");
    int64_t bad[G] = {9, 9, 8, 41, 70}, short_[G] = {9, 9, 40, 41, 69};
    o.fmt = FP8MIX_E4M3;
    CHECK(fp8mix_quantize_current_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, bad, 0, 0, 0.0f, q, COLS, NULL, ROWS,
                                          sinv, NULL, &o) == FP8MIX_ERR_BAD_ARG, "decreasing offs");
    CHECK(fp8mix_quantize_current_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, short_, 0, 0, 0.0f, q, COLS, NULL,
                                          ROWS, sinv, NULL, &o) == FP8MIX_ERR_BAD_ARG, "offs not ending at rows");
    int untouched = 1;
    for (int i = 0; i < ROWS * COLS; i++) untouched &= q[i] == 0xAB;
    CHECK(untouched, "an error writes no byte");
    free(x);
}

static void test_delayed(void)
{
    int64_t offs[G];
    offsets(offs);
    enum { R = 3 * G, CAP = 4 };
    float hist[CAP * R], scale[R];
    int64_t steps[R];
    memset(hist, 0, sizeof hist);
    for (int r = 0; r < R; r++) { scale[r] = 1.0f; steps[r] = 0; }
    fp8mix_delayed_state S = {hist, CAP, R, scale, steps};
    fp8mix_delayed_recipe rec = {2, FP8MIX_AMAX_MAX, 0, 0, 1};
    float *x = malloc(sizeof(float) * ROWS * COLS);
    for (int64_t i = 0; i < ROWS * COLS; i++) x[i] = frand(-1.0f, 1.0f) * (float)(1 + (i / COLS) % 7);
    uint8_t q[ROWS * COLS], qt[ROWS * COLS];
    float scales[2 * G], amax[G], sc[G];
    fp8mix_cast_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = FP8MIX_E4M3;
    o.saturate = 1;
    fp8mix_status s = fp8mix_cast_delayed_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, offs, q, COLS, qt, ROWS, &S, 0,
                                                  3, &rec, 1, &o, scales, amax);
    CHECK(s == FP8MIX_OK, "cast_delayed_grouped status %d", s);
    int64_t r0 = 0;
    int first_ok = 1, state_ok = 1;
    for (int g = 0; g < G; g++) {
        float a = 0.0f;
        for (int64_t i = r0 * COLS; i < offs[g] * COLS; i++) a = fmaxf(a, fabsf(x[i]));
        sc[g] = sizes[g] ? scale_for(a, FP8MIX_E4M3) : 1.0f;
        first_ok &= scales[2 * g] == sc[g] && scales[2 * g + 1] == 1.0f / sc[g];
        state_ok &= steps[3 * g] == (sizes[g] ? 1 : 0) && hist[3 * g] == (sizes[g] ? a : 0.0f);
        state_ok &= steps[3 * g + 1] == 0 && steps[3 * g + 2] == 0; /* the other roles untouched */
        r0 = offs[g];
    }
    CHECK(first_ok, "first use: each group scaled from its own amax");
    CHECK(state_ok, "recorded into roles 0, 3, 6, ... (an empty group: nothing)");
    CHECK(bytes_match(x, q, qt, offs, sc, FP8MIX_E4M3), "delayed: bytes at each group's scale");
    /* a second call casts with the state's scales */
    for (int64_t i = 0; i < ROWS * COLS; i++) x[i] *= 0.5f;
    s = fp8mix_cast_delayed_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, offs, q, COLS, qt, ROWS, &S, 0, 3, &rec, 0,
                                    &o, scales, amax);
    CHECK(s == FP8MIX_OK && bytes_match(x, q, qt, offs, sc, FP8MIX_E4M3), "second use: the recorded scales");
    CHECK(steps[0] == 1, "record=0 records nothing");
    CHECK(fp8mix_cast_delayed_grouped(x, FP8MIX_F32, ROWS, COLS, COLS, G, offs, q, COLS, NULL, ROWS, &S, 3, 3, &rec,
                                      0, &o, scales, amax) == FP8MIX_ERR_BAD_SHAPE, "a role past the state");

    /* flush: pending rings per group recorded into roles 2, 5, 8, ... */
    float pending[G * 8], plans[2 * G];
    int64_t next[G], reserved[G];
    for (int i = 0; i < G * 8; i++) pending[i] = -1.0f;
    for (int g = 0; g < G; g++) { next[g] = g % 8; pending[g * 8 + (g + 3) % 8] = (float)(g + 1); }
    s = fp8mix_delayed_flush_grouped(&S, 2, 3, G, FP8MIX_E5M2, &rec, pending, 8, next, 1, 1, plans, reserved);
    CHECK(s == FP8MIX_OK, "flush_grouped status %d", s);
    int fl_ok = 1;
    for (int g = 0; g < G; g++) {
        fl_ok &= steps[3 * g + 2] == 1 && hist[3 * g + 2] == (float)(g + 1);
        fl_ok &= plans[2 * g] == scale[3 * g + 2] && plans[2 * g + 1] == 0.0f;
        fl_ok &= reserved[g] == g % 8 && next[g] == (g + 1) % 8 && pending[g * 8 + (g + 3) % 8] == -1.0f;
        fl_ok &= scale[3 * g + 2] == 57344.0f / (float)(g + 1);
    }
    CHECK(fl_ok, "flush: each group's ring recorded into its own role, its slot reserved");
    free(x);
}

static void test_gemm_k(fp8mix_a_layout al, fp8mix_mm_scale kind, int with_bias, int threads)
{
    enum { M = 20, N = 33, K = 70 };
    int64_t offs[G];
    offsets(offs);
    const float *tab = fp8mix_decode_table(FP8MIX_E4M3);
    uint8_t a[M * K], b[K * N];
    for (int i = 0; i < M * K; i++) do a[i] = (uint8_t)rnd(); while ((a[i] & 0x7F) == 0x7F);
    for (int i = 0; i < K * N; i++) do b[i] = (uint8_t)rnd(); while ((b[i] & 0x7F) == 0x7F);
    float sa[G * M], sb[G * N], bias[G * N], out[G * M * N], one[M * N];
    for (int i = 0; i < G * M; i++) sa[i] = frand(0.01f, 2.0f);
    for (int i = 0; i < G * N; i++) { sb[i] = frand(0.01f, 2.0f); bias[i] = frand(-1.0f, 1.0f); }
    fp8mix_gemm_args A;
    memset(&A, 0, sizeof A);
    A.m = M; A.n = N; A.k = K; A.a = a; A.fmt_a = FP8MIX_E4M3; A.a_layout = al; A.lda = al == FP8MIX_A_MK ? K : M;
    A.b = b; A.fmt_b = FP8MIX_E4M3; A.ldb = N; A.b_layout = FP8MIX_B_KN;
    A.scale_a = sa; A.scale_a_kind = kind; A.scale_b = sb; A.scale_b_kind = kind;
    A.bias = with_bias ? bias : NULL; A.bias_t = FP8MIX_F32; A.out = out; A.out_t = FP8MIX_F32; A.ldo = N;
    fp8mix_set_num_threads(threads);
    fp8mix_status s = fp8mix_gemm_grouped_k(&A, G, offs, M * N);
    CHECK(s == FP8MIX_OK, "gemm_grouped_k status %d", s);
    int exact = 1, bound = 1;
    int64_t k0 = 0;
    for (int g = 0; g < G; g++) {
        fp8mix_gemm_args S1 = A;
        S1.k = offs[g] - k0;
        S1.a = al == FP8MIX_A_MK ? a + k0 : a + k0 * M;
        S1.b = b + k0 * N;
        S1.scale_a = kind == FP8MIX_MM_SCALE_OUTER ? sa + g * M : sa + g;
        S1.scale_b = kind == FP8MIX_MM_SCALE_OUTER ? sb + g * N : sb + g;
        S1.bias = with_bias ? bias + g * N : NULL;
        S1.out = one;
        CHECK(fp8mix_gemm(&S1) == FP8MIX_OK, "single gemm");
        exact &= !memcmp(one, out + g * M * N, sizeof one);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                double ref = with_bias ? bias[g * N + j] : 0.0, mag = fabs(ref);
                double s_a = kind == FP8MIX_MM_SCALE_OUTER ? sa[g * M + i] : sa[g];
                double s_b = kind == FP8MIX_MM_SCALE_OUTER ? sb[g * N + j] : sb[g];
                for (int64_t p = k0; p < offs[g]; p++) {
                    double av = tab[al == FP8MIX_A_MK ? a[i * K + p] : a[p * M + i]], bv = tab[b[p * N + j]];
                    ref += av * bv * s_a * s_b;
                    mag += fabs(av * bv * s_a * s_b);
                }
                bound &= fabs(out[g * M * N + i * N + j] - ref) <= (K + 8) * FLT_EPSILON * mag + 1e-30;
            }
        k0 = offs[g];
    }
    CHECK(exact, "grouped-K: each output is fp8mix_gemm of its K range (layout %d, kind %d, bias %d, %d threads)", al,
          kind, with_bias, threads);
    CHECK(bound, "grouped-K: float64 bound (layout %d, kind %d)", al, kind);
    fp8mix_set_num_threads(1);
    for (int i = 0; i < G * M * N; i++) out[i] = -7.0f;
    A.scale_a_kind = A.scale_b_kind = FP8MIX_MM_SCALE_BLOCK;
    CHECK(fp8mix_gemm_grouped_k(&A, G, offs, M * N) == FP8MIX_ERR_UNSUPPORTED, "BLOCK scales refused");
    A.scale_a_kind = A.scale_b_kind = kind;
    CHECK(fp8mix_gemm_grouped_k(&A, G, offs, M * N - 1) == FP8MIX_ERR_BAD_SHAPE, "overlapping outputs");
    sb[kind == FP8MIX_MM_SCALE_OUTER ? 4 * N : 4] = INFINITY;
    CHECK(fp8mix_gemm_grouped_k(&A, G, offs, M * N) == FP8MIX_ERR_BAD_SCALE, "a bad scale in the last group");
    int untouched = 1;
    for (int i = 0; i < G * M * N; i++) untouched &= out[i] == -7.0f;
    CHECK(untouched, "grouped-K: an error writes nothing");
}

int main(void)
{
    test_current_and_grad();
    test_delayed();
    for (int al = 0; al < 2; al++)
        for (int kind = 0; kind < 2; kind++) {
            test_gemm_k((fp8mix_a_layout)al, (fp8mix_mm_scale)kind, kind, 1);
            test_gemm_k((fp8mix_a_layout)al, (fp8mix_mm_scale)kind, 1 - kind, 2);
        }
    return check_report("test_grouped_cast");
}
