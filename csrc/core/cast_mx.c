/*
 * cast_mx.c — MX quantisation (OCP Microscaling v1.0, MXFP8;
 * fp8mix_quantize_mx): one power-of-two scale per 1x32 block, row-wise and,
 * for the wgrad operand, transposed (a second quantisation of x^T read from x).
 *
 * The row-wise quantisation is cast.c's fused current-scaling path with
 * GRAN_MX (one 32-element segment per block, the active ISA's segment kernel,
 * bit-exact to the scalar one).  The transposed quantisation gathers each
 * column piece of 32 rows into a float32 buffer (exact: every input type
 * widens exactly) and runs the same segment kernel on it, so qt is what the
 * row-wise path gives for the transpose.  Not here: the block scale rule
 * (scale.c's fp8mix_mx_block_scale), the GEMM with MX scales (gemm_mx.c).
 */
#include <stdlib.h>

#include "internal.h"

#define MX FP8MIX_MX_BLOCK
#define T_COLS 64          /* columns of x per transposed task */
#define MX_GRAIN (1 << 17) /* elements per worker before threads pay off */

/* ---- the transposed quantisation ------------------------------------------ */

typedef struct mxt_job {
    const uint8_t *x;
    fp8mix_dtype xt;
    size_t esz;
    int64_t rows, cols, ld_x;
    fp8mix_mx_rule rule;
    int margin;
    float eps;
    uint8_t *qt;
    int64_t ld_qt;
    float *sinv_t; /* cols x ceil(rows/32) */
    int64_t ncb;   /* column groups of T_COLS */
    fp8_params p;
    uint64_t seed, offset;
    const fp8mix_kernels *k;
} mxt_job;

/* One 32-row stripe of x over T_COLS columns: each column piece is one MX
 * block of qt's row j. */
static void mxt_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    const mxt_job *J = (const mxt_job *)ctx;
    int64_t r0 = (task / J->ncb) * MX, c0 = (task % J->ncb) * T_COLS;
    int64_t r1 = r0 + MX < J->rows ? r0 + MX : J->rows;
    int64_t c1 = c0 + T_COLS < J->cols ? c0 + T_COLS : J->cols;
    int64_t len = r1 - r0, nkb = ceil_div(J->rows, MX);
    float buf[T_COLS][MX];
    for (int64_t i = r0; i < r1; i++) { /* rows of x are contiguous: read them whole */
        const uint8_t *xrow = J->x + (size_t)(i * J->ld_x) * J->esz;
        for (int64_t j = c0; j < c1; j++) buf[j - c0][i - r0] = load_f32(xrow, J->xt, j);
    }
    for (int64_t j = c0; j < c1; j++) {
        uint32_t m = 0;
        J->k->cast_seg(buf[j - c0], FP8MIX_F32, len, 1.0f, NULL, &m, &J->p, 0, 0);
        float s, sinv;
        fp8mix_mx_block_scale(m, J->p.fmt, J->rule, J->margin, J->eps, &s, &sinv);
        if (J->sinv_t) J->sinv_t[j * nkb + r0 / MX] = sinv;
        J->k->cast_seg(buf[j - c0], FP8MIX_F32, len, s, J->qt + j * J->ld_qt + r0, &m, &J->p, J->seed,
                       J->offset + (uint64_t)(j * J->rows + r0));
    }
}

static void quantize_mx_t(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                          fp8mix_mx_rule rule, int margin, float eps, uint8_t *qt, int64_t ld_qt, float *sinv_t,
                          const fp8mix_cast_opts *opts, const fp8_params *p)
{
    mxt_job J = {(const uint8_t *)x, xt, dtype_size(xt), rows, cols, ld_x, rule, margin, eps, qt, ld_qt, sinv_t,
                 ceil_div(cols, T_COLS), *p, opts->seed, opts->offset, fp8mix_kernels_active()};
    int64_t ntasks = ceil_div(rows, MX) * J.ncb;
    int workers = fp8mix_workers_for(rows * cols * (p->stochastic ? 8 : 1), MX_GRAIN);
    fp8mix_parallel_for(ntasks, workers, mxt_task, &J);
}

fp8mix_status fp8mix_quantize_mx(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                 fp8mix_mx_rule rule, int margin, float amax_epsilon, uint8_t *q,
                                 int64_t ld_q, float *scale_inv, uint8_t *qt, int64_t ld_qt,
                                 float *scale_inv_t, float *amax_out, const fp8mix_cast_opts *opts)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    if ((xt != FP8MIX_F32 && xt != FP8MIX_BF16 && xt != FP8MIX_F16) ||
        (rule != FP8MIX_MX_RCEIL && rule != FP8MIX_MX_FLOOR))
        return FP8MIX_ERR_BAD_ENUM;
    fp8_params p;
    fp8mix_status st = fp8_params_init(&p, opts);
    if (st) return st;
    if (margin < 0 || margin > 126 || !(amax_epsilon >= 0.0f) || amax_epsilon > 3.4028234663852886e38f)
        return FP8MIX_ERR_BAD_ARG;
    if (bad_2d(rows, cols, ld_x) || (q && bad_2d(rows, cols, ld_q)) || (qt && bad_2d(cols, rows, ld_qt)))
        return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!x || (!q && !qt) || (q && !scale_inv) || (qt && !scale_inv_t)) return FP8MIX_ERR_NULL_POINTER;
    if (q || amax_out) { /* the row-wise blocks: cast.c's fused path (rule and margin below) */
        if (rule == FP8MIX_MX_RCEIL) {
            st = fp8mix_quantize_current(x, xt, rows, cols, ld_x, FP8MIX_GRAN_MX, margin, 1, amax_epsilon, q,
                                         ld_q, NULL, 0, scale_inv, amax_out, opts);
        } else { /* FLOOR: amax per block, then the cast with the FLOOR scales */
            int64_t n = fp8mix_scale_count(FP8MIX_GRAN_MX, rows, cols);
            float *am = malloc((size_t)n * 2 * sizeof(float));
            if (!am) return FP8MIX_ERR_NO_MEMORY;
            float *sc = am + n;
            st = fp8mix_amax(x, xt, rows, cols, ld_x, FP8MIX_GRAN_MX, am);
            for (int64_t t = 0; st == FP8MIX_OK && t < n; t++) {
                float sinv;
                fp8mix_mx_block_scale(f32_bits(am[t]) & 0x7FFFFFFFu, opts->fmt, rule, margin, amax_epsilon, &sc[t],
                                      &sinv);
                if (scale_inv) scale_inv[t] = sinv;
                if (amax_out) amax_out[t] = am[t];
            }
            if (st == FP8MIX_OK && q)
                st = fp8mix_cast(x, xt, rows, cols, ld_x, FP8MIX_GRAN_MX, sc, q, ld_q, NULL, 0, NULL, opts);
            free(am);
        }
        if (st) return st;
    }
    if (qt) quantize_mx_t(x, xt, rows, cols, ld_x, rule, margin, amax_epsilon, qt, ld_qt, scale_inv_t, opts, &p);
    return FP8MIX_OK;
}
