/*
 * stats.c — what a cast lost: counts and error energy of x against its FP8
 * bytes (fp8mix_quant_stats).  Used by the numerics monitor, the gradient
 * scaler's feedback and the automatic format choice.  Sampled, not on the hot
 * path, so there is one portable scalar kernel and no SIMD variant.
 *
 * Rows are split into tasks of STATS_ROWS rows; each task writes its own
 * partial sums and the partials are added in task order, so the doubles are
 * the same for every thread count.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp8mix.h"
#include "internal.h"

#define STATS_ROWS 64
#define STATS_GRAIN (1 << 16)

typedef struct stats_job {
    const uint8_t *x;
    fp8mix_dtype xt;
    size_t esz;
    int64_t rows, cols, ld_x;
    const uint8_t *q;
    int64_t ld_q;
    fp8mix_granularity gran;
    const float *scale_inv;
    const float *table;
    double fmt_max, ovf_bound, min_normal;
    double *part; /* ntasks x FP8MIX_STATS_N */
} stats_job;

/* Running sums of one task: integer counts, two float64 energies. */
typedef struct stats_acc {
    int64_t nz, und, sat, nonfin, ovf, sub;
    double sig, err, mn;
} stats_acc;

/* One segment of a row that shares a single scale: v (already float32), q. */
static void stats_seg(stats_acc *a, const float *v, const uint8_t *q, int64_t n, const stats_job *J, double si)
{
    const float *tab = J->table;
    const float fmax = (float)J->fmt_max, minn = (float)J->min_normal;
    const double bound = J->ovf_bound * si;
    int64_t nz = 0, und = 0, sat = 0, sub = 0, ovf = 0;
    double sig = 0, err = 0, mn = a->mn;
    for (int64_t j = 0; j < n; j++) {
        float x = v[j], ax = fabsf(x);
        float d = tab[q[j]], ad = fabsf(d);
        nz += x != 0;
        if (!(ax <= FLT_MAX)) { a->nonfin++; continue; } /* NaN or inf */
        und += (x != 0) & (d == 0);
        sat += ad == fmax;
        sub += (ad != 0) & (ad < minn);
        ovf += (double)ax > bound;
        if (x != 0 && ax < mn) mn = ax;
        sig += (double)x * (double)x;
        if (ad <= FLT_MAX) {
            double e = (double)x - (double)d * si;
            err += e * e;
        }
    }
    a->nz += nz; a->und += und; a->sat += sat; a->sub += sub; a->ovf += ovf;
    a->sig += sig; a->err += err; a->mn = mn;
}

/* Row segment of any element type to float32 (exact widening). */
static void load_seg(float *dst, const uint8_t *row, fp8mix_dtype t, int64_t j0, int64_t n)
{
    switch (t) {
    case FP8MIX_F32: memcpy(dst, (const float *)row + j0, (size_t)n * sizeof(float)); break;
    case FP8MIX_BF16:
        for (int64_t j = 0; j < n; j++) dst[j] = bf16_to_f32(((const uint16_t *)row)[j0 + j]);
        break;
    default:
        for (int64_t j = 0; j < n; j++) dst[j] = fp8mix_f16_to_f32_ref(((const uint16_t *)row)[j0 + j]);
        break;
    }
}

static void stats_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    stats_job *J = (stats_job *)ctx;
    float buf[FP8MIX_BLOCK];
    stats_acc a = {0, 0, 0, 0, 0, 0, 0.0, 0.0, INFINITY};
    int64_t r0 = task * STATS_ROWS, r1 = r0 + STATS_ROWS < J->rows ? r0 + STATS_ROWS : J->rows;
    for (int64_t i = r0; i < r1; i++) {
        const uint8_t *xr = J->x + (size_t)(i * J->ld_x) * J->esz;
        const uint8_t *qr = J->q + i * J->ld_q;
        /* chunks of FP8MIX_BLOCK columns never straddle a block scale */
        for (int64_t j = 0; j < J->cols; j += FP8MIX_BLOCK) {
            int64_t n = J->cols - j < FP8MIX_BLOCK ? J->cols - j : FP8MIX_BLOCK;
            load_seg(buf, xr, J->xt, j, n);
            stats_seg(&a, buf, qr + j, n, J, (double)J->scale_inv[scale_index(J->gran, i, j, J->cols)]);
        }
    }
    double *s = J->part + task * FP8MIX_STATS_N;
    s[FP8MIX_STATS_NUMEL] = (double)((r1 - r0) * J->cols);
    s[FP8MIX_STATS_NONZERO] = (double)a.nz;
    s[FP8MIX_STATS_UNDERFLOW] = (double)a.und;
    s[FP8MIX_STATS_SATURATED] = (double)a.sat;
    s[FP8MIX_STATS_NONFINITE] = (double)a.nonfin;
    s[FP8MIX_STATS_OVERFLOW] = (double)a.ovf;
    s[FP8MIX_STATS_SUBNORMAL] = (double)a.sub;
    s[FP8MIX_STATS_SIGNAL] = a.sig;
    s[FP8MIX_STATS_NOISE] = a.err;
    s[FP8MIX_STATS_MIN_NONZERO] = a.mn;
}

fp8mix_status fp8mix_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                 int64_t ld_x, const uint8_t *q, int64_t ld_q, fp8mix_format fmt,
                                 fp8mix_granularity gran, const float *scale_inv,
                                 double out[FP8MIX_STATS_N])
{
    if (!out) return FP8MIX_ERR_NULL_POINTER;
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || (xt != FP8MIX_F32 && xt != FP8MIX_BF16 &&
        xt != FP8MIX_F16) || gran < FP8MIX_GRAN_TENSOR || gran > FP8MIX_GRAN_BLOCK2D)
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x) || bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    int empty = rows == 0 || cols == 0;
    if (!empty && (!x || !q || !scale_inv)) return FP8MIX_ERR_NULL_POINTER;
    if (!empty && fp8mix_scales_bad(scale_inv, fp8mix_scale_count(gran, rows, cols))) return FP8MIX_ERR_BAD_SCALE;
    for (int k = 0; k < FP8MIX_STATS_N; k++) out[k] = 0;
    out[FP8MIX_STATS_MIN_NONZERO] = INFINITY;
    if (empty) return FP8MIX_OK;
    int64_t ntasks = ceil_div(rows, STATS_ROWS);
    if ((uint64_t)ntasks > SIZE_MAX / (FP8MIX_STATS_N * sizeof(double))) return FP8MIX_ERR_NO_MEMORY;
    double *part = (double *)malloc((size_t)ntasks * FP8MIX_STATS_N * sizeof(double));
    if (!part) return FP8MIX_ERR_NO_MEMORY;
    stats_job J = {(const uint8_t *)x, xt, dtype_size(xt), rows, cols, ld_x, q, ld_q, gran, scale_inv,
                   fp8mix_decode_table(fmt), (double)fp8mix_format_max(fmt),
                   /* the overflow threshold of the encoder: max + half a step */
                   fmt == FP8MIX_E4M3 ? 464.0 : 59392.0,
                   fmt == FP8MIX_E4M3 ? ldexp(1.0, -6) : ldexp(1.0, -14), part};
    fp8mix_parallel_for(ntasks, fp8mix_workers_for(rows * cols, STATS_GRAIN), stats_task, &J);
    for (int64_t t = 0; t < ntasks; t++) {
        const double *s = part + t * FP8MIX_STATS_N;
        for (int k = 0; k < FP8MIX_STATS_N; k++)
            if (k == FP8MIX_STATS_MIN_NONZERO)
                out[k] = s[k] < out[k] ? s[k] : out[k];
            else
                out[k] += s[k];
    }
    free(part);
    return FP8MIX_OK;
}
