/*
 * cast.cu — scale + cast (+ transpose) + amax with given scales, every granularity
 * (fp8mix_cuda_cast), and the x -> q launcher that current scaling (quantize.cu)
 * reuses with scales derived from per-tile amaxes.  Bytes equal the C core's
 * (csrc/core/cast.c); the number rules are in encode.cuh.
 *
 * Kernels (grid-stride, 64-bit indices, 256 threads per block):
 *   cast_rows_vec          one 16-byte unit of x per thread step (U = 4 or 8
 *                          elements), U bytes stored: coalesced on both sides
 *   cast_rows_scalar       one element per thread step (unaligned / odd shapes)
 *   cast_transpose_kernel  64x64 tiles through shared memory -> q and qt
 * amax: each thread folds max |x| bits; each block canonicalises NaN to 0x7FC00000
 * and commits with one unsigned atomicMax, so the result is the CPU's.
 * Not here: per-tile amax and current scaling (quantize.cu), dequantisation
 * (dequant.cu), compute_scale / delayed scaling (scale.cu), the GEMM.
 */
#include "cast_body.cuh"

namespace fp8mix_cuda {

/* ---- kernels (the work loops are cast_body.cuh's) ------------------------------- */
template <int XT, bool STOCH>
__global__ void __launch_bounds__(kThreads) cast_rows_vec(CastArgs A)
{
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    uint32_t m;
    if (A.gran == FP8MIX_GRAN_TENSOR) { /* one scale: read (and validated) once */
        const FixedScale s{A.rows * A.cols > 0 ? tile_scale(A, 0) : 1.0f};
        m = rows_vec_body<XT, STOCH>(A, s, first, stride);
    } else {
        m = rows_vec_body<XT, STOCH>(A, GivenScale{A}, first, stride);
    }
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

template <int XT>
__global__ void __launch_bounds__(kThreads) cast_rows_scalar(CastArgs A)
{
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    const uint32_t m = rows_scalar_body<XT>(A, GivenScale{A}, first, stride);
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

template <int XT, bool STOCH>
__global__ void __launch_bounds__(kThreads) cast_transpose_kernel(CastArgs A, int vec_x, int vec_q, int vec_qt)
{
    __shared__ __align__(16) uint8_t tile[kTile * kPitch];
    const uint32_t m = transpose_body<XT, STOCH>(A, GivenScale{A}, vec_x, vec_q, vec_qt, blockIdx.x, gridDim.x, tile);
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

/* ---- launchers ------------------------------------------------------------------- */
static fp8mix_status launch_cast_transpose(const CastArgs &A, fp8mix_dtype xt, cudaStream_t st)
{
    const int sr = A.p.stochastic;
    const TransposeVec v = transpose_vec(A, xt);
    const unsigned grid = grid_for(transpose_tiles(A), 1, 1u << 20);
#define FP8MIX_LAUNCH_T(XT)                                                                                         \
    if (sr) cast_transpose_kernel<XT, true><<<grid, kThreads, 0, st>>>(A, v.x, v.q, v.qt);                          \
    else cast_transpose_kernel<XT, false><<<grid, kThreads, 0, st>>>(A, v.x, v.q, v.qt);
    FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_T)
#undef FP8MIX_LAUNCH_T
    return check_launch("fp8mix_cuda_cast (cast_transpose_kernel)");
}

fp8mix_status launch_cast(const CastArgs &A, fp8mix_dtype xt, cudaStream_t st)
{
    if (A.rows == 0 || A.cols == 0) return FP8MIX_OK;
    if (A.qt) return launch_cast_transpose(A, xt, st);
    const int sr = A.p.stochastic;
    if (rows_vec_ok(A, xt)) {
        const unsigned grid = grid_for(vec_units(A, xt), kThreads);
#define FP8MIX_LAUNCH_V(XT)                                                                                         \
    if (sr) cast_rows_vec<XT, true><<<grid, kThreads, 0, st>>>(A);                                                  \
    else cast_rows_vec<XT, false><<<grid, kThreads, 0, st>>>(A);
        FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_V)
#undef FP8MIX_LAUNCH_V
    } else {
        const unsigned grid = grid_for(A.rows * A.cols, kThreads);
#define FP8MIX_LAUNCH_S(XT) cast_rows_scalar<XT><<<grid, kThreads, 0, st>>>(A);
        FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_S)
#undef FP8MIX_LAUNCH_S
    }
    return check_launch("fp8mix_cuda_cast (cast_rows)");
}

} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

/* ---- entry point ------------------------------------------------------------------- */

extern "C" fp8mix_status fp8mix_cuda_cast(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                          fp8mix_granularity gran, const float *scale, uint8_t *q, int64_t ld_q,
                                          uint8_t *qt, int64_t ld_qt, float *amax, int *scale_status,
                                          const fp8mix_cast_opts *opts, const int64_t *rng, uint64_t rng_skip,
                                          cudaStream_t stream)
{
    begin_call();
    Fp8Params p;
    fp8mix_status st = cast_prologue(x, xt, rows, cols, ld_x, gran, q, ld_q, qt, ld_qt, opts, &p);
    if (st) return st;
    if (rows > 0 && cols > 0 && !scale) return FP8MIX_ERR_NULL_POINTER;
    if (amax && (st = cuda_status(cudaMemsetAsync(amax, 0, sizeof(float), stream), "fp8mix_cuda_cast (memset)")))
        return st;
    CastArgs A = make_args(x, rows, cols, ld_x, gran, p, opts);
    A.scale = scale;
    A.q = q;
    A.ld_q = ld_q;
    A.qt = qt;
    A.ld_qt = ld_qt;
    A.amax_bits = (uint32_t *)amax;
    A.scale_status = scale_status;
    with_rng(A, rng, rng_skip);
    return launch_cast(A, xt, stream);
}
