/*
 * cast_ref.c — the portable segment kernels of the casts (internal.h's
 * fp8mix_kernels contract): scale + encode + amax of one row segment, its
 * dequantisation, and the transposed widening read of cast_t.c.  They are the
 * scalar ISA's kernels (dispatch.c's table) and the oracle every SIMD variant
 * (x86/cast_*.c, x86/widen_t_avx2.c) is tested against bit for bit
 * (tests/c/test_cast.c); the x86 kernels also hand their ragged tails here.
 * Not here: the task loops and entry points that call them (cast.c, cast_t.c,
 * cast_mx.c) and the choice of ISA (dispatch.c).  Calls no other core file
 * but format.c's helpers, so the dispatch table can name these without a
 * circle.
 */
#include "internal.h"

/* One segment: q[t] = fp8_encode(fl32(x[t] * scale)) with random word
 * rng_start + t; *amax folds max |x[t]| bits; q NULL: the amax only. */
void fp8mix_cast_seg_ref(const void *x, fp8mix_dtype xt, int64_t n, float scale,
                         uint8_t *q, uint32_t *amax, const fp8_params *p,
                         uint64_t seed, uint64_t rng_start)
{
    uint32_t m = *amax;
    uint32_t r[64];
    for (int64_t i0 = 0; i0 < n; i0 += 64) {
        int64_t len = n - i0 < 64 ? n - i0 : 64;
        if (q && p->stochastic) fp8mix_random_words(seed, rng_start + (uint64_t)i0, len, r);
        for (int64_t t = 0; t < len; t++) {
            float v = load_f32(x, xt, i0 + t);
            uint32_t a = f32_bits(v) & 0x7FFFFFFFu;
            if (a > m) m = a;
            if (!q) continue;
            uint8_t c = fp8_encode(p, v * scale, p->stochastic ? r[t] : 0);
            if (p->inf_to_nan && a == 0x7F800000u) c = (uint8_t)(p->nan_code | (c & 0x80u));
            q[i0 + t] = c;
        }
    }
    *amax = m;
}

void fp8mix_dequant_seg_ref(const uint8_t *q, int64_t n, const float *table,
                            float scale_inv, void *out, fp8mix_dtype out_t)
{
    for (int64_t i = 0; i < n; i++) {
        float v = table[q[i]] * scale_inv;
        switch (out_t) {
        case FP8MIX_F32: ((float *)out)[i] = v; break;
        case FP8MIX_BF16: ((uint16_t *)out)[i] = fp8mix_f32_to_bf16_ref(v); break;
        default: ((uint16_t *)out)[i] = fp8mix_f32_to_f16_ref(v); break;
        }
    }
}

/* The transposed widening read (internal.h's fp8mix_widen_t_fn): exact for every
 * input type. */
void fp8mix_widen_t_ref(const void *x, fp8mix_dtype xt, int64_t ld_x, int64_t rows, int64_t cols, float *buf,
                        int64_t ldb)
{
    for (int64_t i = 0; i < rows; i++) {
        const uint8_t *row = (const uint8_t *)x + (size_t)(i * ld_x) * dtype_size(xt);
        if (xt == FP8MIX_F32) {
            const float *f = (const float *)row;
            for (int64_t j = 0; j < cols; j++) buf[j * ldb + i] = f[j];
        } else if (xt == FP8MIX_BF16) {
            const uint16_t *h = (const uint16_t *)row;
            for (int64_t j = 0; j < cols; j++) buf[j * ldb + i] = bf16_to_f32(h[j]);
        } else {
            for (int64_t j = 0; j < cols; j++) buf[j * ldb + i] = load_f32(row, xt, j);
        }
    }
}
