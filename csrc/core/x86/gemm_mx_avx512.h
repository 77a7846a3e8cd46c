/*
 * gemm_mx_avx512.h — what the AVX-512 kernels' MX mode shares (x86/gemm_avx512.c,
 * x86/gemm_avx512bf16.c; included only by files built with AVX-512 flags): the 14 x 32
 * tile runs as two 7-row halves whose 7 x 32 outputs o##r##0/1 stay in 14 zmm
 * registers for a whole K step, and each 32-deep block's part p##r##0/1 in 14 more,
 * so that C is loaded and stored once per K step rather than once per block (the C
 * rows, often 4 KiB multiples apart, collide in L1: with a round trip through C per
 * block the MX GEMM ran at 0.7-0.8x the per-tensor one).  The including file makes
 * each block's parts (+0 + products, canonical order); these macros do the rest:
 *   acc = (load_c ? C : +0);  per block  acc = acc + part * (sa[r] * sb[c]);  C = acc
 * (the scale product, the multiply and the add each rounded: three instructions, no
 * FMA, the build has -ffp-contract=off; the operands in the order of the 14-row
 * kernels' block store).  Used inside a half kernel with c, ldc, load_c, sa (this
 * block's 7 row scales) and sb (its 32 column scales) in scope.  The pow2 mode
 * (gemm_internal.h's fn_mx_pow2: every scale and scale product a normal power of
 * two) forms sa * sb by adding exponents in the integer unit instead, the same bits
 * as the multiply there; the multiply port, which the products saturate, is left
 * one multiply per output vector and block (+5-7% kernel speed on Zen 4).
 */
#ifndef FP8MIX_GEMM_MX_AVX512_H
#define FP8MIX_GEMM_MX_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MX7_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6)

/* (The outputs' start is read from ci, stride ldi: C itself, or the copy mx7_copy_rows
 * made of the second half's rows.) */
#define MX7_DECL(r)                                                                     \
    __m512 o##r##0 = load_c ? _mm512_loadu_ps(ci + r * ldi) : _mm512_setzero_ps();     \
    __m512 o##r##1 = load_c ? _mm512_loadu_ps(ci + r * ldi + 16) : _mm512_setzero_ps();

#define MX7_SCALE(r)                                                                                    \
    {                                                                                                   \
        __m512 s = _mm512_set1_ps(sa[r]);                                                               \
        __m512 s0 = _mm512_mul_ps(s, _mm512_loadu_ps(sb)), s1 = _mm512_mul_ps(s, _mm512_loadu_ps(sb + 16)); \
        o##r##0 = _mm512_add_ps(o##r##0, _mm512_mul_ps(p##r##0, s0));                                   \
        o##r##1 = _mm512_add_ps(o##r##1, _mm512_mul_ps(p##r##1, s1));                                   \
    }

/* pow2 mode: sbb0/sbb1 hold bits(sb) - bits(1.0f) (MX7_SB_POW2, once per block). */
#define MX7_SB_POW2                                                                                 \
    const __m512i one_ = _mm512_set1_epi32(0x3F800000);                                             \
    const __m512i sbb0 = _mm512_sub_epi32(_mm512_loadu_si512((const void *)sb), one_);              \
    const __m512i sbb1 = _mm512_sub_epi32(_mm512_loadu_si512((const void *)(sb + 16)), one_);
#define MX7_SCALE_POW2(r)                                                                           \
    {                                                                                               \
        __m512i s = _mm512_set1_epi32(mx_f32_bits(sa[r]));                                          \
        __m512 s0 = _mm512_castsi512_ps(_mm512_add_epi32(s, sbb0));                                 \
        __m512 s1 = _mm512_castsi512_ps(_mm512_add_epi32(s, sbb1));                                 \
        o##r##0 = _mm512_add_ps(o##r##0, _mm512_mul_ps(p##r##0, s0));                               \
        o##r##1 = _mm512_add_ps(o##r##1, _mm512_mul_ps(p##r##1, s1));                               \
    }
/* One block's scale step in either mode (pow2: a constant of the inlined half kernel). */
#define MX7_SCALE_BLOCK(pow2)               \
    if (pow2) {                             \
        MX7_SB_POW2                         \
        MX7_ROWS(MX7_SCALE_POW2)            \
    } else {                                \
        MX7_ROWS(MX7_SCALE)                 \
    }

static inline int32_t mx_f32_bits(float f)
{
    int32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#define MX7_STORE(r)                              \
    _mm512_storeu_ps(c + r * ldc, o##r##0);       \
    _mm512_storeu_ps(c + r * ldc + 16, o##r##1);

/* The AVX-512 kernels run A panels outer (their a_outer): the driver's next tile
 * is usually the next 32 columns of the same 14 rows, fetched into L2 once per tile. */
static inline void mx14_prefetch_next_tile(const float *c, int64_t ldc)
{
    for (int r = 0; r < 14; r++) {
        _mm_prefetch((const char *)(c + r * ldc + 32), _MM_HINT_T1);
        _mm_prefetch((const char *)(c + r * ldc + 63), _MM_HINT_T1);
    }
}

/* The tile's second 7 C rows (stride ldc) into t (7 x 32), at the tile's start: their
 * loads then miss together with the first half's, one wait per tile as in the 14-row
 * kernels, rather than a second one in the middle of the tile (C rows 4-8 KiB apart
 * share a few L1 sets: a half's loads missed there, 8-9% of the kernel's time each at
 * 2048^3). */
static inline void mx7_copy_rows(float *t, const float *c, int64_t ldc)
{
    for (int r = 0; r < 7; r++) {
        _mm512_store_ps(t + r * 32, _mm512_loadu_ps(c + r * ldc));
        _mm512_store_ps(t + r * 32 + 16, _mm512_loadu_ps(c + r * ldc + 16));
    }
}

#endif /* FP8MIX_GEMM_MX_AVX512_H */
