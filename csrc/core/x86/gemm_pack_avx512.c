/*
 * gemm_pack_avx512.c — AVX-512 (F/BW/VL/DQ) packing of float32 GEMM panels for the
 * AVX-512 microkernel: FP8 bytes decoded to float32 thirty-two at a time, in the
 * layouts of gemm_internal.h (slot t holds k = t ^ 1).  Bit-identical to the scalar
 * packing in gemm_ref.c (tests/c/test_gemm.c compares every byte, also with DAZ/FTZ
 * set); bf16 panels and panels wider than 32 go to the AVX2 packing.
 *
 * Decoding as in gemm_pack_avx2.c, on 32 words at once: an E4M3 magnitude m placed as
 * the float16 pattern m << 7 is the value times 2^-8 (multiplied back after the exact
 * float16 -> float32 conversion, which ignores DAZ); an E5M2 byte is the top byte of a
 * float16; NaN codes become the float16 quiet NaN 0x7E00 with their sign.
 *
 * pack_krows (row-major A, B as N x K) transposes 16 rows x 32 k-steps of float16
 * patterns in registers (unpacks of words, dwords and qwords, then a two-source qword
 * permute) before converting: the AVX2 packing's 8 x 8 byte transposes and 8-lane
 * stores ran at 0.75-0.8 cycles per value on a Sapphire Rapids class Xeon, 4-5% of a
 * 2048^3 GEMM's time.
 *
 * bf16 panels (the AVX512_BF16 kernel's pairs, one word per pair of k-steps and lane)
 * come from the same decoding and transposes: the float32 values of k-steps 2q and 2q+1
 * are merged into bf16(k=2q) | bf16(k=2q+1) << 16, their top halves (exact: an FP8
 * value, even times a power-of-two MX scale in range, has at most 4 significant bits).
 */
#include <immintrin.h>

#include "gemm_internal.h"

#define FP8MIX_INLINE static inline __attribute__((always_inline))

/* 32 FP8 bytes to their 32 float16 patterns (see above); e4 a constant after inlining. */
FP8MIX_INLINE __m512i to_half32(int e4, __m256i bytes)
{
    const __m512i sign = _mm512_set1_epi16((short)0x8000), qnan = _mm512_set1_epi16(0x7E00);
    __m512i x = _mm512_cvtepu8_epi16(bytes), h;
    __mmask32 nan;
    if (e4) {
        /* (x << 7 & 0x3F80) | (x << 8 & 0x8000): ternary logic a | (b & c) */
        h = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_slli_epi16(x, 7), _mm512_set1_epi16(0x3F80)),
                                      _mm512_slli_epi16(x, 8), sign, 0xF8);
        nan = _mm512_cmpeq_epi16_mask(_mm512_and_si512(x, _mm512_set1_epi16(0x7F)), _mm512_set1_epi16(0x7F));
    } else {
        h = _mm512_slli_epi16(x, 8);
        nan = _mm512_cmpgt_epu16_mask(_mm512_andnot_si512(sign, h), _mm512_set1_epi16(0x7C00));
    }
    /* NaN lanes: (h & 0x8000) | 0x7E00, ternary logic (a & b) | c */
    return _mm512_mask_mov_epi16(h, nan, _mm512_ternarylogic_epi32(h, sign, qnan, 0xEA));
}

/* 16 float16 patterns to float32 (times 2^8 for E4M3: exact). */
FP8MIX_INLINE __m512 to_f32(int e4, __m256i h)
{
    __m512 f = _mm512_cvtph_ps(h);
    return e4 ? _mm512_mul_ps(f, _mm512_set1_ps(256.0f)) : f;
}

/* 32 bytes at p, the first n (0..32) of them read, zeros for the rest. */
FP8MIX_INLINE __m256i load_upto32(const uint8_t *p, int64_t n)
{
    if (n >= 32) return _mm256_loadu_si256((const __m256i *)p);
    if (n <= 0) return _mm256_setzero_si256();
    return _mm256_maskz_loadu_epi8((__mmask32)((1u << n) - 1u), p);
}

/* 16 float16 patterns to float32 times the MX scales sv (pack_mx; exact there) when sc,
 * a constant after inlining, is not NULL. */
FP8MIX_INLINE __m512 to_f32_scaled(int e4, __m256i h, const float *sc, __m512 sv)
{
    __m512 f = to_f32(e4, h);
    return sc ? _mm512_mul_ps(f, sv) : f;
}

/* The bf16 pair words of two float32 vectors: top half of lo (k = 2q) in the low
 * half-word, top half of hi (k = 2q+1) in the high one: (hi & 0xFFFF0000) | (lo >> 16). */
FP8MIX_INLINE __m512i pair16(__m512 lo, __m512 hi)
{
    return _mm512_ternarylogic_epi32(_mm512_srli_epi32(_mm512_castps_si512(lo), 16), _mm512_castps_si512(hi),
                                     _mm512_set1_epi32((int)0xFFFF0000u), 0xF8); /* a | (b & c) */
}

/* k-steps k0 .. k0+31 (k0 a multiple of 32: one MX block) of 16 row slots from r0 (rows
 * nv.. zero; bytes from kc on zero) into slots k0 + (j ^ 1), j < nslot (float32), or the
 * pair words (k0 + j) / 2, j even and < nslot (bf16), lanes r0 .. r0+15 under mask m;
 * times the block's scales sc[(k0 / 32) * w + r] unless sc is NULL. */
FP8MIX_INLINE void krows16x32(int e4, int bf16, const uint8_t *src, int64_t ld, int r0, int nv, int64_t k0,
                              int64_t kc, int64_t nslot, int w, __mmask16 m, const float *sc, void *dst)
{
    const __m512 sv = sc ? _mm512_maskz_loadu_ps(m, sc + (k0 / 32) * w + r0) : _mm512_setzero_ps();
    __m512i R[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; r++)
        R[r] = r0 + r < nv ? to_half32(e4, load_upto32(src + (r0 + r) * ld + k0, kc - k0)) : _mm512_setzero_si512();
    /* words of rows (2i, 2i+1) -> dwords: P k = 8L + d, Q k = 8L + 4 + d (lane L) */
    __m512i P[8], Q[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        P[i] = _mm512_unpacklo_epi16(R[2 * i], R[2 * i + 1]);
        Q[i] = _mm512_unpackhi_epi16(R[2 * i], R[2 * i + 1]);
    }
    /* row quads j as qwords: S[s][j] holds k = 8L + 2s + e in qword e of lane L */
    __m512i S[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        S[0][j] = _mm512_unpacklo_epi32(P[2 * j], P[2 * j + 1]);
        S[1][j] = _mm512_unpackhi_epi32(P[2 * j], P[2 * j + 1]);
        S[2][j] = _mm512_unpacklo_epi32(Q[2 * j], Q[2 * j + 1]);
        S[3][j] = _mm512_unpackhi_epi32(Q[2 * j], Q[2 * j + 1]);
    }
    /* rows 8g .. 8g+7 of k = 8L + c in lane L of V[c][g]; then both row halves of one k
     * side by side: W0 lanes (k = c | k = 8 + c), W1 (k = 16 + c | k = 24 + c) */
    const __m512i lo = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
    float *o = (float *)dst + k0 * w + r0;
    uint32_t *o2 = (uint32_t *)dst + (k0 / 2) * w + r0;
#define KSTORE(j, h) /* k-step k0 + j to slot k0 + (j ^ 1) */ \
    if ((j) < nslot) _mm512_mask_storeu_ps(o + ((j) ^ 1) * w, m, to_f32_scaled(e4, h, sc, sv));
#define PSTORE(j, h0, h1) /* k-steps k0 + j, k0 + j + 1 (j even) to pair word (k0 + j) / 2 */ \
    if ((j) < nslot)                                                                           \
        _mm512_mask_storeu_epi32(o2 + ((j) / 2) * w, m,                                       \
                                 pair16(to_f32_scaled(e4, h0, sc, sv), to_f32_scaled(e4, h1, sc, sv)));
#pragma GCC unroll 4
    for (int s = 0; s < 4; s++) {
        __m512i w0[2], w1[2];
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            __m512i v0 = e ? _mm512_unpackhi_epi64(S[s][0], S[s][1]) : _mm512_unpacklo_epi64(S[s][0], S[s][1]);
            __m512i v1 = e ? _mm512_unpackhi_epi64(S[s][2], S[s][3]) : _mm512_unpacklo_epi64(S[s][2], S[s][3]);
            w0[e] = _mm512_permutex2var_epi64(v0, lo, v1);
            w1[e] = _mm512_permutex2var_epi64(v0, hi, v1);
        }
        if (bf16) { /* k = 2s and 2s + 1 side by side: one pair word each */
            PSTORE(2 * s, _mm512_castsi512_si256(w0[0]), _mm512_castsi512_si256(w0[1]))
            PSTORE(8 + 2 * s, _mm512_extracti64x4_epi64(w0[0], 1), _mm512_extracti64x4_epi64(w0[1], 1))
            PSTORE(16 + 2 * s, _mm512_castsi512_si256(w1[0]), _mm512_castsi512_si256(w1[1]))
            PSTORE(24 + 2 * s, _mm512_extracti64x4_epi64(w1[0], 1), _mm512_extracti64x4_epi64(w1[1], 1))
            continue;
        }
#pragma GCC unroll 2
        for (int e = 0; e < 2; e++) {
            int c = 2 * s + e;
            KSTORE(c, _mm512_castsi512_si256(w0[e]))
            KSTORE(8 + c, _mm512_extracti64x4_epi64(w0[e], 1))
            KSTORE(16 + c, _mm512_castsi512_si256(w1[e]))
            KSTORE(24 + c, _mm512_extracti64x4_epi64(w1[e], 1))
        }
    }
#undef PSTORE
#undef KSTORE
}

FP8MIX_INLINE void pack_krows_t(int e4, int bf16, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                const float *sc, void *out)
{
    int64_t kce = kc + (kc & 1);
    for (int r0 = 0; r0 < w; r0 += 16) {
        __mmask16 m = (__mmask16)(w - r0 >= 16 ? 0xFFFFu : (1u << (w - r0)) - 1u);
        for (int64_t k0 = 0; k0 < kce; k0 += 32)
            krows16x32(e4, bf16, src, ld, r0, nv, k0, kc, kce - k0, w, m, sc, out);
    }
}

/* pack_kcols: row k of the source holds the panel's w values of k-step k; two rows
 * (k, k+1) per conversion when w <= 16, one row when w <= 32; times the MX scales of
 * the pair's block, sc[(k / 32) * w + r], unless sc is NULL.  bf16: the pair's two
 * rows merged into one row of pair words. */
FP8MIX_INLINE void pack_kcols_t(int e4, int bf16, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                const float *sc, void *dst)
{
    float *out = (float *)dst;
    uint32_t *out2 = (uint32_t *)dst;
    int64_t kce = kc + (kc & 1);
    __mmask16 m0 = (__mmask16)(w >= 16 ? 0xFFFFu : (1u << w) - 1u);
    __mmask16 m1 = (__mmask16)(w >= 32 ? 0xFFFFu : w > 16 ? (1u << (w - 16)) - 1u : 0u);
    __mmask32 in = (__mmask32)(nv >= 32 ? 0xFFFFFFFFu : (1u << nv) - 1u);
    for (int64_t k = 0; k < kce; k += 2) {
        const uint8_t *r0 = src + k * ld, *r1 = r0 + ld;
        const float *sq = sc ? sc + (k / 32) * w : NULL;
        const __m512 s0 = sc ? _mm512_maskz_loadu_ps(m0, sq) : _mm512_setzero_ps();
        const __m512 s1 = sc && w > 16 ? _mm512_maskz_loadu_ps(m1, sq + 16) : _mm512_setzero_ps();
        if (w <= 16) {
            __m128i b0 = _mm_maskz_loadu_epi8((__mmask16)in, r0);
            __m128i b1 = k + 1 < kc ? _mm_maskz_loadu_epi8((__mmask16)in, r1) : _mm_setzero_si128();
            __m512i h = to_half32(e4, _mm256_inserti128_si256(_mm256_castsi128_si256(b0), b1, 1));
            __m512 f0 = to_f32_scaled(e4, _mm512_castsi512_si256(h), sc, s0);
            __m512 f1 = to_f32_scaled(e4, _mm512_extracti64x4_epi64(h, 1), sc, s0);
            if (bf16) {
                _mm512_mask_storeu_epi32(out2 + (k / 2) * w, m0, pair16(f0, f1));
            } else {
                _mm512_mask_storeu_ps(out + (k + 1) * w, m0, f0);
                _mm512_mask_storeu_ps(out + k * w, m0, f1);
            }
            continue;
        }
        __m512i h[2];
        for (int h1 = 0; h1 < 2; h1++)
            h[h1] = k + h1 < kc ? to_half32(e4, _mm256_maskz_loadu_epi8(in, h1 ? r1 : r0)) : _mm512_setzero_si512();
        if (bf16) {
            uint32_t *o = out2 + (k / 2) * w;
            _mm512_mask_storeu_epi32(o, m0, pair16(to_f32_scaled(e4, _mm512_castsi512_si256(h[0]), sc, s0),
                                                   to_f32_scaled(e4, _mm512_castsi512_si256(h[1]), sc, s0)));
            _mm512_mask_storeu_epi32(o + 16, m1,
                                     pair16(to_f32_scaled(e4, _mm512_extracti64x4_epi64(h[0], 1), sc, s1),
                                            to_f32_scaled(e4, _mm512_extracti64x4_epi64(h[1], 1), sc, s1)));
            continue;
        }
        for (int h1 = 0; h1 < 2; h1++) {
            float *o = out + (k + (h1 ^ 1)) * w;
            _mm512_mask_storeu_ps(o, m0, to_f32_scaled(e4, _mm512_castsi512_si256(h[h1]), sc, s0));
            _mm512_mask_storeu_ps(o + 16, m1, to_f32_scaled(e4, _mm512_extracti64x4_epi64(h[h1], 1), sc, s1));
        }
    }
}

/* Both layouts, both formats, float32 or bf16 pairs, with or without MX scales: e4, the
 * layout, bf16 and whether sc is NULL are constants inside. */
FP8MIX_INLINE void pack_any(int kcols, int bf16, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                            fp8mix_format fmt, const float *sc, void *out)
{
    const int e4 = fmt == FP8MIX_E4M3;
    if (kcols)
        e4 ? pack_kcols_t(1, bf16, src, ld, nv, w, kc, sc, out) : pack_kcols_t(0, bf16, src, ld, nv, w, kc, sc, out);
    else
        e4 ? pack_krows_t(1, bf16, src, ld, nv, w, kc, sc, out) : pack_krows_t(0, bf16, src, ld, nv, w, kc, sc, out);
}

void fp8mix_gemm_pack_krows__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                    fp8mix_format fmt, int bf16, void *dst)
{
    if (bf16)
        pack_any(0, 1, src, ld, nv, w, kc, fmt, NULL, dst);
    else
        pack_any(0, 0, src, ld, nv, w, kc, fmt, NULL, dst);
}

void fp8mix_gemm_pack_kcols__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                    fp8mix_format fmt, int bf16, void *dst)
{
    if (w > 32)
        fp8mix_gemm_pack_kcols__avx2(src, ld, nv, w, kc, fmt, bf16, dst);
    else if (bf16)
        pack_any(1, 1, src, ld, nv, w, kc, fmt, NULL, dst);
    else
        pack_any(1, 0, src, ld, nv, w, kc, fmt, NULL, dst);
}

/* gemm_internal.h's pack_mx: float32 panels times their MX scales as they are stored
 * (the panels of fn_mx_scaled; one multiply per 16 values, no second pass). */
void fp8mix_gemm_pack_mx__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                 int kcols, const float *sc, void *dst)
{
    float *out = (float *)dst;
    if (kcols && w > 32) { /* (not the kernel's panels: MR 14, NR 32) */
        fp8mix_gemm_pack_kcols__avx2(src, ld, nv, w, kc, fmt, 0, dst);
        for (int64_t t = 0; t < kc + (kc & 1); t++)
            for (int r = 0; r < w; r++) out[t * w + r] *= sc[(t / 32) * w + r];
        return;
    }
    pack_any(kcols, 0, src, ld, nv, w, kc, fmt, sc, out);
}

/* The same for bf16 pair panels (the AVX512_BF16 kernel's fn_mx_scaled), w <= 32 with
 * kcols: only the kernel's own panels (MR 14, NR 32). */
void fp8mix_gemm_pack_mx_bf16__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int kcols, const float *sc, void *dst)
{
    pack_any(kcols, 1, src, ld, nv, w, kc, fmt, sc, dst);
}
