/*
 * gemm_epilogue.c — what every GEMM driver does to a finished sum (gemm.c's
 * rules): the BLOCK scale factor of a K block, then per output the scales,
 * the bias and the rounding to out_t, in place on float32 outputs.  Holds the
 * portable kernel of the epilogue's common case (fp8mix_gemm_scale_rows_ref:
 * the scalar ISA's, and the oracle of x86/gemm_epilogue_avx2.c).  Calls no
 * driver: gemm_blocked.c, gemm_fp22.c, gemm_mx.c and gemm_ref.c call here.
 * Not here: the sums themselves (the drivers and microkernels).
 */
#include <stdint.h>
#include <string.h>

#include "gemm_internal.h"

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
    if (g->out_t == FP8MIX_F32 && !g->bias && vals == (float *)g->out + i0 * g->ldo + j0 && ldv == g->ldo &&
        (g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK || g->scale_a_kind == FP8MIX_MM_SCALE_MX))
        return; /* block / MX sums into the float32 output itself: already final */
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
