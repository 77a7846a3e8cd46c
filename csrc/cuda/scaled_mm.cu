/*
 * scaled_mm.cu — the scaled_mm op's GEMM policy on the device: asks
 * fp8mix_mm_layout_plan (csrc/core/mm_layout.c) what cuBLASLt needs and carries
 * the plan out in one scratch buffer: operand copies (zero padding, or a transpose
 * across layouts), the scale arrays cuBLASLt reads, a padded bias, the GEMM
 * (gemm_cublaslt.cu), then the bias add or the copy of a padded product into out.
 * Everything is enqueued on the caller's stream; nothing syncs.
 *
 * Kernels: pack_bytes_kernel (32x32 byte tiles through shared memory, loading
 * along the source's contiguous index and storing along the destination's),
 * repack_scales_kernel (both scale arrays in one launch).
 * Not here: the cuBLASLt call itself (gemm_cublaslt.cu), bias_add (scale.cu).
 */
#include <cstring>

#include "encode.cuh"

namespace fp8mix_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kPackTile = 32;

/* dst (rows_p x cols_p, row stride ld_dst): element (r, c) = src[r * s_r + c * s_c]
 * for r < rows and c < cols, else 0.  load_along_c: src is contiguous along c. */
__global__ void __launch_bounds__(kThreads) pack_bytes_kernel(const uint8_t *src, int64_t rows, int64_t cols,
                                                              int64_t s_r, int64_t s_c, uint8_t *dst,
                                                              int64_t rows_p, int64_t cols_p, int64_t ld_dst,
                                                              int load_along_c)
{
    __shared__ uint8_t tile[kPackTile][kPackTile + 1];
    const int x = threadIdx.x & 31, y = threadIdx.x >> 5; /* 32 x 8 threads */
    const int64_t tiles_c = (cols_p + kPackTile - 1) / kPackTile;
    const int64_t ntiles = ((rows_p + kPackTile - 1) / kPackTile) * tiles_c;
    for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
        const int64_t r0 = (t / tiles_c) * kPackTile, c0 = (t % tiles_c) * kPackTile;
        for (int k = y; k < kPackTile; k += kThreads / 32) {
            const int rr = load_along_c ? k : x, cc = load_along_c ? x : k;
            const int64_t r = r0 + rr, c = c0 + cc;
            tile[rr][cc] = (r < rows && c < cols) ? src[r * s_r + c * s_c] : (uint8_t)0;
        }
        __syncthreads();
        for (int k = y; k < kPackTile; k += kThreads / 32) {
            const int64_t r = r0 + k, c = c0 + x;
            if (r < rows_p && c < cols_p) dst[r * ld_dst + c] = tile[k][x];
        }
        __syncthreads();
    }
}

struct ScaleJob {
    const float *src;
    float *dst; /* NULL: nothing to do */
    fp8mix_mm_scale_map m;
};

/* blockIdx.y selects the job: dst[r][c] = src[r*sr + c*sc] inside the valid box, else 1. */
__global__ void __launch_bounds__(kThreads) repack_scales_kernel(ScaleJob j0, ScaleJob j1)
{
    const ScaleJob J = blockIdx.y == 0 ? j0 : j1;
    if (!J.dst) return;
    const int64_t n = J.m.rows * J.m.cols, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride) {
        const int64_t r = e / J.m.cols, c = e - r * J.m.cols;
        const bool in = r < J.m.valid_rows && c < J.m.valid_cols;
        J.dst[e] = in ? J.src[r * J.m.src_stride_r + c * J.m.src_stride_c] : 1.0f;
    }
}

fp8mix_status pack(const uint8_t *src, int64_t rows, int64_t cols, int64_t s_r, int64_t s_c, uint8_t *dst,
                   int64_t rows_p, int64_t cols_p, cudaStream_t st)
{
    const int64_t tiles = ((rows_p + kPackTile - 1) / kPackTile) * ((cols_p + kPackTile - 1) / kPackTile);
    pack_bytes_kernel<<<grid_for(tiles, 1, 1u << 20), kThreads, 0, st>>>(src, rows, cols, s_r, s_c, dst, rows_p,
                                                                         cols_p, cols_p, s_c == 1 || cols == 1);
    return check_launch("fp8mix_cuda_scaled_mm (pack)");
}

uint8_t *at(void *scratch, size_t off) { return (uint8_t *)scratch + off; }

/* Operand copies and scale arrays, before the GEMM. */
fp8mix_status prepare(const fp8mix_cuda_scaled_mm_args *x, cudaStream_t st)
{
    const fp8mix_mm_problem *p = x->problem;
    const fp8mix_mm_plan *pl = x->plan;
    fp8mix_status s;
    if (pl->copy_a != FP8MIX_MM_IN_PLACE &&
        (s = pack(x->a, p->m, p->k, p->a_stride0, p->a_stride1, at(x->scratch, pl->off_a), pl->mp, pl->kp, st)))
        return s;
    /* b's row j of the packed (np x kp) matrix is column j of b */
    if (pl->copy_b != FP8MIX_MM_IN_PLACE &&
        (s = pack(x->b, p->n, p->k, p->b_stride1, p->b_stride0, at(x->scratch, pl->off_b), pl->np, pl->kp, st)))
        return s;
    if (pl->sa.repack || pl->sb.repack) {
        ScaleJob ja = {x->scale_a, pl->sa.repack ? (float *)at(x->scratch, pl->off_sa) : nullptr, pl->sa};
        ScaleJob jb = {x->scale_b, pl->sb.repack ? (float *)at(x->scratch, pl->off_sb) : nullptr, pl->sb};
        const int64_t n = pl->sa.rows * pl->sa.cols > pl->sb.rows * pl->sb.cols ? pl->sa.rows * pl->sa.cols
                                                                                  : pl->sb.rows * pl->sb.cols;
        repack_scales_kernel<<<dim3(grid_for(n, kThreads, 4096), 2), kThreads, 0, st>>>(ja, jb);
        if ((s = check_launch("fp8mix_cuda_scaled_mm (scales)"))) return s;
    }
    if (pl->copy_bias) {
        const size_t bsz = p->bias_t == FP8MIX_F32 ? 4 : 2;
        uint8_t *dst = at(x->scratch, pl->off_bias);
        if ((s = cuda_status(cudaMemsetAsync(dst, 0, (size_t)pl->np * bsz, st), "fp8mix_cuda_scaled_mm (bias)")))
            return s;
        if ((s = cuda_status(cudaMemcpyAsync(dst, x->bias, (size_t)p->n * bsz, cudaMemcpyDeviceToDevice, st),
                             "fp8mix_cuda_scaled_mm (bias)")))
            return s;
    }
    return FP8MIX_OK;
}

/* The cuBLASLt call the plan describes. */
fp8mix_status run_gemm(const fp8mix_cuda_scaled_mm_args *x, cudaStream_t st)
{
    const fp8mix_mm_problem *p = x->problem;
    const fp8mix_mm_plan *pl = x->plan;
    fp8mix_cuda_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = pl->mp; g.n = pl->np; g.k = pl->kp;
    g.a = pl->copy_a != FP8MIX_MM_IN_PLACE ? at(x->scratch, pl->off_a) : x->a;
    g.fmt_a = p->fmt_a; g.lda = pl->lda;
    g.b = pl->copy_b != FP8MIX_MM_IN_PLACE ? at(x->scratch, pl->off_b) : x->b;
    g.fmt_b = p->fmt_b; g.ldb = pl->ldb;
    g.scale_a = pl->sa.repack ? (const float *)at(x->scratch, pl->off_sa) : x->scale_a;
    g.scale_b = pl->sb.repack ? (const float *)at(x->scratch, pl->off_sb) : x->scale_b;
    g.scale_a_kind = g.scale_b_kind = pl->kind;
    if (pl->bias_epilogue) {
        g.bias = pl->copy_bias ? at(x->scratch, pl->off_bias) : x->bias;
        g.bias_t = p->bias_t;
    }
    g.out = pl->d_in_scratch ? at(x->scratch, pl->off_d) : x->out;
    g.out_t = pl->d_t;
    g.ldo = pl->d_in_scratch ? pl->np : p->n;
    g.fast_accum = pl->fast_accum;
    g.workspace = at(x->scratch, pl->off_ws);
    g.workspace_size = pl->workspace_bytes;
    return fp8mix_cuda_gemm(&g, st);
}

/* After the GEMM: the bias add, or the padded product's top-left M x N into out. */
fp8mix_status finish(const fp8mix_cuda_scaled_mm_args *x, cudaStream_t st)
{
    const fp8mix_mm_problem *p = x->problem;
    const fp8mix_mm_plan *pl = x->plan;
    const void *d = pl->d_in_scratch ? at(x->scratch, pl->off_d) : x->out;
    const int64_t ldd = pl->d_in_scratch ? pl->np : p->n;
    if (pl->bias_add)
        return fp8mix_cuda_bias_add((const float *)d, p->m, p->n, ldd, x->bias, p->bias_t, x->out, p->out_t, p->n, st);
    if (!pl->d_in_scratch) return FP8MIX_OK;
    const size_t osz = p->out_t == FP8MIX_F32 ? 4 : 2;
    return cuda_status(cudaMemcpy2DAsync(x->out, (size_t)p->n * osz, d, (size_t)ldd * osz, (size_t)p->n * osz,
                                         (size_t)p->m, cudaMemcpyDeviceToDevice, st),
                       "fp8mix_cuda_scaled_mm (copy out)");
}

} // namespace
} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" fp8mix_status fp8mix_cuda_scaled_mm_plan(fp8mix_mm_problem *p, fp8mix_mm_plan *plan)
{
    begin_call();
    if (!p || !plan) return FP8MIX_ERR_NULL_POINTER;
    int dev = 0, major = 0, minor = 0;
    fp8mix_status st = cuda_status(cudaGetDevice(&dev), "fp8mix_cuda_scaled_mm_plan (cudaGetDevice)");
    if (!st) st = cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "capability");
    if (!st) st = cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "capability");
    if (st) return st;
    p->sm = major * 10 + minor;
    p->blas_version = fp8mix_cuda_blas_version();
    return fp8mix_mm_layout_plan(p, plan);
}

extern "C" fp8mix_status fp8mix_cuda_scaled_mm(const fp8mix_cuda_scaled_mm_args *x, cudaStream_t stream)
{
    begin_call();
    if (!x || !x->problem || !x->plan) return FP8MIX_ERR_NULL_POINTER;
    if (!x->a || !x->b || !x->scale_a || !x->scale_b || !x->out || !x->scratch ||
        (x->problem->has_bias && !x->bias))
        return FP8MIX_ERR_NULL_POINTER;
    if (x->plan->rule != FP8MIX_MM_RULE_OK || x->plan->scratch_bytes == 0 || x->scratch_bytes < x->plan->scratch_bytes)
        return FP8MIX_ERR_BAD_ARG;
    fp8mix_status st = prepare(x, stream);
    if (!st) st = run_gemm(x, stream);
    if (!st) st = finish(x, stream);
    return st;
}
