/*
 * format.c — the FP8 formats themselves: scalar reference encoder and decoder,
 * decode tables, float16/bfloat16 conversions and the Philox random stream.
 * Everything here is the oracle the SIMD (and CUDA) variants are tested
 * against; it favours obviousness over speed.
 */
#include <math.h>
#include <stdatomic.h>

#include "internal.h"

float fp8mix_format_max(fp8mix_format fmt)
{
    switch (fmt) {
    case FP8MIX_E4M3: return 448.0f;
    case FP8MIX_E5M2: return 57344.0f;
    }
    return 0.0f;
}

uint8_t fp8mix_encode_ref(float y, fp8mix_format fmt, int saturate,
                          fp8mix_rounding rounding, uint32_t r)
{
    fp8mix_cast_opts o = {fmt, saturate, rounding, 0, 0, 0};
    fp8_params p;
    if (fp8_params_init(&p, &o) != FP8MIX_OK) return 0;
    return fp8_encode(&p, y, r);
}

float fp8mix_decode_ref(uint8_t q, fp8mix_format fmt)
{
    int mbits = fmt == FP8MIX_E4M3 ? 3 : 2;
    int bias = fmt == FP8MIX_E4M3 ? 7 : 15;
    int neg = q >> 7;
    int ebits = (q >> mbits) & (fmt == FP8MIX_E4M3 ? 0xF : 0x1F);
    int mant = q & ((1 << mbits) - 1);
    float v;
    if (fmt == FP8MIX_E4M3 && (q & 0x7F) == 0x7F) {
        return bits_f32(neg ? 0xFFC00000u : 0x7FC00000u);
    } else if (fmt == FP8MIX_E5M2 && ebits == 0x1F) {
        if (mant) return bits_f32(neg ? 0xFFC00000u : 0x7FC00000u);
        v = INFINITY;
    } else if (ebits == 0) {
        v = ldexpf((float)mant, 1 - bias - mbits);
    } else {
        v = ldexpf((float)((1 << mbits) | mant), ebits - bias - mbits);
    }
    return neg ? -v : v;
}

static float g_table[2][256];
static atomic_int g_table_ready = 0;

const float *fp8mix_decode_table(fp8mix_format fmt)
{
    if (!atomic_load_explicit(&g_table_ready, memory_order_acquire)) {
        /* Racing initialisers write identical values: benign. */
        for (int f = 0; f < 2; f++)
            for (int i = 0; i < 256; i++) g_table[f][i] = fp8mix_decode_ref((uint8_t)i, (fp8mix_format)f);
        atomic_store_explicit(&g_table_ready, 1, memory_order_release);
    }
    return g_table[fmt == FP8MIX_E5M2 ? 1 : 0];
}

/* ---- float16 / bfloat16 ---------------------------------------------------- */

float fp8mix_f16_to_f32_ref(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1F, m = h & 0x3FF;
    float v;
    if (e == 0x1F) return bits_f32(sign | 0x7F800000u | (m << 13)); /* inf/NaN, payload kept */
    if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf((float)(m | 0x400), (int)e - 25);
    return (h & 0x8000u) ? -v : v;
}

uint16_t fp8mix_f32_to_bf16_ref(float f) { return fp8r_f32_to_bf16(f); }

uint16_t fp8mix_f32_to_f16_ref(float f) { return fp8r_f32_to_f16(f); }

/* ---- Philox4x32-10 ------------------------------------------------------- */

void fp8mix_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    fp8r_philox(counter, key, out);
}

uint32_t fp8mix_random_word(uint64_t seed, uint64_t offset, uint64_t n)
{
    uint64_t c = offset + n;
    uint64_t blk = c >> 2;
    uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    fp8mix_philox4x32_10(ctr, key, out);
    return out[c & 3];
}

void fp8mix_random_words(uint64_t seed, uint64_t start, int64_t n, uint32_t *r)
{
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint64_t c = start;
    int64_t i = 0;
    while (i < n) {
        uint64_t blk = c >> 2;
        uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0, 0};
        uint32_t out[4];
        fp8mix_philox4x32_10(ctr, key, out);
        for (unsigned w = (unsigned)(c & 3); w < 4 && i < n; w++, i++, c++) r[i] = out[w];
    }
}
