/*
 * act.c — an MLP's activation written directly as FP8 (fp8mix_act_cast and
 * its delayed-scaling variant): gelu (tanh form), relu, silu, quick gelu,
 * squared relu and their gated forms, computed in float32 segments that the
 * fused engine (fused_cast.c) casts while they are in cache.  A gated row
 * reads its two halves in place (no copy of either).  Not here: the
 * activation arithmetic (the active ISA's kernel: fused_ref.c, x86/fused_*.c;
 * the formulas are in fused_ref.c), the activation's backward (torch, from the
 * saved input).
 */

#include "fused.h"

typedef struct act_src {
    const uint8_t *h;
    fp8mix_dtype ht;
    int64_t ld_h, cols; /* cols: produced values per row (F) */
    fp8mix_act_kind act;
    int gated;
    const fp8mix_fused_kernels *K;
} act_src;

/* h[i][j0 .. j0 + n) as float32: a pointer into h for float32 rows, else widened into dst. */
static const float *load_seg(const act_src *A, const fp8mix_fused_kernels *K, int64_t i, int64_t j0, int64_t n,
                             float *dst)
{
    const uint8_t *row = A->h + (size_t)(i * A->ld_h) * dtype_size(A->ht);
    if (A->ht == FP8MIX_F32) return (const float *)row + j0;
    K->widen(row + (size_t)j0 * dtype_size(A->ht), A->ht, n, dst);
    return dst;
}

static void act_produce(const void *ctx, int64_t i, int64_t j0, int64_t n, float *buf)
{
    const act_src *A = (const act_src *)ctx;
    const fp8mix_fused_kernels *K = A->K;
    float bb[FUSED_SEG];
    const float *a = load_seg(A, K, i, j0, n, buf);
    const float *b = A->gated ? load_seg(A, K, i, A->cols + j0, n, bb) : NULL;
    K->act(A->act, a, b, n, buf);
}

static fp8mix_status act_setup(act_src *A, const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in,
                               int64_t ld_h, fp8mix_act_kind act)
{
    int gated = fp8mix_act_gated(act);
    if (gated < 0 || (ht != FP8MIX_F32 && ht != FP8MIX_BF16 && ht != FP8MIX_F16)) return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols_in, ld_h) || (gated && cols_in % 2)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows > 0 && cols_in > 0 && !h) return FP8MIX_ERR_NULL_POINTER;
    A->h = (const uint8_t *)h;
    A->ht = ht;
    A->ld_h = ld_h;
    A->cols = gated ? cols_in / 2 : cols_in;
    A->act = act;
    A->gated = gated;
    A->K = fp8mix_fused_kernels_active();
    return FP8MIX_OK;
}

fp8mix_status fp8mix_act_cast(const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in, int64_t ld_h,
                              fp8mix_act_kind act, const fp8mix_fused_out *out, const fp8mix_cast_opts *opts)
{
    act_src A;
    fp8mix_status st = act_setup(&A, h, ht, rows, cols_in, ld_h, act);
    if (st) return st;
    fp8mix_fused_source src = {rows, A.cols, &A, NULL, act_produce};
    return fp8mix_fused_cast_run(&src, out, opts);
}

fp8mix_status fp8mix_act_cast_delayed(const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in,
                                      int64_t ld_h, fp8mix_act_kind act, const fp8mix_fused_out *out,
                                      const fp8mix_delayed_state *st, int64_t role,
                                      const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                      const fp8mix_cast_opts *opts, float scales[2])
{
    act_src A;
    fp8mix_status s = act_setup(&A, h, ht, rows, cols_in, ld_h, act);
    if (s) return s;
    fp8mix_fused_source src = {rows, A.cols, &A, NULL, act_produce};
    return fp8mix_fused_cast_delayed_run(&src, out, st, role, r, fresh_amax, record, opts, scales);
}
