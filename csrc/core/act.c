/*
 * act.c — an MLP's activation written directly as FP8 (fp8mix_act_cast and
 * its delayed-scaling variant): gelu (tanh form), relu, silu, quick gelu,
 * squared relu and their gated forms, computed in float32 segments that the
 * fused engine (fused_cast.c) casts while they are in cache.  A gated row
 * reads its two halves in place (no copy of either).
 *
 * The exponential is fp8mix's own (act_exp: Cody-Waite reduction and a fixed
 * degree-6 polynomial, float32 operations only), not the C library's, so the
 * bits are the same for every libm, compiler and ISA.  The sigmoid forms:
 *   gelu(a)  = a / (1 + exp(-2u)), u = sqrt(2/pi) (a + 0.044715 a^3)
 *              (= 0.5 a (1 + tanh u), Transformer Engine's / torch's "tanh" gelu)
 *   silu(a)  = a / (1 + exp(-a)),  qgelu(a) = a / (1 + exp(-1.702 a)).
 * Not here: the activation's backward (torch, from the saved input).
 */
#include <math.h>
#include <string.h>

#include "fused.h"

/* exp(x) in float32: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its Taylor
 * polynomial of degree 6 (Horner), times 2^n from the exponent bits.
 * Relative error below 2^-22 over the range; +inf above ACT_EXP_MAX, 0 below
 * ACT_EXP_MIN, NaN for NaN. */
static float act_exp(float x)
{
    if (x != x) return x;
    if (x > ACT_EXP_MAX) return INFINITY;
    if (x < ACT_EXP_MIN) return 0.0f;
    float n = (x * ACT_LOG2E + ACT_ROUND) - ACT_ROUND;
    float r = (x - n * ACT_LN2_HI) - n * ACT_LN2_LO;
    float p = ACT_P6;
    p = p * r + ACT_P5;
    p = p * r + ACT_P4;
    p = p * r + ACT_P3;
    p = p * r + ACT_P2;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    /* n is in [-126, 128]; 2^n as two factors so that n = 128 stays finite on the way */
    int32_t k = (int32_t)n;
    int32_t k1 = k / 2, k2 = k - k1;
    return (p * bits_f32((uint32_t)(k1 + 127) << 23)) * bits_f32((uint32_t)(k2 + 127) << 23);
}

static float act_relu(float a) { return a > 0.0f ? a : (a != a ? a : 0.0f); }
static float act_gelu(float a)
{
    float u = ACT_GELU_K * (a + ACT_GELU_C * ((a * a) * a));
    return a / (1.0f + act_exp(-2.0f * u));
}
static float act_silu(float a) { return a / (1.0f + act_exp(-a)); }
static float act_qgelu(float a) { return a / (1.0f + act_exp(-ACT_QGELU_K * a)); }
static float act_srelu(float a)
{
    float r = act_relu(a);
    return r * r;
}

static float act_base(fp8mix_act_kind act, float a)
{
    switch (act) {
    case FP8MIX_ACT_GELU: case FP8MIX_ACT_GEGLU: return act_gelu(a);
    case FP8MIX_ACT_RELU: case FP8MIX_ACT_REGLU: return act_relu(a);
    case FP8MIX_ACT_SILU: case FP8MIX_ACT_SWIGLU: return act_silu(a);
    case FP8MIX_ACT_QGELU: case FP8MIX_ACT_QGEGLU: return act_qgelu(a);
    default: return act_srelu(a);
    }
}

/* The scalar kernel: one loop per kind (no switch per element). */
void fp8mix_fused_act_ref(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out)
{
    float (*f)(float);
    switch (k) {
    case FP8MIX_ACT_GELU: case FP8MIX_ACT_GEGLU: f = act_gelu; break;
    case FP8MIX_ACT_RELU: case FP8MIX_ACT_REGLU: f = act_relu; break;
    case FP8MIX_ACT_SILU: case FP8MIX_ACT_SWIGLU: f = act_silu; break;
    case FP8MIX_ACT_QGELU: case FP8MIX_ACT_QGEGLU: f = act_qgelu; break;
    default: f = act_srelu; break;
    }
    for (int64_t t = 0; t < n; t++) out[t] = f(a[t]);
    if (b)
        for (int64_t t = 0; t < n; t++) out[t] = out[t] * b[t];
}

int fp8mix_act_gated(fp8mix_act_kind act)
{
    if (act < FP8MIX_ACT_GELU || act > FP8MIX_ACT_SREGLU) return -1;
    return act >= FP8MIX_ACT_GEGLU;
}

float fp8mix_act_ref(fp8mix_act_kind act, float a, float b)
{
    int gated = fp8mix_act_gated(act);
    if (gated < 0) return 0.0f;
    float v = act_base(act, a);
    return gated ? v * b : v;
}

typedef struct act_src {
    const uint8_t *h;
    fp8mix_dtype ht;
    int64_t ld_h, cols; /* cols: produced values per row (F) */
    fp8mix_act_kind act;
    int gated;
    const fp8mix_fused_kernels *K;
} act_src;

/* h[i][j0 .. j0 + n) as float32: a pointer into h for float32 rows, else widened into dst. */
static const float *load_seg(const act_src *A, const fp8mix_fused_kernels *K, int64_t i, int64_t j0, int64_t n,
                             float *dst)
{
    const uint8_t *row = A->h + (size_t)(i * A->ld_h) * dtype_size(A->ht);
    if (A->ht == FP8MIX_F32) return (const float *)row + j0;
    K->widen(row + (size_t)j0 * dtype_size(A->ht), A->ht, n, dst);
    return dst;
}

static void act_produce(const void *ctx, int64_t i, int64_t j0, int64_t n, float *buf)
{
    const act_src *A = (const act_src *)ctx;
    const fp8mix_fused_kernels *K = A->K;
    float bb[FUSED_SEG];
    const float *a = load_seg(A, K, i, j0, n, buf);
    const float *b = A->gated ? load_seg(A, K, i, A->cols + j0, n, bb) : NULL;
    K->act(A->act, a, b, n, buf);
}

static fp8mix_status act_setup(act_src *A, const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in,
                               int64_t ld_h, fp8mix_act_kind act)
{
    int gated = fp8mix_act_gated(act);
    if (gated < 0 || (ht != FP8MIX_F32 && ht != FP8MIX_BF16 && ht != FP8MIX_F16)) return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols_in, ld_h) || (gated && cols_in % 2)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows > 0 && cols_in > 0 && !h) return FP8MIX_ERR_NULL_POINTER;
    A->h = (const uint8_t *)h;
    A->ht = ht;
    A->ld_h = ld_h;
    A->cols = gated ? cols_in / 2 : cols_in;
    A->act = act;
    A->gated = gated;
    A->K = fp8mix_fused_kernels_active();
    return FP8MIX_OK;
}

fp8mix_status fp8mix_act_cast(const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in, int64_t ld_h,
                              fp8mix_act_kind act, const fp8mix_fused_out *out, const fp8mix_cast_opts *opts)
{
    act_src A;
    fp8mix_status st = act_setup(&A, h, ht, rows, cols_in, ld_h, act);
    if (st) return st;
    fp8mix_fused_source src = {rows, A.cols, &A, NULL, act_produce};
    return fp8mix_fused_cast_run(&src, out, opts);
}

fp8mix_status fp8mix_act_cast_delayed(const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in,
                                      int64_t ld_h, fp8mix_act_kind act, const fp8mix_fused_out *out,
                                      const fp8mix_delayed_state *st, int64_t role,
                                      const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                      const fp8mix_cast_opts *opts, float scales[2])
{
    act_src A;
    fp8mix_status s = act_setup(&A, h, ht, rows, cols_in, ld_h, act);
    if (s) return s;
    fp8mix_fused_source src = {rows, A.cols, &A, NULL, act_produce};
    return fp8mix_fused_cast_delayed_run(&src, out, st, role, r, fresh_amax, record, opts, scales);
}
