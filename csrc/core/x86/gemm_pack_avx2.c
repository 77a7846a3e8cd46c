/*
 * gemm_pack_avx2.c — AVX2 packing of GEMM panels: FP8 bytes decoded to
 * float32 (or bf16 pairs) sixteen at a time, in the layouts of gemm_internal.h.
 * Bit-identical to the scalar packing in gemm_ref.c (tests/c/test_gemm.c compares
 * them over every byte, also with DAZ/FTZ set); used by every x86 microkernel.
 *
 * Decoding goes through float16, which F16C converts exactly (its denormals
 * included, whatever MXCSR says): an E5M2 byte is the top byte of a float16;
 * an E4M3 magnitude m, placed as the float16 pattern m << 7, is the E4M3 value
 * times 2^-8, subnormals included (the float16 subnormal spacing 2^-24 is
 * the E4M3 one, 2^-9, times 2^-8), so one exact multiply by 2^8 finishes it.
 * NaN codes become the float16 quiet NaN 0x7E00 (sign kept), which converts
 * to fp8mix_decode_ref's 0x7FC00000; E5M2 0x7C is infinity.  No table gather
 * (slow on several AMD cores).
 */
#include <immintrin.h>

#include "gemm_internal.h"
#include "transpose8.h"

#define FP8MIX_INLINE static inline __attribute__((always_inline))

/* Sixteen FP8 bytes to sixteen float32 patterns: bytes 0-7 into *lo, 8-15
 * into *hi (the float16 stage works on all 16 lanes at once); e4 is a
 * constant after inlining. */
FP8MIX_INLINE void decode16(int e4, __m128i b, __m256i *lo, __m256i *hi)
{
    const __m256i sign = _mm256_set1_epi16((short)0x8000), qnan = _mm256_set1_epi16(0x7E00);
    __m256i x = _mm256_cvtepu8_epi16(b), h, nan;
    if (e4) {
        h = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi16(x, 7), _mm256_set1_epi16(0x3F80)),
                            _mm256_and_si256(_mm256_slli_epi16(x, 8), sign));
        nan = _mm256_cmpeq_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), _mm256_set1_epi16(0x7F));
    } else {
        h = _mm256_slli_epi16(x, 8);
        nan = _mm256_cmpgt_epi16(_mm256_andnot_si256(sign, h), _mm256_set1_epi16(0x7C00));
    }
    h = _mm256_blendv_epi8(h, _mm256_or_si256(_mm256_and_si256(h, sign), qnan), nan);
    __m256 f0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h)), f1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (e4) {
        f0 = _mm256_mul_ps(f0, _mm256_set1_ps(256.0f));
        f1 = _mm256_mul_ps(f1, _mm256_set1_ps(256.0f));
    }
    *lo = _mm256_castps_si256(f0);
    *hi = _mm256_castps_si256(f1);
}

/* Store the first n (1..8) lanes of v at p. */
static inline void store_lanes(uint32_t *p, __m256i v, int n)
{
    if (n == 8) {
        _mm256_storeu_si256((__m256i *)p, v);
    } else if (n == 6) {
        _mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(v));
        _mm_storel_epi64((__m128i *)(p + 4), _mm256_extracti128_si256(v, 1));
    } else {
        uint32_t t[8];
        _mm256_storeu_si256((__m256i *)t, v);
        memcpy(p, t, (size_t)n * 4);
    }
}

/* bf16 pair words of k-steps (lo, hi): the high halves of two patterns. */
static inline __m256i pair16(__m256i lo, __m256i hi)
{
    return _mm256_or_si256(_mm256_srli_epi32(lo, 16), _mm256_and_si256(hi, _mm256_set1_epi32((int)0xFFFF0000u)));
}

/* The decoded k-steps (k, k+1), k even, of n rows/columns from r0: as a bf16
 * pair word, or in slots k+1 and k (slot t holds k = t ^ 1).  bf16 and n are
 * constants in the fast loops below (no branch per store there). */
FP8MIX_INLINE void store_pair(uint32_t *out, int64_t k, int w, int r0, __m256i v0, __m256i v1, int n, int bf16)
{
    if (bf16) {
        store_lanes(out + (k >> 1) * w + r0, pair16(v0, v1), n);
    } else {
        store_lanes(out + k * w + r0, v1, n);
        store_lanes(out + (k + 1) * w + r0, v0, n);
    }
}

/* Up to 8 bytes at p, `avail` of them readable (zeros for the rest).  Four
 * to seven bytes are two overlapping 4-byte loads (the bytes they share are
 * the same), not a call to memcpy: a 6-wide A panel of a column-major A
 * (wgrad's dy^T) took that call for every k-step. */
static inline __m128i load8_upto(const uint8_t *p, int64_t avail)
{
    if (avail >= 8) return _mm_loadl_epi64((const __m128i *)p);
    uint64_t v = 0;
    if (avail >= 4) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + avail - 4, 4);
        v = lo | (uint64_t)hi << (8 * (avail - 4));
    } else {
        for (int64_t i = 0; i < avail; i++) v |= (uint64_t)p[i] << (8 * i);
    }
    return _mm_cvtsi64_si128((long long)v);
}

/* Exactly 6 bytes at p (zeros above). */
static inline __m128i load6(const uint8_t *p)
{
    uint32_t lo, hi;
    memcpy(&lo, p, 4);
    memcpy(&hi, p + 2, 4);
    return _mm_cvtsi64_si128((long long)(lo | (uint64_t)hi << 16));
}

/* Bytes k0 .. k0+7 of a row (zeros past kc, or everywhere for a padding row). */
static inline __m128i load_row8(const uint8_t *row, int64_t k0, int64_t kc)
{
    return row ? load8_upto(row + k0, kc - k0) : _mm_setzero_si128();
}

/* pack_krows, any panel, k-steps from k_start (a multiple of 8) on: every
 * load guarded (edge panels and the last, partial block of k-steps). */
static void krows_any(int e4, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, int bf16, uint32_t *out,
                      int64_t k_start)
{
    int64_t kce = kc + (kc & 1);
    for (int r0 = 0; r0 < w; r0 += 8) {
        int n = w - r0 < 8 ? w - r0 : 8;
        const uint8_t *rows[8];
        for (int r = 0; r < 8; r++) rows[r] = r0 + r < nv && r < n ? src + (r0 + r) * ld : NULL;
        for (int64_t k0 = k_start; k0 < kce; k0 += 8) {
            __m128i in[8], pairs[4];
            for (int r = 0; r < 8; r++) in[r] = load_row8(rows[r], k0, kc);
            fp8mix_transpose8x8_pairs(in, pairs); /* pairs[m]: k-steps 2m and 2m + 1 */
            int64_t kn = kce - k0 < 8 ? kce - k0 : 8; /* even */
            for (int64_t k = 0; k < kn; k += 2) {
                __m256i v0, v1;
                decode16(e4, pairs[k >> 1], &v0, &v1);
                store_pair(out, k0 + k, w, r0, v0, v1, n, bf16);
            }
        }
    }
}

/* pack_krows of 8 row slots from r0, the first n (8 or 6) of them panel rows
 * that are all valid, the rest zero: k-steps 0 .. kfull-1 (a multiple of 8),
 * unguarded loads.  e4, bf16 and n are constants after inlining. */
FP8MIX_INLINE void krows_group(int e4, int bf16, int n, const uint8_t *src, int64_t ld, int w, int r0,
                               int64_t kfull, uint32_t *out)
{
    const uint8_t *p = src + r0 * ld;
    for (int64_t k0 = 0; k0 < kfull; k0 += 8) {
        __m128i in[8], pairs[4];
        for (int r = 0; r < 8; r++)
            in[r] = r < n ? _mm_loadl_epi64((const __m128i *)(p + r * ld + k0)) : _mm_setzero_si128();
        fp8mix_transpose8x8_pairs(in, pairs);
        for (int m = 0; m < 4; m++) {
            __m256i v0, v1;
            decode16(e4, pairs[m], &v0, &v1);
            store_pair(out, k0 + 2 * m, w, r0, v0, v1, n, bf16);
        }
    }
}

FP8MIX_INLINE void pack_krows_t(int e4, int bf16, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                void *dst)
{
    uint32_t *out = (uint32_t *)dst;
    int64_t kfull = kc & ~(int64_t)7;
    if (nv < w || (w & 7) % 6 != 0 || kfull == 0) { /* an edge panel or an unusual width */
        krows_any(e4, src, ld, nv, w, kc, bf16, out, 0);
        return;
    }
    int r0 = 0;
    for (; r0 + 8 <= w; r0 += 8) krows_group(e4, bf16, 8, src, ld, w, r0, kfull, out);
    if (r0 < w) krows_group(e4, bf16, 6, src, ld, w, r0, kfull, out);
    if (kfull < kc + (kc & 1)) krows_any(e4, src, ld, nv, w, kc, bf16, out, kfull);
}

void fp8mix_gemm_pack_krows__avx2(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst)
{
    if (fmt == FP8MIX_E4M3) {
        if (bf16) pack_krows_t(1, 1, src, ld, nv, w, kc, dst);
        else pack_krows_t(1, 0, src, ld, nv, w, kc, dst);
    } else {
        if (bf16) pack_krows_t(0, 1, src, ld, nv, w, kc, dst);
        else pack_krows_t(0, 0, src, ld, nv, w, kc, dst);
    }
}

/* Bytes c0 .. c0+7 of row k (zeros past nv or past kc). */
static inline __m128i load_cols8(const uint8_t *src, int64_t ld, int64_t k, int64_t kc, int c0, int nv)
{
    return k < kc && c0 < nv ? load8_upto(src + k * ld + c0, nv - c0) : _mm_setzero_si128();
}

/* pack_kcols, any panel, k-steps from k_start (even) on, every load guarded. */
static void kcols_any(int e4, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, int bf16, uint32_t *out,
                      int64_t k_start)
{
    int64_t kce = kc + (kc & 1);
    for (int64_t k = k_start; k < kce; k += 2) {
        for (int c0 = 0; c0 < w; c0 += 8) {
            int n = w - c0 < 8 ? w - c0 : 8;
            __m256i v0, v1;
            decode16(e4, _mm_unpacklo_epi64(load_cols8(src, ld, k, kc, c0, nv), load_cols8(src, ld, k + 1, kc, c0, nv)),
                     &v0, &v1);
            store_pair(out, k, w, c0, v0, v1, n, bf16);
        }
    }
}

/* pack_kcols of a panel whose w columns are all valid, w = 8j or 8j + 6:
 * k-step pairs below kfull (even), unguarded loads. */
FP8MIX_INLINE void pack_kcols_t(int e4, int bf16, const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                void *dst)
{
    uint32_t *out = (uint32_t *)dst;
    int64_t kfull = kc & ~(int64_t)1;
    int w8 = w & ~7;
    if (nv < w || (w - w8) % 6 != 0) {
        kcols_any(e4, src, ld, nv, w, kc, bf16, out, 0);
        return;
    }
    for (int64_t k = 0; k < kfull; k += 2) {
        const uint8_t *r0 = src + k * ld, *r1 = r0 + ld;
        __m256i v0, v1;
        for (int c0 = 0; c0 < w8; c0 += 8) {
            decode16(e4, _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(r0 + c0)),
                                            _mm_loadl_epi64((const __m128i *)(r1 + c0))), &v0, &v1);
            store_pair(out, k, w, c0, v0, v1, 8, bf16);
        }
        if (w8 < w) {
            decode16(e4, _mm_unpacklo_epi64(load6(r0 + w8), load6(r1 + w8)), &v0, &v1);
            store_pair(out, k, w, w8, v0, v1, 6, bf16);
        }
    }
    if (kfull < kc) kcols_any(e4, src, ld, nv, w, kc, bf16, out, kfull);
}

void fp8mix_gemm_pack_kcols__avx2(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst)
{
    if (fmt == FP8MIX_E4M3) {
        if (bf16) pack_kcols_t(1, 1, src, ld, nv, w, kc, dst);
        else pack_kcols_t(1, 0, src, ld, nv, w, kc, dst);
    } else {
        if (bf16) pack_kcols_t(0, 1, src, ld, nv, w, kc, dst);
        else pack_kcols_t(0, 0, src, ld, nv, w, kc, dst);
    }
}
