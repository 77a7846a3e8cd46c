/*
 * quantize.cu — per-granularity amax (fp8mix_cuda_amax) and current-scaling
 * quantisation (fp8mix_cuda_quantize_current): amax -> scale -> cast with no host
 * sync, fused into one kernel for ROW and BLOCK tiles, two for TENSOR (recipe.cu's
 * pre-pass and state cast).  Bytes, amaxes and scale
 * inverses equal the C core's (csrc/core/cast.c).
 *
 * Kernels (256 threads per block):
 *   group_kernel        one thread group per scale tile (ROW: a warp per row; BLOCK:
 *                       8 lanes per 1x128 tile; BLOCK2D: a block per 128x128 tile):
 *                       per-tile amax, or fused amax -> scale -> cast
 *   amax_tensor_kernel  whole-tensor amax (block reduce + one atomicMax per block)
 * Not here: the given-scale cast kernels (cast.cu), compute_scale (scale.cu).
 */
#include "cast_body.cuh"

namespace fp8mix_cuda {

/* ---- one thread group per scale tile ----------------------------------------
 * G lanes (8, 32 or 256) own a tile: ROW (1 x cols), BLOCK (1 x 128) or BLOCK2D
 * (128 x 128).  The tile is cut into units of U elements (one 16-byte load); lane
 * g takes units g, g+G, ... so that the lanes of a group read contiguous bytes.
 * FUSED: after the group's amax is known, every lane computes the tile's scale and
 * casts its units (re-read, now in cache); lane 0 writes amax_out[tile] and
 * scale_inv[tile].  Otherwise lane 0 writes the tile's amax to amax_out[tile]. */
struct GroupArgs {
    CastArgs c;
    float *amax_out;
    float *scale_inv;
    int vec_x, vec_q;
};

template <int G>
__device__ __forceinline__ uint32_t group_max(uint32_t m)
{
    if (G == 8) {
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 4));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 2));
        m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, 1));
        return m;
    } else if (G == 32) {
        return warp_max_u32(m);
    } else {
        __shared__ uint32_t part[kThreads / 32];
        m = warp_max_u32(m);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
        __syncthreads();
        uint32_t r = 0;
#pragma unroll
        for (int k = 0; k < kThreads / 32; k++) r = max(r, part[k]);
        __syncthreads(); /* part is reused by the next tile */
        return r;
    }
}

/* The bounds of tile `tileno` (rows r0..r1-1, columns c0..c1-1). */
struct TileBox {
    int64_t r0, r1, c0, c1;
};

__device__ __forceinline__ TileBox tile_box(const CastArgs &A, int64_t tileno, int64_t ntc)
{
    const int64_t tw = A.gran == FP8MIX_GRAN_ROW ? A.cols : FP8MIX_BLOCK; /* nominal tile width */
    const int64_t th = A.gran == FP8MIX_GRAN_BLOCK2D ? FP8MIX_BLOCK : 1;
    TileBox b;
    b.r0 = (tileno / ntc) * th;
    b.r1 = min(b.r0 + th, A.rows);
    b.c0 = (tileno % ntc) * tw;
    b.c1 = min(b.c0 + tw, A.cols);
    return b;
}

/* max |x| bits over this lane's units of tile b. */
template <int XT, int G>
__device__ __forceinline__ uint32_t tile_lane_max(const GroupArgs &GA, const TileBox &b, int g)
{
    using L = In<XT>;
    constexpr int U = L::U;
    const CastArgs &A = GA.c;
    const int64_t nun = (b.c1 - b.c0 + U - 1) / U, total = (b.r1 - b.r0) * nun;
    uint32_t m = 0;
    for (int64_t sg = g; sg < total; sg += G) {
        const int64_t i = b.r0 + sg / nun, j = b.c0 + (sg % nun) * U;
        const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
        if (GA.vec_x && b.c1 - j >= U) {
            float x[U];
            L::unit(xrow, j, x);
#pragma unroll
            for (int u = 0; u < U; u++) m = max(m, abs_bits(x[u]));
        } else {
            for (int64_t u = j; u < b.c1 && u < j + U; u++) m = max(m, abs_bits(L::one(xrow, u)));
        }
    }
    return m;
}

/* Cast this lane's units of tile b with scale s. */
template <int XT, int G, bool STOCH>
__device__ __forceinline__ void tile_lane_cast(const GroupArgs &GA, const TileBox &b, int g, float s)
{
    using L = In<XT>;
    constexpr int U = L::U;
    const CastArgs &A = GA.c;
    const int64_t nun = (b.c1 - b.c0 + U - 1) / U, total = (b.r1 - b.r0) * nun;
    for (int64_t sg = g; sg < total; sg += G) {
        const int64_t i = b.r0 + sg / nun, j = b.c0 + (sg % nun) * U;
        const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
        if (GA.vec_x && GA.vec_q && b.c1 - j >= U) {
            float x[U];
            L::unit(xrow, j, x);
            uint32_t w[U / 4];
            encode_unit<U, STOCH>(A, x, s, (uint64_t)(i * A.cols + j), w);
            store_unit<U>(A.q + i * A.ld_q + j, w);
        } else {
            for (int64_t u = j; u < b.c1 && u < j + U; u++)
                A.q[i * A.ld_q + u] = encode1(A, L::one(xrow, u), s, (uint64_t)(i * A.cols + u));
        }
    }
}

template <int XT, int G, bool FUSED, bool STOCH>
__global__ void __launch_bounds__(kThreads) group_kernel(GroupArgs GA)
{
    const CastArgs &A = GA.c;
    const int64_t ntr = A.gran == FP8MIX_GRAN_BLOCK2D ? (A.rows + FP8MIX_BLOCK - 1) / FP8MIX_BLOCK : A.rows;
    const int64_t ntc = A.gran == FP8MIX_GRAN_ROW ? 1 : A.nbc;
    const int64_t ntiles = ntr * ntc;
    const int64_t groups_per_block = kThreads / G;
    const int g = threadIdx.x % G;
    /* Tiles are visited in rounds of one tile per group; the round count is the
     * same for all lanes of a warp (and of a block), so shuffles and barriers
     * are always reached by every lane. */
    const int64_t group0 = (int64_t)blockIdx.x * groups_per_block + threadIdx.x / G;
    const int64_t ngroups = (int64_t)gridDim.x * groups_per_block;
    const int64_t rounds = (ntiles + ngroups - 1) / ngroups;
    for (int64_t rd = 0; rd < rounds; rd++) {
        const int64_t tileno = rd * ngroups + group0;
        const bool active = tileno < ntiles;
        TileBox b = {0, 0, 0, 0};
        if (active) b = tile_box(A, tileno, ntc);
        const uint32_t m = canon_amax_bits(group_max<G>(tile_lane_max<XT, G>(GA, b, g)));
        if (!FUSED) {
            if (active && g == 0) GA.amax_out[tileno] = bits_f32(m);
            continue;
        }
        const float s = compute_scale_one(bits_f32(m), A.fmax, A.margin, A.pow2, A.eps);
        if (active && g == 0) {
            GA.amax_out[tileno] = bits_f32(m);
            GA.scale_inv[tileno] = __frcp_rn(s);
        }
        tile_lane_cast<XT, G, STOCH>(GA, b, g, s);
    }
}

template <int XT>
__global__ void __launch_bounds__(kThreads) amax_tensor_kernel(const uint8_t *x, int64_t rows, int64_t cols,
                                                               int64_t ld_x, int vec, uint32_t *out)
{
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    block_amax_commit(amax_body<XT>(x, rows, cols, ld_x, vec, first, stride), out);
}

/* ---- launchers ------------------------------------------------------------------- */
/* Per-tile amax (gran != TENSOR) or fused current-scaling cast (ROW / BLOCK). */
static fp8mix_status launch_group(const GroupArgs &GA, fp8mix_dtype xt, bool fused, cudaStream_t st)
{
    const CastArgs &A = GA.c;
    const int64_t ntiles = scale_count(A.gran, A.rows, A.cols);
    if (ntiles <= 0) return FP8MIX_OK;
    const int sr = A.p.stochastic;
    const int G = A.gran == FP8MIX_GRAN_ROW ? 32 : A.gran == FP8MIX_GRAN_BLOCK ? 8 : kThreads;
    const unsigned grid = grid_for(ntiles, kThreads / G);
#define FP8MIX_LAUNCH_G1(XT, GG)                                                                                    \
    if (!fused) group_kernel<XT, GG, false, false><<<grid, kThreads, 0, st>>>(GA);                                  \
    else if (sr) group_kernel<XT, GG, true, true><<<grid, kThreads, 0, st>>>(GA);                                   \
    else group_kernel<XT, GG, true, false><<<grid, kThreads, 0, st>>>(GA);
#define FP8MIX_LAUNCH_G(XT)                                                                                         \
    if (G == 32) { FP8MIX_LAUNCH_G1(XT, 32) }                                                                       \
    else if (G == 8) { FP8MIX_LAUNCH_G1(XT, 8) }                                                                    \
    else { FP8MIX_LAUNCH_G1(XT, kThreads) }
    FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_G)
#undef FP8MIX_LAUNCH_G
#undef FP8MIX_LAUNCH_G1
    return check_launch("fp8mix_cuda (group_kernel)");
}

/* amax per granularity into out (device floats, scale-array shape). */
static fp8mix_status launch_amax(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                 fp8mix_granularity gran, float *out, cudaStream_t st)
{
    const int64_t n = scale_count(gran, rows, cols);
    if (n <= 0) return FP8MIX_OK;
    if (gran == FP8MIX_GRAN_TENSOR) {
        fp8mix_status s = cuda_status(cudaMemsetAsync(out, 0, sizeof(float), st), "fp8mix_cuda_amax (memset)");
        if (s || rows == 0 || cols == 0) return s;
        const int vec = vec_ok_x(x, xt, cols, ld_x);
        const int64_t units = rows * (cols / (xt == FP8MIX_F32 ? 4 : 8));
        const unsigned grid = grid_for(vec ? units : rows * cols, kThreads);
#define FP8MIX_LAUNCH_A(XT)                                                                                         \
    amax_tensor_kernel<XT><<<grid, kThreads, 0, st>>>((const uint8_t *)x, rows, cols, ld_x, vec, (uint32_t *)out);
        FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_A)
#undef FP8MIX_LAUNCH_A
        return check_launch("fp8mix_cuda_amax (amax_tensor_kernel)");
    }
    fp8mix_cast_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = FP8MIX_E4M3;
    o.saturate = 1;
    o.rounding = FP8MIX_ROUND_NEAREST;
    Fp8Params p;
    params_init(&p, &o);
    GroupArgs GA;
    memset(&GA, 0, sizeof GA);
    GA.c = make_args(x, rows, cols, ld_x, gran, p, &o);
    GA.amax_out = out;
    GA.vec_x = vec_ok_x(x, xt, kVec, ld_x);
    return launch_group(GA, xt, false, st);
}

} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

/* ---- entry points ----------------------------------------------------------------- */

extern "C" fp8mix_status fp8mix_cuda_amax(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                          fp8mix_granularity gran, float *out, cudaStream_t stream)
{
    begin_call();
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if (scale_count(gran, rows, cols) > 0 && !out) return FP8MIX_ERR_NULL_POINTER;
    return launch_amax(x, xt, rows, cols, ld_x, gran, out, stream);
}

extern "C" fp8mix_status fp8mix_cuda_quantize_current(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                                      int64_t ld_x, fp8mix_granularity gran, int margin, int pow2,
                                                      float amax_epsilon, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                                      int64_t ld_qt, float *scale_inv, float *amax_out,
                                                      const fp8mix_cast_opts *opts, const int64_t *rng,
                                                      uint64_t rng_skip, void *work, cudaStream_t stream)
{
    begin_call();
    Fp8Params p;
    fp8mix_status st = cast_prologue(x, xt, rows, cols, ld_x, gran, q, ld_q, qt, ld_qt, opts, &p);
    if (st) return st;
    if (margin < 0 || margin > 126 || !(amax_epsilon >= 0.0f) || amax_epsilon > 3.40282346638528859812e+38f)
        return FP8MIX_ERR_BAD_ARG;
    const int64_t n = scale_count(gran, rows, cols);
    if (n <= 0) return FP8MIX_OK;
    if (!scale_inv || !amax_out) return FP8MIX_ERR_NULL_POINTER;
    CastArgs A = make_args(x, rows, cols, ld_x, gran, p, opts);
    A.margin = margin;
    A.pow2 = pow2 ? 1 : 0;
    A.eps = amax_epsilon;
    A.q = q;
    A.ld_q = ld_q;
    A.qt = qt;
    A.ld_qt = ld_qt;
    with_rng(A, rng, rng_skip);
    if (gran == FP8MIX_GRAN_TENSOR) return launch_current_tensor(A, xt, scale_inv, amax_out, work, stream);
    if (!qt && (gran == FP8MIX_GRAN_ROW || gran == FP8MIX_GRAN_BLOCK)) {
        GroupArgs GA;
        memset(&GA, 0, sizeof GA);
        GA.c = A;
        GA.amax_out = amax_out;
        GA.scale_inv = scale_inv;
        GA.vec_x = vec_ok_x(x, xt, kVec, ld_x);
        GA.vec_q = aligned16(q) && ld_q % 16 == 0;
        return launch_group(GA, xt, true, stream);
    }
    if ((st = launch_amax(x, xt, rows, cols, ld_x, gran, amax_out, stream))) return st;
    if ((st = fp8mix_cuda_compute_scale(amax_out, n, opts->fmt, margin, pow2, amax_epsilon, NULL, scale_inv, stream)))
        return st;
    A.amax_src = amax_out;
    return launch_cast(A, xt, stream);
}
