/*
 * fused.h — the engine behind the fused producer casts (norm.c, act.c): an op
 * that produces a GEMM's input row by row hands its values to the engine in
 * short float32 segments, which casts them to FP8 at any granularity (given
 * scales, current scaling, or delayed-scaling state) while they are in L1.
 * The high-precision result is never stored unless the caller asks for it.
 * Not installed, not part of the API: fp8mix.h documents the entry points.
 */
#ifndef FP8MIX_FUSED_H
#define FP8MIX_FUSED_H

#include "internal.h"

/* Longest segment a source is asked for (floats); BLOCK granularities ask
 * for at most FP8MIX_BLOCK, cut at multiples of 128. */
#define FUSED_SEG 256

/* What the engine casts: rows x cols values, produced on demand.
 *   row_begin(ctx, i): called once per call for row i, in the first pass
 *     that visits it (before any produce of that row); NULL: nothing to do.
 *     A source keeps what it computes there (a norm's statistics) in
 *     per-row arrays, so later passes and other threads can read it.
 *   produce(ctx, i, j0, n, buf): buf[t] = value (i, j0 + t), t < n.
 * Both are called from several threads for different rows at once, and
 * must give the same bits whatever the thread or pass. */
typedef struct fp8mix_fused_source {
    int64_t rows, cols;
    const void *ctx;
    void (*row_begin)(const void *ctx, int64_t i);
    void (*produce)(const void *ctx, int64_t i, int64_t j0, int64_t n, float *buf);
} fp8mix_fused_source;

/* Cast src as `out` says (fp8mix_fused_out), under opts.  Checks out and
 * opts first (nothing is written on error).  Stochastic rounding: element
 * (i, j) uses random word index i * cols + j, as fp8mix_cast would. */
fp8mix_status fp8mix_fused_cast_run(const fp8mix_fused_source *src, const fp8mix_fused_out *out,
                                     const fp8mix_cast_opts *opts);

/* The delayed-scaling cast of src, as fp8mix_cast_delayed does for a tensor:
 * out->gran must be TENSOR and out->scale NULL (the state gives the scale);
 * on the role's first use the scale comes from *fresh_amax, or from an amax
 * pass over src.  scales[0] = s, scales[1] = 1 / s; out->amax (if given)
 * receives the amax; with record, it is recorded (fp8mix_delayed_record). */
fp8mix_status fp8mix_fused_cast_delayed_run(const fp8mix_fused_source *src, const fp8mix_fused_out *out,
                                            const fp8mix_delayed_state *st, int64_t role,
                                            const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                            const fp8mix_cast_opts *opts, float scales[2]);

/* ---- producer kernels ----------------------------------------------------
 * The arithmetic of the sources, per ISA: the scalar versions (fused_ref.c)
 * are the oracle; the AVX2 / AVX-512 ones (x86/fused_*.c) run the
 * same float32 / float64 operations in the same order (no FMA), so every
 * output bit is the same, which the tests check. */
typedef struct fp8mix_fused_kernels {
    /* dst[t] = src[t] widened exactly to float32 (BF16 / F16), t < n */
    void (*widen)(const void *src, fp8mix_dtype t, int64_t n, float *dst);
    /* lanes[t & 7] += v[t] in float64, or (v[t] - c)^2 with squares */
    void (*lane_sums)(const float *v, int64_t n, int squares, double c, double lanes[8]);
    /* out[t] = ((v[t] - m) * r) * g[t] + b[t], the g and b steps skipped when NULL;
     * out may be v */
    void (*norm_apply)(const float *v, int64_t n, float m, float r, const float *g, const float *b, float *out);
    /* out[t] = act(a[t]), times b[t] when b is not NULL; out may be a */
    void (*act)(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out);
} fp8mix_fused_kernels;

/* The kernels of the active ISA (never NULL), chosen in dispatch.c. */
const fp8mix_fused_kernels *fp8mix_fused_kernels_active(void);

void fp8mix_fused_widen_ref(const void *src, fp8mix_dtype t, int64_t n, float *dst);
void fp8mix_fused_lane_sums_ref(const float *v, int64_t n, int squares, double c, double lanes[8]);
void fp8mix_fused_norm_apply_ref(const float *v, int64_t n, float m, float r, const float *g, const float *b,
                                 float *out);
void fp8mix_fused_act_ref(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out);
#if FP8MIX_X86
void fp8mix_fused_widen__avx2(const void *src, fp8mix_dtype t, int64_t n, float *dst);
void fp8mix_fused_lane_sums__avx2(const float *v, int64_t n, int squares, double c, double lanes[8]);
void fp8mix_fused_norm_apply__avx2(const float *v, int64_t n, float m, float r, const float *g, const float *b,
                                   float *out);
void fp8mix_fused_act__avx2(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out);
void fp8mix_fused_widen__avx512(const void *src, fp8mix_dtype t, int64_t n, float *dst);
void fp8mix_fused_lane_sums__avx512(const float *v, int64_t n, int squares, double c, double lanes[8]);
void fp8mix_fused_norm_apply__avx512(const float *v, int64_t n, float m, float r, const float *g, const float *b,
                                     float *out);
void fp8mix_fused_act__avx512(fp8mix_act_kind k, const float *a, const float *b, int64_t n, float *out);
#endif

/* Constants of fused_ref.c's exponential and sigmoid forms, shared with the SIMD
 * kernels (fp8mix.h, fp8mix_act_ref, gives the formulas). */
#define ACT_LOG2E 1.44269504088896341f
#define ACT_LN2_HI 0.693359375f        /* 10 significant bits: n * LN2_HI is exact */
#define ACT_LN2_LO -2.12194440e-4f
#define ACT_EXP_MAX 88.7228317f        /* above: exp overflows to +inf */
#define ACT_EXP_MIN -87.3365479f       /* below: the result would be subnormal; 0 */
#define ACT_ROUND 12582912.0f          /* 1.5 * 2^23: adding it rounds to an integer (nearest even) */
#define ACT_GELU_K 0.797884560802865f  /* sqrt(2 / pi) */
#define ACT_GELU_C 0.044715f
#define ACT_QGELU_K 1.702f
/* exp's polynomial: Taylor coefficients of degree 6 .. 2 (then r + 1, r + 1) */
#define ACT_P6 (1.0f / 720.0f)
#define ACT_P5 (1.0f / 120.0f)
#define ACT_P4 (1.0f / 24.0f)
#define ACT_P3 (1.0f / 6.0f)
#define ACT_P2 0.5f

/* Checks the output description of a rows x cols result (shapes, pointers,
 * enums, the current-scaling rule, given scales) without running anything. */
fp8mix_status fp8mix_fused_check_out(int64_t rows, int64_t cols, const fp8mix_fused_out *out,
                                     const fp8mix_cast_opts *opts);

#endif /* FP8MIX_FUSED_H */
