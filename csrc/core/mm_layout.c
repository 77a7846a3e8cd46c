/*
 * mm_layout.c — the layout rules of cuBLASLt's FP8 matmul as one checked,
 * host-only function (fp8mix_mm_layout_plan; the rules R1-R9 are listed in
 * fp8mix.h).  Plain C with no CUDA headers, so every build compiles it and the CPU
 * tests exercise it with the shapes fp8mix's modules produce; the CUDA op
 * (csrc/cuda/scaled_mm.cu) only carries a plan out.
 * Not here: anything that touches memory (the plan reads no data).
 */
#include <string.h>

#include "fp8mix.h"

#define MM_ALIGN 256 /* scratch sub-buffers start on 256-byte boundaries */

static int64_t ru(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
static int64_t cdiv64(int64_t a, int64_t b) { return (a + b - 1) / b; }
static size_t dt_size(fp8mix_dtype t) { return t == FP8MIX_F32 ? 4 : 2; }
static int aligned16(uint64_t addr) { return (addr & 15u) == 0; }
static int valid_fmt(fp8mix_format f) { return f == FP8MIX_E4M3 || f == FP8MIX_E5M2; }
static int valid_dt(fp8mix_dtype t) { return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16; }
static int valid_kind(fp8mix_mm_scale s) { return s >= FP8MIX_MM_SCALE_TENSOR && s <= FP8MIX_MM_SCALE_BLOCK; }

const char *fp8mix_mm_rule_string(fp8mix_mm_rule r)
{
    switch (r) {
    case FP8MIX_MM_RULE_OK: return "no rule violated";
    case FP8MIX_MM_RULE_ARCH: return "cuBLASLt FP8 matmul needs compute capability 8.9 or newer";
    case FP8MIX_MM_RULE_FORMATS: return "there is no E5M2 x E5M2 FP8 tensor-core kernel (use E4M3 for one operand)";
    case FP8MIX_MM_RULE_SCALE_ARCH:
        return "row-wise (OUTER_VEC_32F) and 128-block (VEC128/BLK128x128) scales exist only on compute capability 9.x";
    case FP8MIX_MM_RULE_SCALE_VERSION: return "row-wise and 128-block scales need cuBLASLt 12.9 or newer";
    case FP8MIX_MM_RULE_SCALE_MIX: return "128-block scales of one operand need 128-block scales of the other";
    case FP8MIX_MM_RULE_SHAPE: return "a size or stride is out of range";
    }
    return "unknown rule";
}

/* Size checks that make every later product fit in int64 / size_t: each padded
 * size <= 2^40 and each padded matrix below 2^60 elements. */
static int shape_ok(const fp8mix_mm_problem *p)
{
    const int64_t lim = (int64_t)1 << 40, big = (int64_t)1 << 60;
    if (p->m < 1 || p->n < 1 || p->k < 1 || p->m > lim || p->n > lim || p->k > lim) return 0;
    const int64_t mp = ru(p->m, 16), np = ru(p->n, 16), kp = ru(p->k, 16);
    if (mp > big / kp || np > big / kp || mp > big / np) return 0;
    return p->a_stride0 >= 0 && p->a_stride1 >= 0 && p->b_stride0 >= 0 && p->b_stride1 >= 0;
}

/* R1-R3 for a (rows = M, K-contiguous when stride along K is 1): in place, or how
 * it is copied; *ld is the leading dimension cuBLASLt gets. */
static fp8mix_mm_copy operand_copy(int64_t rows, int64_t rows_p, int64_t k, int64_t kp, int64_t s_row,
                                   int64_t s_k, uint64_t addr, int64_t *ld)
{
    const int k_contig = s_k == 1 || k == 1;
    const int64_t ld_given = rows > 1 ? s_row : kp;
    if (k_contig && rows == rows_p && k == kp && ld_given >= k && ld_given % 16 == 0 && aligned16(addr)) {
        *ld = ld_given;
        return FP8MIX_MM_IN_PLACE;
    }
    *ld = kp;
    /* a K-contiguous source whose rows do not overlap is a padded copy; anything
     * else (the other layout, or odd strides) is a transposing gather */
    return k_contig && (rows <= 1 || s_row >= k) ? FP8MIX_MM_COPY_PAD : FP8MIX_MM_COPY_TRANSPOSE;
}

static fp8mix_mm_scale_map map_vec(int64_t len, int64_t valid, int broadcast, int repack)
{
    fp8mix_mm_scale_map s = {repack, 1, len, 1, valid, 0, broadcast ? 0 : 1};
    return s;
}

/* R6 / R7: the scale arrays cuBLASLt reads and whether they must be rewritten. */
static void plan_scales(const fp8mix_mm_problem *p, fp8mix_mm_plan *pl)
{
    const fp8mix_mm_scale ka = p->scale_a_kind, kb = p->scale_b_kind;
    if (ka == FP8MIX_MM_SCALE_BLOCK) {
        const int64_t nkb = cdiv64(p->k, FP8MIX_BLOCK), nnb = cdiv64(p->n, FP8MIX_BLOCK);
        pl->kind = FP8MIX_MM_SCALE_BLOCK;
        /* given sa: (M, nkb) dense, sa[i * nkb + kb]; given sb: (nkb, nnb), sb[kb * nnb + nb] */
        fp8mix_mm_scale_map sa = {1, nkb, pl->mp, nkb, p->m, 1, nkb};
        fp8mix_mm_scale_map sb = {1, cdiv64(pl->np, FP8MIX_BLOCK), ru(nkb, 4), nnb, nkb, 1, nnb};
        pl->sa = sa;
        pl->sb = sb;
    } else if (ka == FP8MIX_MM_SCALE_TENSOR && kb == FP8MIX_MM_SCALE_TENSOR) {
        pl->kind = FP8MIX_MM_SCALE_TENSOR;
        pl->sa = map_vec(1, 1, 1, 0);
        pl->sb = map_vec(1, 1, 1, 0);
    } else { /* OUTER, a TENSOR partner expanded */
        pl->kind = FP8MIX_MM_SCALE_OUTER;
        const int a_t = ka == FP8MIX_MM_SCALE_TENSOR, b_t = kb == FP8MIX_MM_SCALE_TENSOR;
        pl->sa = map_vec(pl->mp, p->m, a_t, a_t || !aligned16(p->sa_addr));
        pl->sb = map_vec(pl->np, p->n, b_t, b_t || pl->np != p->n || !aligned16(p->sb_addr));
    }
}

/* R9 and the output: where cuBLASLt writes, whether a bias-add kernel follows. */
static void plan_output(const fp8mix_mm_problem *p, fp8mix_mm_plan *pl)
{
    pl->bias_epilogue = p->has_bias && p->bias_t == p->out_t && p->out_t != FP8MIX_F32 &&
                        pl->kind == FP8MIX_MM_SCALE_TENSOR;
    pl->copy_bias = pl->bias_epilogue && (pl->np != p->n || !aligned16(p->bias_addr));
    pl->bias_add = p->has_bias && !pl->bias_epilogue;
    pl->d_t = pl->bias_add ? FP8MIX_F32 : p->out_t;
    /* out is M x N with row stride N: cuBLASLt can write it only unpadded, aligned
     * and of its own type (an F32 accumulator is then updated in place) */
    const int fits = pl->mp == p->m && pl->np == p->n && aligned16(p->out_addr) &&
                     ((size_t)p->n * dt_size(p->out_t)) % 16 == 0;
    pl->d_in_scratch = !(fits && pl->d_t == p->out_t);
}

static size_t take(size_t *at, size_t bytes)
{
    size_t off = *at;
    *at += (bytes + MM_ALIGN - 1) / MM_ALIGN * MM_ALIGN;
    return off;
}

/* Scratch layout: workspace first, then each copy the plan asks for. */
static void plan_scratch(const fp8mix_mm_problem *p, fp8mix_mm_plan *pl)
{
    size_t at = 0;
    pl->workspace_bytes = FP8MIX_MM_WORKSPACE;
    pl->off_ws = take(&at, pl->workspace_bytes);
    pl->off_a = pl->copy_a != FP8MIX_MM_IN_PLACE ? take(&at, (size_t)(pl->mp * pl->kp)) : 0;
    pl->off_b = pl->copy_b != FP8MIX_MM_IN_PLACE ? take(&at, (size_t)(pl->np * pl->kp)) : 0;
    pl->off_sa = pl->sa.repack ? take(&at, (size_t)(pl->sa.rows * pl->sa.cols) * 4) : 0;
    pl->off_sb = pl->sb.repack ? take(&at, (size_t)(pl->sb.rows * pl->sb.cols) * 4) : 0;
    pl->off_bias = pl->copy_bias ? take(&at, (size_t)pl->np * dt_size(p->bias_t)) : 0;
    pl->off_d = pl->d_in_scratch ? take(&at, (size_t)(pl->mp * pl->np) * dt_size(pl->d_t)) : 0;
    pl->scratch_bytes = at;
}

/* The rules that refuse a problem outright (R4-R6); OK when none does. */
static fp8mix_mm_rule refusal(const fp8mix_mm_problem *p)
{
    if (p->sm < 89) return FP8MIX_MM_RULE_ARCH;
    if (p->fmt_a == FP8MIX_E5M2 && p->fmt_b == FP8MIX_E5M2) return FP8MIX_MM_RULE_FORMATS;
    if (p->scale_a_kind != FP8MIX_MM_SCALE_TENSOR || p->scale_b_kind != FP8MIX_MM_SCALE_TENSOR) {
        if (p->sm / 10 != 9) return FP8MIX_MM_RULE_SCALE_ARCH;
        if (p->blas_version < 120900) return FP8MIX_MM_RULE_SCALE_VERSION;
    }
    return FP8MIX_MM_RULE_OK;
}

fp8mix_status fp8mix_mm_layout_plan(const fp8mix_mm_problem *p, fp8mix_mm_plan *pl)
{
    if (!p || !pl) return FP8MIX_ERR_NULL_POINTER;
    memset(pl, 0, sizeof *pl);
    if (!valid_fmt(p->fmt_a) || !valid_fmt(p->fmt_b) || !valid_dt(p->out_t) || !valid_kind(p->scale_a_kind) ||
        !valid_kind(p->scale_b_kind) || (p->has_bias && !valid_dt(p->bias_t)))
        return FP8MIX_ERR_BAD_ENUM;
    if (!shape_ok(p)) {
        pl->rule = FP8MIX_MM_RULE_SHAPE;
        return FP8MIX_ERR_BAD_SHAPE;
    }
    if ((p->scale_a_kind == FP8MIX_MM_SCALE_BLOCK) != (p->scale_b_kind == FP8MIX_MM_SCALE_BLOCK)) {
        pl->rule = FP8MIX_MM_RULE_SCALE_MIX;
        return FP8MIX_ERR_BAD_ARG;
    }
    pl->rule = refusal(p);
    if (pl->rule != FP8MIX_MM_RULE_OK) return FP8MIX_ERR_UNSUPPORTED;
    const int block = p->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    pl->mp = block ? ru(p->m, 4) : p->m;
    pl->np = ru(p->n, 16);
    pl->kp = ru(p->k, block ? FP8MIX_BLOCK : 16);
    pl->copy_a = operand_copy(p->m, pl->mp, p->k, pl->kp, p->a_stride0, p->a_stride1, p->a_addr, &pl->lda);
    pl->copy_b = operand_copy(p->n, pl->np, p->k, pl->kp, p->b_stride1, p->b_stride0, p->b_addr, &pl->ldb);
    plan_scales(p, pl);
    plan_output(p, pl);
    pl->fast_accum = p->fast_accum && !block;
    plan_scratch(p, pl);
    return FP8MIX_OK;
}
