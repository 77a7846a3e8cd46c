/*
 * gemm_check.c — the argument checks of the GEMM entry points (fp8mix_gemm
 * and its oracle fp8mix_gemm_ref): enums, shapes and leading dimensions,
 * pointers, the scale kinds' pairing and every scale's value.  Its own file:
 * both entry points need it, and gemm_ref.c may not call gemm.c (gemm.c ->
 * gemm_blocked.c -> dispatch.c -> gemm_ref.c would close a circle).  Not
 * here: what the GEMM computes (gemm.c).
 */
#include "gemm_internal.h"

static int fmt_ok(fp8mix_format f) { return f == FP8MIX_E4M3 || f == FP8MIX_E5M2; }
static int dtype_ok(fp8mix_dtype t)
{
    return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16;
}
static int kind_ok(fp8mix_mm_scale s)
{
    return s == FP8MIX_MM_SCALE_TENSOR || s == FP8MIX_MM_SCALE_OUTER ||
           s == FP8MIX_MM_SCALE_BLOCK || s == FP8MIX_MM_SCALE_MX;
}

/* Scale counts; only meaningful after the shape checks passed. */
static int64_t scale_a_count(const fp8mix_gemm_args *g)
{
    switch (g->scale_a_kind) {
    case FP8MIX_MM_SCALE_TENSOR: return 1;
    case FP8MIX_MM_SCALE_OUTER: return g->m;
    case FP8MIX_MM_SCALE_MX: return g->m * ceil_div(g->k, FP8MIX_MX_BLOCK);
    default: return g->m * ceil_div(g->k, FP8MIX_BLOCK);
    }
}
static int64_t scale_b_count(const fp8mix_gemm_args *g)
{
    switch (g->scale_b_kind) {
    case FP8MIX_MM_SCALE_TENSOR: return 1;
    case FP8MIX_MM_SCALE_OUTER: return g->n;
    case FP8MIX_MM_SCALE_MX: return g->n * ceil_div(g->k, FP8MIX_MX_BLOCK);
    default: return ceil_div(g->k, FP8MIX_BLOCK) * ceil_div(g->n, FP8MIX_BLOCK);
    }
}

fp8mix_status fp8mix_gemm_check_args(const fp8mix_gemm_args *g)
{
    if (!g) return FP8MIX_ERR_NULL_POINTER;
    if (g->m < 0 || g->n < 0 || g->k < 0) return FP8MIX_ERR_BAD_SHAPE;
    if (!fmt_ok(g->fmt_a) || !fmt_ok(g->fmt_b) || !dtype_ok(g->out_t) ||
        !kind_ok(g->scale_a_kind) || !kind_ok(g->scale_b_kind) ||
        (g->b_layout != FP8MIX_B_KN && g->b_layout != FP8MIX_B_NK) ||
        (g->a_layout != FP8MIX_A_MK && g->a_layout != FP8MIX_A_KM) ||
        (g->accum != FP8MIX_ACCUM_FP32 && g->accum != FP8MIX_ACCUM_FP22) ||
        (g->order != FP8MIX_GEMM_CANONICAL && g->order != FP8MIX_GEMM_NATIVE) ||
        (g->bias && !dtype_ok(g->bias_t)))
        return FP8MIX_ERR_BAD_ENUM;
    if ((g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK) !=
            (g->scale_b_kind == FP8MIX_MM_SCALE_BLOCK) ||
        (g->scale_a_kind == FP8MIX_MM_SCALE_MX) != (g->scale_b_kind == FP8MIX_MM_SCALE_MX) ||
        g->promote_interval < 0)
        return FP8MIX_ERR_BAD_ARG;
    if (g->scale_a_kind == FP8MIX_MM_SCALE_MX && g->accum != FP8MIX_ACCUM_FP32) return FP8MIX_ERR_UNSUPPORTED;
    if ((g->a_layout == FP8MIX_A_MK ? bad_2d(g->m, g->k, g->lda) : bad_2d(g->k, g->m, g->lda)) ||
        bad_2d(g->m, g->n, g->ldo) ||
        (g->b_layout == FP8MIX_B_KN ? bad_2d(g->k, g->n, g->ldb)
                                    : bad_2d(g->n, g->k, g->ldb)))
        return FP8MIX_ERR_BAD_SHAPE;
    if (g->m == 0 || g->n == 0) return FP8MIX_OK;
    /* BLOCK scales with k == 0 have no entries and may be NULL. */
    int64_t na = scale_a_count(g), nb = scale_b_count(g);
    if (!g->out || (na > 0 && !g->scale_a) || (nb > 0 && !g->scale_b) ||
        (g->k > 0 && (!g->a || !g->b)))
        return FP8MIX_ERR_NULL_POINTER;
    if ((na > 0 && fp8mix_scales_bad(g->scale_a, na)) ||
        (nb > 0 && fp8mix_scales_bad(g->scale_b, nb)))
        return FP8MIX_ERR_BAD_SCALE;
    return FP8MIX_OK;
}
