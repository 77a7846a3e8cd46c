/*
 * fused_ref.c — the portable producer kernels of the fused casts (fused.h's
 * fp8mix_fused_kernels): widening to float32, a norm's lane sums and its
 * apply step, the activations; and the scalar definitions of one activation
 * (fp8mix_act_ref, fp8mix_act_gated).  They are the scalar ISA's kernels
 * (dispatch.c's table) and the oracle the SIMD variants (x86/fused_*.c) are
 * tested against bit for bit (tests/c/test_norm.c); those hand their tails
 * here.  Not here: the sources that use them (norm.c, act.c), the engine
 * (fused_cast.c), the choice of ISA (dispatch.c).
 *
 * The exponential is fp8mix's own (act_exp: Cody-Waite reduction and a fixed
 * degree-6 polynomial, float32 operations only), not the C library's, so the
 * bits are the same for every libm, compiler and ISA.  The sigmoid forms:
 *   gelu(a)  = a / (1 + exp(-2u)), u = sqrt(2/pi) (a + 0.044715 a^3)
 *              (= 0.5 a (1 + tanh u), Transformer Engine's / torch's "tanh" gelu)
 *   silu(a)  = a / (1 + exp(-a)),  qgelu(a) = a / (1 + exp(-1.702 a)).
 */
#include <math.h>

#include "fused.h"

/* ---- widening and the norm's arithmetic ------------------------------------ */

void fp8mix_fused_widen_ref(const void *src, fp8mix_dtype t, int64_t n, float *dst)
{
    for (int64_t k = 0; k < n; k++) dst[k] = load_f32(src, t, k);
}

void fp8mix_fused_lane_sums_ref(const float *v, int64_t n, int squares, double c, double lanes[8])
{
    if (squares)
        for (int64_t t = 0; t < n; t++) {
            double d = (double)v[t] - c;
            lanes[t & 7] += d * d;
        }
    else
        for (int64_t t = 0; t < n; t++) lanes[t & 7] += (double)v[t];
}

void fp8mix_fused_norm_apply_ref(const float *v, int64_t n, float m, float r, const float *g, const float *b,
                                 float *out)
{
    for (int64_t t = 0; t < n; t++) out[t] = (v[t] - m) * r;
    if (g)
        for (int64_t t = 0; t < n; t++) out[t] = out[t] * g[t];
    if (b)
        for (int64_t t = 0; t < n; t++) out[t] = out[t] + b[t];
}

/* ---- activations -------------------------------------------------------------- */

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
