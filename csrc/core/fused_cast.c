/*
 * fused_cast.c — the engine of the fused producer casts (fused.h): rows of a
 * source (a norm, an activation) produced in float32 segments and cast to
 * FP8 with the active ISA's segment kernel while they sit in L1.
 *
 * Work is cut into tasks of FUSED_TR whole rows.  Per granularity:
 *   given scales           one pass: produce, cast, fold the amax;
 *   current BLOCK / ROW    one pass: per tile (row) produce, amax, scale, cast
 *                          (a ROW produces its row twice: amax, then cast);
 *   current TENSOR/BLOCK2D two passes: amaxes of every tile, scales, cast.
 * amaxes fold as unsigned maxima of |v|'s bits (atomics across tasks), so no
 * result depends on the split or the thread count.  Not here: what the
 * values are (norm.c, act.c), how bytes are encoded (the cast kernels), which
 * ISA's kernels run (dispatch.c).
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "fused.h"

#define FUSED_TR 16            /* rows per task */
#define FUSED_GRAIN (1 << 15)  /* produced values per worker before threads pay off */

enum { PASS_AMAX = 0, PASS_CAST = 1 };

typedef struct fused_job {
    const fp8mix_fused_source *src;
    const fp8mix_fused_out *out;
    const fp8mix_kernels *k;
    fp8_params p;
    uint64_t seed, offset;
    int pass;
    int first;               /* this pass is the first to visit the rows: call row_begin */
    int write_y;             /* this pass writes out->y */
    const float *scale;      /* scales of the cast pass; NULL: inline current (ROW / BLOCK) */
    _Atomic uint32_t *bits;  /* per-tile max |v| bits */
    float *inv;              /* out->scale_inv for inline current scaling, else NULL */
} fused_job;

static void atomic_max_bits(_Atomic uint32_t *dst, uint32_t v)
{
    uint32_t cur = atomic_load_explicit(dst, memory_order_relaxed);
    while (v > cur && !atomic_compare_exchange_weak(dst, &cur, v)) {
    }
}

static float from_bits(uint32_t b) { return b > 0x7F800000u ? bits_f32(0x7FC00000u) : bits_f32(b); }

static int is_block(fp8mix_granularity g) { return g == FP8MIX_GRAN_BLOCK || g == FP8MIX_GRAN_BLOCK2D; }

/* End of the segment that starts at column j (< cols). */
static int64_t seg_end(fp8mix_granularity g, int64_t j, int64_t cols)
{
    int64_t e = is_block(g) ? (j / FP8MIX_BLOCK + 1) * FP8MIX_BLOCK : j + FUSED_SEG;
    return e < cols ? e : cols;
}

static void store_y(const fp8mix_fused_out *O, int64_t i, int64_t j, int64_t n, const float *buf)
{
    uint8_t *row = (uint8_t *)O->y + (size_t)(i * O->ld_y) * dtype_size(O->yt);
    for (int64_t t = 0; t < n; t++) {
        switch (O->yt) {
        case FP8MIX_F32: ((float *)row)[j + t] = buf[t]; break;
        case FP8MIX_BF16: ((uint16_t *)row)[j + t] = fp8mix_f32_to_bf16_ref(buf[t]); break;
        default: ((uint16_t *)row)[j + t] = fp8mix_f32_to_f16_ref(buf[t]); break;
        }
    }
}

/* max |buf| bits (the cast kernel in amax-only mode). */
static uint32_t seg_amax(const fused_job *J, const float *buf, int64_t n)
{
    uint32_t m = 0;
    J->k->cast_seg(buf, FP8MIX_F32, n, 1.0f, NULL, &m, &J->p, 0, 0);
    return m;
}

/* The scale current scaling gives an amax (fp8mix_compute_scale's rule). */
static float current_scale(const fused_job *J, uint32_t m)
{
    const fp8mix_fused_out *O = J->out;
    return fp8r_scale_from_amax(from_bits(m), fp8mix_format_max(J->p.fmt), O->margin, O->pow2, O->amax_epsilon);
}

static void cast_seg(const fused_job *J, int64_t i, int64_t j, int64_t n, float s, const float *buf, uint32_t *m)
{
    const fp8mix_fused_out *O = J->out;
    J->k->cast_seg(buf, FP8MIX_F32, n, s, O->q + i * O->ld_q + j, m, &J->p, J->seed,
                   J->offset + (uint64_t)(i * J->src->cols + j));
}

/* A ROW under current scaling: amax over the produced row, then the cast. */
static void row_current(const fused_job *J, int64_t i, float *buf)
{
    const fp8mix_fused_source *S = J->src;
    uint32_t m = 0;
    for (int64_t j = 0; j < S->cols;) {
        int64_t je = seg_end(FP8MIX_GRAN_ROW, j, S->cols);
        S->produce(S->ctx, i, j, je - j, buf);
        uint32_t sm = seg_amax(J, buf, je - j);
        m = sm > m ? sm : m;
        j = je;
    }
    float s = current_scale(J, m);
    atomic_store_explicit(&J->bits[i], m, memory_order_relaxed);
    if (J->inv) J->inv[i] = 1.0f / s;
    for (int64_t j = 0; j < S->cols;) {
        int64_t je = seg_end(FP8MIX_GRAN_ROW, j, S->cols);
        uint32_t unused = 0;
        S->produce(S->ctx, i, j, je - j, buf);
        cast_seg(J, i, j, je - j, s, buf, &unused);
        if (J->write_y) store_y(J->out, i, j, je - j, buf);
        j = je;
    }
}

/* One segment of the cast pass: its scale (given, computed, or inline block
 * current scaling), the cast, and the amax it folds. */
static void cast_step(const fused_job *J, int64_t i, int64_t j, int64_t n, const float *buf, uint32_t *local)
{
    const fp8mix_fused_out *O = J->out;
    int64_t si = scale_index(O->gran, i, j, J->src->cols);
    uint32_t m = 0;
    if (J->scale) {
        cast_seg(J, i, j, n, J->scale[si], buf, &m);
    } else { /* BLOCK, current: one 1x128 tile */
        uint32_t a = seg_amax(J, buf, n);
        float s = current_scale(J, a);
        if (J->inv) J->inv[si] = 1.0f / s;
        cast_seg(J, i, j, n, s, buf, &m);
    }
    if (O->gran == FP8MIX_GRAN_TENSOR) *local = m > *local ? m : *local;
    else atomic_max_bits(&J->bits[si], m);
}

static void fused_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    const fused_job *J = (const fused_job *)ctx;
    const fp8mix_fused_source *S = J->src;
    const fp8mix_fused_out *O = J->out;
    int64_t r0 = task * FUSED_TR, r1 = r0 + FUSED_TR < S->rows ? r0 + FUSED_TR : S->rows;
    float buf[FUSED_SEG];
    uint32_t local = 0;
    for (int64_t i = r0; i < r1; i++) {
        if (J->first && S->row_begin) S->row_begin(S->ctx, i);
        if (J->pass == PASS_CAST && !J->scale && O->gran == FP8MIX_GRAN_ROW) {
            row_current(J, i, buf);
            continue;
        }
        for (int64_t j = 0; j < S->cols;) {
            int64_t je = seg_end(O->gran, j, S->cols);
            S->produce(S->ctx, i, j, je - j, buf);
            if (J->pass == PASS_AMAX) {
                uint32_t m = seg_amax(J, buf, je - j);
                if (O->gran == FP8MIX_GRAN_TENSOR) local = m > local ? m : local;
                else atomic_max_bits(&J->bits[scale_index(O->gran, i, j, S->cols)], m);
            } else {
                cast_step(J, i, j, je - j, buf, &local);
            }
            if (J->write_y) store_y(O, i, j, je - j, buf);
            j = je;
        }
    }
    if (O->gran == FP8MIX_GRAN_TENSOR && (J->pass == PASS_AMAX || J->scale)) atomic_max_bits(&J->bits[0], local);
}

static void run_pass(fused_job *J, int pass, int first, int write_y)
{
    J->pass = pass;
    J->first = first;
    J->write_y = write_y;
    const fp8mix_fused_source *S = J->src;
    int64_t ntasks = ceil_div(S->rows, FUSED_TR);
    int workers = fp8mix_workers_for(S->rows * (S->cols > 0 ? S->cols : 1), FUSED_GRAIN);
    fp8mix_parallel_for(ntasks, workers, fused_task, J);
}

fp8mix_status fp8mix_fused_check_out(int64_t rows, int64_t cols, const fp8mix_fused_out *O,
                                      const fp8mix_cast_opts *opts)
{
    if (!O || !opts) return FP8MIX_ERR_NULL_POINTER;
    if (O->gran < FP8MIX_GRAN_TENSOR || O->gran > FP8MIX_GRAN_BLOCK2D) return FP8MIX_ERR_BAD_ENUM;
    fp8_params p;
    fp8mix_status st = fp8_params_init(&p, opts);
    if (st) return st;
    if (rows < 0 || cols < 0) return FP8MIX_ERR_BAD_SHAPE;
    const int nonempty = rows > 0 && cols > 0;
    if (O->qt && !O->q) return FP8MIX_ERR_BAD_ARG;
    if (O->q && bad_2d(rows, cols, O->ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    if (O->qt && bad_2d(cols, rows, O->ld_qt)) return FP8MIX_ERR_BAD_SHAPE;
    if (O->y) {
        if (O->yt != FP8MIX_F32 && O->yt != FP8MIX_BF16 && O->yt != FP8MIX_F16) return FP8MIX_ERR_BAD_ENUM;
        if (bad_2d(rows, cols, O->ld_y)) return FP8MIX_ERR_BAD_SHAPE;
    }
    int64_t n = fp8mix_scale_count(O->gran, rows, cols);
    if (O->scale) {
        if (fp8mix_scales_bad(O->scale, nonempty ? n : 0)) return FP8MIX_ERR_BAD_SCALE;
    } else {
        float probe = 0.0f; /* margin, epsilon and format of the current-scaling rule */
        if ((st = fp8mix_compute_scale(&probe, 1, opts->fmt, O->margin, O->pow2, O->amax_epsilon, NULL, NULL)))
            return st;
    }
    return FP8MIX_OK;
}

/* The outputs of an empty result (no values): amax 0, scales of amax 0. */
static void empty_outputs(const fp8mix_fused_source *src, const fp8mix_fused_out *O, const fp8mix_cast_opts *opts)
{
    for (int64_t i = 0; src->row_begin && i < src->rows; i++) src->row_begin(src->ctx, i);
    int64_t n = fp8mix_scale_count(O->gran, src->rows, src->cols);
    float s0 = fp8r_scale_from_amax(0.0f, fp8mix_format_max(opts->fmt), O->margin, O->pow2, O->amax_epsilon);
    for (int64_t t = 0; t < n; t++) {
        if (O->amax) O->amax[t] = 0.0f;
        if (O->scale_inv) O->scale_inv[t] = 1.0f / (O->scale ? O->scale[t] : s0);
    }
}

/* The cast proper, arguments checked; `visited`: row_begin already ran for every row. */
static fp8mix_status run_checked(const fp8mix_fused_source *src, const fp8mix_fused_out *O,
                                 const fp8mix_cast_opts *opts, int visited)
{
    if (src->rows == 0 || src->cols == 0) {
        if (!visited) empty_outputs(src, O, opts);
        return FP8MIX_OK;
    }
    const int64_t n = fp8mix_scale_count(O->gran, src->rows, src->cols);
    const int two_pass = O->q && !O->scale && (O->gran == FP8MIX_GRAN_TENSOR || O->gran == FP8MIX_GRAN_BLOCK2D);
    if ((uint64_t)n > SIZE_MAX / sizeof(float)) return FP8MIX_ERR_NO_MEMORY;
    _Atomic uint32_t *bits = malloc((size_t)n * sizeof *bits);
    float *sc = two_pass ? malloc((size_t)n * sizeof(float)) : NULL;
    if (!bits || (two_pass && !sc)) {
        free(bits);
        free(sc);
        return FP8MIX_ERR_NO_MEMORY;
    }
    for (int64_t t = 0; t < n; t++) atomic_init(&bits[t], 0u);
    fused_job J;
    memset(&J, 0, sizeof J);
    J.src = src;
    J.out = O;
    J.k = fp8mix_kernels_active();
    fp8_params_init(&J.p, opts);
    J.seed = opts->seed;
    J.offset = opts->offset;
    J.bits = bits;
    const int y = O->y != NULL;
    if (!O->q) { /* amax only */
        run_pass(&J, PASS_AMAX, !visited, y);
    } else if (O->scale) {
        J.scale = O->scale;
        for (int64_t t = 0; O->scale_inv && t < n; t++) O->scale_inv[t] = 1.0f / O->scale[t];
        run_pass(&J, PASS_CAST, !visited, y);
    } else if (two_pass) { /* TENSOR / BLOCK2D current: every amax first */
        run_pass(&J, PASS_AMAX, !visited, 0);
        for (int64_t t = 0; t < n; t++) {
            sc[t] = fp8r_scale_from_amax(from_bits(atomic_load(&bits[t])), fp8mix_format_max(opts->fmt), O->margin,
                                         O->pow2, O->amax_epsilon);
            if (O->scale_inv) O->scale_inv[t] = 1.0f / sc[t];
        }
        J.scale = sc; /* the cast pass folds the same amaxes again: a no-op */
        run_pass(&J, PASS_CAST, 0, y);
    } else { /* ROW / BLOCK current, inline per row or tile */
        J.inv = O->scale_inv;
        run_pass(&J, PASS_CAST, !visited, y);
    }
    if (O->qt) fp8mix_transpose_u8(O->q, O->ld_q, O->qt, O->ld_qt, src->rows, src->cols);
    for (int64_t t = 0; O->amax && t < n; t++) O->amax[t] = from_bits(atomic_load(&bits[t]));
    free(bits);
    free(sc);
    return FP8MIX_OK;
}

fp8mix_status fp8mix_fused_cast_run(const fp8mix_fused_source *src, const fp8mix_fused_out *out,
                                     const fp8mix_cast_opts *opts)
{
    fp8mix_status st = fp8mix_fused_check_out(src->rows, src->cols, out, opts);
    if (st) return st;
    return run_checked(src, out, opts, 0);
}

fp8mix_status fp8mix_fused_cast_delayed_run(const fp8mix_fused_source *src, const fp8mix_fused_out *out,
                                            const fp8mix_delayed_state *st, int64_t role,
                                            const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                            const fp8mix_cast_opts *opts, float scales[2])
{
    if (!out || !opts || !scales) return FP8MIX_ERR_NULL_POINTER;
    if (out->gran != FP8MIX_GRAN_TENSOR || out->scale) return FP8MIX_ERR_BAD_ARG;
    fp8mix_status s = fp8mix_fused_check_out(src->rows, src->cols, out, opts);
    if (s) return s;
    /* The role's scale and whether this is its first use, read without recording
     * (a flush with record = 0 checks the state and the recipe and writes only plan). */
    float plan[2], unused_slot = -1.0f;
    int64_t head = 0;
    if ((s = fp8mix_delayed_flush(st, role, opts->fmt, r, &unused_slot, 1, &head, 0, 0, plan, NULL))) return s;
    float sc = plan[0];
    int visited = 0;
    if (plan[1] == 0.0f && fp8mix_scales_bad(&sc, 1)) return FP8MIX_ERR_BAD_SCALE;
    if (plan[1] != 0.0f) { /* first use: no history yet, scale from the values themselves */
        float a0 = 0.0f;
        if (fresh_amax) {
            a0 = *fresh_amax;
        } else {
            fp8mix_fused_out probe = {FP8MIX_GRAN_TENSOR, NULL, 0, 0, 0.0f, NULL, 0, NULL, 0, NULL, &a0,
                                      NULL, FP8MIX_F32, 0};
            if ((s = run_checked(src, &probe, opts, 0))) return s;
            visited = 1;
        }
        sc = fp8r_scale_from_amax(a0, fp8mix_format_max(opts->fmt), r->margin, r->pow2, 0.0f);
    }
    float a = 0.0f;
    fp8mix_fused_out o = *out;
    o.scale = &sc;
    o.amax = &a;
    if ((s = run_checked(src, &o, opts, visited))) return s;
    scales[0] = sc;
    scales[1] = 1.0f / sc;
    if (out->amax) *out->amax = a;
    if (record) return fp8mix_delayed_record(st, role, opts->fmt, r, a);
    return FP8MIX_OK;
}
