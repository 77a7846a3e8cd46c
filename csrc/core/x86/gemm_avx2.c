/*
 * gemm_avx2.c — AVX2/FMA float32 GEMM microkernel, 6 x 16 tile: 12 ymm
 * accumulators, 2 for the B row, 1 for the broadcast A value (15 of the 16
 * registers); per k-step 12 FMAs against 8 loads, so the two FMA ports set the
 * pace.  Packed panels and the summation order are defined in
 * gemm_internal.h; FMA equals mul+add here because FP8 products are exact.
 */
#include "gemm_internal.h"

#if FP8MIX_X86
#include <immintrin.h>

#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define STR_(x) #x
#define STR(x) STR_(x)
/* One k-step in assembly: the B row (two vectors) at byte offsets OB, OB2 of b, the six
 * A values at byte offsets A0..A5 of a; ymm13-15 are its scratch registers. */
#define FMA2_ASM(r) "vfmadd231ps %%ymm13, %%ymm15, %[c" #r "0]\n\t" "vfmadd231ps %%ymm14, %%ymm15, %[c" #r "1]\n\t"
#define KSTEP_ASM(OB, OB2, A0, A1, A2, A3, A4, A5)         \
    "vmovups " STR(OB) "(%[b]), %%ymm13\n\t"                \
    "vmovups " STR(OB2) "(%[b]), %%ymm14\n\t"               \
    "vbroadcastss " STR(A0) "(%[a]), %%ymm15\n\t" FMA2_ASM(0) \
    "vbroadcastss " STR(A1) "(%[a]), %%ymm15\n\t" FMA2_ASM(1) \
    "vbroadcastss " STR(A2) "(%[a]), %%ymm15\n\t" FMA2_ASM(2) \
    "vbroadcastss " STR(A3) "(%[a]), %%ymm15\n\t" FMA2_ASM(3) \
    "vbroadcastss " STR(A4) "(%[a]), %%ymm15\n\t" FMA2_ASM(4) \
    "vbroadcastss " STR(A5) "(%[a]), %%ymm15\n\t" FMA2_ASM(5)

/* %[n] iterations of four k-steps (label 1), advancing a and b. */
#define KLOOP4_ASM                                  \
    "1:\n\t"                                        \
    KSTEP_ASM(0, 32, 0, 4, 8, 12, 16, 20)           \
    KSTEP_ASM(64, 96, 24, 28, 32, 36, 40, 44)       \
    KSTEP_ASM(128, 160, 48, 52, 56, 60, 64, 68)     \
    KSTEP_ASM(192, 224, 72, 76, 80, 84, 88, 92)     \
    "addq $96, %[a]\n\t"                            \
    "addq $256, %[b]\n\t"                           \
    "decq %[n]\n\t"                                 \
    "jnz 1b\n\t"

/* The driver's next tile is usually the next 6 rows of C: start fetching it into
 * L2 now (C rows are often 4 KiB multiples apart and collide in L1). */
static inline __attribute__((always_inline)) void prefetch_next_tile(const float *c, int64_t ldc)
{
    for (int r = 0; r < 6; r++) {
        _mm_prefetch((const char *)(c + (6 + r) * ldc), _MM_HINT_T1);
        _mm_prefetch((const char *)(c + (6 + r) * ldc + 15), _MM_HINT_T1);
    }
}

/* The kernel, and with s (the final K step) the epilogue in its store: see
 * gemm_internal.h's fp8mix_gemm_ukernel_fn and fp8mix_gemm_ukernel_final_fn. */
static inline __attribute__((always_inline)) void
ukernel_6x16(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc, int load_c, const float *rs,
             const float *s, const float *bias, const float *cs)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    int init = load_c && !rs;
    if (!rs) /* (block scales: once per tile, in the blocks entry) */
        prefetch_next_tile(c, ldc);
#define DECL(r)                                                                   \
    __m256 c##r##0 = init ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();  \
    __m256 c##r##1 = init ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
    ROWS6(DECL)
#undef DECL
    /* Four k-steps per iteration, written in assembly: compiled from intrinsics, GCC
     * spilled three accumulators to the stack inside the loop (and copied others
     * between registers), which held the kernel at 92% of the FMA peak on a Zen 3 core;
     * this loop runs at the peak (benchmarks/bench_isa_limits.py).  Each accumulator
     * still takes its products one k-step after another: the same sums as the C steps
     * below. */
    int64_t t = kc & ~(int64_t)3, n4 = kc / 4;
    if (n4 > 0) {
        __asm__ volatile(
            KLOOP4_ASM
            : [a] "+r"(a), [b] "+r"(b), [n] "+r"(n4),
              [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11),
              [c20] "+x"(c20), [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31),
              [c40] "+x"(c40), [c41] "+x"(c41), [c50] "+x"(c50), [c51] "+x"(c51)
            :
            : "xmm13", "xmm14", "xmm15", "cc", "memory");
    }
#define STEP(r, u)                                              \
    {                                                           \
        __m256 av = _mm256_broadcast_ss(a + 6 * (u) + (r));     \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);             \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);             \
    }
#define KSTEP(u)                                                                      \
    {                                                                                 \
        __m256 b0 = _mm256_loadu_ps(b + 16 * (u)), b1 = _mm256_loadu_ps(b + 16 * (u) + 8); \
        STEP(0, u) STEP(1, u) STEP(2, u) STEP(3, u) STEP(4, u) STEP(5, u)             \
    }
    for (; t < kc; t++, a += 6, b += 16) KSTEP(0)
#undef KSTEP
#undef STEP
    if (s) { /* out = s[r] * acc (+ bias): mul, then add, each rounded (no FMA) */
        __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
        __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
#define FINAL(r)                                                                         \
    {                                                                                    \
        __m256 sv = _mm256_set1_ps(s[r]);                                                \
        __m256 o0 = _mm256_mul_ps(sv, c##r##0), o1 = _mm256_mul_ps(sv, c##r##1);         \
        if (bias) o0 = _mm256_add_ps(o0, b0), o1 = _mm256_add_ps(o1, b1);               \
        _mm256_storeu_ps(c + r * ldc, o0);                                               \
        _mm256_storeu_ps(c + r * ldc + 8, o1);                                           \
    }
        ROWS6(FINAL)
#undef FINAL
        return;
    }
    if (!rs) {
#define STORE(r)                              \
    _mm256_storeu_ps(c + r * ldc, c##r##0);   \
    _mm256_storeu_ps(c + r * ldc + 8, c##r##1);
        ROWS6(STORE)
#undef STORE
        return;
    }
    /* Block scales: C = (load_c ? C : +0) + part * rs[r], mul then add; MX (cs, the
     * columns' scales): C = (load_c ? C : +0) + part * (rs[r] * cs[c]). */
    __m256 cs0 = cs ? _mm256_loadu_ps(cs) : _mm256_setzero_ps();
    __m256 cs1 = cs ? _mm256_loadu_ps(cs + 8) : _mm256_setzero_ps();
#define SCALE(r)                                                                   \
    {                                                                              \
        __m256 s0 = _mm256_set1_ps(rs[r]), s1 = s0;                                \
        if (cs) s0 = _mm256_mul_ps(s0, cs0), s1 = _mm256_mul_ps(s1, cs1);          \
        __m256 o0 = load_c ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();   \
        __m256 o1 = load_c ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps(); \
        _mm256_storeu_ps(c + r * ldc, _mm256_add_ps(o0, _mm256_mul_ps(c##r##0, s0)));     \
        _mm256_storeu_ps(c + r * ldc + 8, _mm256_add_ps(o1, _mm256_mul_ps(c##r##1, s1))); \
    }
    ROWS6(SCALE)
#undef SCALE
}

void fp8mix_gemm_ukernel_f32_6x16__avx2(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc, int load_c,
                                        const float *rs)
{
    ukernel_6x16(kc, ap, bp, c, ldc, load_c, rs, NULL, NULL, NULL);
}

/* One row's block epilogue in assembly: C[r] = C[r] + part * rs[r] (mul, then add with
 * C as the first operand, as the C version's _mm256_add_ps(o, mul)), then the part
 * cleared for the next block.  ROW is C's row address, RS the byte offset of rs[r]. */
#define BLOCK_ROW_ASM(r, ROW, RS)                              \
    "vbroadcastss " STR(RS) "(%[rs]), %%ymm15\n\t"              \
    "vmulps %[c" #r "0], %%ymm15, %%ymm13\n\t"                  \
    "vmulps %[c" #r "1], %%ymm15, %%ymm14\n\t"                  \
    "vmovups " ROW ", %%ymm12\n\t"                              \
    "vaddps %%ymm13, %%ymm12, %%ymm13\n\t"                       \
    "vmovups %%ymm13, " ROW "\n\t"                              \
    "vmovups 32" ROW ", %%ymm12\n\t"                            \
    "vaddps %%ymm14, %%ymm12, %%ymm14\n\t"                       \
    "vmovups %%ymm14, 32" ROW "\n\t"                            \
    "vxorps %[c" #r "0], %[c" #r "0], %[c" #r "0]\n\t"           \
    "vxorps %[c" #r "1], %[c" #r "1], %[c" #r "1]\n\t"

/* nblk whole 128-deep blocks added into C (which holds earlier sums): the block loop,
 * its k-loop and the per-block epilogue in one assembly loop, so that a block's end
 * costs no call, no reload of the kernel's state and no separate loop (+2-3% over
 * calling ukernel_6x16 per block; the same operations in the same order). */
static void blocks_6x16_asm(int64_t nblk, const float *a, const float *b, float *c, int64_t ldc, const float *rs)
{
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51; /* (asm outputs: cleared first) */
    const int64_t ldb = ldc * (int64_t)sizeof(float);
    float *c3 = c + 3 * ldc;
    int64_t n;
    __asm__ volatile(
        "vxorps %[c00], %[c00], %[c00]\n\t" "vxorps %[c01], %[c01], %[c01]\n\t"
        "vxorps %[c10], %[c10], %[c10]\n\t" "vxorps %[c11], %[c11], %[c11]\n\t"
        "vxorps %[c20], %[c20], %[c20]\n\t" "vxorps %[c21], %[c21], %[c21]\n\t"
        "vxorps %[c30], %[c30], %[c30]\n\t" "vxorps %[c31], %[c31], %[c31]\n\t"
        "vxorps %[c40], %[c40], %[c40]\n\t" "vxorps %[c41], %[c41], %[c41]\n\t"
        "vxorps %[c50], %[c50], %[c50]\n\t" "vxorps %[c51], %[c51], %[c51]\n\t"
        "2:\n\t"
        "movq $32, %[n]\n\t"
        KLOOP4_ASM
        BLOCK_ROW_ASM(0, "(%[c])", 0)
        BLOCK_ROW_ASM(1, "(%[c],%[ldb],1)", 4)
        BLOCK_ROW_ASM(2, "(%[c],%[ldb],2)", 8)
        BLOCK_ROW_ASM(3, "(%[c3])", 12)
        BLOCK_ROW_ASM(4, "(%[c3],%[ldb],1)", 16)
        BLOCK_ROW_ASM(5, "(%[c3],%[ldb],2)", 20)
        "addq $24, %[rs]\n\t"
        "decq %[nblk]\n\t"
        "jnz 2b\n\t"
        : [a] "+r"(a), [b] "+r"(b), [rs] "+r"(rs), [nblk] "+r"(nblk), [n] "=&r"(n),
          [c00] "=&x"(c00), [c01] "=&x"(c01), [c10] "=&x"(c10), [c11] "=&x"(c11),
          [c20] "=&x"(c20), [c21] "=&x"(c21), [c30] "=&x"(c30), [c31] "=&x"(c31),
          [c40] "=&x"(c40), [c41] "=&x"(c41), [c50] "=&x"(c50), [c51] "=&x"(c51)
        : [c] "r"(c), [c3] "r"(c3), [ldb] "r"(ldb)
        : "xmm12", "xmm13", "xmm14", "xmm15", "cc", "memory");
}

/* Block scales over a whole K step: the per-block calls inlined in one loop (one call
 * and one prefetch per tile instead of one per 128-deep block: +4% at 1024^3); whole
 * blocks that add into C run as one assembly loop (blocks_6x16_asm). */
void fp8mix_gemm_ukernel_blocks_f32_6x16__avx2(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                               int load_c, const float *rs)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    prefetch_next_tile(c, ldc);
    if (!load_c) { /* the first block starts from C = +0: the same sums as C = +0 + part * rs */
        const __m256 z = _mm256_setzero_ps();
        for (int r = 0; r < 6; r++) _mm256_storeu_ps(c + r * ldc, z), _mm256_storeu_ps(c + r * ldc + 8, z);
    }
    int64_t q0 = kc / 128; /* whole blocks, then a partial one */
    if (q0 > 0) blocks_6x16_asm(q0, a, b, c, ldc, rs);
    for (int64_t q = q0; q * 128 < kc; q++) {
        int64_t kk = kc - q * 128;
        ukernel_6x16(kk + (kk & 1), a + q * 128 * 6, b + q * 128 * 16, c, ldc, 1, rs + q * 6, NULL, NULL, NULL);
    }
}

/* MX scales over a whole K step: one kernel pass per 32-deep block, its part scaled
 * by (sa[r] * sb[c]) and added into C while the part is still in registers. */
void fp8mix_gemm_ukernel_mx_f32_6x16__avx2(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                           int load_c, const float *sa, const float *sb)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    prefetch_next_tile(c, ldc);
    for (int64_t q = 0; q * 32 < kc; q++) {
        int64_t kk = kc - q * 32 < 32 ? kc - q * 32 : 32; /* even: kc is */
        ukernel_6x16(kk, a + q * 32 * 6, b + q * 32 * 16, c, ldc, load_c || q > 0, sa + q * 6, NULL, NULL,
                     sb + q * 16);
    }
}

void fp8mix_gemm_ukernel_final_f32_6x16__avx2(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                              int load_c, const float *s, const float *bias)
{
    ukernel_6x16(kc, ap, bp, c, ldc, load_c, NULL, s, bias, NULL);
}
#endif /* FP8MIX_X86 */
