/*
 * gemm_avx512.c — AVX-512 float32 GEMM microkernel, 14 x 32 tile (28 zmm
 * accumulators, A broadcast from the packed panel).  Packed panels and the
 * summation order are defined in gemm_internal.h; FMA equals mul+add here
 * because FP8 products are exact.  The MX mode runs the tile as two 7-row halves
 * (x86/gemm_mx_avx512.h); on panels the driver packed times their power-of-two MX
 * scales (fn_mx_scaled) it runs the whole tile, each block's part added to an L1 tile
 * buffer (0.92-0.94x the per-tensor GEMM's speed at 1024^3-2048^3 on a Sapphire Rapids
 * class Xeon, 1-2 threads, against 0.82-0.88x for the halves with their scale step).
 *
 * The plain tile (no block scales: the per-tensor / per-row GEMM) and the prescaled MX
 * tile are inline assembly (x86/gemm_tile14_asm.h, shared with the bf16 kernel).
 */
#include "gemm_internal.h"

#if FP8MIX_X86
#include <immintrin.h>

#include "x86/gemm_mx_avx512.h"
#define TILE14_MADD "vfmadd231ps"
#include "x86/gemm_tile14_asm.h"

#define ROWS14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

/* Block scales (rs): the block's part from +0, then C = (load_c ? C : +0) + part * rs[r],
 * mul then add. */
static inline __attribute__((always_inline)) void
tile14_scaled(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, int load_c, const float *rs)
{
#define DECL(r) __m512 c##r##0 = _mm512_setzero_ps(), c##r##1 = _mm512_setzero_ps();
    ROWS14(DECL)
#undef DECL
    /* Four k-steps per iteration (fewer loop uops per FMA); the empty asm
     * keeps GCC from hoisting the next step's loads and spilling accumulators. */
#define STEP(r, u)                                              \
    {                                                           \
        __m512 av = _mm512_set1_ps(a[14 * (u) + (r)]);          \
        c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);             \
        c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);             \
    }
#define KSTEP(u)                                                                           \
    {                                                                                      \
        __m512 b0 = _mm512_loadu_ps(b + 32 * (u)), b1 = _mm512_loadu_ps(b + 32 * (u) + 16); \
        STEP(0, u) STEP(1, u) STEP(2, u) STEP(3, u) STEP(4, u) STEP(5, u) STEP(6, u)       \
        STEP(7, u) STEP(8, u) STEP(9, u) STEP(10, u) STEP(11, u) STEP(12, u) STEP(13, u)   \
    }
    int64_t t = 0;
    for (; t + 4 <= kc; t += 4, a += 56, b += 128) {
        KSTEP(0) __asm__ volatile("" ::: "memory");
        KSTEP(1) __asm__ volatile("" ::: "memory");
        KSTEP(2) __asm__ volatile("" ::: "memory");
        KSTEP(3)
    }
    for (; t < kc; t++, a += 14, b += 32) KSTEP(0)
#undef KSTEP
#undef STEP
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

void fp8mix_gemm_ukernel_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp,
                                           float *c, int64_t ldc, int load_c,
                                           const float *rs)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    mx14_prefetch_next_tile(c, ldc);
    if (rs)
        tile14_scaled(kc, a, b, c, ldc, load_c, rs);
    else
        tile14_asm(kc, a, b, c, ldc, load_c, NULL, NULL);
}

/* The last K step of a whole tile with the epilogue's common case in its store
 * (gemm_internal.h's fn_final): no second pass over the tile. */
void fp8mix_gemm_ukernel_final_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                                 int load_c, const float *s, const float *bias)
{
    mx14_prefetch_next_tile(c, ldc);
    tile14_asm(kc, (const float *)ap, (const float *)bp, c, ldc, load_c, s, bias);
}

/* One k-step of 7 rows in assembly: the B row (two vectors) at byte offset OB of b,
 * the A values at byte offsets A0..A6 of a; zmm29-31 are its scratch registers. */
#define FMA2_ASM(r) "vfmadd231ps %%zmm29, %%zmm31, %[p" #r "0]\n\t" "vfmadd231ps %%zmm30, %%zmm31, %[p" #r "1]\n\t"
#define KSTEP7_ASM(OB, OB2, A0, A1, A2, A3, A4, A5, A6)                                  \
    "vmovups " STR(OB) "(%[b]), %%zmm29\n\t" "vmovups " STR(OB2) "(%[b]), %%zmm30\n\t"   \
    "vbroadcastss " STR(A0) "(%[a]), %%zmm31\n\t" FMA2_ASM(0)                            \
    "vbroadcastss " STR(A1) "(%[a]), %%zmm31\n\t" FMA2_ASM(1)                            \
    "vbroadcastss " STR(A2) "(%[a]), %%zmm31\n\t" FMA2_ASM(2)                            \
    "vbroadcastss " STR(A3) "(%[a]), %%zmm31\n\t" FMA2_ASM(3)                            \
    "vbroadcastss " STR(A4) "(%[a]), %%zmm31\n\t" FMA2_ASM(4)                            \
    "vbroadcastss " STR(A5) "(%[a]), %%zmm31\n\t" FMA2_ASM(5)                            \
    "vbroadcastss " STR(A6) "(%[a]), %%zmm31\n\t" FMA2_ASM(6)

#define ZERO2_ASM(r) "vpxord %[p" #r "0], %[p" #r "0], %[p" #r "0]\n\t" "vpxord %[p" #r "1], %[p" #r "1], %[p" #r "1]\n\t"
#define ZERO7_ASM ZERO2_ASM(0) ZERO2_ASM(1) ZERO2_ASM(2) ZERO2_ASM(3) ZERO2_ASM(4) ZERO2_ASM(5) ZERO2_ASM(6)

/* MX over a whole K step for 7 of the tile's 14 rows (gemm_mx_avx512.h; a: the packed
 * panel at the first of them, its k-steps still 14 rows apart; sa: their scales, 14
 * per block). */
static inline __attribute__((always_inline)) void
mx_half_f32_7x32(int64_t kc, const float *a, const float *b, float *c, int64_t ldc, const float *ci, int64_t ldi,
                 int load_c, const float *sa,
                 const float *sb, int pow2)
{
    MX7_ROWS(MX7_DECL)
    for (int64_t k0 = 0; k0 < kc; k0 += 32, sa += 14, sb += 32) {
        const int64_t kk = kc - k0 < 32 ? kc - k0 : 32; /* even: kc is */
        /* The block's parts cleared to +0 and its k-loop, two k-steps per iteration, in
         * assembly: from intrinsics GCC spilled parts to the stack (28 accumulators
         * live).  Each part takes its products k-step after k-step, as in the C
         * kernel above. */
        __m512 p00, p01, p10, p11, p20, p21, p30, p31, p40, p41, p50, p51, p60, p61;
        int64_t n2 = kk / 2;
        __asm__ volatile(
            ZERO7_ASM
            "1:\n\t"
            KSTEP7_ASM(0, 64, 0, 4, 8, 12, 16, 20, 24)
            KSTEP7_ASM(128, 192, 56, 60, 64, 68, 72, 76, 80)
            "addq $112, %[a]\n\t"
            "addq $256, %[b]\n\t"
            "decq %[n]\n\t"
            "jnz 1b\n\t"
            : [a] "+r"(a), [b] "+r"(b), [n] "+r"(n2),
              [p00] "=&v"(p00), [p01] "=&v"(p01), [p10] "=&v"(p10), [p11] "=&v"(p11), [p20] "=&v"(p20),
              [p21] "=&v"(p21), [p30] "=&v"(p30), [p31] "=&v"(p31), [p40] "=&v"(p40), [p41] "=&v"(p41),
              [p50] "=&v"(p50), [p51] "=&v"(p51), [p60] "=&v"(p60), [p61] "=&v"(p61)
            :
            : "xmm29", "xmm30", "xmm31", "cc", "memory");
        MX7_SCALE_BLOCK(pow2)
    }
    MX7_ROWS(MX7_STORE)
}

/* MX scales over a whole K step (gemm_internal.h's fp8mix_gemm_ukernel_mx_fn, and with
 * pow2 its fn_mx_pow2): the tile as two 7-row halves, each with its outputs in registers across the blocks
 * (mx_half_f32_7x32; the B sliver is read twice, from L1). */
static inline __attribute__((always_inline)) void
mx_tile(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc, int load_c, const float *sa,
        const float *sb, int pow2)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    mx14_prefetch_next_tile(c, ldc);
    float t[7 * 32] __attribute__((aligned(64)));
    if (load_c) mx7_copy_rows(t, c + 7 * ldc, ldc);
    mx_half_f32_7x32(kc, a, b, c, ldc, c, ldc, load_c, sa, sb, pow2);
    mx_half_f32_7x32(kc, a + 7, b, c + 7 * ldc, ldc, t, 32, load_c, sa + 7, sb, pow2);
}

void fp8mix_gemm_ukernel_mx_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
    int load_c, const float *sa, const float *sb)
{
    mx_tile(kc, ap, bp, c, ldc, load_c, sa, sb, 0);
}

/* The same sums where every scale and scale product is a normal power of two
 * (gemm_internal.h's fn_mx_pow2). */
void fp8mix_gemm_ukernel_mx_pow2_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
    int load_c, const float *sa, const float *sb)
{
    mx_tile(kc, ap, bp, c, ldc, load_c, sa, sb, 1);
}

/* One block's parts (zmm0-27, the plain tile's registers) added to the tile buffer o
 * (14 rows of 32 floats): o = o + part, o the first operand as in the MX rule. */
#define OADD_ASM(v) "vmovaps " STR(v) "*64(%[o]), %%zmm30\n\t" "vaddps %%zmm" #v ", %%zmm30, %%zmm30\n\t" \
    "vmovaps %%zmm30, " STR(v) "*64(%[o])\n\t"
#define OADD2_ASM(r0, r1) OADD_ASM(r0) OADD_ASM(r1)

/* fn_mx_scaled's sums over a K step into the tile buffer o (+0 or C on entry): for each
 * 32-deep block (the last one kc % 32 deep, even) part = +0 + products, o = o + part.
 * The whole 14 x 32 tile at once, as the plain kernel (one pass over the B sliver, 16
 * loads per 28 FMAs): the outputs wait in o, an L1 buffer without C's aliasing rows,
 * for 28 loads, adds and stores per block. */
static void mx_scaled_asm(int64_t kc, const float *a, const float *b, float *o)
{
    int64_t nfull = kc / 32, rem2 = (kc % 32) / 2, n4 = 0;
    __asm__ volatile(
        "testq %[nfull], %[nfull]\n\t"
        "jz 3f\n\t"
        "1:\n\t"
        TILE14_ASM(CZERO_ASM)
        "movq $8, %[n4]\n\t"
        ".p2align 6\n\t"
        "2:\n\t"
        KLOOP14_ASM
        "addq $224, %[a]\n\t"
        "addq $512, %[b]\n\t"
        "decq %[n4]\n\t"
        "jnz 2b\n\t"
        TILE14_ASM(OADD2_ASM)
        "decq %[nfull]\n\t"
        "jnz 1b\n\t"
        "3:\n\t"
        "testq %[rem2], %[rem2]\n\t"
        "jz 5f\n\t"
        TILE14_ASM(CZERO_ASM)
        "4:\n\t"
        KSTEP14_ASM(0, 0) KSTEP14_ASM(128, 56)
        "addq $112, %[a]\n\t"
        "addq $256, %[b]\n\t"
        "decq %[rem2]\n\t"
        "jnz 4b\n\t"
        TILE14_ASM(OADD2_ASM)
        "5:\n\t"
        "vzeroupper\n\t"
        : [a] "+&r"(a), [b] "+&r"(b), [nfull] "+&r"(nfull), [rem2] "+&r"(rem2), [n4] "+&r"(n4)
        : [o] "r"(o)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
          "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "cc", "memory");
}

/* The same sums on panels packed already multiplied by their scales (gemm_internal.h's
 * fn_mx_scaled; sa and sb are not read). */
void fp8mix_gemm_ukernel_mx_scaled_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp, float *c,
                                                     int64_t ldc, int load_c, const float *sa, const float *sb)
{
    (void)sa;
    (void)sb;
    float o[14 * 32] __attribute__((aligned(64)));
    mx14_prefetch_next_tile(c, ldc);
    for (int r = 0; r < 14; r++) {
        __m512 v0 = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
        __m512 v1 = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
        _mm512_store_ps(o + r * 32, v0);
        _mm512_store_ps(o + r * 32 + 16, v1);
    }
    mx_scaled_asm(kc, (const float *)ap, (const float *)bp, o);
    for (int r = 0; r < 14; r++) {
        _mm512_storeu_ps(c + r * ldc, _mm512_load_ps(o + r * 32));
        _mm512_storeu_ps(c + r * ldc + 16, _mm512_load_ps(o + r * 32 + 16));
    }
}

#endif /* FP8MIX_X86 */
