/*
 * cast_avx512.c — AVX-512 (F/BW/VL/DQ) segment kernels for scale+cast+amax
 * and dequantisation, 16 lanes.  They run the integer steps of fp8_encode
 * (internal.h) lane by lane, so their bytes equal the scalar reference's;
 * tests/c/test_cast.c checks that over the float32 bit space.
 */
#include <immintrin.h>

#include "internal.h"

/* The fast loops are written once and instantiated per input dtype and
 * format (always inlined with constant arguments): no switch in the loop,
 * shifts by an immediate. */
#define FP8MIX_INLINE static inline __attribute__((always_inline))

typedef struct enc512 {
    __m512i emin, shift0, bexp, mbits, max_code, ovf_code, nan_code;
    __m512i rnd, rebias, min_normal; /* round-to-nearest fast path */
    __m512 magic, maxf;
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
    c.maxf = _mm512_set1_ps(p->fmt == FP8MIX_E4M3 ? 448.0f : 57344.0f);
    return c;
}

/* Saturating round to nearest even, the lean form of encode16_rne for the
 * training cast (same bytes; the reasoning is cast_avx2.c's encode8_sat):
 * |y| clamped in float, the unsigned min of the normal-path and
 * subnormal-path codes, then of nan_code; `inf` marks infinite inputs under
 * inf_to_nan, which become the NaN code. */
FP8MIX_INLINE __m512i encode16_sat(const enc512 *c, int sh, int i2n, __m512i xbits, __m512i ax, __m512 s)
{
    /* |x * s| == |x| * s bit for bit; the sign of x * s is x's */
    __m512 af = _mm512_min_ps(c->maxf, _mm512_mul_ps(_mm512_castsi512_ps(ax), s));
    /* the normal path sees at least the smallest normal: its code is then
     * never below the subnormal path's, which wins the min */
    __m512i a = _mm512_max_epi32(_mm512_castps_si512(af), c->min_normal);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(a, sh), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, c->rnd), lsb);
    __m512i code = _mm512_sub_epi32(_mm512_srli_epi32(r, sh), c->rebias);
    __m512i sub = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(af, c->magic)), _mm512_castps_si512(c->magic));
    code = _mm512_min_epu32(_mm512_min_epu32(code, sub), c->nan_code);
    if (i2n) code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(ax, _mm512_set1_epi32(0x7F800000)), c->nan_code);
    /* code | ((x >> 24) & 0x80): ternary logic A | (B & C) */
    return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(xbits, 24), _mm512_set1_epi32(0x80), 0xF8);
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


/* max |x| bits over n elements, four accumulators; returns how many elements
 * it covered (a multiple of 64). */
FP8MIX_INLINE int64_t amax_run_t(const void *x, fp8mix_dtype xt, int64_t n, uint32_t *amax)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i m0 = _mm512_setzero_si512(), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        m0 = _mm512_max_epu32(m0, _mm512_and_si512(_mm512_castps_si512(load16(x, xt, i, 0xFFFF)), absmask));
        m1 = _mm512_max_epu32(m1, _mm512_and_si512(_mm512_castps_si512(load16(x, xt, i + 16, 0xFFFF)), absmask));
        m2 = _mm512_max_epu32(m2, _mm512_and_si512(_mm512_castps_si512(load16(x, xt, i + 32, 0xFFFF)), absmask));
        m3 = _mm512_max_epu32(m3, _mm512_and_si512(_mm512_castps_si512(load16(x, xt, i + 48, 0xFFFF)), absmask));
    }
    uint32_t mm = _mm512_reduce_max_epu32(_mm512_max_epu32(_mm512_max_epu32(m0, m1), _mm512_max_epu32(m2, m3)));
    if (mm > *amax) *amax = mm;
    return i;
}

/* The saturating round-to-nearest cast, 64 elements per step; returns how
 * many elements it covered (a multiple of 64). */
FP8MIX_INLINE int64_t cast_sat_run_t(const void *x, fp8mix_dtype xt, int sh, int i2n, int64_t n, float scale,
                                     uint8_t *q, uint32_t *amax, const fp8_params *p)
{
    enc512 c = enc512_init(p);
    const __m512 s = _mm512_set1_ps(scale);
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    /* packs work per 128-bit lane: dword 4k + u holds 4 codes of vector u, lane k */
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    __m512i m = _mm512_setzero_si512();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i code[4];
#pragma GCC unroll 4
        for (int u = 0; u < 4; u++) {
            __m512i xb = _mm512_castps_si512(load16(x, xt, i + 16 * u, 0xFFFF));
            __m512i av = _mm512_and_si512(xb, absmask);
            m = _mm512_max_epu32(m, av);
            code[u] = encode16_sat(&c, sh, i2n, xb, av, s);
        }
        __m512i b = _mm512_packus_epi16(_mm512_packus_epi32(code[0], code[1]), _mm512_packus_epi32(code[2], code[3]));
        _mm512_storeu_si512((void *)(q + i), _mm512_permutexvar_epi32(order, b));
    }
    uint32_t mm = _mm512_reduce_max_epu32(m);
    if (mm > *amax) *amax = mm;
    return i;
}

#include "cast_fast.h"

void fp8mix_cast_seg__avx512(const void *x, fp8mix_dtype xt, int64_t n, float scale, uint8_t *q,
                             uint32_t *amax, const fp8_params *p, uint64_t seed,
                             uint64_t rng_start)
{
    int64_t done = fast_prefix(x, xt, n, scale, q, amax, p); /* amax only, the training cast */
    if (done > 0) {
        if (done == n) return;
        x = (const uint8_t *)x + (size_t)done * dtype_size(xt);
        n -= done;
        if (q) q += done;
        rng_start += (uint64_t)done;
    }
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

void fp8mix_dequant_seg__avx512(const uint8_t *q, int64_t n, const float *table, float scale_inv,
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
