/*
 * norm.c — LayerNorm / RMSNorm written directly as FP8 (fp8mix_norm_cast and
 * its delayed-scaling variant): the row statistics in float64, the
 * normalized values in float32 segments that the fused engine (fused_cast.c)
 * casts while they are in cache.  The statistics are kept (mean, rstd) for
 * the norm's backward, which is the caller's (torch).  Not here: the
 * per-element arithmetic (the active ISA's kernels: fused_ref.c,
 * x86/fused_*.c), the backward, the activation casts (act.c).
 */
#include <math.h>
#include <stdlib.h>

#include "fused.h"

typedef struct norm_src {
    const uint8_t *x;
    fp8mix_dtype xt;
    int64_t ld_x, cols;
    fp8mix_norm_kind kind;
    double eps;
    const float *g;     /* cols scales (1 + gamma when zero-centered), or NULL: 1 */
    const float *b;     /* cols shifts, or NULL: 0 */
    float *mean, *rstd; /* per row; mean may be NULL for RMSNorm */
    int stats_given;
    const fp8mix_fused_kernels *K;
} norm_src;

/* x[i][j0 .. j0 + n) as float32: a pointer into x itself for float32 rows,
 * else widened into buf. */
static const float *row_seg(const norm_src *N, const fp8mix_fused_kernels *K, int64_t i, int64_t j0, int64_t n,
                            float *buf)
{
    const uint8_t *row = N->x + (size_t)(i * N->ld_x) * dtype_size(N->xt);
    if (N->xt == FP8MIX_F32) return (const float *)row + j0;
    K->widen(row + (size_t)j0 * dtype_size(N->xt), N->xt, n, buf);
    return buf;
}

/* The 8 lanes of a row sum added in the header's fixed order. */
static double lanes_sum(const double l[8])
{
    double u0 = l[0] + l[4], u1 = l[1] + l[5], u2 = l[2] + l[6], u3 = l[3] + l[7];
    return (u0 + u2) + (u1 + u3);
}

/* sum over the row of x, or of (x - center)^2; segments start at multiples of 8,
 * so element j lands in lane j mod 8. */
static double row_sum(const norm_src *N, const fp8mix_fused_kernels *K, int64_t i, int squares, double center)
{
    double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float buf[FUSED_SEG];
    for (int64_t j = 0; j < N->cols; j += FUSED_SEG) {
        int64_t n = N->cols - j < FUSED_SEG ? N->cols - j : FUSED_SEG;
        K->lane_sums(row_seg(N, K, i, j, n, buf), n, squares, center, l);
    }
    return lanes_sum(l);
}

static void norm_row_begin(const void *ctx, int64_t i)
{
    const norm_src *N = (const norm_src *)ctx;
    if (N->stats_given) return;
    const fp8mix_fused_kernels *K = N->K;
    double mean = 0.0, var = 0.0;
    if (N->cols > 0) {
        if (N->kind == FP8MIX_NORM_LAYER) mean = row_sum(N, K, i, 0, 0.0) / (double)N->cols;
        var = row_sum(N, K, i, 1, mean) / (double)N->cols;
    }
    /* A non-finite row has NaN statistics; which NaN a sum ends with depends on
     * the lanes' order of operations, so give them one bit pattern (its sign
     * would reach the FP8 NaN byte). */
    float m = (float)mean, r = (float)(1.0 / sqrt(var + N->eps));
    if (N->mean) N->mean[i] = m == m ? m : bits_f32(0x7FC00000u);
    N->rstd[i] = r == r ? r : bits_f32(0x7FC00000u);
}

/* RMSNorm is the LayerNorm arithmetic with mean 0: x - 0 is x exactly.  A row
 * with NaN statistics (a non-finite x) is the canonical NaN throughout, so no
 * ISA's choice among NaN operands shows. */
static void norm_produce(const void *ctx, int64_t i, int64_t j0, int64_t n, float *buf)
{
    const norm_src *N = (const norm_src *)ctx;
    const fp8mix_fused_kernels *K = N->K;
    const float m = N->kind == FP8MIX_NORM_LAYER ? N->mean[i] : 0.0f, r = N->rstd[i];
    if (m != m || r != r) {
        for (int64_t t = 0; t < n; t++) buf[t] = bits_f32(0x7FC00000u);
        return;
    }
    const float *v = row_seg(N, K, i, j0, n, buf);
    K->norm_apply(v, n, m, r, N->g ? N->g + j0 : NULL, N->b ? N->b + j0 : NULL, buf);
}

static int valid_dtype(fp8mix_dtype t) { return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16; }

static fp8mix_status check_norm(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                const fp8mix_norm_params *np, const float *mean, const float *rstd)
{
    if (!np) return FP8MIX_ERR_NULL_POINTER;
    if (!valid_dtype(xt) || (np->kind != FP8MIX_NORM_LAYER && np->kind != FP8MIX_NORM_RMS))
        return FP8MIX_ERR_BAD_ENUM;
    if ((np->gamma || np->beta) && !valid_dtype(np->wt)) return FP8MIX_ERR_BAD_ENUM;
    if (!(np->eps >= 0.0f) || isinf(np->eps)) return FP8MIX_ERR_BAD_ARG;
    if (bad_2d(rows, cols, ld_x)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows > 0 && cols > 0 && !x) return FP8MIX_ERR_NULL_POINTER;
    if (rows > 0 && (!rstd || (np->kind == FP8MIX_NORM_LAYER && !mean))) return FP8MIX_ERR_NULL_POINTER;
    return FP8MIX_OK;
}

/* Fill N from the arguments; *owned receives the scale/shift arrays to free. */
static fp8mix_status norm_setup(norm_src *N, float **owned, const void *x, fp8mix_dtype xt, int64_t cols,
                                int64_t ld_x, const fp8mix_norm_params *np, float *mean, float *rstd,
                                int stats_given)
{
    memset(N, 0, sizeof *N);
    N->x = (const uint8_t *)x;
    N->xt = xt;
    N->ld_x = ld_x;
    N->cols = cols;
    N->kind = np->kind;
    N->eps = (double)np->eps;
    N->mean = mean;
    N->rstd = rstd;
    N->stats_given = stats_given != 0;
    N->K = fp8mix_fused_kernels_active();
    *owned = NULL;
    const int want_g = np->gamma != NULL, want_b = np->beta != NULL;
    if (!(want_g || want_b) || cols == 0) return FP8MIX_OK;
    if ((uint64_t)cols > SIZE_MAX / (2 * sizeof(float))) return FP8MIX_ERR_NO_MEMORY;
    float *w = malloc((size_t)cols * 2 * sizeof(float));
    if (!w) return FP8MIX_ERR_NO_MEMORY;
    for (int64_t j = 0; j < cols; j++) {
        if (want_g) {
            float gj = load_f32(np->gamma, np->wt, j);
            w[j] = np->zero_centered_gamma ? 1.0f + gj : gj;
        }
        if (want_b) w[cols + j] = load_f32(np->beta, np->wt, j);
        /* NaN weights as one bit pattern (a NaN times a NaN keeps either operand's) */
        if (want_g && w[j] != w[j]) w[j] = bits_f32(0x7FC00000u);
        if (want_b && w[cols + j] != w[cols + j]) w[cols + j] = bits_f32(0x7FC00000u);
    }
    N->g = want_g ? w : NULL;
    N->b = want_b ? w + cols : NULL;
    *owned = w;
    return FP8MIX_OK;
}

static fp8mix_fused_source norm_source(const norm_src *N, int64_t rows)
{
    fp8mix_fused_source s = {rows, N->cols, N, norm_row_begin, norm_produce};
    return s;
}

fp8mix_status fp8mix_norm_cast(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                               const fp8mix_norm_params *np, float *mean, float *rstd, int stats_given,
                               const fp8mix_fused_out *out, const fp8mix_cast_opts *opts)
{
    fp8mix_status st = check_norm(x, xt, rows, cols, ld_x, np, mean, rstd);
    if (st || (st = fp8mix_fused_check_out(rows, cols, out, opts))) return st;
    norm_src N;
    float *owned;
    if ((st = norm_setup(&N, &owned, x, xt, cols, ld_x, np, mean, rstd, stats_given))) return st;
    fp8mix_fused_source src = norm_source(&N, rows);
    st = fp8mix_fused_cast_run(&src, out, opts);
    free(owned);
    return st;
}

fp8mix_status fp8mix_norm_cast_delayed(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                       int64_t ld_x, const fp8mix_norm_params *np, float *mean, float *rstd,
                                       int stats_given, const fp8mix_fused_out *out,
                                       const fp8mix_delayed_state *sst, int64_t role,
                                       const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                       const fp8mix_cast_opts *opts, float scales[2])
{
    fp8mix_status st = check_norm(x, xt, rows, cols, ld_x, np, mean, rstd);
    if (st) return st;
    norm_src N;
    float *owned;
    if ((st = norm_setup(&N, &owned, x, xt, cols, ld_x, np, mean, rstd, stats_given))) return st;
    fp8mix_fused_source src = norm_source(&N, rows);
    st = fp8mix_fused_cast_delayed_run(&src, out, sst, role, r, fresh_amax, record, opts, scales);
    free(owned);
    return st;
}
