/*
 * gemm_pack_avx2.c — AVX2 packing of GEMM panels: FP8 bytes decoded to
 * float32 (or bf16 pairs) eight at a time, in the layouts of gemm_internal.h.
 * Bit-identical to the scalar packing in gemm.c (tests/c/test_gemm.c compares
 * them panel by panel); used by every x86 microkernel.
 *
 * Decoding is arithmetic, not a table gather (slow on several AMD cores):
 * a normal FP8 magnitude m (exponent field >= 1) is the float32 pattern
 * (m << (23 - mbits)) + ((127 - bias) << 23); a subnormal one (exponent field
 * 0, m < 2^mbits) is float(m) * 2^(1 - bias - mbits), an exact product whose
 * result is a normal float32 (so DAZ/FTZ in MXCSR cannot change it); NaN
 * (E4M3 0x7F, E5M2 0x7D..0x7F) is the quiet NaN and E5M2 0x7C infinity, as in
 * fp8mix_decode_ref; the sign bit is copied.
 */
#include <immintrin.h>

#include "gemm_internal.h"

typedef struct dec8 {
    __m128i shift;        /* 23 - mbits                                  */
    __m256i off;          /* (127 - bias) << 23                          */
    __m256i sub_lim;      /* magnitudes below it are subnormal           */
    __m256i spec_gt;      /* magnitudes above it are inf / NaN           */
    __m256i inf_code;     /* the infinity magnitude (E5M2), else none    */
    __m256 sub_scale;     /* 2^(1 - bias - mbits)                        */
} dec8;

static dec8 dec8_init(fp8mix_format fmt)
{
    dec8 d;
    int e4 = fmt == FP8MIX_E4M3;
    int mbits = e4 ? 3 : 2, bias = e4 ? 7 : 15;
    d.shift = _mm_cvtsi32_si128(23 - mbits);
    d.off = _mm256_set1_epi32((127 - bias) << 23);
    d.sub_lim = _mm256_set1_epi32(1 << mbits);
    d.spec_gt = _mm256_set1_epi32(e4 ? 0x7E : 0x7B);
    d.inf_code = _mm256_set1_epi32(e4 ? 0x100 : 0x7C);
    d.sub_scale = _mm256_set1_ps(e4 ? 0x1p-9f : 0x1p-16f);
    return d;
}

/* Eight FP8 bytes (the low 8 of b) to eight float32 patterns. */
static inline __m256i decode8(const dec8 *d, __m128i b)
{
    __m256i x = _mm256_cvtepu8_epi32(b);
    __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
    __m256i sign = _mm256_slli_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x80)), 24);
    __m256i v = _mm256_add_epi32(_mm256_sll_epi32(mag, d->shift), d->off);
    __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(mag), d->sub_scale));
    v = _mm256_blendv_epi8(v, sub, _mm256_cmpgt_epi32(d->sub_lim, mag));
    __m256i special = _mm256_blendv_epi8(_mm256_set1_epi32(0x7FC00000), _mm256_set1_epi32(0x7F800000),
                                         _mm256_cmpeq_epi32(mag, d->inf_code));
    v = _mm256_blendv_epi8(v, special, _mm256_cmpgt_epi32(mag, d->spec_gt));
    return _mm256_or_si256(v, sign);
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

/* 8 rows x 8 bytes -> out[c] = byte c of every row (row r in byte r), c = 0..7. */
static inline void transpose8x8(const __m128i r[8], __m128i out[8])
{
    __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
    __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                    _mm_unpackhi_epi32(b1, b3)};
    for (int m = 0; m < 4; m++) {
        out[2 * m] = c[m];
        out[2 * m + 1] = _mm_unpackhi_epi64(c[m], c[m]);
    }
}

/* Bytes k0 .. k0+7 of a row (zeros past kc, or everywhere for a padding row). */
static inline __m128i load_row8(const uint8_t *row, int64_t k0, int64_t kc)
{
    if (!row) return _mm_setzero_si128();
    if (k0 + 8 <= kc) return _mm_loadl_epi64((const __m128i *)(row + k0));
    uint8_t t[8] = {0};
    if (k0 < kc) memcpy(t, row + k0, (size_t)(kc - k0));
    return _mm_loadl_epi64((const __m128i *)t);
}

void fp8mix_gemm_pack_krows__avx2(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst)
{
    const dec8 d = dec8_init(fmt);
    uint32_t *out = (uint32_t *)dst;
    int64_t kce = kc + (kc & 1);
    for (int r0 = 0; r0 < w; r0 += 8) {
        int n = w - r0 < 8 ? w - r0 : 8;
        const uint8_t *rows[8];
        for (int r = 0; r < 8; r++) rows[r] = r0 + r < nv && r < n ? src + (r0 + r) * ld : NULL;
        for (int64_t k0 = 0; k0 < kce; k0 += 8) {
            __m128i in[8], col[8];
            for (int r = 0; r < 8; r++) in[r] = load_row8(rows[r], k0, kc);
            transpose8x8(in, col);
            int64_t kn = kce - k0 < 8 ? kce - k0 : 8; /* even */
            for (int64_t k = 0; k < kn; k += 2) {
                __m256i v0 = decode8(&d, col[k]), v1 = decode8(&d, col[k + 1]);
                if (bf16) {
                    store_lanes(out + ((k0 + k) >> 1) * w + r0, pair16(v0, v1), n);
                } else { /* slot t holds k = t ^ 1 */
                    store_lanes(out + (k0 + k) * w + r0, v1, n);
                    store_lanes(out + (k0 + k + 1) * w + r0, v0, n);
                }
            }
        }
    }
}

/* Bytes c0 .. c0+7 of row k (zeros past nv or past kc). */
static inline __m128i load_cols8(const uint8_t *src, int64_t ld, int64_t k, int64_t kc, int c0, int nv)
{
    if (k >= kc || c0 >= nv) return _mm_setzero_si128();
    const uint8_t *p = src + k * ld + c0;
    if (c0 + 8 <= nv) return _mm_loadl_epi64((const __m128i *)p);
    uint8_t t[8] = {0};
    memcpy(t, p, (size_t)(nv - c0));
    return _mm_loadl_epi64((const __m128i *)t);
}

void fp8mix_gemm_pack_kcols__avx2(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst)
{
    const dec8 d = dec8_init(fmt);
    uint32_t *out = (uint32_t *)dst;
    int64_t kce = kc + (kc & 1);
    for (int64_t k = 0; k < kce; k += 2) {
        for (int c0 = 0; c0 < w; c0 += 8) {
            int n = w - c0 < 8 ? w - c0 : 8;
            __m256i v0 = decode8(&d, load_cols8(src, ld, k, kc, c0, nv));
            __m256i v1 = decode8(&d, load_cols8(src, ld, k + 1, kc, c0, nv));
            if (bf16) {
                store_lanes(out + (k >> 1) * w + c0, pair16(v0, v1), n);
            } else {
                store_lanes(out + k * w + c0, v1, n);
                store_lanes(out + (k + 1) * w + c0, v0, n);
            }
        }
    }
}
