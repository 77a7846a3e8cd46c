/*
 * fused_avx2.c — AVX2 (+F16C) kernels of the fused producer casts (fused.h):
 * widening to float32, the norm's float64 lane sums and affine step, and the
 * activations with fused_ref.c's exponential, 8 floats per step.  Every lane
 * runs the scalar kernel's IEEE operations in the same order (plain mul / add
 * / div, no FMA; the 8 float64 lanes of a sum are two registers of 4), so the
 * bits are the scalar ones (fused_ref.c); tails go to the scalar kernels.
 */
#include <immintrin.h>
#include <math.h>

#include "fused.h"

void fp8mix_fused_widen__avx2(const void *src, fp8mix_dtype t, int64_t n, float *dst)
{
    const uint16_t *s = (const uint16_t *)src;
    int64_t k = 0;
    if (t == FP8MIX_BF16) {
        for (; k + 8 <= n; k += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + k)));
            _mm256_storeu_ps(dst + k, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
    } else if (t == FP8MIX_F16) {
        for (; k + 8 <= n; k += 8) _mm256_storeu_ps(dst + k, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + k))));
    }
    fp8mix_fused_widen_ref((const uint8_t *)src + (size_t)k * dtype_size(t), t, n - k, dst + k);
}

void fp8mix_fused_lane_sums__avx2(const float *v, int64_t n, int squares, double c, double lanes[8])
{
    __m256d lo = _mm256_loadu_pd(lanes), hi = _mm256_loadu_pd(lanes + 4);
    const __m256d vc = _mm256_set1_pd(c);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(v + t)), b = _mm256_cvtps_pd(_mm_loadu_ps(v + t + 4));
        if (squares) {
            a = _mm256_sub_pd(a, vc);
            b = _mm256_sub_pd(b, vc);
            a = _mm256_mul_pd(a, a);
            b = _mm256_mul_pd(b, b);
        }
        lo = _mm256_add_pd(lo, a);
        hi = _mm256_add_pd(hi, b);
    }
    _mm256_storeu_pd(lanes, lo);
    _mm256_storeu_pd(lanes + 4, hi);
    fp8mix_fused_lane_sums_ref(v + t, n - t, squares, c, lanes); /* t is a multiple of 8: lanes line up */
}

void fp8mix_fused_norm_apply__avx2(const float *v, int64_t n, float m, float r, const float *g, const float *b,
                                   float *out)
{
    const __m256 vm = _mm256_set1_ps(m), vr = _mm256_set1_ps(r);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(v + t), vm), vr);
        if (g) y = _mm256_mul_ps(y, _mm256_loadu_ps(g + t));
        if (b) y = _mm256_add_ps(y, _mm256_loadu_ps(b + t));
        _mm256_storeu_ps(out + t, y);
    }
    fp8mix_fused_norm_apply_ref(v + t, n - t, m, r, g ? g + t : NULL, b ? b + t : NULL, out + t);
}

/* fused_ref.c's act_exp, 8 lanes: the same reduction, polynomial and 2^n factors;
 * NaN, overflow and underflow lanes selected at the end. */
static inline __m256 exp8(__m256 x)
{
    const __m256 rnd = _mm256_set1_ps(ACT_ROUND);
    __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(ACT_LOG2E)), rnd), rnd);
    __m256 r = _mm256_sub_ps(_mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(ACT_LN2_HI))),
                             _mm256_mul_ps(n, _mm256_set1_ps(ACT_LN2_LO)));
    __m256 p = _mm256_set1_ps(ACT_P6);
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ACT_P5));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ACT_P4));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ACT_P3));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(ACT_P2));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.0f));
    __m256i k = _mm256_cvttps_epi32(n);
    __m256i k1 = _mm256_srai_epi32(_mm256_add_epi32(k, _mm256_srli_epi32(k, 31)), 1); /* k / 2, toward 0 */
    __m256i k2 = _mm256_sub_epi32(k, k1);
    const __m256i bias = _mm256_set1_epi32(127);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k1, bias), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k2, bias), 23));
    __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
    y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(ACT_EXP_MIN), _CMP_LT_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(ACT_EXP_MAX), _CMP_GT_OQ));
    return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

static inline __m256 relu8(__m256 a)
{
    __m256 keep = _mm256_or_ps(_mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_GT_OQ), _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    return _mm256_and_ps(a, keep);
}

static inline __m256 act8(fp8mix_act_kind k, __m256 a)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    switch (k) {
    case FP8MIX_ACT_GELU: case FP8MIX_ACT_GEGLU: {
        __m256 a3 = _mm256_mul_ps(_mm256_mul_ps(a, a), a);
        __m256 u = _mm256_mul_ps(_mm256_set1_ps(ACT_GELU_K),
                                 _mm256_add_ps(a, _mm256_mul_ps(_mm256_set1_ps(ACT_GELU_C), a3)));
        return _mm256_div_ps(a, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u))));
    }
    case FP8MIX_ACT_RELU: case FP8MIX_ACT_REGLU: return relu8(a);
    case FP8MIX_ACT_SILU: case FP8MIX_ACT_SWIGLU:
        return _mm256_div_ps(a, _mm256_add_ps(one, exp8(_mm256_xor_ps(a, _mm256_set1_ps(-0.0f)))));
    case FP8MIX_ACT_QGELU: case FP8MIX_ACT_QGEGLU:
        return _mm256_div_ps(a, _mm256_add_ps(one, exp8(_mm256_mul_ps(_mm256_set1_ps(-ACT_QGELU_K), a))));
    default: {
        __m256 r = relu8(a);
        return _mm256_mul_ps(r, r);
    }
    }
}

void fp8mix_fused_act__avx2(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out)
{
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m256 y = act8(k, _mm256_loadu_ps(a + t));
        if (b) y = _mm256_mul_ps(y, _mm256_loadu_ps(b + t));
        _mm256_storeu_ps(out + t, y);
    }
    fp8mix_fused_act_ref(k, a + t, b ? b + t : NULL, n - t, out + t);
}
