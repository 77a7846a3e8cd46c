/*
 * gemm_grouped.c — the grouped GEMM of mixture-of-experts layers
 * (fp8mix_gemm_grouped): the rows of A cut into consecutive groups, each
 * multiplied by its own B with its own scales, in one call.
 *
 * Each group is fp8mix_gemm on that group's slice of every operand, so a
 * group's rows are bit for bit what a single GEMM of the group gives (the
 * header's promise; same order, same kernels, the same result for every
 * thread count).  Every group's arguments are checked before any is
 * computed, so an error leaves the output untouched.
 */
#include "gemm_internal.h"

/* The arguments of group g (rows [r0, r1)) as a plain GEMM. */
static fp8mix_gemm_args group_args(const fp8mix_gemm_args *G, int64_t g, int64_t r0, int64_t r1,
                                   int64_t stride_b)
{
    fp8mix_gemm_args a = *G;
    int64_t k = G->k, n = G->n;
    a.m = r1 - r0;
    a.a = G->a ? G->a + (G->a_layout == FP8MIX_A_MK ? r0 * G->lda : r0) : NULL;
    a.b = G->b ? G->b + g * stride_b : NULL;
    switch (G->scale_a_kind) {
    case FP8MIX_MM_SCALE_TENSOR: a.scale_a = G->scale_a ? G->scale_a + g : NULL; break;
    case FP8MIX_MM_SCALE_OUTER: a.scale_a = G->scale_a ? G->scale_a + r0 : NULL; break;
    case FP8MIX_MM_SCALE_MX: a.scale_a = G->scale_a ? G->scale_a + r0 * ceil_div(k, FP8MIX_MX_BLOCK) : NULL; break;
    default: a.scale_a = G->scale_a ? G->scale_a + r0 * ceil_div(k, FP8MIX_BLOCK) : NULL; break;
    }
    switch (G->scale_b_kind) {
    case FP8MIX_MM_SCALE_TENSOR: a.scale_b = G->scale_b ? G->scale_b + g : NULL; break;
    case FP8MIX_MM_SCALE_OUTER: a.scale_b = G->scale_b ? G->scale_b + g * n : NULL; break;
    case FP8MIX_MM_SCALE_MX: a.scale_b = G->scale_b ? G->scale_b + g * n * ceil_div(k, FP8MIX_MX_BLOCK) : NULL; break;
    default:
        a.scale_b = G->scale_b ? G->scale_b + g * ceil_div(k, FP8MIX_BLOCK) * ceil_div(n, FP8MIX_BLOCK) : NULL;
        break;
    }
    if (G->bias) a.bias = (const uint8_t *)G->bias + (size_t)(g * n) * dtype_size(G->bias_t);
    a.out = G->out ? (uint8_t *)G->out + (size_t)(r0 * G->ldo) * dtype_size(G->out_t) : NULL;
    return a;
}

fp8mix_status fp8mix_gemm_grouped(const fp8mix_gemm_args *args, int64_t groups, const int64_t *offs,
                                  int64_t stride_b)
{
    if (!args) return FP8MIX_ERR_NULL_POINTER;
    if (groups < 0 || stride_b < 0) return FP8MIX_ERR_BAD_ARG;
    if (groups > 0 && !offs) return FP8MIX_ERR_NULL_POINTER;
    if (args->m < 0) return FP8MIX_ERR_BAD_SHAPE;
    int64_t prev = 0;
    for (int64_t g = 0; g < groups; g++) {
        if (offs[g] < prev) return FP8MIX_ERR_BAD_ARG; /* negative group size */
        prev = offs[g];
    }
    if (prev != args->m) return FP8MIX_ERR_BAD_ARG; /* the groups must cover A's rows exactly */
    /* B_g must not overlap the next one: its extent in elements */
    int64_t b_extent = 0; /* an empty B (k or n zero) has none */
    if (args->k > 0 && args->n > 0)
        b_extent = args->b_layout == FP8MIX_B_KN ? (args->k - 1) * args->ldb + args->n
                                                 : (args->n - 1) * args->ldb + args->k;
    if (groups > 1 && stride_b < b_extent) return FP8MIX_ERR_BAD_SHAPE;
    for (int pass = 0; pass < 2; pass++) { /* pass 0 checks every group, pass 1 computes */
        int64_t r0 = 0;
        for (int64_t g = 0; g < groups; g++) {
            fp8mix_gemm_args a = group_args(args, g, r0, offs[g], stride_b);
            fp8mix_status st = pass == 0 ? fp8mix_gemm_check_args(&a) : (a.m ? fp8mix_gemm(&a) : FP8MIX_OK);
            if (st) return st;
            r0 = offs[g];
        }
    }
    return FP8MIX_OK;
}

/* The arguments of group g of a grouped-K GEMM (contraction range [k0, k1)) as a plain GEMM. */
static fp8mix_gemm_args group_k_args(const fp8mix_gemm_args *G, int64_t g, int64_t k0, int64_t k1,
                                     int64_t stride_out)
{
    fp8mix_gemm_args a = *G;
    a.k = k1 - k0;
    a.a = G->a ? G->a + (G->a_layout == FP8MIX_A_MK ? k0 : k0 * G->lda) : NULL;
    a.b = G->b ? G->b + (G->b_layout == FP8MIX_B_KN ? k0 * G->ldb : k0) : NULL;
    const int64_t per_a = G->scale_a_kind == FP8MIX_MM_SCALE_OUTER ? G->m : 1;
    const int64_t per_b = G->scale_b_kind == FP8MIX_MM_SCALE_OUTER ? G->n : 1;
    a.scale_a = G->scale_a ? G->scale_a + g * per_a : NULL;
    a.scale_b = G->scale_b ? G->scale_b + g * per_b : NULL;
    if (G->bias) a.bias = (const uint8_t *)G->bias + (size_t)(g * G->n) * dtype_size(G->bias_t);
    a.out = G->out ? (uint8_t *)G->out + (size_t)(g * stride_out) * dtype_size(G->out_t) : NULL;
    return a;
}

fp8mix_status fp8mix_gemm_grouped_k(const fp8mix_gemm_args *args, int64_t groups, const int64_t *offs,
                                    int64_t stride_out)
{
    if (!args) return FP8MIX_ERR_NULL_POINTER;
    if (groups < 0 || stride_out < 0) return FP8MIX_ERR_BAD_ARG;
    if (groups > 0 && !offs) return FP8MIX_ERR_NULL_POINTER;
    if (args->k < 0 || args->m < 0 || args->n < 0) return FP8MIX_ERR_BAD_SHAPE;
    for (int k = 0; k < 2; k++) {
        fp8mix_mm_scale kind = k ? args->scale_b_kind : args->scale_a_kind;
        if (kind != FP8MIX_MM_SCALE_TENSOR && kind != FP8MIX_MM_SCALE_OUTER) return FP8MIX_ERR_UNSUPPORTED;
    }
    int64_t prev = 0;
    for (int64_t g = 0; g < groups; g++) {
        if (offs[g] < prev) return FP8MIX_ERR_BAD_ARG;
        prev = offs[g];
    }
    if (prev != args->k) return FP8MIX_ERR_BAD_ARG;
    const int64_t out_extent = args->m > 0 && args->n > 0 ? (args->m - 1) * args->ldo + args->n : 0;
    if (groups > 1 && stride_out < out_extent) return FP8MIX_ERR_BAD_SHAPE; /* outputs must not overlap */
    for (int pass = 0; pass < 2; pass++) {
        int64_t k0 = 0;
        for (int64_t g = 0; g < groups; g++) {
            fp8mix_gemm_args a = group_k_args(args, g, k0, offs[g], stride_out);
            fp8mix_status st = pass == 0 ? fp8mix_gemm_check_args(&a) : fp8mix_gemm(&a);
            if (st) return st;
            k0 = offs[g];
        }
    }
    return FP8MIX_OK;
}
