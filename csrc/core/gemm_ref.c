/*
 * gemm_ref.c — the scalar reference of the GEMM: fp8mix_gemm_ref, a plain
 * loop over (i, j, k) that implements gemm.c's rules literally (the oracle of
 * every driver, ISA and thread count in tests/c/test_gemm.c and the fuzzer),
 * and the portable microkernel and packing: the scalar ISA's entries in
 * dispatch.c's table and the oracles of x86/gemm_avx2.c, gemm_avx512*.c and
 * gemm_pack_avx2.c.  Not here: the fast drivers (gemm_blocked.c,
 * gemm_fp22.c), the epilogue (gemm_epilogue.c), the checks (gemm_check.c).
 */
#include <stdint.h>

#include "gemm_internal.h"

/* FP22 model: the float32 sum truncated to 13 explicit mantissa bits (gemm.c). */
static inline float trunc22(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
    return bits_f32(u & 0xFFFFFC00u);
}

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
    fp8mix_status st = fp8mix_gemm_check_args(g);
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
