/*
 * transpose_sse2.c — byte transpose with SSE2 unpacks (the x86-64 baseline,
 * so no dispatch is needed): 16x16 tiles (full 16-byte rows in and out), 8x8
 * tiles for a remaining 8-wide strip.  rows and cols are multiples of 8;
 * transpose.c handles the ragged edges.  Column tiles are the outer loop, so
 * the few destination rows a column tile writes are completed before the
 * next ones are touched (destination rows are often a power of two apart and
 * share L1 sets).  Tested against the scalar reference in tests/c/test_cast.c.
 */
#include <emmintrin.h>

#include "internal.h"
#include "transpose8.h"

static inline void tile8(const uint8_t *s, int64_t ls, uint8_t *d, int64_t ld)
{
    __m128i r[8], c[8];
    for (int k = 0; k < 8; k++) r[k] = _mm_loadl_epi64((const __m128i *)(s + k * ls));
    fp8mix_transpose8x8_regs(r, c);
    for (int k = 0; k < 8; k++) _mm_storel_epi64((__m128i *)(d + k * ld), c[k]);
}

/* 16 rows of 16 bytes -> 16 columns; four rounds of unpacks, each doubling
 * the width of the units that hold one column's consecutive rows. */
static inline void tile16(const uint8_t *s, int64_t ls, uint8_t *d, int64_t ld)
{
    __m128i r[16], a[16], b[16], c[16];
    for (int k = 0; k < 16; k++) r[k] = _mm_loadu_si128((const __m128i *)(s + k * ls));
    for (int m = 0; m < 8; m++) { /* a[2m]: columns 0-7, a[2m+1]: 8-15; rows 2m, 2m+1 */
        a[2 * m] = _mm_unpacklo_epi8(r[2 * m], r[2 * m + 1]);
        a[2 * m + 1] = _mm_unpackhi_epi8(r[2 * m], r[2 * m + 1]);
    }
    for (int n = 0; n < 4; n++) { /* b[4n + g]: columns 4g .. 4g+3, rows 4n .. 4n+3 */
        b[4 * n + 0] = _mm_unpacklo_epi16(a[4 * n], a[4 * n + 2]);
        b[4 * n + 1] = _mm_unpackhi_epi16(a[4 * n], a[4 * n + 2]);
        b[4 * n + 2] = _mm_unpacklo_epi16(a[4 * n + 1], a[4 * n + 3]);
        b[4 * n + 3] = _mm_unpackhi_epi16(a[4 * n + 1], a[4 * n + 3]);
    }
    for (int p = 0; p < 2; p++) /* c[8p + 2g (+1)]: columns 4g, 4g+1 (4g+2, 4g+3), rows 8p .. 8p+7 */
        for (int g = 0; g < 4; g++) {
            c[8 * p + 2 * g] = _mm_unpacklo_epi32(b[8 * p + g], b[8 * p + 4 + g]);
            c[8 * p + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * p + g], b[8 * p + 4 + g]);
        }
    for (int g = 0; g < 4; g++) {
        _mm_storeu_si128((__m128i *)(d + (4 * g + 0) * ld), _mm_unpacklo_epi64(c[2 * g], c[8 + 2 * g]));
        _mm_storeu_si128((__m128i *)(d + (4 * g + 1) * ld), _mm_unpackhi_epi64(c[2 * g], c[8 + 2 * g]));
        _mm_storeu_si128((__m128i *)(d + (4 * g + 2) * ld), _mm_unpacklo_epi64(c[2 * g + 1], c[8 + 2 * g + 1]));
        _mm_storeu_si128((__m128i *)(d + (4 * g + 3) * ld), _mm_unpackhi_epi64(c[2 * g + 1], c[8 + 2 * g + 1]));
    }
}

/* A whole-line transpose for the cast+transpose tasks: rows (16, 32, 48 or
 * 64) x cols (a multiple of 16) into dst, where each destination row receives
 * `rows` consecutive bytes.  16 columns are staged at a time (L1), then each
 * destination piece is written in one go; with `stream`, by non-temporal
 * stores when dst is 16-byte aligned there: a large qt then costs no reads
 * for ownership (its lines are written whole), which is up to half of its
 * memory traffic. */
void fp8mix_transpose_u8_lines__sse2(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                                     int64_t cols, int stream)
{
    _Alignas(16) uint8_t stage[16 * 64];
    for (int64_t j = 0; j < cols; j += 16) {
        for (int64_t i = 0; i < rows; i += 16) tile16(src + i * ld_src + j, ld_src, stage + i, 64);
        for (int c = 0; c < 16; c++) {
            uint8_t *d = dst + (j + c) * ld_dst;
            const __m128i *st = (const __m128i *)(stage + c * 64);
            if (stream && ((uintptr_t)d & 15) == 0)
                for (int64_t i = 0; i < rows / 16; i++) _mm_stream_si128((__m128i *)d + i, _mm_load_si128(st + i));
            else
                for (int64_t i = 0; i < rows / 16; i++) _mm_storeu_si128((__m128i *)d + i, _mm_load_si128(st + i));
        }
    }
    if (stream) _mm_sfence(); /* order the streamed lines before the task's end is signalled */
}

void fp8mix_transpose_u8__sse2(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                               int64_t cols)
{
    int64_t r16 = rows & ~(int64_t)15, c16 = cols & ~(int64_t)15;
    for (int64_t j = 0; j < c16; j += 16)
        for (int64_t i = 0; i < r16; i += 16) tile16(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
    /* an 8-wide strip at the right (all rows) and at the bottom (16-aligned columns) */
    for (int64_t j = c16; j < cols; j += 8)
        for (int64_t i = 0; i < rows; i += 8) tile8(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
    for (int64_t j = 0; j < c16; j += 8)
        for (int64_t i = r16; i < rows; i += 8) tile8(src + i * ld_src + j, ld_src, dst + j * ld_dst + i, ld_dst);
}
