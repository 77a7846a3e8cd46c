/*
 * cast_grouped.c — the per-tensor casts of grouped linear layers
 * (mixture-of-experts experts): a tensor's rows cut into consecutive groups,
 * each cast with its own per-tensor scale, in one call.
 *
 * Each group is the single-tensor entry point on that group's rows (its q
 * rows, its qt columns), so a group's bytes, scales and amax are bit for bit
 * what that entry point gives the group alone; state roles are role0 +
 * g * role_step.  Every group's shape is checked before any is cast.
 */
#include <float.h>
#include <string.h>

#include "internal.h"

/* offs: groups non-decreasing row ends finishing at rows. */
static fp8mix_status check_offs(int64_t rows, int64_t groups, const int64_t *offs)
{
    if (groups < 0 || rows < 0) return FP8MIX_ERR_BAD_ARG;
    if (groups > 0 && !offs) return FP8MIX_ERR_NULL_POINTER;
    int64_t prev = 0;
    for (int64_t g = 0; g < groups; g++) {
        if (offs[g] < prev) return FP8MIX_ERR_BAD_ARG;
        prev = offs[g];
    }
    return prev == rows ? FP8MIX_OK : FP8MIX_ERR_BAD_ARG;
}

/* Group g's options: stochastic rounding takes the words a cast of the whole tensor gives its rows. */
static fp8mix_cast_opts group_opts(const fp8mix_cast_opts *o, int64_t r0, int64_t cols)
{
    fp8mix_cast_opts go = *o;
    go.offset = o->offset + (uint64_t)r0 * (uint64_t)cols;
    return go;
}

static fp8mix_status check_common(const void *x, int64_t rows, int64_t cols, int64_t ld_x, int64_t groups,
                                  const int64_t *offs, const uint8_t *q, int64_t ld_q, const uint8_t *qt,
                                  int64_t ld_qt, const fp8mix_cast_opts *opts)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status s = check_offs(rows, groups, offs);
    if (s) return s;
    if (cols < 0 || ld_x < (cols > 0 ? cols : 1) || (q && ld_q < (cols > 0 ? cols : 1)) ||
        (qt && ld_qt < (rows > 0 ? rows : 1)))
        return FP8MIX_ERR_BAD_SHAPE;
    if (rows > 0 && cols > 0 && (!x || (!q && !qt))) return FP8MIX_ERR_NULL_POINTER;
    return FP8MIX_OK;
}

fp8mix_status fp8mix_quantize_current_grouped(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                              int64_t ld_x, int64_t groups, const int64_t *offs, int margin,
                                              int pow2, float amax_epsilon, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                              int64_t ld_qt, float *scale_inv, float *amax_out,
                                              const fp8mix_cast_opts *opts)
{
    fp8mix_status s = check_common(x, rows, cols, ld_x, groups, offs, q, ld_q, qt, ld_qt, opts);
    if (s) return s;
    float probe = 0.0f;
    if ((s = fp8mix_compute_scale(&probe, 1, opts->fmt, margin, pow2, amax_epsilon, NULL, NULL))) return s;
    int64_t r0 = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t m = offs[g] - r0, esz = dtype_size(xt);
        const fp8mix_cast_opts go = group_opts(opts, r0, cols);
        s = fp8mix_quantize_current(x ? (const uint8_t *)x + (size_t)(r0 * ld_x) * esz : NULL, xt, m, cols, ld_x,
                                    FP8MIX_GRAN_TENSOR, margin, pow2, amax_epsilon, q ? q + r0 * ld_q : NULL, ld_q,
                                    qt ? qt + r0 : NULL, ld_qt, scale_inv ? scale_inv + g : NULL,
                                    amax_out ? amax_out + g : NULL, &go);
        if (s) return s;
        r0 = offs[g];
    }
    return FP8MIX_OK;
}

fp8mix_status fp8mix_cast_delayed_grouped(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                          int64_t groups, const int64_t *offs, uint8_t *q, int64_t ld_q,
                                          uint8_t *qt, int64_t ld_qt, const fp8mix_delayed_state *st,
                                          int64_t role0, int64_t role_step, const fp8mix_delayed_recipe *r,
                                          int record, const fp8mix_cast_opts *opts, float *scales, float *amax)
{
    fp8mix_status s = check_common(x, rows, cols, ld_x, groups, offs, q, ld_q, qt, ld_qt, opts);
    if (s) return s;
    if (!st || !r || !scales) return FP8MIX_ERR_NULL_POINTER;
    if (groups > 0 && (role0 < 0 || role_step < 0 || role0 + (groups - 1) * role_step >= st->roles))
        return FP8MIX_ERR_BAD_SHAPE;
    int64_t r0 = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t m = offs[g] - r0, role = role0 + g * role_step;
        if (m == 0) { /* an empty group: nothing cast, nothing recorded */
            if (!st->scale) return FP8MIX_ERR_NULL_POINTER;
            scales[2 * g] = st->scale[role];
            scales[2 * g + 1] = 1.0f / st->scale[role];
            if (amax) amax[g] = 0.0f;
            continue;
        }
        const fp8mix_cast_opts go = group_opts(opts, r0, cols);
        s = fp8mix_cast_delayed((const uint8_t *)x + (size_t)(r0 * ld_x) * dtype_size(xt), xt, m, cols, ld_x,
                                q ? q + r0 * ld_q : NULL, ld_q, qt ? qt + r0 : NULL, ld_qt, st, role, r, NULL,
                                record, &go, scales + 2 * g, amax ? amax + g : NULL);
        if (s) return s;
        r0 = offs[g];
    }
    return FP8MIX_OK;
}

fp8mix_status fp8mix_cast_grad_grouped(const void *dy, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld,
                                       int64_t groups, const int64_t *offs, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                       int64_t ld_qt, const float *plans, int margin, int pow2, float amax_epsilon,
                                       float *pending, int64_t pending_slots, const int64_t *slots,
                                       const fp8mix_cast_opts *opts, float *scale_inv, float *amax, float *colsum)
{
    fp8mix_status s = check_common(dy, rows, cols, ld, groups, offs, q, ld_q, qt, ld_qt, opts);
    if (s) return s;
    if (!scale_inv) return FP8MIX_ERR_NULL_POINTER;
    if ((pending == NULL) != (slots == NULL)) return FP8MIX_ERR_NULL_POINTER;
    if (pending) {
        if (pending_slots < 1) return FP8MIX_ERR_BAD_SHAPE;
        for (int64_t g = 0; g < groups; g++)
            if (slots[g] < 0 || slots[g] >= pending_slots) return FP8MIX_ERR_BAD_SHAPE;
    }
    for (int64_t g = 0; g < groups && plans; g++) /* every plan checked before any group is cast */
        if (plans[2 * g + 1] == 0.0f && !(plans[2 * g] > 0.0f && plans[2 * g] <= FLT_MAX))
            return FP8MIX_ERR_BAD_SCALE;
    float probe = 0.0f;
    if ((s = fp8mix_compute_scale(&probe, 1, opts->fmt, margin, pow2, amax_epsilon, NULL, NULL))) return s;
    int64_t r0 = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t m = offs[g] - r0;
        const fp8mix_cast_opts go = group_opts(opts, r0, cols);
        if (m == 0) { /* an empty group: no gradient, its bias gradient +0, its pending slot untouched */
            scale_inv[g] = 1.0f;
            if (amax) amax[g] = 0.0f;
            if (colsum) memset(colsum + g * cols, 0, (size_t)cols * sizeof(float));
            continue;
        }
        s = fp8mix_cast_grad((const uint8_t *)dy + (size_t)(r0 * ld) * dtype_size(xt), xt, m, cols, ld,
                             q ? q + r0 * ld_q : NULL, ld_q, qt ? qt + r0 : NULL, ld_qt, plans ? plans + 2 * g : NULL,
                             margin, pow2, amax_epsilon, pending ? pending + g * pending_slots + slots[g] : NULL,
                             &go, scale_inv + g, amax ? amax + g : NULL, colsum ? colsum + g * cols : NULL);
        if (s) return s;
        r0 = offs[g];
    }
    return FP8MIX_OK;
}

fp8mix_status fp8mix_delayed_flush_grouped(const fp8mix_delayed_state *st, int64_t role0, int64_t role_step,
                                           int64_t groups, fp8mix_format fmt, const fp8mix_delayed_recipe *r,
                                           float *pending, int64_t slots, int64_t *next_slot, int record,
                                           int reserve, float *plans, int64_t *reserved)
{
    if (!st || !pending || !next_slot || !plans || (reserve && !reserved)) return FP8MIX_ERR_NULL_POINTER;
    if (groups < 0 || slots < 1) return FP8MIX_ERR_BAD_ARG;
    if (groups > 0 && (role0 < 0 || role_step < 0 || role0 + (groups - 1) * role_step >= st->roles))
        return FP8MIX_ERR_BAD_SHAPE;
    for (int64_t g = 0; g < groups; g++) {
        fp8mix_status s = fp8mix_delayed_flush(st, role0 + g * role_step, fmt, r, pending + g * slots, slots,
                                               next_slot + g, record, reserve, plans + 2 * g,
                                               reserved ? reserved + g : NULL);
        if (s) return s;
    }
    return FP8MIX_OK;
}
