/*
 * widen_t_avx2.c — the transposed widening read of block scaling's x^T casts
 * (cast_t.c): buf[j * ldb + i] = (float)x[i * ld_x + j], 8x8 tiles at a time.
 *
 * Why: the scalar gather writes one float per load at a 512-byte stride and
 * was more than half of fp8mix_quantize_current_t (0.64 of 1.17 ms at 1024^2,
 * Zen 3).  Here eight rows are widened to float32 in registers and transposed
 * with the usual unpack / shuffle / lane-permute network, so every store is a
 * whole 8-float row of the buffer.  Widening is exact for every input type,
 * and the result equals fp8mix_widen_t_ref's bit for bit (the ragged
 * edges go to it) except for a float16 signalling NaN, which F16C returns
 * quiet: every NaN casts to the same FP8 code and folds into amax as the
 * same quiet NaN, so the quantisation is unchanged.  Tested through fp8mix_quantize_current_t
 * against fp8mix_quantize_current of a contiguous x^T, per ISA
 * (tests/c/test_cast.c).
 */
#include <immintrin.h>

#include "internal.h"

static inline __m256 load_row8(const uint8_t *p, fp8mix_dtype xt)
{
    switch (xt) {
    case FP8MIX_F32: return _mm256_loadu_ps((const float *)p);
    case FP8MIX_BF16:
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    default: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    }
}

/* r[k]: 8 floats of row k -> column c of the 8 rows stored at out + c * ldb. */
static inline void transpose8_store(__m256 r[8], float *out, int64_t ldb)
{
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    /* u0..u3 hold columns 0..3 (rows 0-3) in the low lane and 4..7 in the high lane */
    _mm256_storeu_ps(out + 0 * ldb, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(out + 1 * ldb, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(out + 2 * ldb, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(out + 3 * ldb, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(out + 4 * ldb, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(out + 5 * ldb, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(out + 6 * ldb, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(out + 7 * ldb, _mm256_permute2f128_ps(u3, u7, 0x31));
}

void fp8mix_widen_t__avx2(const void *x, fp8mix_dtype xt, int64_t ld_x, int64_t rows, int64_t cols, float *buf,
                          int64_t ldb)
{
    const size_t esz = dtype_size(xt);
    const uint8_t *xb = (const uint8_t *)x;
    int64_t r8 = rows & ~(int64_t)7, c8 = cols & ~(int64_t)7;
    for (int64_t i = 0; i < r8; i += 8)
        for (int64_t j = 0; j < c8; j += 8) {
            __m256 r[8];
            for (int k = 0; k < 8; k++) r[k] = load_row8(xb + (size_t)((i + k) * ld_x + j) * esz, xt);
            transpose8_store(r, buf + j * ldb + i, ldb);
        }
    /* the ragged right strip (all rows) and bottom strip (8-aligned columns) */
    if (c8 < cols) fp8mix_widen_t_ref(xb + (size_t)c8 * esz, xt, ld_x, rows, cols - c8, buf + c8 * ldb, ldb);
    if (r8 < rows && c8 > 0)
        fp8mix_widen_t_ref(xb + (size_t)(r8 * ld_x) * esz, xt, ld_x, rows - r8, c8, buf + r8, ldb);
}
