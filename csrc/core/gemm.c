/*
 * gemm.c — the scaled FP8 GEMM: out = (A * scale_a) @ (B * scale_b) + bias.
 *
 * Covers: argument checks, the scalar reference fp8mix_gemm_ref (the oracle),
 * the blocked float32-accumulation driver (FP8 decoded while packing panels,
 * register-blocked microkernels chosen by ISA, threads over output tiles,
 * scales + bias in the epilogue), the portable scalar microkernel, and the
 * FP22 accumulation model.  The SIMD microkernels live in x86/gemm_*.c.
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
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
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
           s == FP8MIX_MM_SCALE_BLOCK;
}

/* Scale counts; only meaningful after the shape checks passed. */
static int64_t scale_a_count(const fp8mix_gemm_args *g)
{
    switch (g->scale_a_kind) {
    case FP8MIX_MM_SCALE_TENSOR: return 1;
    case FP8MIX_MM_SCALE_OUTER: return g->m;
    default: return g->m * ceil_div(g->k, FP8MIX_BLOCK);
    }
}
static int64_t scale_b_count(const fp8mix_gemm_args *g)
{
    switch (g->scale_b_kind) {
    case FP8MIX_MM_SCALE_TENSOR: return 1;
    case FP8MIX_MM_SCALE_OUTER: return g->n;
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
        (g->accum != FP8MIX_ACCUM_FP32 && g->accum != FP8MIX_ACCUM_FP22) ||
        (g->bias && !dtype_ok(g->bias_t)))
        return FP8MIX_ERR_BAD_ENUM;
    if ((g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK) !=
            (g->scale_b_kind == FP8MIX_MM_SCALE_BLOCK) ||
        g->promote_interval < 0)
        return FP8MIX_ERR_BAD_ARG;
    if (bad_2d(g->m, g->k, g->lda) || bad_2d(g->m, g->n, g->ldo) ||
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

static inline uint8_t b_at(const fp8mix_gemm_args *g, int64_t p, int64_t j)
{
    return g->b_layout == FP8MIX_B_KN ? g->b[p * g->ldb + j] : g->b[j * g->ldb + p];
}

/* BLOCK: the float32 factor of K block kb for element (i, j). */
static inline float block_scale(const fp8mix_gemm_args *g, int64_t i, int64_t kb,
                                int64_t j)
{
    int64_t nkb = ceil_div(g->k, FP8MIX_BLOCK), nnb = ceil_div(g->n, FP8MIX_BLOCK);
    return g->scale_a[i * nkb + kb] * g->scale_b[kb * nnb + j / FP8MIX_BLOCK];
}

/* Epilogue of n outputs of row i from column j0: vals (may be overwritten)
 * are the float32 sums (non-BLOCK) or block accumulators (BLOCK).  One plain
 * loop per step, each compiler-vectorisable; a float32 output is written by
 * the last step directly. */
static void epilogue_row(const fp8mix_gemm_args *g, int64_t i, int64_t j0,
                         int64_t n, float *vals)
{
    float *dst = g->out_t == FP8MIX_F32 ? (float *)g->out + i * g->ldo + j0 : vals;
    const float *src = vals;
    if (g->scale_a_kind != FP8MIX_MM_SCALE_BLOCK) {
        float sa = g->scale_a[g->scale_a_kind == FP8MIX_MM_SCALE_TENSOR ? 0 : i];
        if (g->scale_b_kind == FP8MIX_MM_SCALE_TENSOR) {
            float sab = sa * g->scale_b[0];
            for (int64_t c = 0; c < n; c++) dst[c] = sab * src[c];
        } else {
            const float *sb = g->scale_b + j0;
            for (int64_t c = 0; c < n; c++) dst[c] = (sa * sb[c]) * src[c];
        }
        src = dst;
    }
    if (g->bias) {
        if (g->bias_t == FP8MIX_F32) {
            const float *b = (const float *)g->bias + j0;
            for (int64_t c = 0; c < n; c++) dst[c] = src[c] + b[c];
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
        for (int64_t c = 0; c < n; c++) o[c] = fp8mix_f32_to_bf16_ref(src[c]);
    else
        for (int64_t c = 0; c < n; c++) o[c] = fp8mix_f32_to_f16_ref(src[c]);
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
    const uint8_t *arow = p1 > p0 ? g->a + i * g->lda : NULL; /* A may be NULL when K == 0 */
    if (g->accum == FP8MIX_ACCUM_FP32) {
        float acc = 0.0f;
        for (int64_t p = p0; p < p1; p += 2) {  /* p0 is even: pairs align */
            if (p + 1 < p1) acc = acc + ta[arow[p + 1]] * tb[b_at(g, p + 1, j)];
            acc = acc + ta[arow[p]] * tb[b_at(g, p, j)];
        }
        return acc;
    }
    float P = 0.0f, s = 0.0f;
    int64_t cnt = 0;
    for (int64_t p = p0; p < p1; p++) {
        s = trunc22(s + ta[arow[p]] * tb[b_at(g, p, j)]);
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
                                block_scale(g, i, p0 / FP8MIX_BLOCK, j);
                }
            }
            epilogue_row(g, i, j, 1, &v);
        }
    }
    return FP8MIX_OK;
}

/* ---- portable microkernel ----------------------------------------------- */

void fp8mix_gemm_ukernel_f32_4x16__scalar(int64_t kc, const void *ap, const void *bp,
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

/* ---- microkernel choice -------------------------------------------------- */

static const fp8mix_gemm_ukernel uk_scalar = {4, 16, 0, fp8mix_gemm_ukernel_f32_4x16__scalar,
                                              "f32_4x16__scalar"};
#if FP8MIX_X86
static const fp8mix_gemm_ukernel uk_avx2 = {6, 16, 0, fp8mix_gemm_ukernel_f32_6x16__avx2,
                                            "f32_6x16__avx2"};
static const fp8mix_gemm_ukernel uk_avx512 = {14, 32, 0,
                                              fp8mix_gemm_ukernel_f32_14x32__avx512,
                                              "f32_14x32__avx512"};
static const fp8mix_gemm_ukernel uk_avx512bf16 = {
    14, 32, 1, fp8mix_gemm_ukernel_bf16_14x32__avx512bf16, "bf16_14x32__avx512bf16"};

/* vdpbf16ps is specified (Intel SDM) as two separately rounded adds, odd
 * element first, with DAZ/FTZ (harmless here: sums of FP8 products are
 * multiples of 2^-32, never subnormal).  Trust but verify: run both kernels on
 * wide-range data once and use the bf16 one only if every bit agrees. */
static int bf16_probe(void)
{
    enum { MR = 14, NR = 32, KC = 64 };
    float af[KC * MR], bf[KC * NR];
    uint16_t ah[KC * MR], bh[KC * NR];  /* bf16 pairs, read as 32-bit words */
    float c1[MR * NR], c2[MR * NR], rs[MR];
    const float *t = fp8mix_decode_table(FP8MIX_E5M2);
    uint32_t x = 12345u;
    int ok = 1;
    for (int trial = 0; trial < 8 && ok; trial++) {
        /* E5M2 bytes with exponent field 1..30: finite, huge dynamic range. */
        for (int k = 0; k < KC; k++) {
            for (int r = 0; r < MR + NR; r++) {
                x = x * 1664525u + 1013904223u;
                uint8_t q = (uint8_t)(x >> 24);
                if ((q & 0x7C) == 0x7C || (q & 0x7C) == 0) q ^= 0x40;
                float v = t[q];
                uint16_t h = (uint16_t)(f32_bits(v) >> 16);
                if (r < MR) {
                    af[(k ^ 1) * MR + r] = v;
                    ah[((k >> 1) * MR + r) * 2 + (k & 1)] = h;
                } else {
                    bf[(k ^ 1) * NR + r - MR] = v;
                    bh[((k >> 1) * NR + r - MR) * 2 + (k & 1)] = h;
                }
            }
        }
        for (int e = 0; e < MR * NR; e++) c1[e] = c2[e] = t[(e * 37 + trial) & 0x7B];
        for (int r = 0; r < MR; r++) rs[r] = 1.0f + (float)r / 3.0f;
        const float *rsp = (trial & 1) ? rs : NULL;
        uk_avx512.fn(KC, af, bf, c1, NR, trial & 2, rsp);
        uk_avx512bf16.fn(KC, ah, bh, c2, NR, trial & 2, rsp);
        ok = memcmp(c1, c2, sizeof c1) == 0;
    }
    return ok;
}
#endif

const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_active(void)
{
    fp8mix_isa isa = fp8mix_active_isa();
#if FP8MIX_X86
    static atomic_int bf16_ok = -1;
    if (isa >= FP8MIX_ISA_AVX512BF16 && fp8mix_gemm_have_avx512bf16) {
        int ok = atomic_load(&bf16_ok);
        if (ok < 0) {
            ok = bf16_probe();
            atomic_store(&bf16_ok, ok);
        }
        if (ok) return &uk_avx512bf16;
    }
    if (isa >= FP8MIX_ISA_AVX512) return &uk_avx512;
    if (isa >= FP8MIX_ISA_AVX2) return &uk_avx2;
#endif
    (void)isa;
    return &uk_scalar;
}

/* ---- blocked driver ------------------------------------------------------
 * A and B are decoded once into packed panels over the whole K (in chunks of
 * at most GEMM_PACK_WORDS words each when large), shared by the threads; the
 * output is then cut into (MC rows) x (NT columns) tiles spread over threads.
 * A task keeps its float32 tile in per-worker scratch, walks K in KC steps
 * (microkernel over MR x NR pieces) and ends with the epilogue.  A tile's
 * values do not depend on the tiling, so any thread count gives the same
 * bits. */

#define GEMM_KC 256          /* multiple of 128 (block scales) and even       */
#define GEMM_MC_TARGET 168
#define GEMM_NT_MAX 512
#define GEMM_PACK_WORDS (4 << 20) /* cap of each packed chunk (16 MiB)        */
#define GEMM_GRAIN (1 << 22)      /* multiply-adds worth a thread            */

typedef struct gemm_plan {
    const fp8mix_gemm_args *g;
    const fp8mix_gemm_ukernel *uk;
    const float *ta, *tb;
    uint16_t ta16[256], tb16[256];     /* bf16 bits of the decoded values   */
    int64_t kp, kw;                    /* K rounded up to even; its slots   */
    int64_t mc, nt;                    /* task tile                         */
    int64_t mch, nch;                  /* packed chunk sizes (rows, cols)   */
    int64_t ic, mcc, jc, ncc;          /* current chunks: start and size    */
    int64_t n_jt;                      /* column tiles in the current chunk */
    uint32_t *apack, *bpack;           /* packed chunks (words)             */
    float *scratch;                    /* per worker: a C tile              */
    size_t scratch_words;
} gemm_plan;

/* Packed words per k-step slot range of even length k. */
static inline int64_t kslots(const gemm_plan *pl, int64_t k) { return pl->uk->bf16 ? k / 2 : k; }

/* bf16 pair word of k-steps (p, p + 1); hi is absent past K. */
static inline uint32_t pair16(const uint16_t *t, uint8_t lo, const uint8_t *hi)
{
    return (uint32_t)t[lo] | (hi ? (uint32_t)t[*hi] << 16 : 0u);
}

/* Sliver of B columns [jg, jg + nr) over all K into dst (kslots(kp) * nr words). */
static void pack_b_sliver(const gemm_plan *pl, int64_t jg, uint32_t *dst)
{
    const fp8mix_gemm_args *g = pl->g;
    int64_t nr = pl->uk->nr, K = g->k, ldb = g->ldb;
    int64_t nv = g->n - jg < nr ? g->n - jg : nr;
    if (nv < nr || (K & 1)) memset(dst, 0, (size_t)(kslots(pl, pl->kp) * nr) * 4);
    if (pl->uk->bf16) {
        const uint16_t *t = pl->tb16;
        if (g->b_layout == FP8MIX_B_KN) {
            for (int64_t p = 0; p < K; p += 2) {
                const uint8_t *r0 = g->b + p * ldb + jg, *r1 = r0 + ldb;
                uint32_t *o = dst + (p >> 1) * nr;
                if (p + 1 < K)
                    for (int64_t x = 0; x < nv; x++) o[x] = pair16(t, r0[x], r1 + x);
                else
                    for (int64_t x = 0; x < nv; x++) o[x] = pair16(t, r0[x], NULL);
            }
        } else {
            for (int64_t x = 0; x < nv; x++) {
                const uint8_t *col = g->b + (jg + x) * ldb;
                int64_t p = 0;
                for (; p + 1 < K; p += 2) dst[(p >> 1) * nr + x] = pair16(t, col[p], col + p + 1);
                if (p < K) dst[(p >> 1) * nr + x] = pair16(t, col[p], NULL);
            }
        }
        return;
    }
    float *d = (float *)dst;
    const float *t = pl->tb;
    if (g->b_layout == FP8MIX_B_KN) {
        for (int64_t p = 0; p < K; p++) {
            const uint8_t *row = g->b + p * ldb + jg;
            float *o = d + (p ^ 1) * nr;
            for (int64_t x = 0; x < nv; x++) o[x] = t[row[x]];
        }
    } else {
        for (int64_t x = 0; x < nv; x++) {
            const uint8_t *col = g->b + (jg + x) * ldb;
            int64_t p = 0;
            for (; p + 1 < K; p += 2) {
                d[p * nr + x] = t[col[p + 1]];
                d[(p + 1) * nr + x] = t[col[p]];
            }
            if (p < K) d[(p + 1) * nr + x] = t[col[p]];
        }
    }
}

/* A micro-panel: rows [i0, i0 + mr) x k [pc, pc + kc) into dst (pc even). */
static void pack_a_panel(const gemm_plan *pl, int64_t i0, int64_t pc, int64_t kc,
                         uint32_t *dst)
{
    const fp8mix_gemm_args *g = pl->g;
    int64_t mr = pl->uk->mr, kce = kc + (kc & 1);
    int64_t nv = g->m - i0 < mr ? g->m - i0 : mr;
    if (nv < mr || (kc & 1)) memset(dst, 0, (size_t)(kslots(pl, kce) * mr) * 4);
    for (int64_t r = 0; r < nv; r++) {
        const uint8_t *row = g->a + (i0 + r) * g->lda + pc;
        int64_t t = 0;
        if (pl->uk->bf16) {
            uint32_t *d = dst + r;
            for (; t + 1 < kc; t += 2) d[(t >> 1) * mr] = pair16(pl->ta16, row[t], row + t + 1);
            if (t < kc) d[(t >> 1) * mr] = pair16(pl->ta16, row[t], NULL);
        } else {
            float *d = (float *)dst + r;
            for (; t + 1 < kc; t += 2) {
                d[t * mr] = pl->ta[row[t + 1]];
                d[(t + 1) * mr] = pl->ta[row[t]];
            }
            if (t < kc) d[(t + 1) * mr] = pl->ta[row[t]];
        }
    }
}

static void pack_b_task(void *ctx, int64_t s, int worker)
{
    const gemm_plan *pl = (const gemm_plan *)ctx;
    int64_t nr = pl->uk->nr;
    pack_b_sliver(pl, pl->jc + s * nr, pl->bpack + s * pl->kw * nr);
}

static void pack_a_task(void *ctx, int64_t s, int worker)
{
    const gemm_plan *pl = (const gemm_plan *)ctx;
    int64_t mr = pl->uk->mr;
    pack_a_panel(pl, pl->ic + s * mr, 0, pl->g->k, pl->apack + s * pl->kw * mr);
}

static void tile_task(void *ctx, int64_t task, int worker)
{
    const gemm_plan *pl = (const gemm_plan *)ctx;
    const fp8mix_gemm_args *g = pl->g;
    const fp8mix_gemm_ukernel *uk = pl->uk;
    int64_t mr = uk->mr, nr = uk->nr, K = g->k, kw = pl->kw;
    int64_t ia = (task / pl->n_jt) * pl->mc, jt0 = (task % pl->n_jt) * pl->nt;
    int64_t i0 = pl->ic + ia;
    int64_t mc = pl->mcc - ia < pl->mc ? pl->mcc - ia : pl->mc;
    int64_t nt = pl->ncc - jt0 < pl->nt ? pl->ncc - jt0 : pl->nt;
    /* Tile rows padded by 64 bytes: rows 4 KiB apart would alias in L1. */
    int64_t nmr = ceil_div(mc, mr), nnr = ceil_div(nt, nr), ldc = pl->nt + 16;
    int block = g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    float *cbuf = pl->scratch + (size_t)worker * pl->scratch_words;
    const uint32_t *ablk = pl->apack + (ia / mr) * kw * mr;
    const uint32_t *bblk = pl->bpack + (jt0 / nr) * kw * nr;
    float rs[32];

    if (K == 0)
        for (int64_t r = 0; r < mc; r++) memset(cbuf + r * ldc, 0, (size_t)nt * 4);
    for (int64_t pc = 0; pc < K; pc += GEMM_KC) {
        int64_t kc = K - pc < GEMM_KC ? K - pc : GEMM_KC, kce = kc + (kc & 1);
        for (int64_t jr = 0; jr < nnr; jr++) {
            const uint32_t *bs = bblk + (jr * kw + kslots(pl, pc)) * nr;
            for (int64_t ir = 0; ir < nmr; ir++) {
                const uint32_t *as = ablk + (ir * kw + kslots(pl, pc)) * mr;
                float *cp = cbuf + ir * mr * ldc + jr * nr;
                if (!block) {
                    uk->fn(kce, as, bs, cp, ldc, pc > 0, NULL);
                    continue;
                }
                int64_t jg = pl->jc + jt0 + jr * nr;
                for (int64_t sb = 0; sb < kc; sb += FP8MIX_BLOCK) {
                    int64_t kk = kc - sb < FP8MIX_BLOCK ? kc - sb : FP8MIX_BLOCK;
                    int64_t kb = (pc + sb) / FP8MIX_BLOCK;
                    for (int64_t r = 0; r < mr; r++) {
                        int64_t i = i0 + ir * mr + r;
                        rs[r] = i < g->m ? block_scale(g, i, kb, jg) : 0.0f;
                    }
                    uk->fn(kk + (kk & 1), as + kslots(pl, sb) * mr, bs + kslots(pl, sb) * nr,
                           cp, ldc, pc + sb > 0, rs);
                }
            }
        }
    }
    for (int64_t r = 0; r < mc; r++)
        epilogue_row(g, i0 + r, pl->jc + jt0, nt, cbuf + r * ldc);
}

static void *alloc64(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

static fp8mix_status gemm_blocked(const fp8mix_gemm_args *g)
{
    gemm_plan pl;
    memset(&pl, 0, sizeof pl);
    pl.g = g;
    pl.uk = fp8mix_gemm_ukernel_active();
    pl.ta = fp8mix_decode_table(g->fmt_a);
    pl.tb = fp8mix_decode_table(g->fmt_b);
    if (!pl.ta || !pl.tb) return FP8MIX_ERR_BAD_ENUM;
    for (int v = 0; v < 256; v++) {
        pl.ta16[v] = (uint16_t)(f32_bits(pl.ta[v]) >> 16);  /* exact: <= 3 mantissa bits */
        pl.tb16[v] = (uint16_t)(f32_bits(pl.tb[v]) >> 16);
    }
    int64_t M = g->m, N = g->n, K = g->k, mr = pl.uk->mr, nr = pl.uk->nr;
    pl.kp = K + (K & 1);
    pl.kw = kslots(&pl, pl.kp) > 0 ? kslots(&pl, pl.kp) : 1;

    /* Threads: gate on the multiply-add count (saturating product). */
    double work = (double)M * (double)N * (double)(K > 0 ? K : 1);
    int workers = fp8mix_workers_for(work > 4e18 ? INT64_MAX : (int64_t)work, GEMM_GRAIN);

    /* Chunks: whole K, as many rows / columns as GEMM_PACK_WORDS allows. */
    /* MC near the target, evened out so that row tiles are about equal. */
    pl.mc = ceil_div(ceil_div(M, ceil_div(M, GEMM_MC_TARGET)), mr) * mr;
    pl.mch = (GEMM_PACK_WORDS / pl.kw) / pl.mc * pl.mc;
    if (pl.mch < pl.mc) pl.mch = pl.mc;
    if (pl.mch > ceil_div(M, pl.mc) * pl.mc) pl.mch = ceil_div(M, pl.mc) * pl.mc;
    pl.nch = (GEMM_PACK_WORDS / pl.kw) / nr * nr;
    if (pl.nch < nr) pl.nch = nr;
    if (pl.nch > ceil_div(N, nr) * nr) pl.nch = ceil_div(N, nr) * nr;
    pl.nt = pl.nch < GEMM_NT_MAX ? pl.nch : GEMM_NT_MAX;
    /* Enough tiles for the workers: narrower tiles when rows are few. */
    int64_t n_ic = ceil_div(pl.mch, pl.mc);
    if (workers > 1 && n_ic * ceil_div(pl.nch, pl.nt) < 4 * workers) {
        int64_t want = ceil_div(4 * workers, n_ic);
        int64_t nt = ceil_div(ceil_div(pl.nch, want), nr) * nr;
        if (nt < pl.nt) pl.nt = nt;
    }

    if ((uint64_t)pl.kw > SIZE_MAX / 4 / (uint64_t)(pl.mch + pl.nch)) return FP8MIX_ERR_NO_MEMORY;
    pl.scratch_words = ((size_t)pl.mc * (size_t)(pl.nt + 16) + 15) & ~(size_t)15;
    pl.apack = (uint32_t *)alloc64((size_t)pl.mch * (size_t)pl.kw * 4);
    pl.bpack = (uint32_t *)alloc64((size_t)pl.nch * (size_t)pl.kw * 4);
    pl.scratch = (float *)alloc64(pl.scratch_words * 4 * (size_t)workers);
    if (!pl.apack || !pl.bpack || !pl.scratch) {
        free(pl.apack);
        free(pl.bpack);
        free(pl.scratch);
        return FP8MIX_ERR_NO_MEMORY;
    }
    int64_t a_packed = -1;
    for (pl.jc = 0; pl.jc < N; pl.jc += pl.nch) {
        pl.ncc = N - pl.jc < pl.nch ? N - pl.jc : pl.nch;
        int64_t nsl = ceil_div(pl.ncc, nr);
        if (K > 0)
            fp8mix_parallel_for(nsl, fp8mix_workers_for(nsl * nr * K, 1 << 18), pack_b_task, &pl);
        pl.n_jt = ceil_div(pl.ncc, pl.nt);
        for (pl.ic = 0; pl.ic < M; pl.ic += pl.mch) {
            pl.mcc = M - pl.ic < pl.mch ? M - pl.ic : pl.mch;
            if (K > 0 && a_packed != pl.ic) {
                int64_t npn = ceil_div(pl.mcc, mr);
                fp8mix_parallel_for(npn, fp8mix_workers_for(npn * mr * K, 1 << 18), pack_a_task, &pl);
                a_packed = pl.ic;
            }
            fp8mix_parallel_for(ceil_div(pl.mcc, pl.mc) * pl.n_jt, workers, tile_task, &pl);
        }
    }
    free(pl.apack);
    free(pl.bpack);
    free(pl.scratch);
    return FP8MIX_OK;
}

/* ---- FP22 model driver ----------------------------------------------------
 * Columns in chunks of FP22_NB decoded to a K x FP22_NB float block; tasks are
 * single rows; each row runs the model on FP22_NB columns at once (a loop the
 * compiler can vectorise: the truncation is an integer mask). */

#define FP22_NB 256

typedef struct fp22_plan {
    const fp8mix_gemm_args *g;
    const float *ta;
    const float *bdec;   /* K x FP22_NB, the current chunk               */
    int64_t j0, nb;      /* chunk start and width                        */
    float *scratch;      /* per worker: arow (K) + 3 x FP22_NB           */
    size_t scratch_words;
} fp22_plan;

/* s[x] = trunc22(s[x] + a * b[x]) over one chunk; branch-free and
 * restrict-qualified so that -O2 vectorises it. */
static void fp22_step(float *restrict s, float a, const float *restrict b)
{
    for (int x = 0; x < FP22_NB; x++) {
        uint32_t u = f32_bits(s[x] + a * b[x]);
        uint32_t keep = (u & 0x7F800000u) == 0x7F800000u ? 0xFFFFFFFFu : 0xFFFFFC00u;
        s[x] = bits_f32(u & keep);
    }
}

static void fp22_row_task(void *ctx, int64_t i, int worker)
{
    const fp22_plan *pl = (const fp22_plan *)ctx;
    const fp8mix_gemm_args *g = pl->g;
    int64_t K = g->k, iv = g->promote_interval;
    int block = g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    int64_t run = block ? FP8MIX_BLOCK : (K > 0 ? K : 1);
    float *arow = pl->scratch + (size_t)worker * pl->scratch_words;
    float *acc = arow + K, *P = acc + FP22_NB, *s = P + FP22_NB;
    if (K > 0) { /* A may be NULL when K == 0 */
        const uint8_t *ar = g->a + i * g->lda;
        for (int64_t p = 0; p < K; p++) arow[p] = pl->ta[ar[p]];
    }
    for (int64_t x = 0; x < FP22_NB; x++) acc[x] = 0.0f;
    for (int64_t p0 = 0; p0 < K; p0 += run) {
        int64_t p1 = p0 + run < K ? p0 + run : K, cnt = 0;
        for (int64_t x = 0; x < FP22_NB; x++) P[x] = s[x] = 0.0f;
        for (int64_t p = p0; p < p1; p++) {
            const float *brow = pl->bdec + p * FP22_NB;
            float a = arow[p];
            fp22_step(s, a, brow);
            if (iv > 0 && ++cnt == iv) {
                for (int64_t x = 0; x < FP22_NB; x++) {
                    P[x] = P[x] + s[x];
                    s[x] = 0.0f;
                }
                cnt = 0;
            }
        }
        for (int64_t x = 0; x < FP22_NB; x++) P[x] = P[x] + s[x];
        if (!block) {
            memcpy(acc, P, sizeof(float) * FP22_NB);
        } else {
            int64_t kb = p0 / FP8MIX_BLOCK;
            for (int64_t x = 0; x < pl->nb; x++)
                acc[x] = acc[x] + P[x] * block_scale(g, i, kb, pl->j0 + x);
        }
    }
    epilogue_row(g, i, pl->j0, pl->nb, acc);
}

static fp8mix_status gemm_fp22(const fp8mix_gemm_args *g)
{
    fp22_plan pl;
    pl.g = g;
    pl.ta = fp8mix_decode_table(g->fmt_a);
    const float *tb = fp8mix_decode_table(g->fmt_b);
    if (!pl.ta || !tb) return FP8MIX_ERR_BAD_ENUM;
    int64_t K = g->k;
    double work = (double)g->m * (double)g->n * (double)(K > 0 ? K : 1);
    int workers = fp8mix_workers_for(work > 4e18 ? INT64_MAX : (int64_t)work, 1 << 20);
    if ((uint64_t)K > SIZE_MAX / 8 / FP22_NB) return FP8MIX_ERR_NO_MEMORY;
    pl.scratch_words = ((size_t)K + 3 * FP22_NB + 15) & ~(size_t)15;
    float *bdec = (float *)alloc64((size_t)K * FP22_NB * 4);
    pl.scratch = (float *)alloc64(pl.scratch_words * 4 * (size_t)workers);
    if (!bdec || !pl.scratch) {
        free(bdec);
        free(pl.scratch);
        return FP8MIX_ERR_NO_MEMORY;
    }
    pl.bdec = bdec;
    for (pl.j0 = 0; pl.j0 < g->n; pl.j0 += FP22_NB) {
        pl.nb = g->n - pl.j0 < FP22_NB ? g->n - pl.j0 : FP22_NB;
        for (int64_t p = 0; p < K; p++)
            for (int64_t x = 0; x < FP22_NB; x++)
                bdec[p * FP22_NB + x] = x < pl.nb ? tb[b_at(g, p, pl.j0 + x)] : 0.0f;
        fp8mix_parallel_for(g->m, workers, fp22_row_task, &pl);
    }
    free(bdec);
    free(pl.scratch);
    return FP8MIX_OK;
}

/* ---- entry point -------------------------------------------------------- */

fp8mix_status fp8mix_gemm(const fp8mix_gemm_args *g)
{
    fp8mix_status st = check_args(g);
    if (st != FP8MIX_OK || g->m == 0 || g->n == 0) return st;
    return g->accum == FP8MIX_ACCUM_FP22 ? gemm_fp22(g) : gemm_blocked(g);
}
