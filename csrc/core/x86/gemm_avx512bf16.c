/*
 * gemm_avx512bf16.c — AVX512_BF16 GEMM microkernel, 14 x 32 tile: every FP8
 * value is exact in bf16, so vdpbf16ps multiplies two k-steps per lane at
 * once.  Its two adds per lane (odd element first, each rounded) are the
 * canonical order of gemm_internal.h; dispatch.c probes once that this CPU agrees
 * bit for bit with the float32 kernel before using it.  The plain tile is the
 * float32 kernel's inline assembly with vdpbf16ps for its FMAs (x86/gemm_tile14_asm.h:
 * both panel layouts advance 14 and 32 words per step).  The MX modes run the tile as
 * two 7-row halves (x86/gemm_mx_avx512.h), on panels prescaled by their scales where
 * the driver allows it: there a block's step is o = o + part, one add per output vector
 * (on Zen 4 the halves ran at 0.95-0.98x the per-tensor GEMM's speed, 1024^3-2048^3, 1-2
 * threads, against 0.87-0.89x for the whole tile adding each block into an L1 buffer as
 * the float32 kernel does: with two k-steps per instruction that buffer's loads, adds
 * and stores weigh twice as much).
 */
#include "gemm_internal.h"

#if FP8MIX_X86 && defined(__AVX512BF16__)
#include <immintrin.h>

#include "x86/gemm_mx_avx512.h"
#define TILE14_MADD "vdpbf16ps"
#include "x86/gemm_tile14_asm.h"

const int fp8mix_gemm_have_avx512bf16 = 1;

#define ROWS14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

static inline __m512bh bcast_pair(const unsigned char *a)
{
    int32_t w;
    memcpy(&w, a, 4);
    return (__m512bh)_mm512_set1_epi32(w);
}

/* One pair of k-steps: the B pair row (two vectors) at pair u of b, and row r's A pair
 * times it into accumulators P##r##0, P##r##1 (both kernels below). */
#define BROW(u)                                                                     \
    __m512bh b0 = (__m512bh)_mm512_loadu_si512((const void *)(b + 128 * (u)));     \
    __m512bh b1 = (__m512bh)_mm512_loadu_si512((const void *)(b + 128 * (u) + 64));
#define STEP(P, r, u)                                           \
    {                                                           \
        __m512bh av = bcast_pair(a + 56 * (u) + 4 * (r));       \
        P##r##0 = _mm512_dpbf16_ps(P##r##0, av, b0);            \
        P##r##1 = _mm512_dpbf16_ps(P##r##1, av, b1);            \
    }

/* The tile with block scales (rs: MR row scales): part over kc k-steps from +0, then
 * C = (load_c ? C : +0) + part * rs[r], mul then add. */
static void tile14_scaled(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc, int load_c,
                          const float *rs)
{
    const unsigned char *a = (const unsigned char *)ap, *b = (const unsigned char *)bp;
#define DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
    ROWS14(DECL)
#undef DECL
    /* Two pairs of k-steps per iteration; the empty asm keeps GCC from
     * hoisting the next step's loads and spilling accumulators. */
#define CSTEP(r) STEP(c, r, ku)
#define KSTEP(u) { const int ku = (u); BROW(ku) ROWS14(CSTEP) }
    int64_t q = 0, nq = kc / 2;
    for (; q + 2 <= nq; q += 2, a += 2 * 56, b += 2 * 128) {
        KSTEP(0) __asm__ volatile("" ::: "memory");
        KSTEP(1)
    }
    for (; q < nq; q++, a += 56, b += 128) KSTEP(0)
#undef KSTEP
#undef CSTEP
#define SCALE(r)                                                                    \
    {                                                                               \
        __m512 s0 = _mm512_set1_ps(rs[r]), s1 = s0;                                 \
        __m512 o0 = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();    \
        __m512 o1 = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps(); \
        _mm512_storeu_ps(c + r * ldc, _mm512_add_ps(o0, _mm512_mul_ps(c##r##0, s0)));      \
        _mm512_storeu_ps(c + r * ldc + 16, _mm512_add_ps(o1, _mm512_mul_ps(c##r##1, s1))); \
    }
    ROWS14(SCALE)
#undef SCALE
}

/* kc is even (the driver pads bf16 panels to whole pairs): kc / 2 vdpbf16ps steps. */
void fp8mix_gemm_ukernel_bf16_14x32__avx512bf16(int64_t kc, const void *ap,
                                                const void *bp, float *c,
                                                int64_t ldc, int load_c,
                                                const float *rs)
{
    mx14_prefetch_next_tile(c, ldc);
    if (rs)
        tile14_scaled(kc, ap, bp, c, ldc, load_c, rs);
    else
        tile14_asm(kc / 2, ap, bp, c, ldc, load_c, NULL, NULL);
}

/* The last K step of a whole tile with the epilogue's common case in its store
 * (gemm_internal.h's fn_final). */
void fp8mix_gemm_ukernel_final_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                      int64_t ldc, int load_c, const float *s, const float *bias)
{
    mx14_prefetch_next_tile(c, ldc);
    tile14_asm(kc / 2, ap, bp, c, ldc, load_c, s, bias);
}

/* MX over a whole K step for 7 of the tile's 14 rows (gemm_mx_avx512.h; a: the packed
 * panel at the first of them, its k-steps still 14 rows apart; sa: their scales, 14
 * per block).  mode (a constant after inlining): 0 fn_mx, 1 fn_mx_pow2, 2 fn_mx_scaled
 * (sa, sb not read), 3 fn_blocks (128-deep blocks, sa the row scales rs, 14 per block;
 * sb not read). */
static inline __attribute__((always_inline)) void
mx_half_bf16_7x32(int64_t kc, const unsigned char *a, const unsigned char *b, float *c, int64_t ldc, const float *ci,
                  int64_t ldi, int load_c,
                  const float *sa, const float *sb, int mode)
{
    const int64_t bd = mode == 3 ? 128 : 32; /* block depth in k-steps */
    MX7_ROWS(MX7_DECL)
    for (int64_t k0 = 0; k0 < kc; k0 += bd, sa += 14, sb += mode == 3 ? 0 : 32) {
        const int64_t np = (kc - k0 < bd ? kc - k0 : bd) / 2; /* pairs: kc is even */
#define ZERO(r) __m512 p##r##0 = _mm512_setzero_ps(), p##r##1 = _mm512_setzero_ps();
        MX7_ROWS(ZERO)
#undef ZERO
#define PSTEP(r) STEP(p, r, ku)
#define KSTEP(u) { const int ku = (u); BROW(ku) MX7_ROWS(PSTEP) }
        int64_t t = 0;
        for (; t + 2 <= np; t += 2, a += 2 * 56, b += 2 * 128) {
            KSTEP(0) __asm__ volatile("" ::: "memory");
            KSTEP(1) __asm__ volatile("" ::: "memory");
        }
        for (; t < np; t++, a += 56, b += 128) KSTEP(0)
#undef KSTEP
#undef PSTEP
        if (mode == 2) { /* prescaled panels: o = o + part */
#define OADD(r) o##r##0 = _mm512_add_ps(o##r##0, p##r##0); o##r##1 = _mm512_add_ps(o##r##1, p##r##1);
            MX7_ROWS(OADD)
#undef OADD
        } else if (mode == 3) { /* block scales: o = o + part * rs[r] */
#define OSCALE(r)                                                   \
    {                                                               \
        const __m512 s = _mm512_set1_ps(sa[r]);                     \
        o##r##0 = _mm512_add_ps(o##r##0, _mm512_mul_ps(p##r##0, s)); \
        o##r##1 = _mm512_add_ps(o##r##1, _mm512_mul_ps(p##r##1, s)); \
    }
            MX7_ROWS(OSCALE)
#undef OSCALE
        } else {
            MX7_SCALE_BLOCK(mode)
        }
    }
    MX7_ROWS(MX7_STORE)
}

/* MX scales over a whole K step (gemm_internal.h's fp8mix_gemm_ukernel_mx_fn; mode as
 * above): the tile as two 7-row halves, each with its outputs in registers across the
 * blocks (mx_half_bf16_7x32; the B sliver is read twice, from L1). */
static inline __attribute__((always_inline)) void
mx_tile(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc, int load_c, const float *sa,
        const float *sb, int mode)
{
    const unsigned char *a = (const unsigned char *)ap, *b = (const unsigned char *)bp;
    mx14_prefetch_next_tile(c, ldc);
    float t[7 * 32] __attribute__((aligned(64)));
    if (load_c) mx7_copy_rows(t, c + 7 * ldc, ldc);
    mx_half_bf16_7x32(kc, a, b, c, ldc, c, ldc, load_c, sa, sb, mode);
    mx_half_bf16_7x32(kc, a + 7 * 4, b, c + 7 * ldc, ldc, t, 32, load_c, sa + 7, sb, mode);
}

void fp8mix_gemm_ukernel_mx_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
    int load_c, const float *sa, const float *sb)
{
    mx_tile(kc, ap, bp, c, ldc, load_c, sa, sb, 0);
}

/* The same sums where every scale and scale product is a normal power of two
 * (gemm_internal.h's fn_mx_pow2). */
void fp8mix_gemm_ukernel_mx_pow2_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
    int load_c, const float *sa, const float *sb)
{
    mx_tile(kc, ap, bp, c, ldc, load_c, sa, sb, 1);
}

/* Block scales over a whole K step (gemm_internal.h's fn_blocks): the halves again, each
 * 128-deep block's part times its row scale added to outputs held in registers; C is
 * loaded and stored once per K step instead of once per block. */
void fp8mix_gemm_ukernel_blocks_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                       int64_t ldc, int load_c, const float *rs)
{
    mx_tile(kc, ap, bp, c, ldc, load_c, rs, rs, 3);
}

/* The same sums on bf16 panels packed already multiplied by their scales
 * (gemm_internal.h's fn_mx_scaled; sa and sb only step along, unread). */
void fp8mix_gemm_ukernel_mx_scaled_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                          int64_t ldc, int load_c, const float *sa, const float *sb)
{
    mx_tile(kc, ap, bp, c, ldc, load_c, sa, sb, 2);
}
#elif FP8MIX_X86
/* Built without AVX512_BF16 support: never selected. */
const int fp8mix_gemm_have_avx512bf16 = 0;
void fp8mix_gemm_ukernel_bf16_14x32__avx512bf16(int64_t kc, const void *ap,
                                                const void *bp, float *c,
                                                int64_t ldc, int load_c,
                                                const float *rs)
{
    (void)kc; (void)ap; (void)bp; (void)c; (void)ldc; (void)load_c; (void)rs;
}
void fp8mix_gemm_ukernel_final_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                      int64_t ldc, int load_c, const float *s, const float *bias)
{
    (void)kc; (void)ap; (void)bp; (void)c; (void)ldc; (void)load_c; (void)s; (void)bias;
}
void fp8mix_gemm_ukernel_mx_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                                   int load_c, const float *sa, const float *sb)
{
    (void)kc; (void)ap; (void)bp; (void)c; (void)ldc; (void)load_c; (void)sa; (void)sb;
}
void fp8mix_gemm_ukernel_mx_pow2_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                        int64_t ldc, int load_c, const float *sa, const float *sb)
{
    (void)kc; (void)ap; (void)bp; (void)c; (void)ldc; (void)load_c; (void)sa; (void)sb;
}
void fp8mix_gemm_ukernel_mx_scaled_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                          int64_t ldc, int load_c, const float *sa, const float *sb)
{
    (void)kc; (void)ap; (void)bp; (void)c; (void)ldc; (void)load_c; (void)sa; (void)sb;
}
void fp8mix_gemm_ukernel_blocks_bf16_14x32__avx512bf16(int64_t kc, const void *ap, const void *bp, float *c,
                                                       int64_t ldc, int load_c, const float *rs)
{
    (void)kc; (void)ap; (void)bp; (void)c; (void)ldc; (void)load_c; (void)rs;
}
#endif
