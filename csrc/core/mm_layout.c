/*
 * mm_layout.c — layout decisions on sizes and strides, as checked host-only
 * functions: the layout rules of cuBLASLt's FP8 matmul (fp8mix_mm_layout_plan;
 * the rules R1-R9 are listed in fp8mix.h), and the torch layer's own choices
 * (fp8mix_gemm_operand_layout: how fp8mix_gemm reads two strided operands;
 * fp8mix_mm_scale_kinds: each operand's scale kind, stated or inferred from the
 * shapes; fp8mix_quantize_current_read: a 1x128-block cast read through its
 * transpose).  Plain C with no CUDA headers, so every build compiles it and the CPU
 * tests exercise it with the shapes fp8mix's modules produce; the CUDA op
 * (csrc/cuda/scaled_mm.cu) only carries a plan out, csrc/torch only converts
 * tensors to these arguments and error codes to messages.
 * Not here: anything that touches memory (no function here reads data).
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

/* ---- the op layer's decisions (fp8mix.h: "the op layer's GEMM and cast decisions") ---- */

static int strided_ok(const fp8mix_strided2d *t)
{
    return t->rows >= 0 && t->cols >= 0 && t->stride0 >= 0 && t->stride1 >= 0;
}

fp8mix_status fp8mix_gemm_operand_layout(const fp8mix_strided2d *a, const fp8mix_strided2d *b,
                                         fp8mix_gemm_operands *out)
{
    if (!a || !b || !out) return FP8MIX_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (!strided_ok(a) || !strided_ok(b) || a->cols != b->rows) return FP8MIX_ERR_BAD_SHAPE;
    const int64_t m = a->rows, k = a->cols, n = b->cols;
    /* A: row-major (M, K), or column-major (a transposed view, wgrad's dy^T): read in place */
    if (a->stride1 == 1 && (m <= 1 || a->stride0 >= k)) {
        out->a_layout = FP8MIX_A_MK;
        out->lda = (m > 1 && k > 0) ? a->stride0 : (k > 0 ? k : 1);
    } else if (m > 1 && k > 1 && a->stride0 == 1 && a->stride1 >= m) {
        out->a_layout = FP8MIX_A_KM;
        out->lda = a->stride1;
    } else {
        out->a_layout = FP8MIX_A_MK;
        out->lda = k > 0 ? k : 1;
        out->copy_a = 1;
    }
    /* B: column-major (K, N) is the transposed row-major weight torch._scaled_mm
     * wants; row-major (K, N) is read in place too */
    if (b->stride0 == 1 && (n <= 1 || b->stride1 >= k) && k > 0) {
        out->b_layout = FP8MIX_B_NK;
        out->ldb = n > 1 ? b->stride1 : k;
    } else if (b->stride1 == 1 && (k <= 1 || b->stride0 >= n) && n > 0) {
        out->b_layout = FP8MIX_B_KN;
        out->ldb = k > 1 ? b->stride0 : n;
    } else {
        out->b_layout = FP8MIX_B_KN;
        out->ldb = n > 0 ? n : 1;
        out->copy_b = 1;
    }
    return FP8MIX_OK;
}

static int given_ok(const fp8mix_mm_scale_given *g)
{
    return g->dim >= 0 && g->numel >= 0 && (g->dim != 2 || (g->rows >= 0 && g->cols >= 0));
}

/* One operand's kind (outer: M for a, N for b); is_a picks the OUTER layout. */
static fp8mix_mm_scale_error operand_kind(const fp8mix_mm_scale_given *g, int64_t outer, int is_a, int block_mode,
                                          fp8mix_mm_backend backend, fp8mix_mm_scale *kind)
{
    const int tensor = g->numel == 1 && g->dim <= 2;
    const int outer_ok = g->dim == 2 && (is_a ? (g->rows == outer && g->cols == 1) : (g->rows == 1 && g->cols == outer));
    if (g->kind == FP8MIX_MM_SCALE_MX) { /* (outer, ceil(K/32)) on either side: K blocks are the pair's check */
        if (backend != FP8MIX_MM_BACKEND_CPU) return FP8MIX_MM_SCALE_NO_MX;
        if (!(g->dim == 2 && g->rows == outer)) return FP8MIX_MM_SCALE_NOT_KIND;
        *kind = FP8MIX_MM_SCALE_MX;
        return FP8MIX_MM_SCALE_FITS;
    }
    if (g->kind >= 0) {
        if (g->kind > FP8MIX_MM_SCALE_BLOCK) return FP8MIX_MM_SCALE_BAD_KIND;
        const int ok = g->kind == FP8MIX_MM_SCALE_TENSOR ? tensor
                       : g->kind == FP8MIX_MM_SCALE_OUTER ? outer_ok
                                                          : block_mode;
        if (!ok) return FP8MIX_MM_SCALE_NOT_KIND;
        *kind = (fp8mix_mm_scale)g->kind;
        return FP8MIX_MM_SCALE_FITS;
    }
    if (block_mode) *kind = FP8MIX_MM_SCALE_BLOCK;
    else if (tensor) *kind = FP8MIX_MM_SCALE_TENSOR;
    else if (outer_ok) *kind = FP8MIX_MM_SCALE_OUTER;
    else return FP8MIX_MM_SCALE_NO_FIT;
    return FP8MIX_MM_SCALE_FITS;
}

fp8mix_status fp8mix_mm_scale_kinds(const fp8mix_mm_scale_query *q, fp8mix_mm_scale_choice *out)
{
    if (!q || !out) return FP8MIX_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (q->backend != FP8MIX_MM_BACKEND_CPU && q->backend != FP8MIX_MM_BACKEND_CUBLASLT) return FP8MIX_ERR_BAD_ENUM;
    if (q->m < 0 || q->n < 0 || q->k < 0 || !given_ok(&q->a) || !given_ok(&q->b)) return FP8MIX_ERR_BAD_SHAPE;
    const fp8mix_mm_scale_given *a = &q->a, *b = &q->b;
    if ((a->kind < 0) != (b->kind < 0)) {
        out->pair = FP8MIX_MM_SCALE_HALF_GIVEN;
        return FP8MIX_ERR_BAD_ARG;
    }
    const int64_t kb = cdiv64(q->k, FP8MIX_BLOCK), nb = cdiv64(q->n, FP8MIX_BLOCK);
    const int block_shapes = a->dim == 2 && b->dim == 2 && a->rows == q->m && a->cols == kb && b->rows == kb &&
                             b->cols == nb;
    const int block_mode = a->kind >= 0 ? a->kind == FP8MIX_MM_SCALE_BLOCK && block_shapes
                                        : block_shapes && !(a->numel == 1 && b->numel == 1);
    out->err_a = operand_kind(a, q->m, 1, block_mode, q->backend, &out->kind_a);
    out->err_b = operand_kind(b, q->n, 0, block_mode, q->backend, &out->kind_b);
    if (out->err_a != FP8MIX_MM_SCALE_FITS || out->err_b != FP8MIX_MM_SCALE_FITS) return FP8MIX_ERR_BAD_ARG;
    if (out->kind_a == FP8MIX_MM_SCALE_MX || out->kind_b == FP8MIX_MM_SCALE_MX) {
        const int64_t k32 = cdiv64(q->k, 32);
        if (!(out->kind_a == out->kind_b && a->cols == k32 && b->cols == k32)) {
            out->pair = FP8MIX_MM_SCALE_MX_PAIR;
            return FP8MIX_ERR_BAD_ARG;
        }
    }
    return FP8MIX_OK;
}

fp8mix_status fp8mix_quantize_current_read(int64_t ndim, const fp8mix_strided2d *x, int64_t gran,
                                           unsigned outputs, fp8mix_quantize_read *out)
{
    if (!out || (ndim == 2 && !x)) return FP8MIX_ERR_NULL_POINTER;
    memset(out, 0, sizeof *out);
    if (ndim < 0 || (ndim == 2 && !strided_ok(x))) return FP8MIX_ERR_BAD_SHAPE;
    /* x = y.t() with y row-major: block scaling's wgrad operands x^T and dy^T,
     * whose 1x128 tiles run down y's columns, read without a contiguous copy */
    if (gran == FP8MIX_GRAN_BLOCK && outputs == FP8MIX_OUT_Q && ndim == 2 && x->rows > 1 && x->cols > 1 &&
        x->stride0 == 1 && x->stride1 >= x->rows) {
        out->source = FP8MIX_READ_TRANSPOSED;
        out->rows = x->cols;
        out->cols = x->rows;
        out->ld = x->stride1;
    }
    return FP8MIX_OK;
}
