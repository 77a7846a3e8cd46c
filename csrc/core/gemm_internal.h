/*
 * gemm_internal.h — what gemm.c shares with its per-ISA microkernels and the
 * C tests: the microkernel contract, the packed-panel layouts, the scalar
 * reference.  Not installed, not part of the API.
 *
 * Canonical summation order (every variant, every ISA, every thread count):
 * inside a K run the products are added to the float32 accumulator in PAIRS
 * (p = 2q+1 first, then p = 2q), q = 0, 1, ...  An odd K is padded with one
 * zero product, which changes nothing (a sum started at +0 is never -0, and
 * x + 0 == x).  This is the order AVX512_BF16's vdpbf16ps uses (odd element
 * first, each add rounded), so the bf16 kernel can match the float32 ones.
 * Every product of two FP8 values is exact in float32, so FMA and mul+add
 * give the same sums.
 *
 * Packed panels (built by gemm.c, padded with zeros, 64-byte aligned):
 *   float32 kernels: k-steps are stored pair-swapped, slot t holds k = t ^ 1
 *     A micro-panel  kc x MR floats:  a[t * MR + r]
 *     B sliver       kc x NR floats:  b[t * NR + c]
 *   bf16 kernels: one uint32 per (pair q, row/col) = bf16(k=2q) | bf16(k=2q+1) << 16
 *     A micro-panel  kc/2 x MR words: a[q * MR + r]
 *     B sliver       kc/2 x NR words: b[q * NR + c]
 */
#ifndef FP8MIX_GEMM_INTERNAL_H
#define FP8MIX_GEMM_INTERNAL_H

#include "internal.h"

/* Microkernel: one MR x NR tile of C (row stride ldc) from an A micro-panel
 * and a B sliver, kc (even) k-steps deep.
 *   rs == NULL:  acc = load_c ? C : +0;  acc += products in canonical order;
 *                C = acc.
 *   rs != NULL:  part = +0 + products (canonical order);
 *                C = (load_c ? C : +0) + part * rs[r]    (mul, then add; both
 *                rounded to float32; rs has MR entries, one per row). */
typedef void (*fp8mix_gemm_ukernel_fn)(int64_t kc, const void *a, const void *b,
                                       float *c, int64_t ldc, int load_c,
                                       const float *rs);

typedef struct fp8mix_gemm_ukernel {
    int mr, nr;            /* tile; nr divides 128 (block scales) */
    int bf16;              /* packed panels hold bf16 pairs       */
    fp8mix_gemm_ukernel_fn fn;
    const char *name;
} fp8mix_gemm_ukernel;

void fp8mix_gemm_ukernel_f32_4x16__scalar(int64_t kc, const void *a, const void *b,
                                          float *c, int64_t ldc, int load_c,
                                          const float *rs);
#if defined(__x86_64__) || defined(_M_X64)
void fp8mix_gemm_ukernel_f32_6x16__avx2(int64_t kc, const void *a, const void *b,
                                        float *c, int64_t ldc, int load_c,
                                        const float *rs);
void fp8mix_gemm_ukernel_f32_14x32__avx512(int64_t kc, const void *a, const void *b,
                                           float *c, int64_t ldc, int load_c,
                                           const float *rs);
void fp8mix_gemm_ukernel_bf16_14x32__avx512bf16(int64_t kc, const void *a,
                                                const void *b, float *c,
                                                int64_t ldc, int load_c,
                                                const float *rs);
/* Nonzero when gemm_avx512bf16.c was compiled with AVX512_BF16 support. */
extern const int fp8mix_gemm_have_avx512bf16;
#endif

/* The microkernel the active ISA uses (never NULL).  The bf16 kernel is used
 * only after a one-time probe showed it bit-identical to the float32 one. */
const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_active(void);

/* The scalar reference: a plain loop over (i, j, k) implementing the exact
 * rules of fp8mix_gemm (see gemm.c).  Same checks and status codes.  The
 * oracle every blocked / SIMD / threaded path is tested against. */
fp8mix_status fp8mix_gemm_ref(const fp8mix_gemm_args *args);

#endif /* FP8MIX_GEMM_INTERNAL_H */
