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
#include "cast_kernels.cuh"

namespace fp8mix_cuda {

constexpr int kTile = 64; /* cast+transpose tile edge */

/* ---- x -> q ------------------------------------------------------------------ */
template <int XT, bool STOCH>
__global__ void __launch_bounds__(kThreads) cast_rows_vec(CastArgs A)
{
    using L = In<XT>;
    constexpr int U = L::U;
    const int64_t upr = A.cols / U, nu = A.rows * upr;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const bool tensor = A.gran == FP8MIX_GRAN_TENSOR;
    const float s_tensor = tensor && nu > 0 ? tile_scale(A, 0) : 1.0f;
    uint32_t m = 0;
    for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < nu; u += stride) {
        const int64_t i = u / upr, j = (u - i * upr) * U;
        float x[U];
        L::unit(A.x + (size_t)(i * A.ld_x) * L::size, j, x);
#pragma unroll
        for (int t = 0; t < U; t++) m = max(m, abs_bits(x[t]));
        const float s = tensor ? s_tensor : tile_scale(A, scale_index(A, i, j));
        uint32_t w[U / 4];
        encode_unit<U, STOCH>(A, x, s, (uint64_t)(i * A.cols + j), w);
        store_unit<U>(A.q + i * A.ld_q + j, w);
    }
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

template <int XT>
__global__ void __launch_bounds__(kThreads) cast_rows_scalar(CastArgs A)
{
    using L = In<XT>;
    const int64_t ne = A.rows * A.cols;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    uint32_t m = 0;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < ne; e += stride) {
        const int64_t i = e / A.cols, j = e - i * A.cols;
        float x = L::one(A.x + (size_t)(i * A.ld_x) * L::size, j);
        m = max(m, abs_bits(x));
        A.q[i * A.ld_q + j] = encode1(A, x, tile_scale(A, scale_index(A, i, j)), (uint64_t)e);
    }
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

/* ---- x -> q and qt through a 64x64 shared tile ------------------------------
 * Load phase, in kTile / rows_per_pass passes: thread t takes unit t % upr of tile
 * row pass * rows_per_pass + t / upr (upr = 64 / U units per tile row), so a warp
 * reads whole contiguous row segments; it encodes the unit, stores it to q and to
 * the tile.  Store phase: thread t owns a 4x4 byte block (tile rows i0..i0+3,
 * columns j0..j0+3), transposes it with byte permutes and writes 4 bytes to each
 * of 4 qt rows; lanes are arranged so that 8 lanes write 32 contiguous bytes of a
 * qt row and the tile reads are free of bank conflicts (row pitch 68 bytes = 17
 * words). */
constexpr int kPitch = kTile + 4;

/* One unit of the load phase: tile row lr, columns lc .. lc+U-1; its bytes go to
 * q (when wanted) and are returned in w (zeros outside the tensor). */
template <int XT, bool STOCH>
__device__ __forceinline__ uint32_t load_unit_t(const CastArgs &A, int64_t i, int64_t j, int vec_x, int vec_q,
                                                uint32_t (&w)[In<XT>::U / 4])
{
    using L = In<XT>;
    constexpr int U = L::U;
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < U / 4; k++) w[k] = 0;
    if (i >= A.rows || j >= A.cols) return 0;
    const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
    const float s = tile_scale(A, scale_index(A, i, j));
    const int64_t nrem = A.cols - j;
    if (vec_x && nrem >= U) {
        float x[U];
        L::unit(xrow, j, x);
#pragma unroll
        for (int u = 0; u < U; u++) m = max(m, abs_bits(x[u]));
        encode_unit<U, STOCH>(A, x, s, (uint64_t)(i * A.cols + j), w);
        if (A.q) {
            if (vec_q) store_unit<U>(A.q + i * A.ld_q + j, w);
            else
                for (int u = 0; u < U; u++) A.q[i * A.ld_q + j + u] = (uint8_t)(w[u >> 2] >> (8 * (u & 3)));
        }
        return m;
    }
    const int cnt = nrem < U ? (int)nrem : U;
    for (int u = 0; u < cnt; u++) {
        float x = L::one(xrow, j + u);
        m = max(m, abs_bits(x));
        uint8_t b = encode1(A, x, s, (uint64_t)(i * A.cols + j + u));
        w[u >> 2] |= (uint32_t)b << (8 * (u & 3));
        if (A.q) A.q[i * A.ld_q + j + u] = b;
    }
    return m;
}

/* The store phase of one tile: 4x4 byte blocks transposed into qt. */
__device__ __forceinline__ void store_tile_t(const CastArgs &A, const uint8_t *tile, int64_t r0, int64_t c0,
                                             int vec_qt)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int si0 = ((warp >> 2) * 8 + (lane & 7)) * 4; /* tile row (i) of the 4x4 block */
    const int sj0 = ((warp & 3) * 4 + (lane >> 3)) * 4; /* tile column (j) */
    uint32_t w0 = *(const uint32_t *)(tile + (si0 + 0) * kPitch + sj0);
    uint32_t w1 = *(const uint32_t *)(tile + (si0 + 1) * kPitch + sj0);
    uint32_t w2 = *(const uint32_t *)(tile + (si0 + 2) * kPitch + sj0);
    uint32_t w3 = *(const uint32_t *)(tile + (si0 + 3) * kPitch + sj0);
    uint32_t t0 = __byte_perm(w0, w1, 0x5140), t1 = __byte_perm(w0, w1, 0x7362);
    uint32_t t2 = __byte_perm(w2, w3, 0x5140), t3 = __byte_perm(w2, w3, 0x7362);
    uint32_t o[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632), __byte_perm(t1, t3, 0x5410),
                     __byte_perm(t1, t3, 0x7632)};
    const int64_t i = r0 + si0, j = c0 + sj0; /* qt row j+k, columns i..i+3 */
    if (vec_qt && i + 3 < A.rows && j + 3 < A.cols) {
#pragma unroll
        for (int k = 0; k < 4; k++) *(uint32_t *)(A.qt + (j + k) * A.ld_qt + i) = o[k];
    } else {
        for (int k = 0; k < 4; k++)
            if (j + k < A.cols)
                for (int u = 0; u < 4; u++)
                    if (i + u < A.rows) A.qt[(j + k) * A.ld_qt + i + u] = (uint8_t)(o[k] >> (8 * u));
    }
}

template <int XT, bool STOCH>
__global__ void __launch_bounds__(kThreads) cast_transpose_kernel(CastArgs A, int vec_x, int vec_q, int vec_qt)
{
    constexpr int U = In<XT>::U, upr = kTile / U, rpp = kThreads / upr;
    __shared__ __align__(16) uint8_t tile[kTile * kPitch];
    const int64_t ntr = (A.rows + kTile - 1) / kTile, ntc = (A.cols + kTile - 1) / kTile;
    const int t = threadIdx.x;
    uint32_t m = 0;
    for (int64_t tileno = blockIdx.x; tileno < ntr * ntc; tileno += gridDim.x) {
        const int64_t r0 = (tileno / ntc) * kTile, c0 = (tileno % ntc) * kTile;
#pragma unroll
        for (int pass = 0; pass < kTile / rpp; pass++) {
            const int lr = pass * rpp + t / upr, lc = (t % upr) * U;
            uint32_t w[U / 4];
            m = max(m, load_unit_t<XT, STOCH>(A, r0 + lr, c0 + lc, vec_x, vec_q, w));
            uint32_t *dst = (uint32_t *)(tile + lr * kPitch + lc);
#pragma unroll
            for (int k = 0; k < U / 4; k++) dst[k] = w[k];
        }
        __syncthreads();
        store_tile_t(A, tile, r0, c0, vec_qt);
        __syncthreads();
    }
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

/* ---- launchers ------------------------------------------------------------------- */
static fp8mix_status launch_cast_transpose(const CastArgs &A, fp8mix_dtype xt, cudaStream_t st)
{
    const int sr = A.p.stochastic;
    const int vx = vec_ok_x(A.x, xt, kVec, A.ld_x); /* per unit: rows aligned, whole units only */
    const int vq = A.q && aligned16(A.q) && A.ld_q % 16 == 0;
    const int vqt = ((uintptr_t)A.qt & 3u) == 0 && A.ld_qt % 4 == 0;
    const int64_t tiles = cdiv(A.rows, kTile) * cdiv(A.cols, kTile);
    const unsigned grid = grid_for(tiles, 1, 1u << 20);
#define FP8MIX_LAUNCH_T(XT)                                                                                         \
    if (sr) cast_transpose_kernel<XT, true><<<grid, kThreads, 0, st>>>(A, vx, vq, vqt);                             \
    else cast_transpose_kernel<XT, false><<<grid, kThreads, 0, st>>>(A, vx, vq, vqt);
    FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_T)
#undef FP8MIX_LAUNCH_T
    return check_launch("fp8mix_cuda_cast (cast_transpose_kernel)");
}

fp8mix_status launch_cast(const CastArgs &A, fp8mix_dtype xt, cudaStream_t st)
{
    if (A.rows == 0 || A.cols == 0) return FP8MIX_OK;
    if (A.qt) return launch_cast_transpose(A, xt, st);
    const int sr = A.p.stochastic;
    const bool vec = vec_ok_x(A.x, xt, A.cols, A.ld_x) && aligned16(A.q) && A.ld_q % 16 == 0;
    if (vec) {
        const int64_t units = A.rows * (A.cols / (xt == FP8MIX_F32 ? 4 : 8));
        const unsigned grid = grid_for(units, kThreads);
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
                                          const fp8mix_cast_opts *opts, cudaStream_t stream)
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
    return launch_cast(A, xt, stream);
}
