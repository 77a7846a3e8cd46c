/*
 * stats_avx2.c — AVX2 (+F16C) segment kernel of fp8mix_quant_stats.  A step
 * is 16 elements in two halves of 8 lanes, lane t feeding partial sum t (the
 * header's fixed order), so the float64 sums are bit-identical to the scalar
 * reference in stats_ref.c.  Counts classify q's bytes (signed compares
 * suffice: every compared value is below 2^31).  tests/c/test_stats.c checks
 * every variant against the scalar kernel bit for bit.
 */
#include <immintrin.h>

#include "stats_kernels.h"

/* Elements per counter flush: int32 lane counters stay below 2^21. */
#define CHUNK (1 << 24)

/* 8 elements of type xt as float32. */
static inline __m256 load8(const void *x, fp8mix_dtype xt)
{
    switch (xt) {
    case FP8MIX_F32: return _mm256_loadu_ps((const float *)x);
    case FP8MIX_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x)), 16));
    default: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)x));
    }
}

typedef struct run256 {
    __m256d sum[STATS_SUMS][4]; /* partials 0-3, 4-7, 8-11, 12-15 */
    __m256i vmin, vmax;
    __m256i nz, nan, nonfin, und, sat, ovf, sub; /* lane counters (minus the all-ones masks) */
} run256;

/* Histogram bins of 8 lanes (FP8MIX_STATS_HIST_BINS where `use` is 0). */
static inline __m256i bins8(__m256i ux, __m256i use, const fp8mix_stats_seg *s)
{
    /* a subnormal |x| times 2^24 is exact and normal: its exponent less 24 */
    __m256i xsub = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), ux);
    __m256i un = _mm256_blendv_epi8(
        ux, _mm256_castps_si256(_mm256_mul_ps(_mm256_castsi256_ps(ux), _mm256_set1_ps(0x1p24f))), xsub);
    __m256i e = _mm256_srli_epi32(un, 23); /* biased: frexpf's exponent is e - 126 */
    e = _mm256_sub_epi32(e, _mm256_and_si256(xsub, _mm256_set1_epi32(24)));
    __m256i lt = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)s->sinv_mant),
                                    _mm256_and_si256(un, _mm256_set1_epi32(0x7FFFFF)));
    e = _mm256_sub_epi32(e, _mm256_set1_epi32(126 + s->sinv_exp + FP8MIX_STATS_HIST_MIN_LOG2));
    e = _mm256_add_epi32(e, lt); /* lt is -1 where the mantissa is the smaller */
    e = _mm256_min_epi32(_mm256_max_epi32(e, _mm256_setzero_si256()), _mm256_set1_epi32(FP8MIX_STATS_HIST_BINS - 1));
    return _mm256_blendv_epi8(_mm256_set1_epi32(FP8MIX_STATS_HIST_BINS), e, use);
}

/* The float64 sums of 4 lanes: x (0 where not finite), xe and d (0 where the
 * error term does not count), tm: all-ones in the lanes whose t = x - pivot
 * counts. */
static inline void sums4(__m256d S[STATS_SUMS][4], int h, __m256d x, __m256d xe, __m256d d, __m256d tm,
                         __m256d sinv, __m256d pivot)
{
    S[STATS_SUM_SIG][h] = _mm256_add_pd(S[STATS_SUM_SIG][h], _mm256_mul_pd(x, x));
    __m256d e = _mm256_sub_pd(xe, _mm256_mul_pd(d, sinv));
    S[STATS_SUM_E2][h] = _mm256_add_pd(S[STATS_SUM_E2][h], _mm256_mul_pd(e, e));
    __m256d t = _mm256_and_pd(_mm256_sub_pd(x, pivot), tm), t2 = _mm256_mul_pd(t, t);
    S[STATS_SUM_T1][h] = _mm256_add_pd(S[STATS_SUM_T1][h], t);
    S[STATS_SUM_T2][h] = _mm256_add_pd(S[STATS_SUM_T2][h], t2);
    S[STATS_SUM_T3][h] = _mm256_add_pd(S[STATS_SUM_T3][h], _mm256_mul_pd(t2, t));
    S[STATS_SUM_T4][h] = _mm256_add_pd(S[STATS_SUM_T4][h], _mm256_mul_pd(t2, t2));
}

/* Half `h` (lanes 8h .. 8h+7) of a step: 8 values and their bytes; `valid`
 * is all-ones in the lanes that hold elements (not the tail's padding). */
static inline void half8(run256 *r, fp8mix_stats_acc *a, int h, __m256 xv, __m256i qv, __m256i valid,
                         const fp8mix_stats_seg *s, __m256d sinv, __m256d pivot)
{
    const __m256i zero = _mm256_setzero_si256(), inf = _mm256_set1_epi32(0x7F800000);
    __m256i ux = _mm256_and_si256(_mm256_castps_si256(xv), _mm256_set1_epi32(0x7FFFFFFF));
    __m256i fin = _mm256_cmpgt_epi32(inf, ux);
    __m256i nz = _mm256_xor_si256(_mm256_cmpeq_epi32(ux, zero), _mm256_set1_epi32(-1));
    __m256i fnz = _mm256_and_si256(fin, nz);
    __m256i qm = _mm256_and_si256(qv, _mm256_set1_epi32(0x7F));
    __m256i qzero = _mm256_cmpeq_epi32(qm, zero);
    __m256i qfin = _mm256_cmpgt_epi32(_mm256_set1_epi32(s->code_nonfin), qm);
    r->nz = _mm256_sub_epi32(r->nz, nz);
    r->nonfin = _mm256_sub_epi32(r->nonfin, _mm256_andnot_si256(fin, _mm256_set1_epi32(-1)));
    r->nan = _mm256_sub_epi32(r->nan, _mm256_cmpgt_epi32(ux, inf));
    r->und = _mm256_sub_epi32(r->und, _mm256_and_si256(fnz, qzero));
    r->sat = _mm256_sub_epi32(r->sat, _mm256_and_si256(fin, _mm256_cmpeq_epi32(qm, _mm256_set1_epi32(s->code_max))));
    __m256i sub = _mm256_andnot_si256(qzero, _mm256_cmpgt_epi32(_mm256_set1_epi32(s->code_sub + 1), qm));
    r->sub = _mm256_sub_epi32(r->sub, _mm256_and_si256(fin, sub));
    __m256i ovf = _mm256_cmpgt_epi32(ux, _mm256_set1_epi32((int)f32_bits(s->ovf_f)));
    r->ovf = _mm256_sub_epi32(r->ovf, _mm256_and_si256(fin, ovf));
    r->vmin = _mm256_min_epu32(r->vmin, _mm256_blendv_epi8(inf, ux, fnz));
    r->vmax = _mm256_max_epu32(r->vmax, _mm256_and_si256(ux, fin));

    __m256i efin = _mm256_and_si256(fin, qfin); /* the error term needs a finite q too */
    __m256 xf = _mm256_and_ps(xv, _mm256_castsi256_ps(fin)), xe = _mm256_and_ps(xv, _mm256_castsi256_ps(efin));
    __m256 d = _mm256_mask_i32gather_ps(_mm256_setzero_ps(), s->table, qv, _mm256_castsi256_ps(efin), 4);
    __m256i tm = _mm256_and_si256(fin, valid);
    __m256d tm0 = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(tm)));
    __m256d tm1 = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(tm, 1)));
    sums4(r->sum, 2 * h, _mm256_cvtps_pd(_mm256_castps256_ps128(xf)), _mm256_cvtps_pd(_mm256_castps256_ps128(xe)),
          _mm256_cvtps_pd(_mm256_castps256_ps128(d)), tm0, sinv, pivot);
    sums4(r->sum, 2 * h + 1, _mm256_cvtps_pd(_mm256_extractf128_ps(xf, 1)),
          _mm256_cvtps_pd(_mm256_extractf128_ps(xe, 1)), _mm256_cvtps_pd(_mm256_extractf128_ps(d, 1)), tm1, sinv,
          pivot);

    int32_t bins[8];
    _mm256_storeu_si256((__m256i *)bins, bins8(ux, fnz, s));
    for (int k = 0; k < 8; k++) a->hist[k % FP8MIX_STATS_HIST_COPIES][bins[k]]++;
}

static int64_t hsum8(__m256i v)
{
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, v);
    int64_t s = 0;
    for (int k = 0; k < 8; k++) s += t[k];
    return s;
}

static void flush_counts(run256 *r, fp8mix_stats_acc *a)
{
    a->nonzero += hsum8(r->nz);
    a->nan += hsum8(r->nan);
    a->nonfinite += hsum8(r->nonfin);
    a->underflow += hsum8(r->und);
    a->saturated += hsum8(r->sat);
    a->overflow += hsum8(r->ovf);
    a->subnormal += hsum8(r->sub);
    r->nz = r->nan = r->nonfin = r->und = r->sat = r->ovf = r->sub = _mm256_setzero_si256();
}

/* 16 elements from x (type xt, esz bytes each) and q, of which the first nv are real. */
static inline void step16(run256 *r, fp8mix_stats_acc *a, const uint8_t *x, fp8mix_dtype xt, size_t esz,
                          const uint8_t *q, int nv, const fp8mix_stats_seg *s, __m256d sinv, __m256d pivot)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m128i qb = _mm_loadu_si128((const __m128i *)q);
    half8(r, a, 0, load8(x, xt), _mm256_cvtepu8_epi32(qb), _mm256_cmpgt_epi32(_mm256_set1_epi32(nv), iota), s,
          sinv, pivot);
    half8(r, a, 1, load8(x + 8 * esz, xt), _mm256_cvtepu8_epi32(_mm_srli_si128(qb, 8)),
          _mm256_cmpgt_epi32(_mm256_set1_epi32(nv - 8), iota), s, sinv, pivot);
}

static uint32_t hred(__m256i v, int want_max)
{
    uint32_t t[8], r;
    _mm256_storeu_si256((__m256i *)t, v);
    r = t[0];
    for (int k = 1; k < 8; k++) r = want_max ? (t[k] > r ? t[k] : r) : (t[k] < r ? t[k] : r);
    return r;
}

void fp8mix_stats_seg__avx2(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q, int64_t n,
                            const fp8mix_stats_seg *s)
{
    run256 r;
    for (int k = 0; k < STATS_SUMS; k++)
        for (int h = 0; h < 4; h++) r.sum[k][h] = _mm256_loadu_pd(&a->part[k][4 * h]);
    r.vmin = _mm256_set1_epi32((int)a->min_bits);
    r.vmax = _mm256_set1_epi32((int)a->max_bits);
    r.nz = r.nan = r.nonfin = r.und = r.sat = r.ovf = r.sub = _mm256_setzero_si256();
    const __m256d sinv = _mm256_set1_pd(s->sinv), pivot = _mm256_set1_pd(s->pivot);
    const size_t esz = xt == FP8MIX_F32 ? 4 : 2;
    const uint8_t *xb = (const uint8_t *)x;
    int64_t full = n & ~(int64_t)15;
    for (int64_t t0 = 0; t0 < full; t0 += CHUNK) {
        int64_t t1 = full - t0 < CHUNK ? full : t0 + CHUNK;
        for (int64_t t = t0; t < t1; t += 16) step16(&r, a, xb + (size_t)t * esz, xt, esz, q + t, 16, s, sinv, pivot);
        flush_counts(&r, a);
    }
    if (full < n) { /* the tail, zero-padded: +0 with byte 0 counts nowhere but in t = x - pivot */
        _Alignas(32) uint8_t xt_buf[16 * 4] = {0}, qt_buf[16] = {0};
        memcpy(xt_buf, xb + (size_t)full * esz, (size_t)(n - full) * esz);
        memcpy(qt_buf, q + full, (size_t)(n - full));
        step16(&r, a, xt_buf, xt, esz, qt_buf, (int)(n - full), s, sinv, pivot);
        flush_counts(&r, a);
    }
    for (int k = 0; k < STATS_SUMS; k++)
        for (int h = 0; h < 4; h++) _mm256_storeu_pd(&a->part[k][4 * h], r.sum[k][h]);
    a->min_bits = hred(r.vmin, 0);
    a->max_bits = hred(r.vmax, 1);
}
