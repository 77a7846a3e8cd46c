/*
 * recipe.c — the per-tensor recipes' state and casts for a linear layer:
 * delayed scaling's amax history (record, rescale, the pending gradient
 * amaxes a forward flushes), the delayed forward cast, and the gradient cast
 * (delayed or current scaling) with the bias gradient's column sums.
 *
 * These run once per tensor role and step, so they are serial over the state;
 * the work over tensors goes to fp8mix_cast / fp8mix_amax (threaded, SIMD).
 * The number rules (history value, scale after a record) are fp8_rules.h's,
 * shared with the CUDA kernels.  Block scaling needs no state: it is
 * fp8mix_quantize_current.
 */
#include <math.h>
#include <stdlib.h>

#include <string.h>

#include "internal.h"

/* ---- checks ----------------------------------------------------------------- */

static fp8mix_status check_state(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                 const fp8mix_delayed_recipe *r)
{
    if (!st || !r || !st->history || !st->scale || !st->steps) return FP8MIX_ERR_NULL_POINTER;
    if (fp8mix_format_max(fmt) == 0.0f || (r->algo != FP8MIX_AMAX_MAX && r->algo != FP8MIX_AMAX_MOST_RECENT))
        return FP8MIX_ERR_BAD_ENUM;
    if (st->roles < 1 || role < 0 || role >= st->roles || st->capacity < 1 || r->history_len < 1 ||
        r->history_len > st->capacity || st->capacity > INT64_MAX / st->roles)
        return FP8MIX_ERR_BAD_SHAPE;
    if (r->margin < 0 || r->margin > 126 || r->interval < 1) return FP8MIX_ERR_BAD_ARG;
    return FP8MIX_OK;
}

static int scale_ok(float s)
{
    uint32_t a = f32_bits(s);
    return !(a >> 31) && a != 0 && (a & 0x7F800000u) != 0x7F800000u;
}

/* ---- history ------------------------------------------------------------------- */

/* max of rows [0, L) (MAX) or row 0 (MOST_RECENT) of the role's column. */
static float history_amax(const fp8mix_delayed_state *st, int64_t role, const fp8mix_delayed_recipe *r)
{
    const float *h = st->history + role;
    if (r->algo == FP8MIX_AMAX_MOST_RECENT) return h[0];
    float a = 0.0f;
    for (int64_t k = 0; k < r->history_len; k++)
        if (h[k * st->roles] > a) a = h[k * st->roles]; /* NaN from a foreign checkpoint: skipped */
    return a;
}

/* The record itself, arguments checked. */
static void record(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                   const fp8mix_delayed_recipe *r, float amax)
{
    const float v = fp8r_history_value(amax);
    float *h = st->history + role;
    const int64_t R = st->roles;
    /* Shift and take the window's max in one strided pass (history_amax's rule: NaN skipped;
     * a max does not depend on the order it is taken in). */
    float a = 0.0f;
    for (int64_t k = r->history_len - 1; k > 0; k--) {
        const float e = h[(k - 1) * R];
        h[k * R] = e;
        if (e > a) a = e;
    }
    h[0] = v;
    if (v > a) a = v;
    if (r->algo == FP8MIX_AMAX_MOST_RECENT) a = v;
    const int64_t steps = ++st->steps[role];
    st->scale[role] = fp8r_delayed_scale(st->scale[role], steps, v, a, r->interval, fp8mix_format_max(fmt),
                                         r->margin, r->pow2);
}

fp8mix_status fp8mix_delayed_record(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                    const fp8mix_delayed_recipe *r, float amax)
{
    fp8mix_status s = check_state(st, role, fmt, r);
    if (s) return s;
    record(st, role, fmt, r, amax);
    return FP8MIX_OK;
}

fp8mix_status fp8mix_delayed_rescale(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                     const fp8mix_delayed_recipe *r)
{
    fp8mix_status s = check_state(st, role, fmt, r);
    if (s) return s;
    float a = history_amax(st, role, r);
    if (a > 0.0f && isfinite(a))
        st->scale[role] = fp8r_scale_from_amax(a, fp8mix_format_max(fmt), r->margin, r->pow2, 0.0f);
    return FP8MIX_OK;
}

fp8mix_status fp8mix_delayed_flush(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                   const fp8mix_delayed_recipe *r, float *pending, int64_t slots,
                                   int64_t *next_slot, int record_, int reserve, float plan[2], int64_t *reserved)
{
    fp8mix_status s = check_state(st, role, fmt, r);
    if (s) return s;
    if (!pending || !next_slot || !plan || (reserve && !reserved)) return FP8MIX_ERR_NULL_POINTER;
    if (slots < 1) return FP8MIX_ERR_BAD_SHAPE;
    if (reserve && !record_) return FP8MIX_ERR_BAD_ARG;
    int64_t head = *next_slot;
    if (head < 0 || head >= slots) head = 0; /* a foreign or corrupted checkpoint: restart the ring */
    if (record_)
        for (int64_t t = 0; t < slots; t++) {
            float *p = &pending[(head + t) % slots];
            if (*p >= 0.0f) { /* filled by a backward (NaN never is: the grad cast stores finite values) */
                record(st, role, fmt, r, *p);
                *p = -1.0f;
            }
        }
    plan[0] = st->scale[role];
    plan[1] = st->steps[role] == 0 ? 1.0f : 0.0f;
    if (reserve) {
        *reserved = head;
        *next_slot = (head + 1) % slots;
    }
    return FP8MIX_OK;
}

/* ---- casts --------------------------------------------------------------------- */

fp8mix_status fp8mix_cast_delayed(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                  uint8_t *q, int64_t ld_q, uint8_t *qt, int64_t ld_qt,
                                  const fp8mix_delayed_state *st, int64_t role, const fp8mix_delayed_recipe *r,
                                  const float *fresh_amax, int record_, const fp8mix_cast_opts *opts,
                                  float scales[2], float *amax)
{
    if (!opts || !scales) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status s = check_state(st, role, opts->fmt, r);
    if (s) return s;
    float sc = st->scale[role];
    if (st->steps[role] == 0) { /* first use: no history yet, scale from the tensor */
        float a0;
        if (fresh_amax) a0 = *fresh_amax;
        else if ((s = fp8mix_amax(x, xt, rows, cols, ld_x, FP8MIX_GRAN_TENSOR, &a0))) return s;
        sc = fp8r_scale_from_amax(a0, fp8mix_format_max(opts->fmt), r->margin, r->pow2, 0.0f);
    }
    float a = 0.0f;
    if ((s = fp8mix_cast(x, xt, rows, cols, ld_x, FP8MIX_GRAN_TENSOR, &sc, q, ld_q, qt, ld_qt, &a, opts)))
        return s;
    scales[0] = sc;
    scales[1] = 1.0f / sc;
    if (amax) *amax = a;
    if (record_) record(st, role, opts->fmt, r, a);
    return FP8MIX_OK;
}

/* acc[j] += row[j], four columns at a time with the compiler's vector
 * extension (GCC does not vectorise the plain loop at -O2): each column
 * still adds its rows in order, so the sums are the scalar loop's. */
typedef float v4f __attribute__((vector_size(16)));

static void add_row_f32(float *acc, const float *row, int64_t cols)
{
    int64_t j = 0;
    for (; j + 4 <= cols; j += 4) {
        v4f a, r;
        memcpy(&a, acc + j, sizeof a);
        memcpy(&r, row + j, sizeof r);
        a = a + r;
        memcpy(acc + j, &a, sizeof a);
    }
    for (; j < cols; j++) acc[j] += row[j];
}

#define COLSUM_STRIP 256 /* columns per task: a 1 KiB accumulator row in L1 */

typedef struct colsum_job {
    const uint8_t *x;
    fp8mix_dtype xt;
    int64_t rows, cols, ld;
    float *colsum;
} colsum_job;

/* Columns [t * COLSUM_STRIP, ...) of every row, rows in order: a strip's sums are the
 * whole loop's, so the split (and the thread count) changes no bit. */
static void colsum_task(void *ctx, int64_t t, int worker)
{
    (void)worker;
    const colsum_job *J = (const colsum_job *)ctx;
    int64_t c0 = t * COLSUM_STRIP, n = J->cols - c0 < COLSUM_STRIP ? J->cols - c0 : COLSUM_STRIP;
    float *acc = J->colsum + c0;
    const size_t es = dtype_size(J->xt);
    for (int64_t j = 0; j < n; j++) acc[j] = 0.0f;
    for (int64_t i = 0; i < J->rows; i++) {
        const uint8_t *row = J->x + ((size_t)i * (size_t)J->ld + (size_t)c0) * es;
        if (J->xt == FP8MIX_F32) {
            add_row_f32(acc, (const float *)row, n);
        } else {
            for (int64_t j = 0; j < n; j++) acc[j] += load_f32(row, J->xt, j);
        }
    }
}

/* colsum[j] = sum_i x[i][j], rows in order. */
static void column_sums(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld, float *colsum)
{
    colsum_job J = {(const uint8_t *)x, xt, rows, cols, ld, colsum};
    int64_t strips = ceil_div(cols, COLSUM_STRIP);
    fp8mix_parallel_for(strips, fp8mix_workers_for(rows * cols, 1 << 17), colsum_task, &J);
}

fp8mix_status fp8mix_cast_grad(const void *dy, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld,
                               uint8_t *q, int64_t ld_q, uint8_t *qt, int64_t ld_qt, const float plan[2],
                               int margin, int pow2, float amax_epsilon, float *pending_slot,
                               const fp8mix_cast_opts *opts, float *scale_inv, float *amax, float *colsum)
{
    if (!opts || !scale_inv) return FP8MIX_ERR_NULL_POINTER;
    float probe = 0.0f, sc;
    fp8mix_status s = fp8mix_compute_scale(&probe, 1, opts->fmt, margin, pow2, amax_epsilon, NULL, NULL);
    if (s) return s;
    if (colsum && cols > 0 && rows > 0 && !dy) return FP8MIX_ERR_NULL_POINTER;
    if (plan && plan[1] == 0.0f) {
        if (!scale_ok(plan[0])) return FP8MIX_ERR_BAD_SCALE;
        sc = plan[0];
    } else {
        float a0;
        if ((s = fp8mix_amax(dy, xt, rows, cols, ld, FP8MIX_GRAN_TENSOR, &a0))) return s;
        sc = fp8r_scale_from_amax(a0, fp8mix_format_max(opts->fmt), margin, pow2, amax_epsilon);
    }
    float a = 0.0f;
    if ((s = fp8mix_cast(dy, xt, rows, cols, ld, FP8MIX_GRAN_TENSOR, &sc, q, ld_q, qt, ld_qt, &a, opts)))
        return s;
    *scale_inv = 1.0f / sc;
    if (amax) *amax = a;
    if (pending_slot) {
        float v = fp8r_history_value(a);
        if (!(*pending_slot >= v)) *pending_slot = v; /* an empty slot (-1) or a smaller amax */
    }
    if (colsum) column_sums(dy, xt, rows, cols, ld, colsum);
    return FP8MIX_OK;
}
