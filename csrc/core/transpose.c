/*
 * transpose.c — byte-matrix transpose (dst[j][i] = src[i][j]) for the
 * cast+transpose path: the scalar reference, and the dispatch to the SSE2
 * kernels on x86-64 (SSE2 is part of the x86-64 baseline): 16x16 / 8x8
 * tiles, and the whole-line variant the cast tasks use.
 */
#include "internal.h"

void fp8mix_transpose_u8_ref(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst,
                             int64_t rows, int64_t cols)
{
    for (int64_t j = 0; j < cols; j++)
        for (int64_t i = 0; i < rows; i++) dst[j * ld_dst + i] = src[i * ld_src + j];
}

void fp8mix_transpose_u8(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                         int64_t cols)
{
#if FP8MIX_X86
    int64_t r8 = rows & ~(int64_t)7, c8 = cols & ~(int64_t)7;
    fp8mix_transpose_u8__sse2(src, ld_src, dst, ld_dst, r8, c8);
    /* the ragged right and bottom edges */
    fp8mix_transpose_u8_ref(src + c8, ld_src, dst + c8 * ld_dst, ld_dst, rows, cols - c8);
    fp8mix_transpose_u8_ref(src + r8 * ld_src, ld_src, dst + r8, ld_dst, rows - r8, c8);
#else
    fp8mix_transpose_u8_ref(src, ld_src, dst, ld_dst, rows, cols);
#endif
}

void fp8mix_transpose_u8_tile(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                              int64_t cols, int stream)
{
#if FP8MIX_X86
    if (rows % 16 == 0 && rows <= 64) {
        int64_t c16 = cols & ~(int64_t)15;
        fp8mix_transpose_u8_lines__sse2(src, ld_src, dst, ld_dst, rows, c16, stream);
        fp8mix_transpose_u8(src + c16, ld_src, dst + c16 * ld_dst, ld_dst, rows, cols - c16);
        return;
    }
#endif
    (void)stream;
    fp8mix_transpose_u8(src, ld_src, dst, ld_dst, rows, cols);
}
