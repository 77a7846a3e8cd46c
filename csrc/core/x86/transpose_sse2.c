/*
 * transpose_sse2.c — byte transpose in 8x8 tiles with SSE2 unpacks (the
 * x86-64 baseline, so no dispatch is needed).  rows and cols are multiples
 * of 8; transpose.c handles the edges.  Tested against the scalar reference
 * in tests/c/test_cast.c.
 */
#include <emmintrin.h>

#include "internal.h"

static inline void tile8(const uint8_t *s, int64_t ls, uint8_t *d, int64_t ld)
{
    __m128i r[8];
    for (int k = 0; k < 8; k++) r[k] = _mm_loadl_epi64((const __m128i *)(s + k * ls));
    /* interleave rows pairwise, then pairs of pairs: column j of the tile ends
     * up as 8 consecutive bytes */
    __m128i a0 = _mm_unpacklo_epi8(r[0], r[1]), a1 = _mm_unpacklo_epi8(r[2], r[3]);
    __m128i a2 = _mm_unpacklo_epi8(r[4], r[5]), a3 = _mm_unpacklo_epi8(r[6], r[7]);
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2), _mm_unpacklo_epi32(b1, b3),
                    _mm_unpackhi_epi32(b1, b3)};
    for (int k = 0; k < 4; k++) {
        _mm_storel_epi64((__m128i *)(d + (2 * k) * ld), c[k]);
        _mm_storel_epi64((__m128i *)(d + (2 * k + 1) * ld), _mm_unpackhi_epi64(c[k], c[k]));
    }
}

void fp8mix_transpose_u8_sse2(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                              int64_t cols)
{
    for (int64_t i = 0; i < rows; i += 8)
        for (int64_t j = 0; j < cols; j += 8) tile8(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
}
