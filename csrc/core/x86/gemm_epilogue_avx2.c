/*
 * gemm_epilogue_avx2.c — the GEMM epilogue's common case on a tile, eight
 * lanes at a time: out = (sa * sb) * sum, then + bias, a multiply and an add,
 * each rounded to float32 (no FMA: the rule of gemm_epilogue.c).
 * Bit-identical to fp8mix_gemm_scale_rows_ref; tests/c/test_gemm.c
 * compares every microkernel's GEMMs (this epilogue included) with the
 * scalar reference.
 */
#include <immintrin.h>

#include "gemm_internal.h"

void fp8mix_gemm_scale_rows__avx2(float *out, int64_t ldo, const float *vals, int64_t ldv, int64_t rows, int64_t n,
                                  const float *sa, int per_row, float sb, const float *bias)
{
    for (int64_t r = 0; r < rows; r++) {
        const float s = sa[per_row ? r : 0] * sb;
        const __m256 sv = _mm256_set1_ps(s);
        const float *src = vals + r * ldv;
        float *dst = out + r * ldo;
        int64_t c = 0;
        if (bias) {
            for (; c + 8 <= n; c += 8)
                _mm256_storeu_ps(dst + c, _mm256_add_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(src + c)),
                                                        _mm256_loadu_ps(bias + c)));
            for (; c < n; c++) {
                float x = s * src[c];
                dst[c] = x + bias[c];
            }
        } else {
            for (; c + 8 <= n; c += 8) _mm256_storeu_ps(dst + c, _mm256_mul_ps(sv, _mm256_loadu_ps(src + c)));
            for (; c < n; c++) dst[c] = s * src[c];
        }
    }
}
