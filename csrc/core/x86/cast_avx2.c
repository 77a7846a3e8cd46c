/*
 * cast_avx2.c — AVX2 (+F16C) segment kernels for scale+cast+amax and
 * dequantisation, 8 lanes.  Same integer steps as fp8_encode (internal.h);
 * tails shorter than a vector go to the scalar kernel, which computes the
 * same bytes.  AVX2 has no unsigned 32-bit compare, so every compared value
 * is kept below 2^31 except the stochastic word compare, which flips sign
 * bits first.
 */
#include <immintrin.h>

#include "internal.h"

/* The fast loops are written once and instantiated per input dtype and
 * format (always inlined with constant arguments): no switch in the loop,
 * shifts by an immediate. */
#define FP8MIX_INLINE static inline __attribute__((always_inline))

typedef struct enc256 {
    __m256i emin, shift0, bexp, mbits, max_code, ovf_code, nan_code;
    __m256i rnd, rebias, min_normal; /* round-to-nearest fast path */
    __m256i rnd_rebias;               /* encode8_sat: rnd - (rebias << (23 - mbits)) */
    __m256 magic, maxf;
} enc256;

static inline enc256 enc256_init(const fp8_params *p)
{
    enc256 c;
    c.emin = _mm256_set1_epi32(p->emin);
    c.shift0 = _mm256_set1_epi32(23 - p->mbits);
    c.bexp = _mm256_set1_epi32(p->bias - 1);
    c.mbits = _mm256_set1_epi32(p->mbits);
    c.max_code = _mm256_set1_epi32((int)p->max_code);
    c.ovf_code = _mm256_set1_epi32((int)p->ovf_code);
    c.nan_code = _mm256_set1_epi32((int)p->nan_code);
    c.rnd = _mm256_set1_epi32((1 << (22 - p->mbits)) - 1);
    c.rebias = _mm256_set1_epi32((127 - p->bias) << p->mbits);
    c.min_normal = _mm256_set1_epi32((127 + p->emin) << 23);
    c.rnd_rebias = _mm256_set1_epi32((int32_t)((uint32_t)((1 << (22 - p->mbits)) - 1) - ((uint32_t)(127 - p->bias) << 23)));
    c.magic = _mm256_castsi256_ps(_mm256_set1_epi32((127 + p->emin - p->mbits + 23) << 23));
    c.maxf = _mm256_set1_ps(p->fmt == FP8MIX_E4M3 ? 448.0f : 57344.0f);
    return c;
}

/* Saturating round to nearest even (the training cast): encode8_rne's
 * bytes in fewer steps (the loop is compute-bound on AVX2: every uop counts).
 *  - |y| is clamped to the format's max in float first (MINPS returns its
 *    second operand, |y|, when that is NaN): no overflow compare;
 *  - the normal-path code (integer rounding at the kept mantissa bit, of
 *    max(|y|, smallest normal)) and the subnormal-path code (FPU rounding to
 *    the subnormal spacing: |y| + magic) are both computed and the unsigned
 *    min taken: below the smallest normal the normal path gives the smallest
 *    normal code, which is >= every subnormal-path code there; above it the
 *    subnormal-path value grows linearly (exponentially in the code) and is
 *    never below the normal code (equal in the smallest normal binade);
 *    the normal path's exponent rebias is folded into its rounding constant
 *    (rnd_rebias): its operand is at least the smallest normal, so the sum
 *    stays non-negative and the shift gives the same code;
 *  - a NaN's codes land above every finite code: min with nan_code;
 *  - with inf_to_nan (i2n), |y| = |x| * s + (|x| - |x|) in one FMA: the added
 *    term is +0 for a finite x (the product's rounding is unchanged) and NaN
 *    for an infinite one, which then takes the NaN path (a finite x whose
 *    product overflows still saturates).
 * Takes x's bits, |x|'s bits and the scale; sh (23 - mbits) and i2n are
 * constants after inlining. */
FP8MIX_INLINE __m256i encode8_sat(const enc256 *c, int sh, int i2n, __m256i xbits, __m256i ax, __m256 s)
{
    /* |x * s| == |x| * s bit for bit (s > 0; IEEE rounding is symmetric), and
     * the sign of x * s is x's: one abs serves amax and the encoder */
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(xbits, 24), _mm256_set1_epi32(0x80));
    __m256 axf = _mm256_castsi256_ps(ax);
    __m256 af;
    if (i2n) /* inf - inf is x86's default NaN, negative: clear its sign */
        af = _mm256_and_ps(_mm256_min_ps(c->maxf, _mm256_fmadd_ps(axf, s, _mm256_sub_ps(axf, axf))),
                           _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
    else
        af = _mm256_min_ps(c->maxf, _mm256_mul_ps(axf, s));
    /* the normal path sees at least the smallest normal: its code is then
     * never below the subnormal path's, which wins the min */
    __m256i a = _mm256_max_epi32(_mm256_castps_si256(af), c->min_normal);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, sh), _mm256_set1_epi32(1));
    __m256i code = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, c->rnd_rebias), lsb), sh);
    __m256i sub = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(af, c->magic)), _mm256_castps_si256(c->magic));
    code = _mm256_min_epu32(_mm256_min_epu32(code, sub), c->nan_code);
    return _mm256_or_si256(code, sign);
}

/* Round to nearest even, fast path (see cast_avx512.c's encode16_rne). */
static inline __m256i encode8_rne(const enc256 *c, __m256 y)
{
    const __m256i one = _mm256_set1_epi32(1);
    __m256i bits = _mm256_castps_si256(y);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    __m256i lsb = _mm256_and_si256(_mm256_srlv_epi32(a, c->shift0), one);
    __m256i r = _mm256_add_epi32(a, _mm256_add_epi32(c->rnd, lsb));
    __m256i code = _mm256_sub_epi32(_mm256_srlv_epi32(r, c->shift0), c->rebias);
    __m256i sub = _mm256_sub_epi32(
        _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), c->magic)), _mm256_castps_si256(c->magic));
    code = _mm256_blendv_epi8(code, sub, _mm256_cmpgt_epi32(c->min_normal, a));
    code = _mm256_blendv_epi8(code, c->ovf_code, _mm256_cmpgt_epi32(code, c->max_code));
    code = _mm256_blendv_epi8(code, c->nan_code, nan);
    return _mm256_or_si256(code, sign);
}

static inline __m256i encode8(const enc256 *c, __m256 y, int stochastic, __m256i r)
{
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i zero = _mm256_setzero_si256();
    __m256i bits = _mm256_castps_si256(y);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    __m256i a = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    __m256i E = _mm256_srli_epi32(a, 23);
    __m256i implicit = _mm256_andnot_si256(_mm256_cmpeq_epi32(E, zero), _mm256_set1_epi32(0x800000));
    __m256i M = _mm256_or_si256(_mm256_and_si256(a, _mm256_set1_epi32(0x7FFFFF)), implicit);
    __m256i e = _mm256_sub_epi32(_mm256_max_epi32(E, one), _mm256_set1_epi32(127));
    __m256i sub = _mm256_max_epi32(_mm256_sub_epi32(c->emin, e), zero);
    __m256i shift = _mm256_add_epi32(c->shift0, sub);
    __m256i q;
    if (!stochastic) {
        shift = _mm256_min_epi32(shift, _mm256_set1_epi32(25));
        q = _mm256_srlv_epi32(M, shift);
        __m256i rem = _mm256_and_si256(M, _mm256_sub_epi32(_mm256_sllv_epi32(one, shift), one));
        __m256i half = _mm256_sllv_epi32(one, _mm256_sub_epi32(shift, one));
        __m256i up = _mm256_or_si256(
            _mm256_cmpgt_epi32(rem, half),
            _mm256_and_si256(_mm256_cmpeq_epi32(rem, half),
                             _mm256_cmpeq_epi32(_mm256_and_si256(q, one), one)));
        q = _mm256_sub_epi32(q, up); /* up is -1 where true */
    } else {
        const __m256i k32 = _mm256_set1_epi32(32);
        const __m256i flip = _mm256_set1_epi32((int)0x80000000u);
        q = _mm256_srlv_epi32(M, shift);
        __m256i rem = _mm256_and_si256(M, _mm256_sub_epi32(_mm256_sllv_epi32(one, shift), one));
        __m256i t = _mm256_or_si256(_mm256_sllv_epi32(rem, _mm256_sub_epi32(k32, shift)),
                                    _mm256_srlv_epi32(M, _mm256_sub_epi32(shift, k32)));
        __m256i up = _mm256_cmpgt_epi32(_mm256_xor_si256(t, flip), _mm256_xor_si256(r, flip));
        q = _mm256_sub_epi32(q, up);
    }
    __m256i ee = _mm256_max_epi32(e, c->emin);
    __m256i code = _mm256_add_epi32(_mm256_sllv_epi32(_mm256_add_epi32(ee, c->bexp), c->mbits), q);
    code = _mm256_blendv_epi8(code, c->ovf_code, _mm256_cmpgt_epi32(code, c->max_code));
    code = _mm256_blendv_epi8(code, c->nan_code, nan);
    return _mm256_or_si256(code, sign);
}

static inline __m256 load8(const void *x, fp8mix_dtype xt, int64_t i)
{
    switch (xt) {
    case FP8MIX_F32: return _mm256_loadu_ps((const float *)x + i);
    case FP8MIX_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    default: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)x + i)));
    }
}

static inline void store8_bytes(uint8_t *dst, __m256i code)
{
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64((__m128i *)dst, _mm_packus_epi16(w, w));
}


/* max |x| bits over n elements, four independent accumulators; returns how
 * many elements it covered (a multiple of 32). */
FP8MIX_INLINE int64_t amax_run_t(const void *x, fp8mix_dtype xt, int64_t n, uint32_t *amax)
{
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_castps_si256(load8(x, xt, i)), absmask));
        m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_castps_si256(load8(x, xt, i + 8)), absmask));
        m2 = _mm256_max_epu32(m2, _mm256_and_si256(_mm256_castps_si256(load8(x, xt, i + 16)), absmask));
        m3 = _mm256_max_epu32(m3, _mm256_and_si256(_mm256_castps_si256(load8(x, xt, i + 24)), absmask));
    }
    __m256i m = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
    uint32_t lanes[8], mm = *amax;
    _mm256_storeu_si256((__m256i *)lanes, m);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mm) mm = lanes[l];
    *amax = mm;
    return i;
}

/* The saturating round-to-nearest cast, 16 elements per step; returns how
 * many elements it covered (a multiple of 16). */
FP8MIX_INLINE int64_t cast_sat_run_t(const void *x, fp8mix_dtype xt, int sh, int i2n, int64_t n, float scale,
                                     uint8_t *q, uint32_t *amax, const fp8_params *p)
{
    enc256 c = enc256_init(p);
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m = _mm256_setzero_si256();
    int64_t i = 0;
    /* two vectors per step: with four, GCC spills the encoder's constants */
    for (; i + 16 <= n; i += 16) {
        __m256i code[2];
#pragma GCC unroll 2
        for (int u = 0; u < 2; u++) {
            __m256i xb = _mm256_castps_si256(load8(x, xt, i + 8 * u));
            __m256i av = _mm256_and_si256(xb, absmask);
            m = _mm256_max_epu32(m, av);
            code[u] = encode8_sat(&c, sh, i2n, xb, av, s);
        }
        /* packs work per 128-bit lane: the words come out as a0 b0 | a1 b1
         * (4 codes each); the byte pack gives dwords a0 b0 a1 b1, one shuffle
         * restores a0 a1 b0 b1 */
        __m256i w = _mm256_packus_epi32(code[0], code[1]);
        __m128i bytes = _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storeu_si128((__m128i *)(q + i), _mm_shuffle_epi32(bytes, _MM_SHUFFLE(3, 1, 2, 0)));
    }
    uint32_t lanes[8], mm = *amax;
    _mm256_storeu_si256((__m256i *)lanes, m);
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mm) mm = lanes[l];
    *amax = mm;
    return i;
}

#include "cast_fast.h"

void fp8mix_cast_seg__avx2(const void *x, fp8mix_dtype xt, int64_t n, float scale, uint8_t *q,
                           uint32_t *amax, const fp8_params *p, uint64_t seed, uint64_t rng_start)
{
    int64_t done = fast_prefix(x, xt, n, scale, q, amax, p); /* amax only, the training cast */
    if (done > 0) {
        if (done == n) return;
        x = (const uint8_t *)x + (size_t)done * dtype_size(xt);
        n -= done;
        if (q) q += done;
        rng_start += (uint64_t)done;
    }
    enc256 c = enc256_init(p);
    const __m256 s = _mm256_set1_ps(scale);
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m = _mm256_setzero_si256();
    uint32_t rbuf[64];
    int sr = p->stochastic && q;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = load8(x, xt, i);
        m = _mm256_max_epu32(m, _mm256_and_si256(_mm256_castps_si256(v), absmask));
        if (!q) continue;
        __m256i r = _mm256_setzero_si256();
        if (sr) {
            if ((i & 63) == 0) {
                int64_t left = n - i;
                fp8mix_random_words(seed, rng_start + (uint64_t)i, left < 64 ? left : 64, rbuf);
            }
            r = _mm256_loadu_si256((const __m256i *)(rbuf + (i & 63)));
        }
        __m256 y = _mm256_mul_ps(v, s);
        __m256i code = sr ? encode8(&c, y, 1, r) : encode8_rne(&c, y);
        if (p->inf_to_nan) { /* infinite x: NaN with x's sign (the sign bit is code's bit 7) */
            __m256i inf = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), absmask),
                                             _mm256_set1_epi32(0x7F800000));
            __m256i nan = _mm256_or_si256(c.nan_code, _mm256_and_si256(code, _mm256_set1_epi32(0x80)));
            code = _mm256_blendv_epi8(code, nan, inf);
        }
        store8_bytes(q + i, code);
    }
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, m);
    uint32_t mm = *amax;
    for (int l = 0; l < 8; l++)
        if (lanes[l] > mm) mm = lanes[l];
    *amax = mm;
    if (i < n) {
        const uint8_t *xb = (const uint8_t *)x + (size_t)i * dtype_size(xt);
        fp8mix_cast_seg_ref(xb, xt, n - i, scale, q ? q + i : NULL, amax, p, seed,
                            rng_start + (uint64_t)i);
    }
}

static inline __m128i to_bf16_8(__m256 v)
{
    __m256i u = _mm256_castps_si256(v);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rnd = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i r = _mm256_blendv_epi8(rnd, qn, nan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

void fp8mix_dequant_seg__avx2(const uint8_t *q, int64_t n, const float *table, float scale_inv,
                              void *out, fp8mix_dtype out_t)
{
    const __m256 s = _mm256_set1_ps(scale_inv);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + i)));
        __m256 v = _mm256_mul_ps(_mm256_i32gather_ps(table, idx, 4), s);
        switch (out_t) {
        case FP8MIX_F32: _mm256_storeu_ps((float *)out + i, v); break;
        case FP8MIX_BF16: _mm_storeu_si128((__m128i *)((uint16_t *)out + i), to_bf16_8(v)); break;
        default:
            _mm_storeu_si128((__m128i *)((uint16_t *)out + i),
                             _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            break;
        }
    }
    if (i < n)
        fp8mix_dequant_seg_ref(q + i, n - i, table, scale_inv,
                               (uint8_t *)out + (size_t)i * dtype_size(out_t), out_t);
}
