/*
 * mx.cu — MX (OCP Microscaling v1.0, MXFP8) on the GPU: the MX quantisation and its
 * transposed second quantisation with the C core's rules (fp8_rules.h's
 * fp8r_mx_exponent and encoder: the same bytes and scales as csrc/core/cast_mx.c), the
 * swizzle of E8M0 scales into cuBLASLt's VEC32_UE8M0 layout, and the cuBLASLt GEMM
 * with MX scales (CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0, compute capability 10.x,
 * cuBLAS 12.8+).  Entry points and layouts: mx.cuh.
 *
 * Kernels (simple first versions, one thread per 32-element block): rows_kernel
 * (blocks along a row; a warp's threads take consecutive blocks) and cols_kernel
 * (blocks down a column; consecutive threads take consecutive columns, so the loads
 * of one row step are coalesced).
 */
#include <cublasLt.h>

#include "encode.cuh"
#include "mx.cuh"

#if !defined(CUBLAS_VERSION)
#define CUBLAS_VERSION 0
#endif
#define FP8MIX_HAVE_MX_MODE (CUBLAS_VERSION >= 120800)

namespace fp8mix_cuda {
namespace {

constexpr int kMx = FP8MIX_MX_BLOCK;
constexpr int kMxThreads = 256;

struct MxArgs {
    const uint8_t *x;
    fp8mix_dtype xt;
    int64_t rows, cols, ld_x;
    int e5m2, floor_rule, margin;
    float eps;
    Fp8Params p;
    uint64_t seed, offset;
};

__device__ __forceinline__ const uint8_t *row_ptr(const MxArgs &A, int64_t i)
{
    return A.x + (size_t)(i * A.ld_x) * (A.xt == FP8MIX_F32 ? 4 : 2);
}

/* The block's scale from its amax bits (the C core's fp8mix_mx_block_scale). */
__device__ __forceinline__ int block_exponent(const MxArgs &A, uint32_t m)
{
    return fp8r_mx_exponent(amax_from_bits(m), A.e5m2, A.floor_rule, A.margin, A.eps);
}

__global__ void rows_kernel(MxArgs A, uint8_t *q, int64_t ld_q, float *sinv, uint8_t *e8m0)
{
    const int64_t nkb = (A.cols + kMx - 1) / kMx, nblk = A.rows * nkb;
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < nblk; b += (int64_t)gridDim.x * blockDim.x) {
        const int64_t i = b / nkb, j0 = (b % nkb) * kMx, j1 = min(j0 + kMx, A.cols);
        const uint8_t *row = row_ptr(A, i);
        uint32_t m = 0;
        for (int64_t j = j0; j < j1; j++) m = max(m, f32_bits(load_hp(row, A.xt, j)) & 0x7FFFFFFFu);
        const int e = block_exponent(A, m);
        const float s = fp8r_exp2i(-e);
        sinv[b] = fp8r_exp2i(e);
        if (e8m0) e8m0[b] = (uint8_t)(e + 127);
        for (int64_t j = j0; j < j1; j++) {
            const uint32_t r = A.p.stochastic ? random_word(A.seed, A.offset + (uint64_t)(i * A.cols + j)) : 0u;
            q[i * ld_q + j] = encode_value(A.p, load_hp(row, A.xt, j), s, r);
        }
    }
}

/* qt (cols x rows) = the MX quantisation of x's transpose: block (j, kb) is x's rows
 * 32 kb .. 32 kb + 31 of column j; element (j, i) takes random word j * rows + i. */
__global__ void cols_kernel(MxArgs A, uint8_t *qt, int64_t ld_qt, float *sinv_t, uint8_t *e8m0_t)
{
    const int64_t nkb = (A.rows + kMx - 1) / kMx, nblk = A.cols * nkb;
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < nblk; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t kb = t / A.cols, j = t % A.cols; /* consecutive threads: consecutive columns */
        const int64_t i0 = kb * kMx, i1 = min(i0 + kMx, A.rows);
        uint32_t m = 0;
        for (int64_t i = i0; i < i1; i++) m = max(m, f32_bits(load_hp(row_ptr(A, i), A.xt, j)) & 0x7FFFFFFFu);
        const int e = block_exponent(A, m);
        const float s = fp8r_exp2i(-e);
        sinv_t[j * nkb + kb] = fp8r_exp2i(e);
        if (e8m0_t) e8m0_t[j * nkb + kb] = (uint8_t)(e + 127);
        for (int64_t i = i0; i < i1; i++) {
            const uint32_t r = A.p.stochastic ? random_word(A.seed, A.offset + (uint64_t)(j * A.rows + i)) : 0u;
            qt[j * ld_qt + i] = encode_value(A.p, load_hp(row_ptr(A, i), A.xt, j), s, r);
        }
    }
}

__global__ void swizzle_kernel(const uint8_t *e8m0, int64_t outer, int64_t kb, uint8_t *out, int64_t total)
{
    const int64_t ntc = (kb + 3) / 4;
    for (int64_t o = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; o < total; o += (int64_t)gridDim.x * blockDim.x) {
        const int64_t tile = o / 512, w = o % 512;
        const int64_t rr = (w % 16) / 4 * 32 + w / 16, cc = w % 4; /* w = (rr % 32) * 16 + (rr / 32) * 4 + cc */
        const int64_t r = (tile / ntc) * 128 + rr, c = (tile % ntc) * 4 + cc;
        out[o] = (r < outer && c < kb) ? e8m0[r * kb + c] : (uint8_t)0;
    }
}

} // namespace
} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

fp8mix_status fp8mix_cuda_quantize_mx(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                      fp8mix_mx_rule rule, int margin, float amax_epsilon, uint8_t *q, int64_t ld_q,
                                      float *scale_inv, uint8_t *e8m0, uint8_t *qt, int64_t ld_qt,
                                      float *scale_inv_t, uint8_t *e8m0_t, const fp8mix_cast_opts *opts,
                                      cudaStream_t stream)
{
    begin_call();
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    if ((xt != FP8MIX_F32 && xt != FP8MIX_BF16 && xt != FP8MIX_F16) ||
        (rule != FP8MIX_MX_RCEIL && rule != FP8MIX_MX_FLOOR))
        return FP8MIX_ERR_BAD_ENUM;
    MxArgs A;
    fp8mix_status st = params_init(&A.p, opts);
    if (st) return st;
    if (margin < 0 || margin > 126 || !(amax_epsilon >= 0.0f) || amax_epsilon > 3.4028234663852886e38f)
        return FP8MIX_ERR_BAD_ARG;
    if (rows < 0 || cols < 0 || ld_x < cols || (q && ld_q < cols) || (qt && ld_qt < rows)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!x || (!q && !qt) || (q && !scale_inv) || (qt && !scale_inv_t)) return FP8MIX_ERR_NULL_POINTER;
    A.x = (const uint8_t *)x;
    A.xt = xt;
    A.rows = rows;
    A.cols = cols;
    A.ld_x = ld_x;
    A.e5m2 = opts->fmt == FP8MIX_E5M2;
    A.floor_rule = rule == FP8MIX_MX_FLOOR;
    A.margin = margin;
    A.eps = amax_epsilon;
    A.seed = opts->seed;
    A.offset = opts->offset;
    if (q) {
        rows_kernel<<<grid_for(rows * ((cols + kMx - 1) / kMx), kMxThreads), kMxThreads, 0, stream>>>(
            A, q, ld_q, scale_inv, e8m0);
        if ((st = check_launch("fp8mix_cuda_quantize_mx (rows)"))) return st;
    }
    if (qt) {
        cols_kernel<<<grid_for(cols * ((rows + kMx - 1) / kMx), kMxThreads), kMxThreads, 0, stream>>>(
            A, qt, ld_qt, scale_inv_t, e8m0_t);
        if ((st = check_launch("fp8mix_cuda_quantize_mx (transpose)"))) return st;
    }
    return FP8MIX_OK;
}

int64_t fp8mix_cuda_mx_swizzled_bytes(int64_t outer, int64_t k_blocks)
{
    return ((outer + 127) / 128) * 128 * ((k_blocks + 3) / 4) * 4;
}

fp8mix_status fp8mix_cuda_mx_swizzle(const uint8_t *e8m0, int64_t outer, int64_t k_blocks, uint8_t *out,
                                     cudaStream_t stream)
{
    begin_call();
    if (outer < 0 || k_blocks < 0) return FP8MIX_ERR_BAD_SHAPE;
    const int64_t total = fp8mix_cuda_mx_swizzled_bytes(outer, k_blocks);
    if (total == 0) return FP8MIX_OK;
    if (!e8m0 || !out) return FP8MIX_ERR_NULL_POINTER;
    swizzle_kernel<<<grid_for(total, kMxThreads), kMxThreads, 0, stream>>>(e8m0, outer, k_blocks, out, total);
    return check_launch("fp8mix_cuda_mx_swizzle");
}

namespace {

fp8mix_status lt_status(cublasStatus_t s, const char *where)
{
    if (s == CUBLAS_STATUS_SUCCESS) return FP8MIX_OK;
    set_error("%s: cuBLASLt status %d", where, (int)s);
    return s == CUBLAS_STATUS_ALLOC_FAILED ? FP8MIX_ERR_NO_MEMORY : FP8MIX_ERR_UNSUPPORTED;
}

/* The cuBLASLt objects of one call, destroyed on every path. */
struct MxDescs {
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    ~MxDescs()
    {
        if (pref) cublasLtMatmulPreferenceDestroy(pref);
        if (ld) cublasLtMatrixLayoutDestroy(ld);
        if (lb) cublasLtMatrixLayoutDestroy(lb);
        if (la) cublasLtMatrixLayoutDestroy(la);
        if (op) cublasLtMatmulDescDestroy(op);
        if (lt) cublasLtDestroy(lt);
    }
};

} // namespace

fp8mix_status fp8mix_cuda_gemm_mx(int64_t m, int64_t n, int64_t k, const uint8_t *a, fp8mix_format fmt_a,
                                  int64_t lda, const uint8_t *sa, const uint8_t *b, fp8mix_format fmt_b, int64_t ldb,
                                  const uint8_t *sb, void *out, fp8mix_dtype out_t, int64_t ldo, void *workspace,
                                  size_t workspace_bytes, cudaStream_t stream)
{
    begin_call();
    if (m < 0 || n < 0 || k < 0 || lda < k || ldb < k || ldo < n) return FP8MIX_ERR_BAD_SHAPE;
    if (k % kMx) {
        set_error("fp8mix_cuda_gemm_mx: K = %lld is not a multiple of 32 (cuBLASLt's MX rule)", (long long)k);
        return FP8MIX_ERR_UNSUPPORTED;
    }
    if ((fmt_a != FP8MIX_E4M3 && fmt_a != FP8MIX_E5M2) || (fmt_b != FP8MIX_E4M3 && fmt_b != FP8MIX_E5M2) ||
        (out_t != FP8MIX_F32 && out_t != FP8MIX_BF16))
        return FP8MIX_ERR_BAD_ENUM;
    if (m == 0 || n == 0) return FP8MIX_OK;
    if (!a || !b || !sa || !sb || !out) return FP8MIX_ERR_NULL_POINTER;
#if !FP8MIX_HAVE_MX_MODE
    set_error("fp8mix_cuda_gemm_mx: built with cuBLAS %d; the MX scale mode needs 12.8+", (int)CUBLAS_VERSION);
    return FP8MIX_ERR_UNSUPPORTED;
#else
    int dev = 0, major = 0;
    fp8mix_status st;
    if ((st = cuda_status(cudaGetDevice(&dev), "cudaGetDevice"))) return st;
    if ((st = cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "attribute")))
        return st;
    if (major != 10) {
        set_error("fp8mix_cuda_gemm_mx: MX tensor cores need compute capability 10.x, device %d is %d.x", dev, major);
        return FP8MIX_ERR_UNSUPPORTED;
    }
    /* out^T (N x M column-major) = b (K x N column-major, op T) . a^T (K x M column-major): the TN layout */
    MxDescs D;
    const cudaDataType_t ta = fmt_a == FP8MIX_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    const cudaDataType_t tb = fmt_b == FP8MIX_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    const cudaDataType_t to = out_t == FP8MIX_F32 ? CUDA_R_32F : CUDA_R_16BF;
    const cublasOperation_t opT = CUBLAS_OP_T, opN = CUBLAS_OP_N;
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    const void *sA = sb, *sB = sa; /* cuBLAS's A is our b */
    if ((st = lt_status(cublasLtCreate(&D.lt), "cublasLtCreate"))) return st;
    if ((st = lt_status(cublasLtMatmulDescCreate(&D.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate")))
        return st;
    const struct { cublasLtMatmulDescAttributes_t attr; const void *v; size_t size; } attrs[] = {
        {CUBLASLT_MATMUL_DESC_TRANSA, &opT, sizeof opT},
        {CUBLASLT_MATMUL_DESC_TRANSB, &opN, sizeof opN},
        {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode},
        {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode},
        {CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sA, sizeof sA},
        {CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sB, sizeof sB},
    };
    for (const auto &t : attrs)
        if ((st = lt_status(cublasLtMatmulDescSetAttribute(D.op, t.attr, t.v, t.size), "MatmulDescSetAttribute")))
            return st;
    if ((st = lt_status(cublasLtMatrixLayoutCreate(&D.la, tb, k, n, ldb), "layout A")) ||
        (st = lt_status(cublasLtMatrixLayoutCreate(&D.lb, ta, k, m, lda), "layout B")) ||
        (st = lt_status(cublasLtMatrixLayoutCreate(&D.ld, to, n, m, ldo), "layout D")))
        return st;
    if ((st = lt_status(cublasLtMatmulPreferenceCreate(&D.pref), "PreferenceCreate")) ||
        (st = lt_status(cublasLtMatmulPreferenceSetAttribute(D.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof workspace_bytes),
                        "PreferenceSetAttribute")))
        return st;
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    if ((st = lt_status(cublasLtMatmulAlgoGetHeuristic(D.lt, D.op, D.la, D.lb, D.ld, D.ld, D.pref, 1, &h, &found),
                        "AlgoGetHeuristic")))
        return st;
    if (found == 0) {
        set_error("fp8mix_cuda_gemm_mx: cuBLASLt has no MX algorithm for %lld x %lld x %lld", (long long)m,
                  (long long)n, (long long)k);
        return FP8MIX_ERR_UNSUPPORTED;
    }
    const float one = 1.0f, zero = 0.0f;
    return lt_status(cublasLtMatmul(D.lt, D.op, &one, b, D.la, a, D.lb, &zero, out, D.ld, out, D.ld, &h.algo,
                                    workspace, workspace_bytes, stream),
                     "cublasLtMatmul");
#endif
}
