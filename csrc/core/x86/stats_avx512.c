/*
 * stats_avx512.c — AVX-512 (F/BW/VL/DQ) segment kernel of fp8mix_quant_stats,
 * 16 lanes: lane t of a step feeds partial sum t (the header's fixed order),
 * so the float64 sums are bit-identical to the scalar reference in stats_ref.c.
 * The counts classify q's bytes instead of comparing decoded values (equal by
 * the formats' encodings); tests/c/test_stats.c checks every variant against
 * the scalar kernel bit for bit.
 */
#include <immintrin.h>

#include "stats_kernels.h"

/* Elements per counter flush: int32 lane counters stay below 2^20. */
#define CHUNK (1 << 24)

/* 16 elements of type xt as float32; lanes outside m read as +0. */
static inline __m512 load16(const void *x, fp8mix_dtype xt, __mmask16 m)
{
    switch (xt) {
    case FP8MIX_F32: return _mm512_maskz_loadu_ps(m, x);
    case FP8MIX_BF16:
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, x)), 16));
    default: return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x));
    }
}

typedef struct run512 {
    __m512d sum[2][STATS_SUMS]; /* [0]: partials 0-7, [1]: 8-15 */
    __m512i vmin, vmax;
    __m512i nz, nan, nonfin, und, sat, ovf, sub; /* lane counters */
} run512;

/* Histogram bins of 16 lanes (FP8MIX_STATS_HIST_BINS for lanes outside `use`). */
static inline __m512i bins16(__m512i ux, __mmask16 use, const fp8mix_stats_seg *s)
{
    /* a subnormal |x| times 2^24 is exact and normal: its exponent less 24 */
    __mmask16 xsub = _mm512_cmplt_epu32_mask(ux, _mm512_set1_epi32(0x00800000));
    __m512i un = _mm512_mask_mov_epi32(
        ux, xsub, _mm512_castps_si512(_mm512_mul_ps(_mm512_castsi512_ps(ux), _mm512_set1_ps(0x1p24f))));
    __m512i e = _mm512_srli_epi32(un, 23); /* biased: frexpf's exponent is e - 126 */
    e = _mm512_mask_sub_epi32(e, xsub, e, _mm512_set1_epi32(24));
    __mmask16 lt = _mm512_cmplt_epu32_mask(_mm512_and_si512(un, _mm512_set1_epi32(0x7FFFFF)),
                                           _mm512_set1_epi32((int)s->sinv_mant));
    e = _mm512_sub_epi32(e, _mm512_set1_epi32(126 + s->sinv_exp + FP8MIX_STATS_HIST_MIN_LOG2));
    e = _mm512_mask_sub_epi32(e, lt, e, _mm512_set1_epi32(1));
    e = _mm512_min_epi32(_mm512_max_epi32(e, _mm512_setzero_si512()), _mm512_set1_epi32(FP8MIX_STATS_HIST_BINS - 1));
    return _mm512_mask_mov_epi32(_mm512_set1_epi32(FP8MIX_STATS_HIST_BINS), use, e);
}

/* The float64 sums of one half (8 lanes) of a step: x (0 where not finite),
 * xe and d (0 where the error term does not count), tm: the lanes whose
 * t = x - pivot counts. */
static inline void sums8(__m512d S[STATS_SUMS], __m512d x, __m512d xe, __m512d d, __mmask8 tm, __m512d sinv,
                         __m512d pivot)
{
    S[STATS_SUM_SIG] = _mm512_add_pd(S[STATS_SUM_SIG], _mm512_mul_pd(x, x));
    __m512d e = _mm512_sub_pd(xe, _mm512_mul_pd(d, sinv));
    S[STATS_SUM_E2] = _mm512_add_pd(S[STATS_SUM_E2], _mm512_mul_pd(e, e));
    __m512d t = _mm512_maskz_sub_pd(tm, x, pivot), t2 = _mm512_mul_pd(t, t);
    S[STATS_SUM_T1] = _mm512_add_pd(S[STATS_SUM_T1], t);
    S[STATS_SUM_T2] = _mm512_add_pd(S[STATS_SUM_T2], t2);
    S[STATS_SUM_T3] = _mm512_add_pd(S[STATS_SUM_T3], _mm512_mul_pd(t2, t));
    S[STATS_SUM_T4] = _mm512_add_pd(S[STATS_SUM_T4], _mm512_mul_pd(t2, t2));
}

/* One step of 16 elements (lanes outside m are +0 and count nowhere). */
static inline void step16(run512 *r, fp8mix_stats_acc *a, __m512 xv, __m512i qv, __mmask16 m,
                          const fp8mix_stats_seg *s, __m512d sinv, __m512d pivot)
{
    const __m512i one = _mm512_set1_epi32(1);
    __m512i ux = _mm512_and_si512(_mm512_castps_si512(xv), _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 fin = _mm512_cmplt_epu32_mask(ux, _mm512_set1_epi32(0x7F800000));
    __mmask16 nz = _mm512_test_epi32_mask(ux, ux), fnz = fin & nz;
    __m512i qm = _mm512_and_si512(qv, _mm512_set1_epi32(0x7F));
    __mmask16 qzero = _mm512_cmpeq_epi32_mask(qm, _mm512_setzero_si512());
    __mmask16 qfin = _mm512_cmplt_epu32_mask(qm, _mm512_set1_epi32(s->code_nonfin));
    r->nz = _mm512_mask_add_epi32(r->nz, nz, r->nz, one);
    r->nonfin = _mm512_mask_add_epi32(r->nonfin, (__mmask16)~fin, r->nonfin, one);
    r->nan = _mm512_mask_add_epi32(r->nan, _mm512_cmpgt_epu32_mask(ux, _mm512_set1_epi32(0x7F800000)), r->nan, one);
    r->und = _mm512_mask_add_epi32(r->und, fnz & qzero, r->und, one);
    r->sat = _mm512_mask_add_epi32(r->sat, fin & _mm512_cmpeq_epi32_mask(qm, _mm512_set1_epi32(s->code_max)),
                                   r->sat, one);
    r->sub = _mm512_mask_add_epi32(
        r->sub, fin & ~qzero & _mm512_cmple_epu32_mask(qm, _mm512_set1_epi32(s->code_sub)), r->sub, one);
    r->ovf = _mm512_mask_add_epi32(
        r->ovf, fin & _mm512_cmpgt_epu32_mask(ux, _mm512_set1_epi32((int)f32_bits(s->ovf_f))), r->ovf, one);
    r->vmin = _mm512_mask_min_epu32(r->vmin, fnz, r->vmin, ux);
    r->vmax = _mm512_mask_max_epu32(r->vmax, fin, r->vmax, ux);

    __mmask16 efin = fin & qfin; /* the error term needs a finite q too */
    __m512 xf = _mm512_maskz_mov_ps(fin, xv), xe = _mm512_maskz_mov_ps(efin, xv);
    __m512 d = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), efin, qv, s->table, 4);
    __mmask16 tm = fin & m;
    sums8(r->sum[0], _mm512_cvtps_pd(_mm512_castps512_ps256(xf)), _mm512_cvtps_pd(_mm512_castps512_ps256(xe)),
          _mm512_cvtps_pd(_mm512_castps512_ps256(d)), (__mmask8)tm, sinv, pivot);
    sums8(r->sum[1], _mm512_cvtps_pd(_mm512_extractf32x8_ps(xf, 1)), _mm512_cvtps_pd(_mm512_extractf32x8_ps(xe, 1)),
          _mm512_cvtps_pd(_mm512_extractf32x8_ps(d, 1)), (__mmask8)(tm >> 8), sinv, pivot);

    int32_t bins[16];
    _mm512_storeu_si512(bins, bins16(ux, fnz, s));
    for (int k = 0; k < 16; k++) a->hist[k % FP8MIX_STATS_HIST_COPIES][bins[k]]++;
}

static void flush_counts(run512 *r, fp8mix_stats_acc *a)
{
    a->nonzero += _mm512_reduce_add_epi32(r->nz);
    a->nan += _mm512_reduce_add_epi32(r->nan);
    a->nonfinite += _mm512_reduce_add_epi32(r->nonfin);
    a->underflow += _mm512_reduce_add_epi32(r->und);
    a->saturated += _mm512_reduce_add_epi32(r->sat);
    a->overflow += _mm512_reduce_add_epi32(r->ovf);
    a->subnormal += _mm512_reduce_add_epi32(r->sub);
    r->nz = r->nan = r->nonfin = r->und = r->sat = r->ovf = r->sub = _mm512_setzero_si512();
}

void fp8mix_stats_seg__avx512(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q, int64_t n,
                              const fp8mix_stats_seg *s)
{
    run512 r;
    for (int k = 0; k < STATS_SUMS; k++)
        for (int h = 0; h < 2; h++) r.sum[h][k] = _mm512_loadu_pd(&a->part[k][8 * h]);
    r.vmin = _mm512_set1_epi32((int)a->min_bits);
    r.vmax = _mm512_set1_epi32((int)a->max_bits);
    r.nz = r.nan = r.nonfin = r.und = r.sat = r.ovf = r.sub = _mm512_setzero_si512();
    const __m512d sinv = _mm512_set1_pd(s->sinv), pivot = _mm512_set1_pd(s->pivot);
    const size_t esz = xt == FP8MIX_F32 ? 4 : 2;
    for (int64_t t0 = 0; t0 < n; t0 += CHUNK) {
        int64_t t1 = n - t0 < CHUNK ? n : t0 + CHUNK;
        for (int64_t t = t0; t < t1; t += 16) {
            __mmask16 m = t1 - t >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (t1 - t)) - 1);
            __m512 xv = load16((const uint8_t *)x + (size_t)t * esz, xt, m);
            __m512i qv = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, q + t));
            step16(&r, a, xv, qv, m, s, sinv, pivot);
        }
        flush_counts(&r, a);
    }
    for (int k = 0; k < STATS_SUMS; k++)
        for (int h = 0; h < 2; h++) _mm512_storeu_pd(&a->part[k][8 * h], r.sum[h][k]);
    a->min_bits = (uint32_t)_mm512_reduce_min_epu32(r.vmin);
    a->max_bits = (uint32_t)_mm512_reduce_max_epu32(r.vmax);
}
