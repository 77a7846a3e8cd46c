/*
 * transpose8.h — the 8x8 byte transpose in SSE2 registers, shared by the
 * transpose kernels (transpose_sse2.c) and the GEMM packing
 * (gemm_pack_avx2.c): rows interleaved pairwise, then pairs of pairs.
 */
#ifndef FP8MIX_X86_TRANSPOSE8_H
#define FP8MIX_X86_TRANSPOSE8_H

#include <emmintrin.h>

/* in[r]: 8 bytes of row r (low half) -> pairs[m]: column 2m of the 8 rows in
 * the low half, column 2m + 1 in the high half (row r in byte r of each). */
static inline void fp8mix_transpose8x8_pairs(const __m128i in[8], __m128i pairs[4])
{
    __m128i a0 = _mm_unpacklo_epi8(in[0], in[1]), a1 = _mm_unpacklo_epi8(in[2], in[3]);
    __m128i a2 = _mm_unpacklo_epi8(in[4], in[5]), a3 = _mm_unpacklo_epi8(in[6], in[7]);
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);
    pairs[0] = _mm_unpacklo_epi32(b0, b2);
    pairs[1] = _mm_unpackhi_epi32(b0, b2);
    pairs[2] = _mm_unpacklo_epi32(b1, b3);
    pairs[3] = _mm_unpackhi_epi32(b1, b3);
}

/* in[r]: 8 bytes of row r (low half) -> out[c]: byte c of every row (row r in
 * byte r, low half), c = 0..7. */
static inline void fp8mix_transpose8x8_regs(const __m128i in[8], __m128i out[8])
{
    __m128i c[4];
    fp8mix_transpose8x8_pairs(in, c);
    for (int m = 0; m < 4; m++) {
        out[2 * m] = c[m];
        out[2 * m + 1] = _mm_unpackhi_epi64(c[m], c[m]);
    }
}

#endif /* FP8MIX_X86_TRANSPOSE8_H */
