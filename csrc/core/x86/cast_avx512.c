/*
 * cast_avx512.c — AVX-512 (F/BW/VL/DQ) segment kernels for scale+cast+amax
 * and dequantisation, 16 lanes.  They run the integer steps of fp8_encode
 * (internal.h) lane by lane, so their bytes equal the scalar reference's;
 * tests/c/test_cast.c checks that over the float32 bit space.
 */
#include <immintrin.h>

#include "internal.h"

typedef struct enc512 {
    __m512i emin, shift0, bexp, mbits, max_code, ovf_code, nan_code;
    __m512i rnd, rebias, min_normal; /* round-to-nearest fast path */
    __m512 magic;
} enc512;

static inline enc512 enc512_init(const fp8_params *p)
{
    enc512 c;
    c.emin = _mm512_set1_epi32(p->emin);
    c.shift0 = _mm512_set1_epi32(23 - p->mbits);
    c.bexp = _mm512_set1_epi32(p->bias - 1);
    c.mbits = _mm512_set1_epi32(p->mbits);
    c.max_code = _mm512_set1_epi32((int)p->max_code);
    c.ovf_code = _mm512_set1_epi32((int)p->ovf_code);
    c.nan_code = _mm512_set1_epi32((int)p->nan_code);
    c.rnd = _mm512_set1_epi32((1 << (22 - p->mbits)) - 1);
    c.rebias = _mm512_set1_epi32((127 - p->bias) << p->mbits);
    c.min_normal = _mm512_set1_epi32((127 + p->emin) << 23);
    c.magic = _mm512_castsi512_ps(_mm512_set1_epi32((127 + p->emin - p->mbits + 23) << 23));
    return c;
}

/* Round to nearest even, fast path with the same results as fp8_encode:
 * normals round at the kept mantissa bit by integer add (a carry moves to the
 * next binade); FP8 subnormals are rounded by the FPU, adding a power of two
 * whose ulp is the FP8 subnormal spacing (IEEE add, nearest even). */
static inline __m512i encode16_rne(const enc512 *c, __m512 y)
{
    const __m512i one = _mm512_set1_epi32(1);
    __m512i bits = _mm512_castps_si512(y);
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    __m512i lsb = _mm512_and_si512(_mm512_srlv_epi32(a, c->shift0), one);
    __m512i r = _mm512_add_epi32(a, _mm512_add_epi32(c->rnd, lsb));
    __m512i code = _mm512_sub_epi32(_mm512_srlv_epi32(r, c->shift0), c->rebias);
    __m512i sub = _mm512_sub_epi32(
        _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(a), c->magic)), _mm512_castps_si512(c->magic));
    code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epu32_mask(a, c->min_normal), sub);
    code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epi32_mask(code, c->max_code), c->ovf_code);
    code = _mm512_mask_mov_epi32(code, nan, c->nan_code);
    return _mm512_or_si512(code, sign);
}

/* 16 float32 values (already scaled) to 16 codes, one per dword. */
static inline __m512i encode16(const enc512 *c, __m512 y, int stochastic, __m512i r)
{
    const __m512i one = _mm512_set1_epi32(1);
    __m512i bits = _mm512_castps_si512(y);
    __m512i sign = _mm512_and_si512(_mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80));
    __m512i a = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    __m512i E = _mm512_srli_epi32(a, 23);
    __mmask16 normal = _mm512_test_epi32_mask(E, E);
    __m512i M = _mm512_mask_or_epi32(_mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)), normal,
                                     _mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)),
                                     _mm512_set1_epi32(0x800000));
    __m512i e = _mm512_sub_epi32(_mm512_max_epi32(E, one), _mm512_set1_epi32(127));
    __m512i sub = _mm512_max_epi32(_mm512_sub_epi32(c->emin, e), _mm512_setzero_si512());
    __m512i shift = _mm512_add_epi32(c->shift0, sub);
    __m512i q;
    if (!stochastic) {
        shift = _mm512_min_epu32(shift, _mm512_set1_epi32(25));
        q = _mm512_srlv_epi32(M, shift);
        __m512i rem = _mm512_and_si512(M, _mm512_sub_epi32(_mm512_sllv_epi32(one, shift), one));
        __m512i half = _mm512_sllv_epi32(one, _mm512_sub_epi32(shift, one));
        __mmask16 up = _mm512_cmpgt_epu32_mask(rem, half) |
                       (_mm512_cmpeq_epi32_mask(rem, half) & _mm512_test_epi32_mask(q, one));
        q = _mm512_mask_add_epi32(q, up, q, one);
    } else {
        const __m512i k32 = _mm512_set1_epi32(32);
        q = _mm512_srlv_epi32(M, shift);
        __m512i rem = _mm512_and_si512(M, _mm512_sub_epi32(_mm512_sllv_epi32(one, shift), one));
        __m512i t = _mm512_or_si512(_mm512_sllv_epi32(rem, _mm512_sub_epi32(k32, shift)),
                                    _mm512_srlv_epi32(M, _mm512_sub_epi32(shift, k32)));
        q = _mm512_mask_add_epi32(q, _mm512_cmplt_epu32_mask(r, t), q, one);
    }
    __m512i ee = _mm512_max_epi32(e, c->emin);
    __m512i code = _mm512_add_epi32(_mm512_sllv_epi32(_mm512_add_epi32(ee, c->bexp), c->mbits), q);
    code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(code, c->max_code), c->ovf_code);
    code = _mm512_mask_mov_epi32(code, nan, c->nan_code);
    return _mm512_or_si512(code, sign);
}

static inline __m512 load16(const void *x, fp8mix_dtype xt, int64_t i, __mmask16 m)
{
    switch (xt) {
    case FP8MIX_F32: return _mm512_maskz_loadu_ps(m, (const float *)x + i);
    case FP8MIX_BF16: {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    default: {
        __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)x + i);
        return _mm512_cvtph_ps(h);
    }
    }
}

void fp8mix_cast_seg_avx512(const void *x, fp8mix_dtype xt, int64_t n, float scale, uint8_t *q,
                            uint32_t *amax, const fp8_params *p, uint64_t seed,
                            uint64_t rng_start)
{
    enc512 c = enc512_init(p);
    const __m512 s = _mm512_set1_ps(scale);
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i m = _mm512_setzero_si512();
    uint32_t rbuf[64];
    int sr = p->stochastic && q;
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512 v = load16(x, xt, i, k);
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(v), absmask));
        if (!q) continue;
        __m512i r = _mm512_setzero_si512();
        if (sr) {
            if ((i & 63) == 0) fp8mix_random_words(seed, rng_start + (uint64_t)i, left < 64 ? left : 64, rbuf);
            r = _mm512_maskz_loadu_epi32(k, rbuf + (i & 63));
        }
        __m512 y = _mm512_mul_ps(v, s);
        __m512i code = sr ? encode16(&c, y, 1, r) : encode16_rne(&c, y);
        if (p->inf_to_nan) { /* infinite x: NaN with x's sign (the sign bit is code's bit 7) */
            __mmask16 inf = _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), absmask),
                                                    _mm512_set1_epi32(0x7F800000));
            __m512i nan = _mm512_or_si512(c.nan_code, _mm512_and_si512(code, _mm512_set1_epi32(0x80)));
            code = _mm512_mask_mov_epi32(code, inf, nan);
        }
        _mm_mask_storeu_epi8(q + i, k, _mm512_cvtepi32_epi8(code));
    }
    uint32_t mm = _mm512_reduce_max_epu32(m);
    if (mm > *amax) *amax = mm;
}

/* float32 -> bf16 bits, nearest even, NaN quieted (matches the scalar ref). */
static inline __m256i to_bf16_16(__m512 v)
{
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rnd = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    __m512i qn = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rnd, nan, qn));
}

void fp8mix_dequant_seg_avx512(const uint8_t *q, int64_t n, const float *table, float scale_inv,
                               void *out, fp8mix_dtype out_t)
{
    const __m512 s = _mm512_set1_ps(scale_inv);
    for (int64_t i = 0; i < n; i += 16) {
        int64_t left = n - i;
        __mmask16 k = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        __m512i idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, q + i));
        __m512 v = _mm512_mul_ps(_mm512_i32gather_ps(idx, table, 4), s);
        switch (out_t) {
        case FP8MIX_F32: _mm512_mask_storeu_ps((float *)out + i, k, v); break;
        case FP8MIX_BF16: _mm256_mask_storeu_epi16((uint16_t *)out + i, k, to_bf16_16(v)); break;
        default:
            _mm256_mask_storeu_epi16((uint16_t *)out + i, k,
                                     _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            break;
        }
    }
}
