/*
 * mx.cuh — the CUDA MX (OCP Microscaling, MXFP8) entry points of mx.cu: the MX
 * quantisation (the C core's fp8mix_quantize_mx, same bytes and scales), the swizzle
 * of E8M0 scales into cuBLASLt's VEC32_UE8M0 layout, and the cuBLASLt MX GEMM
 * (Blackwell, compute capability 10.x; UNSUPPORTED elsewhere).  Device pointers,
 * stream-ordered, no host sync (fp8mix_cuda.h's conventions).  Not yet called by the
 * torch layer (csrc/torch/): compiled and type-checked by `make cuda-check`.
 */
#ifndef FP8MIX_CUDA_MX_CUH
#define FP8MIX_CUDA_MX_CUH

#include <cuda_runtime.h>

#include "fp8mix.h"

/* As fp8mix_quantize_mx; e8m0 / e8m0_t (optional, NULL: none) receive the scales'
 * biased exponents e + 127, the bytes cuBLASLt's MX mode reads (before swizzling). */
fp8mix_status fp8mix_cuda_quantize_mx(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                      fp8mix_mx_rule rule, int margin, float amax_epsilon, uint8_t *q, int64_t ld_q,
                                      float *scale_inv, uint8_t *e8m0, uint8_t *qt, int64_t ld_qt,
                                      float *scale_inv_t, uint8_t *e8m0_t, const fp8mix_cast_opts *opts,
                                      cudaStream_t stream);

/* Bytes of the swizzled scales of an (outer x ceil(K/32)) E8M0 array: the outer
 * dimension padded to 128, the K blocks to 4 (cuBLASLt's 128x4 tiles). */
int64_t fp8mix_cuda_mx_swizzled_bytes(int64_t outer, int64_t k_blocks);

/* e8m0 (outer x k_blocks, row-major) into cuBLASLt's tiled layout: tile (t_r, t_c)
 * of 128 x 4 scales at byte (t_r * ceil(k_blocks/4) + t_c) * 512, scale (r, c) of a
 * tile at (r % 32) * 16 + (r / 32) * 4 + c; padding is 0 (2^-127). */
fp8mix_status fp8mix_cuda_mx_swizzle(const uint8_t *e8m0, int64_t outer, int64_t k_blocks, uint8_t *out,
                                     cudaStream_t stream);

/* out (M x N row-major, float32 or bfloat16) = a (M x K, K-contiguous, lda) . b^T with b
 * (N x K, K-contiguous, ldb), both FP8 with swizzled MX scales sa (of a) and sb (of b).
 * K must be a multiple of 32 (cuBLASLt's MX rule).  workspace may be NULL (0 bytes). */
fp8mix_status fp8mix_cuda_gemm_mx(int64_t m, int64_t n, int64_t k, const uint8_t *a, fp8mix_format fmt_a,
                                  int64_t lda, const uint8_t *sa, const uint8_t *b, fp8mix_format fmt_b, int64_t ldb,
                                  const uint8_t *sb, void *out, fp8mix_dtype out_t, int64_t ldo, void *workspace,
                                  size_t workspace_bytes, cudaStream_t stream);

#endif /* FP8MIX_CUDA_MX_CUH */
