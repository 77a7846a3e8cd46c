/*
 * gemm.c — the scaled FP8 GEMM: out = (A * scale_a) @ (B * scale_b) + bias.
 *
 * Covers: the numerics contract (below), argument checks, the scalar
 * reference fp8mix_gemm_ref (the oracle), the epilogue shared by every
 * driver, the portable microkernel and packing, and the entry point.  The
 * blocked float32 driver is gemm_blocked.c, the FP22 model driver
 * gemm_fp22.c, the SIMD microkernels and packing x86/gemm_*.c; which of them
 * run is decided in dispatch.c.
 *
 * Numerics of ACCUM_FP32 (identical on every ISA and thread count):
 *   - every product of two FP8 values is exact in float32;
 *   - a "K run" is the whole K (TENSOR / OUTER scales) or one 128-deep K block
 *     (BLOCK scales); its float32 sum starts at +0 and adds the products in
 *     the canonical pair order of gemm_internal.h (k = 1, 0, 3, 2, 5, 4, ...),
 *     each addition rounded to float32;
 *   - TENSOR / OUTER: v = (sa_i * sb_j) * sum;
 *     BLOCK: acc = +0; for kb = 0, 1, ...: acc = acc + part_kb * (sa[i][kb] *
 *     sb[kb][j / 128]) (each operation rounded to float32, no FMA); v = acc;
 *     MX: the same with 32-deep K runs and (sa[i][kb] * sb[j][kb]) (gemm_mx.c);
 *   - with bias: v = v + bias_j (bias widened to float32 exactly);
 *   - v is rounded once to out_t (nearest even, NaN stays NaN).
 *
 * The FP22 model (ACCUM_FP22), a study tool for Hopper FP8 tensor cores,
 * whose accumulator keeps only about 14 significant bits (DeepSeek-V3 tech
 * report, sec. 3.3.2):
 *   - products are exact (float32);
 *   - inside a K run (as above) the products are taken in plain order
 *     k = 0, 1, 2, ...; the running partial s starts at +0 and after every
 *     addition becomes trunc22(fl32(s + a_k * b_k)): the float32 sum (round to
 *     nearest even) truncated toward zero to 13 explicit mantissa bits (the
 *     1-8-13 "fp22" format: the low 10 bits of the float32 pattern cleared;
 *     inf and NaN are kept as they are);
 *   - every promote_interval products (counted from the start of the K run;
 *     0 = never) the partial is promoted: P = P + s in float32, s = +0;
 *     at the end of the run P = P + s (P starts at +0);
 *   - P then plays the role of the float32 sum above (scales, BLOCK
 *     accumulation, bias, output rounding unchanged).
 *   With BLOCK scales a run is 128 deep, so the partial is promoted at least
 *   every 128 products whatever promote_interval says, as on Hopper with
 *   DeepSeek's recipe.  Plain C (the compiler vectorises it), threaded over
 *   rows.
 */
#include <stdint.h>
#include <string.h>

#include "gemm_internal.h"

/* ---- argument checks ---------------------------------------------------- */

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

/* Everything but the work: FP8MIX_OK means "compute" unless the output is
 * empty (the caller checks m * n == 0). */
static fp8mix_status check_args(const fp8mix_gemm_args *g)
{
    if (!g) return FP8MIX_ERR_NULL_POINTER;
    if (g->m < 0 || g->n < 0 || g->k < 0) return FP8MIX_ERR_BAD_SHAPE;
    if (!fmt_ok(g->fmt_a) || !fmt_ok(g->fmt_b) || !dtype_ok(g->out_t) ||
        !kind_ok(g->scale_a_kind) || !kind_ok(g->scale_b_kind) ||
        (g->b_layout != FP8MIX_B_KN && g->b_layout != FP8MIX_B_NK) ||
        (g->a_layout != FP8MIX_A_MK && g->a_layout != FP8MIX_A_KM) ||
        (g->accum != FP8MIX_ACCUM_FP32 && g->accum != FP8MIX_ACCUM_FP22) ||
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

/* ---- shared pieces ------------------------------------------------------ */

float fp8mix_gemm_block_scale(const fp8mix_gemm_args *g, int64_t i, int64_t kb, int64_t j)
{
    int64_t nkb = ceil_div(g->k, FP8MIX_BLOCK), nnb = ceil_div(g->n, FP8MIX_BLOCK);
    return g->scale_a[i * nkb + kb] * g->scale_b[kb * nnb + j / FP8MIX_BLOCK];
}

/* Four lanes at a time with the compiler's vector extension (SSE2 / NEON):
 * the same IEEE products as the scalar loop, which GCC does not vectorise
 * here at -O2. */
typedef float v4f __attribute__((vector_size(16)));

static inline void mul_scalar(float *dst, const float *src, float s, int64_t n)
{
    int64_t c = 0;
    v4f sv = {s, s, s, s};
    for (; c + 4 <= n; c += 4) {
        v4f x;
        memcpy(&x, src + c, sizeof x);
        x = sv * x;
        memcpy(dst + c, &x, sizeof x);
    }
    for (; c < n; c++) dst[c] = s * src[c];
}

/* dst = (sa * sb) * src, lane by lane (sa * sb rounded first). */
static inline void mul_cols(float *dst, const float *src, float sa, const float *sb, int64_t n)
{
    int64_t c = 0;
    v4f av = {sa, sa, sa, sa};
    for (; c + 4 <= n; c += 4) {
        v4f x, b;
        memcpy(&x, src + c, sizeof x);
        memcpy(&b, sb + c, sizeof b);
        x = (av * b) * x;
        memcpy(dst + c, &x, sizeof x);
    }
    for (; c < n; c++) dst[c] = (sa * sb[c]) * src[c];
}

static inline void add_cols(float *dst, const float *src, const float *b, int64_t n)
{
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        v4f x, y;
        memcpy(&x, src + c, sizeof x);
        memcpy(&y, b + c, sizeof y);
        x = x + y;
        memcpy(dst + c, &x, sizeof x);
    }
    for (; c < n; c++) dst[c] = src[c] + b[c];
}

/* One row: one plain loop per step, each compiler-vectorisable; a float32
 * output is written by the last step directly (in place when vals is the
 * output row). */
static inline void epilogue_one(const fp8mix_gemm_args *g, int64_t i, int64_t j0, int64_t n, float *vals)
{
    float *dst = g->out_t == FP8MIX_F32 ? (float *)g->out + i * g->ldo + j0 : vals;
    const float *src = vals;
    if (g->scale_a_kind != FP8MIX_MM_SCALE_BLOCK && g->scale_a_kind != FP8MIX_MM_SCALE_MX) {
        float sa = g->scale_a[g->scale_a_kind == FP8MIX_MM_SCALE_TENSOR ? 0 : i];
        if (g->scale_b_kind == FP8MIX_MM_SCALE_TENSOR) {
            mul_scalar(dst, src, sa * g->scale_b[0], n);
        } else {
            mul_cols(dst, src, sa, g->scale_b + j0, n);
        }
        src = dst;
    }
    if (g->bias) {
        if (g->bias_t == FP8MIX_F32) {
            add_cols(dst, src, (const float *)g->bias + j0, n);
        } else {
            for (int64_t c = 0; c < n; c++) dst[c] = src[c] + load_f32(g->bias, g->bias_t, j0 + c);
        }
        src = dst;
    }
    if (g->out_t == FP8MIX_F32) {
        if (src != dst) memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)g->out + i * g->ldo + j0;
    if (g->out_t == FP8MIX_BF16)
        for (int64_t c = 0; c < n; c++) o[c] = fp8r_f32_to_bf16(src[c]);
    else
        for (int64_t c = 0; c < n; c++) o[c] = fp8r_f32_to_f16(src[c]);
}

/* dst = s * src, then + bias when given: mul_scalar then add_cols of epilogue_one
 * in one pass (each lane rounded after the multiply and after the add, as there). */
static inline void scale_bias_row(float *dst, const float *src, float s, const float *bias, int64_t n)
{
    int64_t c = 0;
    v4f sv = {s, s, s, s};
    if (bias) {
        for (; c + 4 <= n; c += 4) {
            v4f x, b;
            memcpy(&x, src + c, sizeof x);
            memcpy(&b, bias + c, sizeof b);
            x = sv * x;
            x = x + b;
            memcpy(dst + c, &x, sizeof x);
        }
        for (; c < n; c++) {
            float x = s * src[c];
            dst[c] = x + bias[c];
        }
    } else {
        for (; c + 4 <= n; c += 4) {
            v4f x;
            memcpy(&x, src + c, sizeof x);
            x = sv * x;
            memcpy(dst + c, &x, sizeof x);
        }
        for (; c < n; c++) dst[c] = s * src[c];
    }
}

void fp8mix_gemm_scale_rows_ref(float *out, int64_t ldo, const float *vals, int64_t ldv, int64_t rows, int64_t n,
                                const float *sa, int per_row, float sb, const float *bias)
{
    for (int64_t r = 0; r < rows; r++) scale_bias_row(out + r * ldo, vals + r * ldv, sa[per_row ? r : 0] * sb, bias, n);
}

int fp8mix_gemm_epilogue_simple(const fp8mix_gemm_args *g)
{
    const int rowwise_or_tensor = g->scale_a_kind == FP8MIX_MM_SCALE_TENSOR || g->scale_a_kind == FP8MIX_MM_SCALE_OUTER;
    return g->out_t == FP8MIX_F32 && rowwise_or_tensor && g->scale_b_kind == FP8MIX_MM_SCALE_TENSOR &&
           (!g->bias || g->bias_t == FP8MIX_F32);
}

void fp8mix_gemm_epilogue_rows(const fp8mix_gemm_args *g, fp8mix_gemm_scale_rows_fn simple, int64_t i0, int64_t rows,
                               int64_t j0, int64_t n, float *vals, int64_t ldv)
{
    /* The common case with its decisions taken once per tile, not once per row: at
     * small shapes the per-row checks cost more than the arithmetic. */
    if (fp8mix_gemm_epilogue_simple(g)) {
        const int per_row = g->scale_a_kind == FP8MIX_MM_SCALE_OUTER;
        simple((float *)g->out + i0 * g->ldo + j0, g->ldo, vals, ldv, rows, n, g->scale_a + (per_row ? i0 : 0),
               per_row, g->scale_b[0], g->bias ? (const float *)g->bias + j0 : NULL);
        return;
    }
    for (int64_t r = 0; r < rows; r++) epilogue_one(g, i0 + r, j0, n, vals + r * ldv);
}

void fp8mix_gemm_epilogue(const fp8mix_gemm_args *g, int64_t i0, int64_t rows, int64_t j0, int64_t n, float *vals,
                          int64_t ldv)
{
    fp8mix_gemm_epilogue_rows(g, fp8mix_gemm_scale_rows_ref, i0, rows, j0, n, vals, ldv);
}

static inline float trunc22(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
    return bits_f32(u & 0xFFFFFC00u);
}

/* ---- scalar reference --------------------------------------------------- */

/* One K run [p0, p1) of element (i, j) under the accumulation mode. */
static float ref_run(const fp8mix_gemm_args *g, const float *ta, const float *tb,
                     int64_t i, int64_t j, int64_t p0, int64_t p1)
{
    if (g->accum == FP8MIX_ACCUM_FP32) { /* A and B are only read for p < p1 (may be NULL when K == 0) */
        float acc = 0.0f;
        for (int64_t p = p0; p < p1; p += 2) {  /* p0 is even: pairs align */
            if (p + 1 < p1) acc = acc + ta[fp8mix_gemm_a_at(g, i, p + 1)] * tb[fp8mix_gemm_b_at(g, p + 1, j)];
            acc = acc + ta[fp8mix_gemm_a_at(g, i, p)] * tb[fp8mix_gemm_b_at(g, p, j)];
        }
        return acc;
    }
    float P = 0.0f, s = 0.0f;
    int64_t cnt = 0;
    for (int64_t p = p0; p < p1; p++) {
        s = trunc22(s + ta[fp8mix_gemm_a_at(g, i, p)] * tb[fp8mix_gemm_b_at(g, p, j)]);
        if (g->promote_interval > 0 && ++cnt == g->promote_interval) {
            P = P + s;
            s = 0.0f;
            cnt = 0;
        }
    }
    return P + s;
}

fp8mix_status fp8mix_gemm_ref(const fp8mix_gemm_args *g)
{
    fp8mix_status st = check_args(g);
    if (st != FP8MIX_OK || g->m == 0 || g->n == 0) return st;
    if (g->scale_a_kind == FP8MIX_MM_SCALE_MX) return fp8mix_gemm_mx(g); /* one plain loop already */
    const float *ta = fp8mix_decode_table(g->fmt_a), *tb = fp8mix_decode_table(g->fmt_b);
    int block = g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    for (int64_t i = 0; i < g->m; i++) {
        for (int64_t j = 0; j < g->n; j++) {
            float v;
            if (!block) {
                v = ref_run(g, ta, tb, i, j, 0, g->k);
            } else {
                v = 0.0f;
                for (int64_t p0 = 0; p0 < g->k; p0 += FP8MIX_BLOCK) {
                    int64_t p1 = p0 + FP8MIX_BLOCK < g->k ? p0 + FP8MIX_BLOCK : g->k;
                    v = v + ref_run(g, ta, tb, i, j, p0, p1) *
                                fp8mix_gemm_block_scale(g, i, p0 / FP8MIX_BLOCK, j);
                }
            }
            fp8mix_gemm_epilogue(g, i, 1, j, 1, &v, 1);
        }
    }
    return FP8MIX_OK;
}

/* ---- portable microkernel ----------------------------------------------- */

void fp8mix_gemm_ukernel_f32_4x16_ref(int64_t kc, const void *ap, const void *bp,
                                      float *c, int64_t ldc, int load_c,
                                      const float *rs)
{
    enum { MR = 4, NR = 16 };
    const float *a = (const float *)ap, *b = (const float *)bp;
    float acc[MR][NR];
    for (int r = 0; r < MR; r++)
        for (int x = 0; x < NR; x++) acc[r][x] = (load_c && !rs) ? c[r * ldc + x] : 0.0f;
    for (int64_t t = 0; t < kc; t++, a += MR, b += NR)
        for (int r = 0; r < MR; r++)
            for (int x = 0; x < NR; x++) acc[r][x] = acc[r][x] + a[r] * b[x];
    for (int r = 0; r < MR; r++)
        for (int x = 0; x < NR; x++) {
            if (!rs) c[r * ldc + x] = acc[r][x];
            else c[r * ldc + x] = (load_c ? c[r * ldc + x] : 0.0f) + acc[r][x] * rs[r];
        }
}

/* ---- portable packing (the reference of the SIMD packing) --------------- */

/* Element k of a run of kc values read with stride `step`, +0 past kc. */
static inline float pk_at(const float *t, const uint8_t *p, int64_t step, int64_t k, int64_t kc)
{
    return k < kc ? t[p[k * step]] : 0.0f;
}

/* One row/column r of a panel: kc values at src + k * step, k = 0 .. kc-1. */
static void pack_line(const float *t, const uint8_t *src, int64_t step, int64_t kc, int w, int bf16,
                      void *dst)
{
    int64_t kce = kc + (kc & 1);
    if (bf16) {
        uint32_t *d = (uint32_t *)dst;
        for (int64_t k = 0; k < kce; k += 2) {
            uint32_t lo = f32_bits(pk_at(t, src, step, k, kc)) >> 16;
            uint32_t hi = f32_bits(pk_at(t, src, step, k + 1, kc)) >> 16;
            d[(k >> 1) * w] = lo | hi << 16;
        }
    } else {
        float *d = (float *)dst;
        for (int64_t k = 0; k < kce; k++) d[(k ^ 1) * w] = pk_at(t, src, step, k, kc);
    }
}

static void pack_zero_rows(int nv, int w, int64_t kc, int bf16, void *dst)
{
    int64_t slots = bf16 ? (kc + 1) / 2 : kc + (kc & 1);
    for (int64_t t = 0; t < slots; t++)
        for (int r = nv; r < w; r++) ((uint32_t *)dst)[t * w + r] = 0u;
}

void fp8mix_gemm_pack_krows_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                fp8mix_format fmt, int bf16, void *dst)
{
    const float *t = fp8mix_decode_table(fmt);
    for (int r = 0; r < nv; r++) pack_line(t, src + r * ld, 1, kc, w, bf16, (uint32_t *)dst + r);
    pack_zero_rows(nv, w, kc, bf16, dst);
}

void fp8mix_gemm_pack_kcols_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                fp8mix_format fmt, int bf16, void *dst)
{
    const float *t = fp8mix_decode_table(fmt);
    for (int r = 0; r < nv; r++) pack_line(t, src + r, ld, kc, w, bf16, (uint32_t *)dst + r);
    pack_zero_rows(nv, w, kc, bf16, dst);
}

/* ---- entry point -------------------------------------------------------- */

fp8mix_status fp8mix_gemm(const fp8mix_gemm_args *g)
{
    fp8mix_status st = check_args(g);
    if (st != FP8MIX_OK || g->m == 0 || g->n == 0) return st;
    fp8mix_prefault(g->out, (size_t)((g->m - 1) * g->ldo + g->n) * dtype_size(g->out_t),
                    fp8mix_workers_for(g->m * g->n, 1 << 18));
    if (g->scale_a_kind == FP8MIX_MM_SCALE_MX) return fp8mix_gemm_mx(g);
    return g->accum == FP8MIX_ACCUM_FP22 ? fp8mix_gemm_fp22(g) : fp8mix_gemm_blocked(g);
}
