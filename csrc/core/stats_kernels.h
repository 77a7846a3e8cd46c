/*
 * stats_kernels.h — the segment kernels of fp8mix_quant_stats (stats.c) and
 * the running sums they fill: shared by stats.c, the scalar reference in
 * stats_ref.c, its SIMD variants in x86/stats_*.c and dispatch.c.  Not
 * installed, not part of the API.
 *
 * A segment is n consecutive elements of one row that share one scale_inv and
 * start at a column that is a multiple of FP8MIX_STATS_LANES, so element t of
 * the segment feeds partial sum t mod FP8MIX_STATS_LANES: the fixed order the
 * header documents, which every variant must follow bit for bit.
 */
#ifndef FP8MIX_STATS_KERNELS_H
#define FP8MIX_STATS_KERNELS_H

#include "internal.h"

#define FP8MIX_STATS_LANES 16
/* Copies of the histogram, element t of a segment counting into copy t mod 4,
 * so that runs of equal bins do not serialise on one counter (merged at the
 * end; integers, so the order does not matter).  One spare bin (index
 * FP8MIX_STATS_HIST_BINS) takes the elements that do not count. */
#define FP8MIX_STATS_HIST_COPIES 4

/* The float64 sums, in partials of FP8MIX_STATS_LANES: x^2, e^2, and the
 * powers of t = x - pivot. */
enum { STATS_SUM_SIG, STATS_SUM_E2, STATS_SUM_T1, STATS_SUM_T2, STATS_SUM_T3, STATS_SUM_T4, STATS_SUMS };

/* Running statistics of one task (a run of rows). */
typedef struct fp8mix_stats_acc {
    int64_t nonzero, nan, nonfinite, underflow, saturated, overflow, subnormal;
    uint32_t min_bits; /* min |x| bits over finite non-zero x; 0x7F800000 (inf): none */
    uint32_t max_bits; /* max |x| bits over finite x; 0: none */
    double part[STATS_SUMS][FP8MIX_STATS_LANES];
    int64_t hist[FP8MIX_STATS_HIST_COPIES][FP8MIX_STATS_HIST_BINS + 1];
} fp8mix_stats_acc;

/* What a segment's kernel needs about the format and the segment's scale. */
typedef struct fp8mix_stats_seg {
    const float *table;  /* decode table of the format */
    float fmax;          /* the format's max */
    float min_normal;    /* the format's min normal */
    double sinv;         /* the segment's scale_inv (finite, > 0) */
    double pivot;        /* the centre of the power sums (FP8MIX_STATS_PIVOT) */
    double ovf_bound;    /* (max + half a step) * sinv, exact in float64 */
    float ovf_f;         /* the largest float32 <= ovf_bound: |x| > ovf_bound iff |x| > ovf_f */
    int sinv_exp;        /* sinv = sinv_frac * 2^sinv_exp, sinv_frac in [0.5, 1) (frexpf) */
    float sinv_frac;
    uint32_t sinv_mant;  /* the 23 fraction bits of sinv_frac (normalised, so also of sinv's 1.m) */
    /* byte classes of the format (SIMD variants): |q| codes */
    uint8_t code_max;    /* +max: 0x7E (E4M3), 0x7B (E5M2) */
    uint8_t code_sub;    /* largest subnormal code: 0x07 (E4M3), 0x03 (E5M2) */
    uint8_t code_nonfin; /* smallest non-finite code: 0x7F (E4M3), 0x7C (E5M2) */
} fp8mix_stats_seg;

/* Adds n elements x[0..n) (type xt) and their bytes q[0..n) to *a. */
typedef void (*fp8mix_stats_seg_fn)(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q,
                                    int64_t n, const fp8mix_stats_seg *s);

/* The segment kernel of the active ISA (never NULL), chosen in dispatch.c. */
fp8mix_stats_seg_fn fp8mix_stats_kernel_active(void);

/* The scalar reference (stats_ref.c): the oracle of every variant. */
void fp8mix_stats_seg_ref(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q, int64_t n,
                          const fp8mix_stats_seg *s);
#if FP8MIX_X86
void fp8mix_stats_seg__avx2(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q, int64_t n,
                            const fp8mix_stats_seg *s);
void fp8mix_stats_seg__avx512(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q, int64_t n,
                              const fp8mix_stats_seg *s);
#endif

/* Histogram bin of the finite non-zero |x| = ax under the segment's scale:
 * floor(log2(ax / sinv)) - FP8MIX_STATS_HIST_MIN_LOG2, clamped to the bins.
 * ax = fx * 2^ex and sinv = fs * 2^es with fx, fs in [0.5, 1), so
 * ax / sinv = (fx / fs) * 2^(ex - es) with fx / fs in (1/2, 2). */
static inline int stats_hist_bin(int ex, float fx, const fp8mix_stats_seg *s)
{
    int e = ex - s->sinv_exp - (fx < s->sinv_frac) - FP8MIX_STATS_HIST_MIN_LOG2;
    return e < 0 ? 0 : e >= FP8MIX_STATS_HIST_BINS ? FP8MIX_STATS_HIST_BINS - 1 : e;
}

#endif /* FP8MIX_STATS_KERNELS_H */
