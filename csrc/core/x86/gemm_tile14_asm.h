/*
 * gemm_tile14_asm.h — the 14 x 32 tile's k-loop in inline assembly, shared by the float32
 * AVX-512 kernel (x86/gemm_avx512.c: TILE14_MADD "vfmadd231ps", one k-step per step) and
 * the AVX512_BF16 one (x86/gemm_avx512bf16.c: "vdpbf16ps", a pair of k-steps per step).
 * Both panels' layouts advance the same bytes per step (14 words of A, 32 of B), so one
 * block of assembly serves both; each includer defines TILE14_MADD first and gets its
 * own static copy of tile14_asm (and the macros, for more kernels of the same registers).
 *
 * From intrinsics GCC 12 kept 28 accumulators + 2 B vectors + the broadcast in 31
 * registers only by spilling two accumulators per four k-steps, and the spill traffic
 * cost 2-3% of a 2048^3 GEMM on a Xeon (Sapphire Rapids class, 1 thread, paired runs).
 * Same instructions, same order of adds per accumulator.
 */
#ifndef FP8MIX_GEMM_TILE14_ASM_H
#define FP8MIX_GEMM_TILE14_ASM_H

#ifndef TILE14_MADD
#error "define TILE14_MADD (the multiply-add mnemonic) before including gemm_tile14_asm.h"
#endif

#include <stdint.h>

#define STR_(x) #x
#define STR(x) STR_(x)

/* Row r of the tile in zmm(2r) (columns 0-15) and zmm(2r+1) (16-31); the B row in
 * zmm28-29, the broadcast A word in zmm30.  One step: B row at byte offset OB of b,
 * the 14 A words from byte offset OA of a. */
#define FMA14_ASM(OA, r0, r1)                                                   \
    "vbroadcastss " STR(OA) "(%[a]), %%zmm30\n\t"                               \
    TILE14_MADD " %%zmm28, %%zmm30, %%zmm" #r0 "\n\t"                            \
    TILE14_MADD " %%zmm29, %%zmm30, %%zmm" #r1 "\n\t"
#define KSTEP14_ASM(OB, OA)                                                                  \
    "vmovups " STR(OB) "(%[b]), %%zmm28\n\t" "vmovups " STR(OB) "+64(%[b]), %%zmm29\n\t"       \
    FMA14_ASM(OA, 0, 1) FMA14_ASM(OA+4, 2, 3) FMA14_ASM(OA+8, 4, 5) FMA14_ASM(OA+12, 6, 7)    \
    FMA14_ASM(OA+16, 8, 9) FMA14_ASM(OA+20, 10, 11) FMA14_ASM(OA+24, 12, 13)                   \
    FMA14_ASM(OA+28, 14, 15) FMA14_ASM(OA+32, 16, 17) FMA14_ASM(OA+36, 18, 19)                 \
    FMA14_ASM(OA+40, 20, 21) FMA14_ASM(OA+44, 22, 23) FMA14_ASM(OA+48, 24, 25)                 \
    FMA14_ASM(OA+52, 26, 27)
/* Four steps (A advances 224 bytes, B 512), each after asking for two lines of B
 * 1.5 KiB ahead: the B sliver (64 KiB at KC 512 float32 k-steps) streams from L2 (the
 * driver keeps the A panel in L1, a_outer), and the prefetches ran a 2048^3 GEMM 2-5%
 * faster on one thread of a Sapphire Rapids class Xeon (bench_ab.py; no change on two). */
#define KLOOP14_ASM                                                                 \
    "prefetcht0 1536(%[b])\n\t" "prefetcht0 1600(%[b])\n\t" KSTEP14_ASM(0, 0)        \
    "prefetcht0 1664(%[b])\n\t" "prefetcht0 1728(%[b])\n\t" KSTEP14_ASM(128, 56)     \
    "prefetcht0 1792(%[b])\n\t" "prefetcht0 1856(%[b])\n\t" KSTEP14_ASM(256, 112)    \
    "prefetcht0 1920(%[b])\n\t" "prefetcht0 1984(%[b])\n\t" KSTEP14_ASM(384, 168)
/* C row by row through p (stride ld bytes): OP is vmovups from or to memory. */
#define CLOAD_ASM(r0, r1) "vmovups (%[p]), %%zmm" #r0 "\n\t" "vmovups 64(%[p]), %%zmm" #r1 "\n\t" "addq %[ld], %[p]\n\t"
#define CSTORE_ASM(r0, r1) "vmovups %%zmm" #r0 ", (%[p])\n\t" "vmovups %%zmm" #r1 ", 64(%[p])\n\t" "addq %[ld], %[p]\n\t"
#define CZERO_ASM(r0, r1) "vpxord %%zmm" #r0 ", %%zmm" #r0 ", %%zmm" #r0 "\n\t" "vpxord %%zmm" #r1 ", %%zmm" #r1 ", %%zmm" #r1 "\n\t"
#define TILE14_ASM(X) X(0, 1) X(2, 3) X(4, 5) X(6, 7) X(8, 9) X(10, 11) X(12, 13) X(14, 15) X(16, 17) \
    X(18, 19) X(20, 21) X(22, 23) X(24, 25) X(26, 27)

/* The final store with the epilogue's common case: row r times s[r] (zmm30), then plus
 * the bias row (zmm28-29) when there is one; acc the first operand, as in scale_rows. */
#define SSTORE_ASM(r0, r1) "vbroadcastss " #r0 "*2(%[s]), %%zmm30\n\t"                                     \
    "vmulps %%zmm30, %%zmm" #r0 ", %%zmm" #r0 "\n\t" "vmulps %%zmm30, %%zmm" #r1 ", %%zmm" #r1 "\n\t"   \
    CSTORE_ASM(r0, r1)
#define BSTORE_ASM(r0, r1) "vbroadcastss " #r0 "*2(%[s]), %%zmm30\n\t"                                     \
    "vmulps %%zmm30, %%zmm" #r0 ", %%zmm" #r0 "\n\t" "vmulps %%zmm30, %%zmm" #r1 ", %%zmm" #r1 "\n\t"   \
    "vaddps %%zmm28, %%zmm" #r0 ", %%zmm" #r0 "\n\t" "vaddps %%zmm29, %%zmm" #r1 ", %%zmm" #r1 "\n\t"   \
    CSTORE_ASM(r0, r1)

/* C (+)= A panel x B sliver over n steps, C loaded first when load_c; with s (MR
 * values) the stored tile is C = s[r] * acc (+ bias[c] when bias is not NULL): the
 * fn_final contract. */
static void tile14_asm(int64_t n, const void *a, const void *b, float *c, int64_t ldc, int load_c,
                       const float *s, const float *bias)
{
    int64_t ld = ldc * (int64_t)sizeof(float), n4 = n / 4, n1 = n % 4;
    float *p = c;
    /* (every operand the block writes is early-clobber: it changes before the inputs'
     * last use, so none may share an input's register) */
    __asm__ volatile(
        "testl %[load], %[load]\n\t"
        "jz 1f\n\t"
        TILE14_ASM(CLOAD_ASM)
        "jmp 2f\n\t"
        "1:\n\t"
        TILE14_ASM(CZERO_ASM)
        "2:\n\t"
        "testq %[n4], %[n4]\n\t"
        "jz 4f\n\t"
        ".p2align 6\n\t" /* unaligned (a copy of this block in another function) it ran 10-20% slower */
        "3:\n\t"
        KLOOP14_ASM
        "addq $224, %[a]\n\t"
        "addq $512, %[b]\n\t"
        "decq %[n4]\n\t"
        "jnz 3b\n\t"
        "4:\n\t"
        "testq %[n1], %[n1]\n\t"
        "jz 6f\n\t"
        "5:\n\t"
        KSTEP14_ASM(0, 0)
        "addq $56, %[a]\n\t"
        "addq $128, %[b]\n\t"
        "decq %[n1]\n\t"
        "jnz 5b\n\t"
        "6:\n\t"
        "movq %[c], %[p]\n\t"
        "testq %[s], %[s]\n\t"
        "jnz 7f\n\t"
        TILE14_ASM(CSTORE_ASM)
        "jmp 9f\n\t"
        "7:\n\t"
        "testq %[bias], %[bias]\n\t"
        "jnz 8f\n\t"
        TILE14_ASM(SSTORE_ASM)
        "jmp 9f\n\t"
        "8:\n\t"
        "vmovups (%[bias]), %%zmm28\n\t"
        "vmovups 64(%[bias]), %%zmm29\n\t"
        TILE14_ASM(BSTORE_ASM)
        "9:\n\t"
        "vzeroupper\n\t"
        : [a] "+&r"(a), [b] "+&r"(b), [n4] "+&r"(n4), [n1] "+&r"(n1), [p] "+&r"(p)
        : [c] "r"(c), [ld] "r"(ld), [load] "r"(load_c), [s] "r"(s), [bias] "r"(bias)
        : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
          "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "cc", "memory");
}

#endif /* FP8MIX_GEMM_TILE14_ASM_H */
