/*
 * cast.c — the casting entry points (cast, amax, quantize_current,
 * dequantize): argument checks, the task split and the fused current-scaling
 * passes, on the active ISA's segment kernels.
 *
 * Work is cut into tasks of TR rows x TC columns; inside a task each row is
 * cut into segments that share one scale (128-column pieces for block
 * granularities) and handed to the active ISA's segment kernel.  amax values
 * are folded with an atomic max over |x|'s bits, so the result is the same
 * for every split and thread count.  Not covered here: the segment kernels
 * (cast_ref.c, x86/cast_*.c) and their choice (dispatch.c), scale arithmetic
 * (scale.c), x^T read from x (cast_t.c), MX (cast_mx.c).
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "internal.h"

#define TC 4096 /* task width in columns (a multiple of FP8MIX_BLOCK) */
#define TR 16   /* task height in rows, no transpose */
#define TTR 64  /* task rows for cast+transpose (qt gets whole 64-byte lines) */
#define TTC 512 /* task columns for cast+transpose (long contiguous reads of x) */
#define TILE_LD (TTC + 16)
#define CAST_GRAIN (1 << 17) /* elements per worker before threads pay off */
#define STREAM_MIN (1 << 21) /* qt bytes from which it is streamed (beyond L2) */

/* ---- shared machinery ----------------------------------------------------- */

static void atomic_max_u32(_Atomic uint32_t *dst, uint32_t v)
{
    uint32_t cur = atomic_load_explicit(dst, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak(dst, &cur, v)) {
    }
}

/* Canonical float from max |x| bits: any NaN becomes the quiet NaN. */
static float amax_from_bits(uint32_t b) { return b > 0x7F800000u ? bits_f32(0x7FC00000u) : bits_f32(b); }

static int valid_dtype(fp8mix_dtype t) { return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16; }
static int valid_gran(fp8mix_granularity g) { return g >= FP8MIX_GRAN_TENSOR && g <= FP8MIX_GRAN_MX; }

/* Segment length from column j within [j, end) under gran. */
static int64_t seg_end(fp8mix_granularity g, int64_t j, int64_t end)
{
    if (g == FP8MIX_GRAN_BLOCK || g == FP8MIX_GRAN_BLOCK2D) {
        int64_t b = (j / FP8MIX_BLOCK + 1) * FP8MIX_BLOCK;
        return b < end ? b : end;
    }
    if (g == FP8MIX_GRAN_MX) {
        int64_t b = (j / FP8MIX_MX_BLOCK + 1) * FP8MIX_MX_BLOCK;
        return b < end ? b : end;
    }
    return end;
}

typedef struct cast_job {
    const uint8_t *x;       /* bytes */
    fp8mix_dtype xt;
    size_t esz;
    int64_t rows, cols, ld_x;
    fp8mix_granularity gran;
    const float *scale;     /* NULL in current mode */
    uint8_t *q;
    int64_t ld_q;
    uint8_t *qt;
    int64_t ld_qt;
    _Atomic uint32_t *amax; /* one per scale in current/amax mode; else 1 or NULL */
    float *scale_inv_out;   /* current mode */
    int current;            /* 1: fused per-segment current scaling (ROW/BLOCK/MX) */
    int amax_only;          /* 1: no cast, per-granularity amax */
    int margin, pow2;
    float eps;
    fp8mix_format fmt;
    fp8_params p;
    uint64_t seed, offset;
    int64_t tr, tc, ntr, ntc;
    int reverse;            /* hand tasks out last first (see fp8mix_quantize_current) */
    int stream;             /* qt is large: write it past the caches           */
    const fp8mix_kernels *k;
} cast_job;

static void cast_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    cast_job *J = (cast_job *)ctx;
    if (J->reverse) task = J->ntr * J->ntc - 1 - task;
    int64_t r0 = (task / J->ntc) * J->tr, c0 = (task % J->ntc) * J->tc;
    int64_t r1 = r0 + J->tr < J->rows ? r0 + J->tr : J->rows;
    int64_t c1 = c0 + J->tc < J->cols ? c0 + J->tc : J->cols;
    /* With a transpose, the tile is encoded into `tile` (its padded stride keeps
     * rows out of the same L1 sets), copied out to q in whole rows and
     * transposed straight into qt, one 16-column group at a time, so that each
     * line of qt is written whole before the next group. */
    uint32_t local = 0;
    /* A per-tensor cast of whole contiguous rows (no transpose): the task's rows as one
     * segment, the same elements with the same scale and random-word offsets, without a
     * kernel call per row (which costs more than the row at small widths). */
    if (!J->qt && !J->current && J->gran == FP8MIX_GRAN_TENSOR && c0 == 0 && c1 == J->cols && r1 > r0 &&
        J->ld_x == J->cols && (!J->q || J->ld_q == J->cols)) {
        const int64_t n = (r1 - r0) * J->cols;
        const uint8_t *xs = J->x + (size_t)(r0 * J->cols) * J->esz;
        if (J->amax_only) {
            uint32_t m = 0;
            J->k->cast_seg(xs, J->xt, n, 1.0f, NULL, &m, &J->p, 0, 0);
            atomic_max_u32(&J->amax[0], m);
            return;
        }
        J->k->cast_seg(xs, J->xt, n, J->scale[0], J->q ? J->q + r0 * J->cols : NULL, &local, &J->p, J->seed,
                       J->offset + (uint64_t)(r0 * J->cols));
        if (J->amax) atomic_max_u32(J->amax, local);
        return;
    }
    uint8_t tile[TTR * TILE_LD];
    int use_scratch = J->qt != NULL;
    for (int64_t i = r0; i < r1; i++) {
        const uint8_t *xrow = J->x + (size_t)(i * J->ld_x) * J->esz;
        /* qrow[j - c0] receives column j */
        uint8_t *qrow = use_scratch ? tile + (i - r0) * TILE_LD
                        : (J->q ? J->q + i * J->ld_q + c0 : NULL);
        if (J->current && J->gran == FP8MIX_GRAN_ROW) {
            /* fused: reduce the whole row, then cast it while it is in cache */
            uint32_t m = 0;
            J->k->cast_seg(xrow, J->xt, J->cols, 1.0f, NULL, &m, &J->p, 0, 0);
            float s, a = amax_from_bits(m);
            fp8mix_compute_scale(&a, 1, J->fmt, J->margin, J->pow2, J->eps, &s, &J->scale_inv_out[i]);
            atomic_store_explicit(&J->amax[i], m, memory_order_relaxed);
            J->k->cast_seg(xrow, J->xt, J->cols, s, qrow, &m, &J->p, J->seed,
                           J->offset + (uint64_t)(i * J->cols));
            continue;
        }
        for (int64_t j = c0; j < c1;) {
            int64_t je = seg_end(J->gran, j, c1);
            int64_t si = scale_index(J->gran, i, j, J->cols);
            const uint8_t *xs = xrow + (size_t)j * J->esz;
            if (J->amax_only) {
                uint32_t m = 0;
                J->k->cast_seg(xs, J->xt, je - j, 1.0f, NULL, &m, &J->p, 0, 0);
                atomic_max_u32(&J->amax[si], m);
            } else if (J->current) { /* BLOCK: one 1x128 tile; MX: one 1x32 block */
                uint32_t m = 0;
                J->k->cast_seg(xs, J->xt, je - j, 1.0f, NULL, &m, &J->p, 0, 0);
                float s, a = amax_from_bits(m);
                if (J->gran == FP8MIX_GRAN_MX)
                    fp8mix_mx_block_scale(m, J->fmt, FP8MIX_MX_RCEIL, J->margin, J->eps, &s, &J->scale_inv_out[si]);
                else
                    fp8mix_compute_scale(&a, 1, J->fmt, J->margin, J->pow2, J->eps, &s, &J->scale_inv_out[si]);
                atomic_store_explicit(&J->amax[si], m, memory_order_relaxed);
                J->k->cast_seg(xs, J->xt, je - j, s, qrow + (j - c0), &m, &J->p, J->seed,
                               J->offset + (uint64_t)(i * J->cols + j));
            } else {
                J->k->cast_seg(xs, J->xt, je - j, J->scale[si], qrow + (j - c0), &local, &J->p, J->seed,
                               J->offset + (uint64_t)(i * J->cols + j));
            }
            j = je;
        }
    }
    if (J->qt) {
        if (J->q)
            for (int64_t i = r0; i < r1; i++)
                memcpy(J->q + i * J->ld_q + c0, tile + (i - r0) * TILE_LD, (size_t)(c1 - c0));
        fp8mix_transpose_u8_tile(tile, TILE_LD, J->qt + c0 * J->ld_qt + r0, J->ld_qt, r1 - r0, c1 - c0,
                                 J->stream);
    }
    if (J->amax && !J->amax_only && !J->current) atomic_max_u32(J->amax, local);
}

static void run_job(cast_job *J)
{
    if (J->qt) {
        J->tr = TTR;
        J->tc = TTC;
    } else {
        J->tr = TR;
        J->tc = TC;
    }
    /* fused ROW tasks own whole rows */
    if (J->current && J->gran == FP8MIX_GRAN_ROW) J->tc = J->cols > 0 ? J->cols : 1;
    J->ntr = ceil_div(J->rows, J->tr);
    J->ntc = ceil_div(J->cols, J->tc);
    J->k = fp8mix_kernels_active();
    J->stream = J->qt && J->rows * J->cols >= STREAM_MIN;
    int64_t ntasks = J->ntr * J->ntc;
    if (ntasks == 0) return;
    int workers = fp8mix_workers_for(J->rows * J->cols * (J->p.stochastic ? 8 : 1), CAST_GRAIN);
    if (J->q) fp8mix_prefault(J->q, (size_t)((J->rows - 1) * J->ld_q + J->cols), workers);
    if (J->qt) fp8mix_prefault(J->qt, (size_t)((J->cols - 1) * J->ld_qt + J->rows), workers);
    fp8mix_parallel_for(ntasks, workers, cast_task, J);
}

static fp8mix_status common_checks(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                   int64_t ld_x, fp8mix_granularity gran)
{
    if (!valid_dtype(xt) || !valid_gran(gran)) return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x)) return FP8MIX_ERR_BAD_SHAPE;
    if (!x && rows > 0 && cols > 0) return FP8MIX_ERR_NULL_POINTER;
    return FP8MIX_OK;
}

static fp8mix_status out_checks(int64_t rows, int64_t cols, const uint8_t *q, int64_t ld_q,
                                const uint8_t *qt, int64_t ld_qt)
{
    if (q && bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    if (qt && bad_2d(cols, rows, ld_qt)) return FP8MIX_ERR_BAD_SHAPE;
    /* an empty tensor needs no output buffer (torch hands out NULL for 0 bytes) */
    if (!q && !qt && rows > 0 && cols > 0) return FP8MIX_ERR_NULL_POINTER;
    return FP8MIX_OK;
}

static void job_init(cast_job *J, const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                     int64_t ld_x, fp8mix_granularity gran)
{
    memset(J, 0, sizeof *J);
    J->x = (const uint8_t *)x;
    J->xt = xt;
    J->esz = dtype_size(xt);
    J->rows = rows;
    J->cols = cols;
    J->ld_x = ld_x;
    J->gran = gran;
}

/* ---- entry points ---------------------------------------------------------- */

/* Task order of a cast pass: a pass that follows a full read of x (current
 * scaling) goes backwards, so that it starts on the part of x that read left
 * in the caches. */
typedef enum task_order { ORDER_FORWARD, ORDER_REVERSE } task_order;

static fp8mix_status cast_impl(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                               fp8mix_granularity gran, const float *scale, uint8_t *q, int64_t ld_q,
                               uint8_t *qt, int64_t ld_qt, float *amax, const fp8mix_cast_opts *opts,
                               task_order order)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if ((st = out_checks(rows, cols, q, ld_q, qt, ld_qt))) return st;
    if (gran == FP8MIX_GRAN_MX && qt) return FP8MIX_ERR_BAD_ARG; /* see fp8mix_quantize_mx */
    cast_job J;
    job_init(&J, x, xt, rows, cols, ld_x, gran);
    if ((st = fp8_params_init(&J.p, opts))) return st;
    int64_t ns = rows && cols ? fp8mix_scale_count(gran, rows, cols) : 0;
    if (ns > 0 && !scale) return FP8MIX_ERR_NULL_POINTER;
    if (fp8mix_scales_bad(scale, ns)) return FP8MIX_ERR_BAD_SCALE;
    _Atomic uint32_t am;
    atomic_init(&am, 0u);
    J.scale = scale;
    J.q = q;
    J.ld_q = ld_q;
    J.qt = qt;
    J.ld_qt = ld_qt;
    J.amax = amax ? &am : NULL;
    J.fmt = opts->fmt;
    J.seed = opts->seed;
    J.offset = opts->offset;
    J.reverse = order == ORDER_REVERSE;
    run_job(&J);
    if (amax) *amax = amax_from_bits(atomic_load(&am));
    return FP8MIX_OK;
}

fp8mix_status fp8mix_cast(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                          fp8mix_granularity gran, const float *scale, uint8_t *q, int64_t ld_q,
                          uint8_t *qt, int64_t ld_qt, float *amax, const fp8mix_cast_opts *opts)
{
    return cast_impl(x, xt, rows, cols, ld_x, gran, scale, q, ld_q, qt, ld_qt, amax, opts, ORDER_FORWARD);
}

/* Per-granularity amax into an atomic bits array (n entries, zeroed here). */
static fp8mix_status amax_bits(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                               int64_t ld_x, fp8mix_granularity gran, _Atomic uint32_t *bits,
                               int64_t n)
{
    for (int64_t t = 0; t < n; t++) atomic_init(&bits[t], 0u);
    cast_job J;
    job_init(&J, x, xt, rows, cols, ld_x, gran);
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    fp8_params_init(&J.p, &o);
    J.amax = bits;
    J.amax_only = 1;
    run_job(&J);
    return FP8MIX_OK;
}

fp8mix_status fp8mix_amax(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                          fp8mix_granularity gran, float *out)
{
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    int64_t n = fp8mix_scale_count(gran, rows, cols);
    if (n > 0 && !out) return FP8MIX_ERR_NULL_POINTER;
    if (n <= 0) return FP8MIX_OK;
    if (rows == 0 || cols == 0) { /* empty tiles have amax 0 */
        for (int64_t t = 0; t < n; t++) out[t] = 0.0f;
        return FP8MIX_OK;
    }
    if ((uint64_t)n > SIZE_MAX / sizeof(uint32_t)) return FP8MIX_ERR_NO_MEMORY;
    _Atomic uint32_t one, *bits = n == 1 ? &one : malloc((size_t)n * sizeof *bits);
    if (!bits) return FP8MIX_ERR_NO_MEMORY;
    amax_bits(x, xt, rows, cols, ld_x, gran, bits, n);
    for (int64_t t = 0; t < n; t++) out[t] = amax_from_bits(atomic_load(&bits[t]));
    if (bits != &one) free(bits);
    return FP8MIX_OK;
}

fp8mix_status fp8mix_quantize_current(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                      int64_t ld_x, fp8mix_granularity gran, int margin, int pow2,
                                      float amax_epsilon, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                      int64_t ld_qt, float *scale_inv, float *amax_out,
                                      const fp8mix_cast_opts *opts)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if ((st = out_checks(rows, cols, q, ld_q, qt, ld_qt))) return st;
    if (gran == FP8MIX_GRAN_MX && qt) return FP8MIX_ERR_BAD_ARG; /* see fp8mix_quantize_mx */
    fp8_params p;
    if ((st = fp8_params_init(&p, opts))) return st;
    float probe = 0.0f;
    /* validates margin / epsilon / format before any work */
    if ((st = fp8mix_compute_scale(&probe, 1, opts->fmt, margin, pow2, amax_epsilon, NULL, NULL)))
        return st;
    int64_t n = fp8mix_scale_count(gran, rows, cols);
    if (n <= 0) return FP8MIX_OK;
    if (rows == 0 || cols == 0) { /* empty tiles: amax 0, scaled by the usual rule */
        float zero = 0.0f, inv0;
        fp8mix_compute_scale(&zero, 1, opts->fmt, margin, pow2, amax_epsilon, NULL, &inv0);
        for (int64_t t = 0; scale_inv && t < n; t++) scale_inv[t] = inv0;
        for (int64_t t = 0; amax_out && t < n; t++) amax_out[t] = 0.0f;
        return FP8MIX_OK;
    }
    if ((uint64_t)n > SIZE_MAX / (2 * sizeof(float))) return FP8MIX_ERR_NO_MEMORY;
    _Atomic uint32_t *bits = malloc((size_t)n * sizeof *bits);
    float *sc = malloc((size_t)n * sizeof(float) * 2);
    if (!bits || !sc) {
        free(bits);
        free(sc);
        return FP8MIX_ERR_NO_MEMORY;
    }
    float *inv = sc + n;
    int fused = !qt && (gran == FP8MIX_GRAN_ROW || gran == FP8MIX_GRAN_BLOCK || gran == FP8MIX_GRAN_MX);
    if (fused) {
        cast_job J;
        job_init(&J, x, xt, rows, cols, ld_x, gran);
        J.p = p;
        J.q = q;
        J.ld_q = ld_q;
        J.amax = bits;
        J.scale_inv_out = inv;
        J.current = 1;
        J.margin = margin;
        J.pow2 = pow2;
        J.eps = amax_epsilon;
        J.fmt = opts->fmt;
        J.seed = opts->seed;
        J.offset = opts->offset;
        for (int64_t t = 0; t < n; t++) atomic_init(&bits[t], 0u);
        run_job(&J);
        for (int64_t t = 0; t < n; t++) sc[t] = amax_from_bits(atomic_load(&bits[t]));
    } else {
        amax_bits(x, xt, rows, cols, ld_x, gran, bits, n);
        for (int64_t t = 0; t < n; t++) sc[t] = amax_from_bits(atomic_load(&bits[t]));
        /* sc holds amax; turn it into scales in place after saving amax */
        if (amax_out) memcpy(amax_out, sc, (size_t)n * sizeof(float));
        fp8mix_compute_scale(sc, n, opts->fmt, margin, pow2, amax_epsilon, sc, inv);
        st = cast_impl(x, xt, rows, cols, ld_x, gran, sc, q, ld_q, qt, ld_qt, NULL, opts, ORDER_REVERSE);
    }
    if (fused && amax_out) memcpy(amax_out, sc, (size_t)n * sizeof(float));
    if (scale_inv && st == FP8MIX_OK) memcpy(scale_inv, inv, (size_t)n * sizeof(float));
    free(bits);
    free(sc);
    return st;
}

typedef struct dq_job {
    const uint8_t *q;
    int64_t rows, cols, ld_q, ld_out;
    fp8mix_granularity gran;
    const float *scale_inv;
    const float *table;
    uint8_t *out;
    fp8mix_dtype out_t;
    size_t esz;
    int64_t ntc;
    const fp8mix_kernels *k;
} dq_job;

static void dq_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    dq_job *J = (dq_job *)ctx;
    int64_t r0 = (task / J->ntc) * TR, c0 = (task % J->ntc) * TC;
    int64_t r1 = r0 + TR < J->rows ? r0 + TR : J->rows;
    int64_t c1 = c0 + TC < J->cols ? c0 + TC : J->cols;
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = c0; j < c1;) {
            int64_t je = seg_end(J->gran, j, c1);
            J->k->dequant_seg(J->q + i * J->ld_q + j, je - j, J->table,
                              J->scale_inv[scale_index(J->gran, i, j, J->cols)],
                              J->out + (size_t)(i * J->ld_out + j) * J->esz, J->out_t);
            j = je;
        }
}

fp8mix_status fp8mix_dequantize(const uint8_t *q, fp8mix_format fmt, int64_t rows, int64_t cols,
                                int64_t ld_q, fp8mix_granularity gran, const float *scale_inv,
                                void *out, fp8mix_dtype out_t, int64_t ld_out)
{
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || !valid_dtype(out_t) || !valid_gran(gran))
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_q) || bad_2d(rows, cols, ld_out)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!q || !out || !scale_inv) return FP8MIX_ERR_NULL_POINTER;
    if (fp8mix_scales_bad(scale_inv, fp8mix_scale_count(gran, rows, cols))) return FP8MIX_ERR_BAD_SCALE;
    dq_job J = {q, rows, cols, ld_q, ld_out, gran, scale_inv, fp8mix_decode_table(fmt),
                (uint8_t *)out, out_t, dtype_size(out_t), ceil_div(cols, TC), fp8mix_kernels_active()};
    int64_t ntasks = ceil_div(rows, TR) * J.ntc;
    int workers = fp8mix_workers_for(rows * cols, CAST_GRAIN);
    fp8mix_prefault(out, (size_t)((rows - 1) * ld_out + cols) * J.esz, workers);
    fp8mix_parallel_for(ntasks, workers, dq_task, &J);
    return FP8MIX_OK;
}
