/*
 * stats.c — what a cast lost, and what the tensor looked like: counts, error
 * energy, power sums and a log2 histogram of x against its FP8 bytes
 * (fp8mix_quant_stats).  The one statistics path of fp8mix: the numerics
 * monitor, the gradient scaler's feedback and the automatic format choice all
 * read it.
 *
 * Layout: the per-segment parameters, the task loop over rows, and the entry
 * point; the segment kernels are stats_ref.c (the oracle) and x86/stats_*.c,
 * chosen in dispatch.c.  The order of the float64 sums is fixed (fp8mix.h): 16
 * lane partials per task, reduced by a fixed tree, tasks added in order, so
 * the doubles are the same for every ISA and thread count.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8mix.h"
#include "internal.h"
#include "stats_kernels.h"

#define STATS_ROWS 64
#define STATS_MAX_TASKS 4096
#define STATS_GRAIN (1 << 16)

/* ---- per-segment parameters ---------------------------------------------- */

/* Parameters of a segment under scale_inv `si` (finite, > 0). */
static void seg_init(fp8mix_stats_seg *s, fp8mix_format fmt, float si, float pivot)
{
    int e4 = fmt == FP8MIX_E4M3;
    s->table = fp8mix_decode_table(fmt);
    s->fmax = fp8mix_format_max(fmt);
    s->min_normal = e4 ? 0x1p-6f : 0x1p-14f;
    s->sinv = (double)si;
    s->pivot = (double)pivot;
    /* the encoder's overflow threshold, max + half a step; the product has at
     * most 24 + 5 significant bits, so it is exact in float64 */
    s->ovf_bound = (e4 ? 464.0 : 59392.0) * (double)si;
    float f = s->ovf_bound > FLT_MAX ? FLT_MAX : (float)s->ovf_bound;
    if ((double)f > s->ovf_bound) f = nextafterf(f, 0.0f);
    s->ovf_f = f;
    s->sinv_frac = frexpf(si, &s->sinv_exp);
    s->sinv_mant = f32_bits(s->sinv_frac) & 0x7FFFFFu;
    s->code_max = e4 ? 0x7E : 0x7B;
    s->code_sub = e4 ? 0x07 : 0x03;
    s->code_nonfin = e4 ? 0x7F : 0x7C;
}

/* ---- tasks ----------------------------------------------------------------- */

typedef struct stats_job {
    const uint8_t *x;
    fp8mix_dtype xt;
    size_t esz;
    int64_t rows, cols, ld_x, rows_per_task;
    const uint8_t *q;
    int64_t ld_q;
    fp8mix_format fmt;
    fp8mix_granularity gran;
    const float *scale_inv;
    int bad_as_one;
    float pivot;
    fp8mix_stats_seg_fn kernel;
    double *part; /* ntasks x FP8MIX_STATS_N */
} stats_job;

/* The fixed reduction tree of the header over one sum's 16 partials. */
static double lanes_sum(const double p[FP8MIX_STATS_LANES])
{
    double u[8], t[4];
    for (int k = 0; k < 8; k++) u[k] = p[k] + p[k + 8];
    for (int k = 0; k < 4; k++) t[k] = u[k] + u[k + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* One task's statistics in the output's layout. */
static void acc_store(const fp8mix_stats_acc *a, int64_t numel, double *s)
{
    for (int k = 0; k < FP8MIX_STATS_N; k++) s[k] = 0;
    s[FP8MIX_STATS_NUMEL] = (double)numel;
    s[FP8MIX_STATS_NONZERO] = (double)a->nonzero;
    s[FP8MIX_STATS_UNDERFLOW] = (double)a->underflow;
    s[FP8MIX_STATS_SATURATED] = (double)a->saturated;
    s[FP8MIX_STATS_NONFINITE] = (double)a->nonfinite;
    s[FP8MIX_STATS_OVERFLOW] = (double)a->overflow;
    s[FP8MIX_STATS_SUBNORMAL] = (double)a->subnormal;
    s[FP8MIX_STATS_NAN] = (double)a->nan;
    s[FP8MIX_STATS_MIN_NONZERO] = (double)bits_f32(a->min_bits);
    s[FP8MIX_STATS_MAX_FINITE] = (double)bits_f32(a->max_bits);
    s[FP8MIX_STATS_SIGNAL] = lanes_sum(a->part[STATS_SUM_SIG]);
    s[FP8MIX_STATS_NOISE] = lanes_sum(a->part[STATS_SUM_E2]);
    s[FP8MIX_STATS_SUM1] = lanes_sum(a->part[STATS_SUM_T1]);
    s[FP8MIX_STATS_SUM2] = lanes_sum(a->part[STATS_SUM_T2]);
    s[FP8MIX_STATS_SUM3] = lanes_sum(a->part[STATS_SUM_T3]);
    s[FP8MIX_STATS_SUM4] = lanes_sum(a->part[STATS_SUM_T4]);
    for (int b = 0; b < FP8MIX_STATS_HIST_BINS; b++) {
        int64_t c = 0;
        for (int k = 0; k < FP8MIX_STATS_HIST_COPIES; k++) c += a->hist[k][b];
        s[FP8MIX_STATS_HIST + b] = (double)c;
    }
}

static void stats_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    const stats_job *J = (const stats_job *)ctx;
    fp8mix_stats_acc acc, *a = &acc; /* ~3 KB */
    memset(a, 0, sizeof acc);
    a->min_bits = 0x7F800000u;
    fp8mix_stats_seg seg;
    float seg_si = 0; /* the scale_inv seg was made for (0: none yet) */
    /* the segment width: one scale per segment, starting at a multiple of 16 */
    int64_t width = J->gran == FP8MIX_GRAN_TENSOR || J->gran == FP8MIX_GRAN_ROW ? J->cols
                    : J->gran == FP8MIX_GRAN_MX ? FP8MIX_MX_BLOCK : FP8MIX_BLOCK;
    int64_t r0 = task * J->rows_per_task;
    int64_t r1 = r0 + J->rows_per_task < J->rows ? r0 + J->rows_per_task : J->rows;
    for (int64_t i = r0; i < r1; i++) {
        const uint8_t *xr = J->x + (size_t)(i * J->ld_x) * J->esz;
        const uint8_t *qr = J->q + i * J->ld_q;
        for (int64_t j = 0; j < J->cols; j += width) {
            int64_t n = J->cols - j < width ? J->cols - j : width;
            float si = J->scale_inv[scale_index(J->gran, i, j, J->cols)];
            if (J->bad_as_one && !(si > 0 && si <= FLT_MAX)) si = 1.0f;
            if (si != seg_si) {
                seg_init(&seg, J->fmt, si, J->pivot);
                seg_si = si;
            }
            J->kernel(a, xr + (size_t)j * J->esz, J->xt, qr + j, n, &seg);
        }
    }
    acc_store(a, (r1 - r0) * J->cols, J->part + task * FP8MIX_STATS_N);
}

/* ---- the entry point -------------------------------------------------------- */

/* The first finite x in row-major order, 0 if none (normally x[0]: the scan
 * is long only for a tensor that is mostly NaN or inf). */
static float first_finite(const uint8_t *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x)
{
    size_t esz = dtype_size(xt);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            float v = load_f32(x + (size_t)(i * ld_x) * esz, xt, j);
            if (fabsf(v) <= FLT_MAX) return v;
        }
    return 0.0f;
}

/* BAD_SCALES, SCALE_INV_MIN and SCALE_INV_MAX of the scale array. */
static void scale_summary(const float *s, int64_t n, double out[FP8MIX_STATS_N])
{
    int64_t bad = 0;
    float lo = INFINITY, hi = 0;
    for (int64_t k = 0; k < n; k++) {
        float v = s[k];
        if (!(v > 0 && v <= FLT_MAX)) {
            bad++;
            continue;
        }
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    out[FP8MIX_STATS_BAD_SCALES] = (double)bad;
    out[FP8MIX_STATS_SCALE_INV_MIN] = (double)lo;
    out[FP8MIX_STATS_SCALE_INV_MAX] = (double)hi;
}

/* The task results added in task order (min / max for MIN_NONZERO / MAX_FINITE). */
static void combine(const double *part, int64_t ntasks, double r[FP8MIX_STATS_N])
{
    for (int k = 0; k < FP8MIX_STATS_N; k++) r[k] = 0;
    r[FP8MIX_STATS_MIN_NONZERO] = INFINITY;
    for (int64_t t = 0; t < ntasks; t++) {
        const double *s = part + t * FP8MIX_STATS_N;
        for (int k = 0; k < FP8MIX_STATS_N; k++) {
            if (k == FP8MIX_STATS_MIN_NONZERO)
                r[k] = s[k] < r[k] ? s[k] : r[k];
            else if (k == FP8MIX_STATS_MAX_FINITE)
                r[k] = s[k] > r[k] ? s[k] : r[k];
            else
                r[k] += s[k];
        }
    }
}

fp8mix_status fp8mix_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                 const uint8_t *q, int64_t ld_q, fp8mix_format fmt, fp8mix_granularity gran,
                                 const float *scale_inv, const fp8mix_stats_opts *opts,
                                 double out[FP8MIX_STATS_N])
{
    if (!out) return FP8MIX_ERR_NULL_POINTER;
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || (xt != FP8MIX_F32 && xt != FP8MIX_BF16 &&
        xt != FP8MIX_F16) || gran < FP8MIX_GRAN_TENSOR || gran > FP8MIX_GRAN_MX)
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x) || bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    int empty = rows == 0 || cols == 0, bad_as_one = opts && opts->bad_scale_as_one;
    if (!empty && (!x || !q || !scale_inv)) return FP8MIX_ERR_NULL_POINTER;
    int64_t ns = empty ? 0 : fp8mix_scale_count(gran, rows, cols);
    if (!bad_as_one && fp8mix_scales_bad(scale_inv, ns)) return FP8MIX_ERR_BAD_SCALE;
    int64_t per = STATS_ROWS * ceil_div(ceil_div(rows, STATS_ROWS), STATS_MAX_TASKS);
    int64_t ntasks = empty ? 0 : ceil_div(rows, per);
    double *part = NULL;
    float pivot = empty ? 0.0f : first_finite((const uint8_t *)x, xt, rows, cols, ld_x);
    if (ntasks) {
        part = (double *)malloc((size_t)ntasks * FP8MIX_STATS_N * sizeof(double));
        if (!part) return FP8MIX_ERR_NO_MEMORY;
        stats_job J = {(const uint8_t *)x, xt, dtype_size(xt), rows, cols, ld_x, per, q, ld_q, fmt, gran,
                       scale_inv, bad_as_one, pivot, fp8mix_stats_kernel_active(), part};
        fp8mix_parallel_for(ntasks, fp8mix_workers_for(rows * cols, STATS_GRAIN), stats_task, &J);
    }
    double r[FP8MIX_STATS_N];
    combine(part, ntasks, r);
    free(part);
    scale_summary(scale_inv, ns, r);
    r[FP8MIX_STATS_PIVOT] = (double)pivot;
    memcpy(out, r, sizeof r);
    return FP8MIX_OK;
}
