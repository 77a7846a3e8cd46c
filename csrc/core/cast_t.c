/*
 * cast_t.c — current-scaling quantisation of x^T in 1x128 tiles, read from a
 * row-major x (fp8mix_quantize_current_t): block scaling's wgrad operands (x^T
 * and dy^T, whose tiles run along the tokens) without a transposed float32 copy.
 *
 * A task reads a 128-row stripe of x over T_COLS columns into a float32
 * buffer, transposed (the active ISA's widen_t kernel; exact: every input type
 * widens exactly to float32),
 * then each buffered column is one 1x128 tile of x^T: its amax and its cast run
 * through the active ISA's segment kernel as cast.c's fused BLOCK path does on a
 * row, so the bytes, scales and random words are those of fp8mix_quantize_current
 * on a contiguous copy of x^T (tests/c/test_cast.c and tests/test_cast.py
 * compare them).  Not covered: other granularities (TENSOR has cast+transpose),
 * the kernels themselves (cast_ref.c, x86/) and their choice (dispatch.c).
 */
#include <string.h>

#include "internal.h"

#define BLK FP8MIX_BLOCK   /* rows of x per tile of x^T */
#define T_COLS 64          /* columns of x per task      */
#define T_GRAIN (1 << 17)  /* elements per worker before threads pay off */

typedef struct ct_job {
    const uint8_t *x;
    fp8mix_dtype xt;
    int64_t rows, cols, ld_x;
    int margin, pow2;
    float eps;
    uint8_t *qt;
    int64_t ld_qt;
    float *sinv_t, *amax_t; /* cols x ceil(rows / 128); amax_t may be NULL */
    int64_t ncb, nkb;
    fp8_params p;
    uint64_t seed, offset;
    const fp8mix_kernels *k;
} ct_job;

static void ct_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    const ct_job *J = (const ct_job *)ctx;
    int64_t r0 = (task / J->ncb) * BLK, c0 = (task % J->ncb) * T_COLS;
    int64_t len = J->rows - r0 < BLK ? J->rows - r0 : BLK;
    int64_t w = J->cols - c0 < T_COLS ? J->cols - c0 : T_COLS;
    float buf[T_COLS][BLK];
    J->k->widen_t(J->x + (size_t)(r0 * J->ld_x + c0) * dtype_size(J->xt), J->xt, J->ld_x, len, w, &buf[0][0], BLK);
    for (int64_t j = 0; j < w; j++) {
        int64_t col = c0 + j, t = col * J->nkb + r0 / BLK;
        uint32_t m = 0;
        J->k->cast_seg(buf[j], FP8MIX_F32, len, 1.0f, NULL, &m, &J->p, 0, 0);
        float s, a = m > 0x7F800000u ? bits_f32(0x7FC00000u) : bits_f32(m); /* any NaN: the quiet NaN */
        fp8mix_compute_scale(&a, 1, J->p.fmt, J->margin, J->pow2, J->eps, &s, &J->sinv_t[t]);
        if (J->amax_t) J->amax_t[t] = a;
        J->k->cast_seg(buf[j], FP8MIX_F32, len, s, J->qt + col * J->ld_qt + r0, &m, &J->p, J->seed,
                       J->offset + (uint64_t)(col * J->rows + r0));
    }
}

fp8mix_status fp8mix_quantize_current_t(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                        fp8mix_granularity gran, int margin, int pow2, float amax_epsilon,
                                        uint8_t *qt, int64_t ld_qt, float *scale_inv_t, float *amax_out_t,
                                        const fp8mix_cast_opts *opts)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    if ((xt != FP8MIX_F32 && xt != FP8MIX_BF16 && xt != FP8MIX_F16) || gran < FP8MIX_GRAN_TENSOR ||
        gran > FP8MIX_GRAN_MX)
        return FP8MIX_ERR_BAD_ENUM;
    if (gran != FP8MIX_GRAN_BLOCK) return FP8MIX_ERR_BAD_ARG;
    if (bad_2d(rows, cols, ld_x) || bad_2d(cols, rows, ld_qt)) return FP8MIX_ERR_BAD_SHAPE;
    fp8_params p;
    fp8mix_status st = fp8_params_init(&p, opts);
    if (st) return st;
    float probe = 0.0f; /* validates margin / epsilon before any work */
    if ((st = fp8mix_compute_scale(&probe, 1, opts->fmt, margin, pow2, amax_epsilon, NULL, NULL))) return st;
    if (rows == 0 || cols == 0) return FP8MIX_OK; /* x^T has no tile */
    if (!x || !qt || !scale_inv_t) return FP8MIX_ERR_NULL_POINTER;
    ct_job J = {(const uint8_t *)x, xt, rows, cols, ld_x, margin, pow2, amax_epsilon, qt, ld_qt, scale_inv_t,
                amax_out_t, ceil_div(cols, T_COLS), ceil_div(rows, BLK), p, opts->seed, opts->offset,
                fp8mix_kernels_active()};
    int workers = fp8mix_workers_for(rows * cols * (p.stochastic ? 8 : 1), T_GRAIN);
    fp8mix_prefault(qt, (size_t)((cols - 1) * ld_qt + rows), workers);
    fp8mix_parallel_for(ceil_div(rows, BLK) * J.ncb, workers, ct_task, &J);
    return FP8MIX_OK;
}
