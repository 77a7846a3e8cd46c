/*
 * fused_avx512.c — AVX-512 (F/BW/VL/DQ) kernels of the fused producer casts
 * (fused.h), 16 floats per step: widening, the norm's float64 lane sums (the
 * 8 lanes are one register, fed twice per 16 floats in element order) and
 * affine step, and the activations with fused_ref.c's exponential.  Every lane
 * runs the scalar kernel's IEEE operations in the same order (no FMA), so
 * the bits are the scalar ones; tails go to the scalar kernels.
 */
#include <immintrin.h>
#include <math.h>

#include "fused.h"

void fp8mix_fused_widen__avx512(const void *src, fp8mix_dtype t, int64_t n, float *dst)
{
    const uint16_t *s = (const uint16_t *)src;
    int64_t k = 0;
    if (t == FP8MIX_BF16) {
        for (; k + 16 <= n; k += 16) {
            __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + k)));
            _mm512_storeu_ps(dst + k, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
        }
    } else if (t == FP8MIX_F16) {
        for (; k + 16 <= n; k += 16)
            _mm512_storeu_ps(dst + k, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + k))));
    }
    fp8mix_fused_widen_ref((const uint8_t *)src + (size_t)k * dtype_size(t), t, n - k, dst + k);
}

void fp8mix_fused_lane_sums__avx512(const float *v, int64_t n, int squares, double c, double lanes[8])
{
    __m512d acc = _mm512_loadu_pd(lanes);
    const __m512d vc = _mm512_set1_pd(c);
    int64_t t = 0;
    for (; t + 8 <= n; t += 8) {
        __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(v + t));
        if (squares) {
            a = _mm512_sub_pd(a, vc);
            a = _mm512_mul_pd(a, a);
        }
        acc = _mm512_add_pd(acc, a);
    }
    _mm512_storeu_pd(lanes, acc);
    fp8mix_fused_lane_sums_ref(v + t, n - t, squares, c, lanes); /* t is a multiple of 8: lanes line up */
}

void fp8mix_fused_norm_apply__avx512(const float *v, int64_t n, float m, float r, const float *g, const float *b,
                                     float *out)
{
    const __m512 vm = _mm512_set1_ps(m), vr = _mm512_set1_ps(r);
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        __m512 y = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(v + t), vm), vr);
        if (g) y = _mm512_mul_ps(y, _mm512_loadu_ps(g + t));
        if (b) y = _mm512_add_ps(y, _mm512_loadu_ps(b + t));
        _mm512_storeu_ps(out + t, y);
    }
    fp8mix_fused_norm_apply_ref(v + t, n - t, m, r, g ? g + t : NULL, b ? b + t : NULL, out + t);
}

/* fused_ref.c's act_exp, 16 lanes (see fused_avx2.c's exp8). */
static inline __m512 exp16(__m512 x)
{
    const __m512 rnd = _mm512_set1_ps(ACT_ROUND);
    __m512 n = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(ACT_LOG2E)), rnd), rnd);
    __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(ACT_LN2_HI))),
                             _mm512_mul_ps(n, _mm512_set1_ps(ACT_LN2_LO)));
    __m512 p = _mm512_set1_ps(ACT_P6);
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(ACT_P5));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(ACT_P4));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(ACT_P3));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(ACT_P2));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(1.0f));
    __m512i k = _mm512_cvttps_epi32(n);
    __m512i k1 = _mm512_srai_epi32(_mm512_add_epi32(k, _mm512_srli_epi32(k, 31)), 1); /* k / 2, toward 0 */
    __m512i k2 = _mm512_sub_epi32(k, k1);
    const __m512i bias = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k1, bias), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k2, bias), 23));
    __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(ACT_EXP_MIN), _CMP_LT_OQ), y,
                             _mm512_setzero_ps());
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(ACT_EXP_MAX), _CMP_GT_OQ), y,
                             _mm512_set1_ps(INFINITY));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}

static inline __m512 relu16(__m512 a)
{
    __mmask16 keep = _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_GT_OQ) | _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    return _mm512_maskz_mov_ps(keep, a);
}

static inline __m512 act16(fp8mix_act_kind k, __m512 a)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    switch (k) {
    case FP8MIX_ACT_GELU: case FP8MIX_ACT_GEGLU: {
        __m512 a3 = _mm512_mul_ps(_mm512_mul_ps(a, a), a);
        __m512 u = _mm512_mul_ps(_mm512_set1_ps(ACT_GELU_K),
                                 _mm512_add_ps(a, _mm512_mul_ps(_mm512_set1_ps(ACT_GELU_C), a3)));
        return _mm512_div_ps(a, _mm512_add_ps(one, exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u))));
    }
    case FP8MIX_ACT_RELU: case FP8MIX_ACT_REGLU: return relu16(a);
    case FP8MIX_ACT_SILU: case FP8MIX_ACT_SWIGLU:
        return _mm512_div_ps(a, _mm512_add_ps(one, exp16(_mm512_xor_ps(a, _mm512_set1_ps(-0.0f)))));
    case FP8MIX_ACT_QGELU: case FP8MIX_ACT_QGEGLU:
        return _mm512_div_ps(a, _mm512_add_ps(one, exp16(_mm512_mul_ps(_mm512_set1_ps(-ACT_QGELU_K), a))));
    default: {
        __m512 r = relu16(a);
        return _mm512_mul_ps(r, r);
    }
    }
}

void fp8mix_fused_act__avx512(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out)
{
    int64_t t = 0;
    for (; t + 16 <= n; t += 16) {
        __m512 y = act16(k, _mm512_loadu_ps(a + t));
        if (b) y = _mm512_mul_ps(y, _mm512_loadu_ps(b + t));
        _mm512_storeu_ps(out + t, y);
    }
    fp8mix_fused_act_ref(k, a + t, b ? b + t : NULL, n - t, out + t);
}
