/*
 * cast.cu — the casting kernels and their launchers: scale+cast+amax (every
 * granularity), cast+transpose, per-granularity amax, current-scaling
 * quantisation, dequantisation.  Bytes equal the C core's (csrc/core/cast.c);
 * the encoder and helpers are in encode.cuh.
 *
 * Kernels (all grid-stride, 64-bit indices, 256 threads per block):
 *   cast_rows_vec / cast_rows_scalar   x -> q, one 16-element vector per thread
 *                                      step (16-byte loads/stores), or one element
 *   cast_transpose_kernel              64x64 tiles through shared memory -> q, qt
 *   group_kernel                       one thread group per scale tile (ROW: a
 *                                      warp per row; BLOCK: 8 lanes per 1x128
 *                                      tile; BLOCK2D: a block per 128x128 tile):
 *                                      per-tile amax, or fused amax->scale->cast
 *   amax_tensor_kernel                 whole-tensor amax (block reduce + atomicMax)
 *   dequant_kernel                     q -> high precision
 * amax reductions fold max |x| bits with atomicMax on unsigned; each block
 * canonicalises NaN to 0x7FC00000 before its atomic, so the result is the CPU's.
 * Not here: compute_scale, delayed scaling, bias add (scale.cu), GEMM.
 */
#include <cstring>

#include "encode.cuh"

namespace fp8mix_cuda {

constexpr int kThreads = 256;
constexpr int kVec = 16; /* elements per vector step */
constexpr int kTile = 64; /* cast+transpose tile edge */

/* Everything a cast kernel needs (passed by value). */
struct CastArgs {
    const uint8_t *x;        /* bytes */
    int64_t rows, cols, ld_x;
    fp8mix_granularity gran;
    int64_t nbc;             /* ceil(cols / 128) */
    const float *scale;      /* given scales, or NULL in current mode */
    const float *amax_src;   /* current mode: per-tile amax the scale derives from */
    int margin, pow2;
    float eps, fmax;
    uint8_t *q;
    int64_t ld_q;
    uint8_t *qt;
    int64_t ld_qt;
    uint32_t *amax_bits;     /* whole-tensor amax accumulator or NULL */
    int *scale_status;
    Fp8Params p;
    uint64_t seed, offset;
    int hw;                  /* saturating nearest: use the cvt instruction */
};

__device__ __forceinline__ int64_t scale_index(const CastArgs &A, int64_t i, int64_t j)
{
    switch (A.gran) {
    case FP8MIX_GRAN_TENSOR: return 0;
    case FP8MIX_GRAN_ROW: return i;
    case FP8MIX_GRAN_BLOCK: return i * A.nbc + j / FP8MIX_BLOCK;
    default: return (i / FP8MIX_BLOCK) * A.nbc + j / FP8MIX_BLOCK;
    }
}

/* The scale of tile si: given, or derived from the tile's amax (current mode). */
__device__ __forceinline__ float tile_scale(const CastArgs &A, int64_t si)
{
    if (A.amax_src) return compute_scale_one(A.amax_src[si], A.fmax, A.margin, A.pow2, A.eps);
    float s = A.scale[si];
    if (!scale_ok(s) && A.scale_status) *A.scale_status = FP8MIX_ERR_BAD_SCALE;
    return s;
}

/* ---- loads ------------------------------------------------------------------- */
template <int XT> struct In;
template <> struct In<FP8MIX_F32> {
    static constexpr int size = 4;
    __device__ static __forceinline__ float one(const uint8_t *row, int64_t j) { return ((const float *)row)[j]; }
    __device__ static __forceinline__ void vec(const uint8_t *row, int64_t j, float (&v)[kVec])
    {
        const float4 *p = (const float4 *)((const float *)row + j);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float4 f = __ldg(p + k);
            v[4 * k] = f.x; v[4 * k + 1] = f.y; v[4 * k + 2] = f.z; v[4 * k + 3] = f.w;
        }
    }
};
template <int XT> struct In16 {
    static constexpr int size = 2;
    __device__ static __forceinline__ float cvt(uint32_t h)
    {
        return XT == FP8MIX_BF16 ? bf16_to_f32((uint16_t)h) : f16_to_f32((uint16_t)h);
    }
    __device__ static __forceinline__ float one(const uint8_t *row, int64_t j)
    {
        return cvt(((const uint16_t *)row)[j]);
    }
    __device__ static __forceinline__ void vec(const uint8_t *row, int64_t j, float (&v)[kVec])
    {
        const uint4 *p = (const uint4 *)((const uint16_t *)row + j);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint4 u = __ldg(p + k);
            uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int t = 0; t < 4; t++) {
                v[8 * k + 2 * t] = cvt(w[t] & 0xFFFFu);
                v[8 * k + 2 * t + 1] = cvt(w[t] >> 16);
            }
        }
    }
};
template <> struct In<FP8MIX_BF16> : In16<FP8MIX_BF16> {};
template <> struct In<FP8MIX_F16> : In16<FP8MIX_F16> {};

/* ---- encode 16 values (element n0 .. n0+15 of the logical tensor) ---------- */
template <bool STOCH>
__device__ __forceinline__ uint4 encode16(const CastArgs &A, const float (&v)[kVec], float s, uint64_t n0)
{
    uint32_t w[4] = {0, 0, 0, 0};
    if (STOCH) {
        uint32_t r[kVec];
        random_words<kVec>(A.seed, A.offset + n0, r);
#pragma unroll
        for (int t = 0; t < kVec; t++)
            w[t >> 2] |= (uint32_t)fp8_encode(A.p, __fmul_rn(v[t], s), r[t]) << (8 * (t & 3));
    } else if (A.hw) {
#pragma unroll
        for (int t = 0; t < kVec; t += 2)
            w[t >> 2] |= (uint32_t)fp8_encode2_hw(A.p, __fmul_rn(v[t], s), __fmul_rn(v[t + 1], s)) << (8 * (t & 3));
    } else {
#pragma unroll
        for (int t = 0; t < kVec; t++)
            w[t >> 2] |= (uint32_t)fp8_encode(A.p, __fmul_rn(v[t], s), 0u) << (8 * (t & 3));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Scalar encode of one element (element number n). */
__device__ __forceinline__ uint8_t encode1(const CastArgs &A, float v, float s, uint64_t n)
{
    uint32_t r = A.p.stochastic ? random_word(A.seed, A.offset + n) : 0u;
    return fp8_encode(A.p, __fmul_rn(v, s), r);
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return f32_bits(v) & 0x7FFFFFFFu; }

/* Block-wide max of m, folded into *dst with one atomic per block.  Every thread
 * of the block must call it. */
__device__ __forceinline__ void block_amax_commit(uint32_t m, uint32_t *dst)
{
    __shared__ uint32_t part[kThreads / 32];
    m = warp_max_u32(m);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) part[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? part[lane] : 0u;
        m = warp_max_u32(m);
        if (lane == 0 && m) atomicMax(dst, canon_amax_bits(m));
    }
}

/* ---- x -> q ------------------------------------------------------------------ */
template <int XT, bool STOCH>
__global__ void __launch_bounds__(kThreads) cast_rows_vec(CastArgs A)
{
    using L = In<XT>;
    const int64_t vpr = A.cols / kVec, nv = A.rows * vpr;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const bool tensor = A.gran == FP8MIX_GRAN_TENSOR;
    const float s_tensor = tensor && nv > 0 ? tile_scale(A, 0) : 1.0f;
    uint32_t m = 0;
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
        const int64_t i = v / vpr, j = (v - i * vpr) * kVec;
        float x[kVec];
        L::vec(A.x + (size_t)(i * A.ld_x) * L::size, j, x);
#pragma unroll
        for (int t = 0; t < kVec; t++) m = max(m, abs_bits(x[t]));
        const float s = tensor ? s_tensor : tile_scale(A, scale_index(A, i, j));
        uint4 o = encode16<STOCH>(A, x, s, (uint64_t)(i * A.cols + j));
        *(uint4 *)(A.q + i * A.ld_q + j) = o;
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
 * Load phase: thread t reads 16 elements of tile row t/4 (columns (t%4)*16..),
 * encodes them, stores them to q (16 bytes) and to the tile.  Store phase: thread
 * t owns a 4x4 byte block (tile rows i0..i0+3, columns j0..j0+3), transposes it
 * with byte permutes and writes 4 bytes to each of 4 qt rows; lanes are arranged
 * so that 8 lanes write 32 contiguous bytes of a qt row and the tile reads are
 * free of bank conflicts (row pitch 68 bytes = 17 words). */
constexpr int kPitch = kTile + 4;

template <int XT, bool STOCH>
__global__ void __launch_bounds__(kThreads) cast_transpose_kernel(CastArgs A, int vec_x, int vec_q, int vec_qt)
{
    using L = In<XT>;
    __shared__ __align__(16) uint8_t tile[kTile * kPitch];
    const int64_t ntr = (A.rows + kTile - 1) / kTile, ntc = (A.cols + kTile - 1) / kTile;
    const int t = threadIdx.x;
    const int lr = t >> 2, lc = (t & 3) * kVec;                /* load phase  */
    const int warp = t >> 5, lane = t & 31;                    /* store phase */
    const int si0 = ((warp >> 2) * 8 + (lane & 7)) * 4;        /* tile row (i) of the 4x4 block */
    const int sj0 = ((warp & 3) * 4 + (lane >> 3)) * 4;        /* tile column (j) */
    uint32_t m = 0;
    for (int64_t tileno = blockIdx.x; tileno < ntr * ntc; tileno += gridDim.x) {
        const int64_t r0 = (tileno / ntc) * kTile, c0 = (tileno % ntc) * kTile;
        /* load, encode, write q, fill the tile */
        {
            const int64_t i = r0 + lr, j = c0 + lc;
            uint32_t w[4] = {0, 0, 0, 0};
            if (i < A.rows && j < A.cols) {
                const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
                const float s = tile_scale(A, scale_index(A, i, j));
                const int64_t nrem = A.cols - j;
                if (vec_x && nrem >= kVec) {
                    float x[kVec];
                    L::vec(xrow, j, x);
#pragma unroll
                    for (int u = 0; u < kVec; u++) m = max(m, abs_bits(x[u]));
                    uint4 o = encode16<STOCH>(A, x, s, (uint64_t)(i * A.cols + j));
                    w[0] = o.x; w[1] = o.y; w[2] = o.z; w[3] = o.w;
                    if (A.q) {
                        if (vec_q) *(uint4 *)(A.q + i * A.ld_q + j) = o;
                        else
                            for (int u = 0; u < kVec; u++) A.q[i * A.ld_q + j + u] = (uint8_t)(w[u >> 2] >> (8 * (u & 3)));
                    }
                } else {
                    const int cnt = nrem < kVec ? (int)nrem : kVec;
                    for (int u = 0; u < cnt; u++) {
                        float x = L::one(xrow, j + u);
                        m = max(m, abs_bits(x));
                        uint8_t b = encode1(A, x, s, (uint64_t)(i * A.cols + j + u));
                        w[u >> 2] |= (uint32_t)b << (8 * (u & 3));
                        if (A.q) A.q[i * A.ld_q + j + u] = b;
                    }
                }
            }
            uint32_t *dst = (uint32_t *)(tile + lr * kPitch + lc);
#pragma unroll
            for (int k = 0; k < 4; k++) dst[k] = w[k];
        }
        __syncthreads();
        /* transpose 4x4 byte blocks, write qt */
        {
            uint32_t w0 = *(const uint32_t *)(tile + (si0 + 0) * kPitch + sj0);
            uint32_t w1 = *(const uint32_t *)(tile + (si0 + 1) * kPitch + sj0);
            uint32_t w2 = *(const uint32_t *)(tile + (si0 + 2) * kPitch + sj0);
            uint32_t w3 = *(const uint32_t *)(tile + (si0 + 3) * kPitch + sj0);
            uint32_t t0 = __byte_perm(w0, w1, 0x5140), t1 = __byte_perm(w0, w1, 0x7362);
            uint32_t t2 = __byte_perm(w2, w3, 0x5140), t3 = __byte_perm(w2, w3, 0x7362);
            uint32_t o[4] = {__byte_perm(t0, t2, 0x5410), __byte_perm(t0, t2, 0x7632),
                             __byte_perm(t1, t3, 0x5410), __byte_perm(t1, t3, 0x7632)};
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
        __syncthreads();
    }
    if (A.amax_bits) block_amax_commit(m, A.amax_bits);
}

/* ---- one thread group per scale tile ----------------------------------------
 * G lanes (8, 32 or 256) own a tile: ROW (1 x cols), BLOCK (1 x 128) or
 * BLOCK2D (128 x 128).  The tile is cut into 16-element segments; lane g takes
 * segments g, g+G, ...  FUSED: after the group's amax is known, every lane
 * computes the tile's scale and casts its segments (re-read, now in cache);
 * lane 0 writes amax_out[tile] and scale_inv[tile].  Otherwise lane 0 writes the
 * tile's amax to out[tile]. */
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

template <int XT, int G, bool FUSED, bool STOCH>
__global__ void __launch_bounds__(kThreads) group_kernel(GroupArgs GA)
{
    using L = In<XT>;
    const CastArgs &A = GA.c;
    const int64_t ntr = A.gran == FP8MIX_GRAN_BLOCK2D ? (A.rows + FP8MIX_BLOCK - 1) / FP8MIX_BLOCK : A.rows;
    const int64_t ntc = A.gran == FP8MIX_GRAN_ROW ? 1 : A.nbc;
    const int64_t ntiles = ntr * ntc;
    const int64_t tw = A.gran == FP8MIX_GRAN_ROW ? A.cols : FP8MIX_BLOCK; /* nominal tile width */
    const int64_t th = A.gran == FP8MIX_GRAN_BLOCK2D ? FP8MIX_BLOCK : 1;
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
        int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
        if (active) {
            r0 = (tileno / ntc) * th;
            r1 = min(r0 + th, A.rows);
            c0 = (tileno % ntc) * tw;
            c1 = min(c0 + tw, A.cols);
        }
        const int64_t nseg = (c1 - c0 + kVec - 1) / kVec, total = (r1 - r0) * nseg;
        uint32_t m = 0;
        for (int64_t sg = g; sg < total; sg += G) {
            const int64_t i = r0 + sg / nseg, j = c0 + (sg % nseg) * kVec;
            const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
            if (GA.vec_x && c1 - j >= kVec) {
                float x[kVec];
                L::vec(xrow, j, x);
#pragma unroll
                for (int u = 0; u < kVec; u++) m = max(m, abs_bits(x[u]));
            } else {
                for (int64_t u = j; u < c1 && u < j + kVec; u++) m = max(m, abs_bits(L::one(xrow, u)));
            }
        }
        m = canon_amax_bits(group_max<G>(m));
        if (!FUSED) {
            if (active && g == 0) GA.amax_out[tileno] = bits_f32(m);
            continue;
        }
        const float s = compute_scale_one(bits_f32(m), A.fmax, A.margin, A.pow2, A.eps);
        if (active && g == 0) {
            GA.amax_out[tileno] = bits_f32(m);
            GA.scale_inv[tileno] = __frcp_rn(s);
        }
        for (int64_t sg = g; sg < total; sg += G) {
            const int64_t i = r0 + sg / nseg, j = c0 + (sg % nseg) * kVec;
            const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
            if (GA.vec_x && GA.vec_q && c1 - j >= kVec) {
                float x[kVec];
                L::vec(xrow, j, x);
                *(uint4 *)(A.q + i * A.ld_q + j) = encode16<STOCH>(A, x, s, (uint64_t)(i * A.cols + j));
            } else {
                for (int64_t u = j; u < c1 && u < j + kVec; u++)
                    A.q[i * A.ld_q + u] = encode1(A, L::one(xrow, u), s, (uint64_t)(i * A.cols + u));
            }
        }
    }
}

template <int XT>
__global__ void __launch_bounds__(kThreads) amax_tensor_kernel(const uint8_t *x, int64_t rows, int64_t cols,
                                                               int64_t ld_x, int vec, uint32_t *out)
{
    using L = In<XT>;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    uint32_t m = 0;
    if (vec) {
        const int64_t vpr = cols / kVec, nv = rows * vpr;
        for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
            const int64_t i = v / vpr, j = (v - i * vpr) * kVec;
            float xv[kVec];
            L::vec(x + (size_t)(i * ld_x) * L::size, j, xv);
#pragma unroll
            for (int u = 0; u < kVec; u++) m = max(m, abs_bits(xv[u]));
        }
    } else {
        const int64_t ne = rows * cols;
        for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < ne; e += stride) {
            const int64_t i = e / cols, j = e - i * cols;
            m = max(m, abs_bits(L::one(x + (size_t)(i * ld_x) * L::size, j)));
        }
    }
    block_amax_commit(m, out);
}

/* ---- dequantise ---------------------------------------------------------------- */
struct DqArgs {
    const uint8_t *q;
    int64_t rows, cols, ld_q, ld_out;
    fp8mix_granularity gran;
    int64_t nbc;
    const float *scale_inv;
    uint8_t *out;
    fp8mix_format fmt;
    int *scale_status;
};

__device__ __forceinline__ float dq_scale(const DqArgs &D, int64_t i, int64_t j)
{
    int64_t si;
    switch (D.gran) {
    case FP8MIX_GRAN_TENSOR: si = 0; break;
    case FP8MIX_GRAN_ROW: si = i; break;
    case FP8MIX_GRAN_BLOCK: si = i * D.nbc + j / FP8MIX_BLOCK; break;
    default: si = (i / FP8MIX_BLOCK) * D.nbc + j / FP8MIX_BLOCK; break;
    }
    float s = D.scale_inv[si];
    if (!scale_ok(s) && D.scale_status) *D.scale_status = FP8MIX_ERR_BAD_SCALE;
    return s;
}

template <int OT>
__global__ void __launch_bounds__(kThreads) dequant_kernel(DqArgs D, int vec)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const size_t osz = OT == FP8MIX_F32 ? 4 : 2;
    if (vec) {
        const int64_t vpr = D.cols / kVec, nv = D.rows * vpr;
        for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < nv; v += stride) {
            const int64_t i = v / vpr, j = (v - i * vpr) * kVec;
            const float s = dq_scale(D, i, j);
            uint4 in = __ldg((const uint4 *)(D.q + i * D.ld_q + j));
            uint32_t w[4] = {in.x, in.y, in.z, in.w};
            float y[kVec];
#pragma unroll
            for (int u = 0; u < kVec; u++) y[u] = __fmul_rn(fp8_decode((uint8_t)(w[u >> 2] >> (8 * (u & 3))), D.fmt), s);
            uint8_t *orow = D.out + (size_t)(i * D.ld_out) * osz;
            if (OT == FP8MIX_F32) {
                float4 *o = (float4 *)((float *)orow + j);
#pragma unroll
                for (int k = 0; k < 4; k++) o[k] = make_float4(y[4 * k], y[4 * k + 1], y[4 * k + 2], y[4 * k + 3]);
            } else {
                uint32_t h[8];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    uint32_t lo = OT == FP8MIX_BF16 ? f32_to_bf16(y[2 * k]) : f32_to_f16(y[2 * k]);
                    uint32_t hi = OT == FP8MIX_BF16 ? f32_to_bf16(y[2 * k + 1]) : f32_to_f16(y[2 * k + 1]);
                    h[k] = lo | (hi << 16);
                }
                uint4 *o = (uint4 *)((uint16_t *)orow + j);
                o[0] = make_uint4(h[0], h[1], h[2], h[3]);
                o[1] = make_uint4(h[4], h[5], h[6], h[7]);
            }
        }
    } else {
        const int64_t ne = D.rows * D.cols;
        for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < ne; e += stride) {
            const int64_t i = e / D.cols, j = e - i * D.cols;
            float y = __fmul_rn(fp8_decode(D.q[i * D.ld_q + j], D.fmt), dq_scale(D, i, j));
            store_hp(D.out + (size_t)(i * D.ld_out) * osz, (fp8mix_dtype)OT, j, y);
        }
    }
}

/* ---- host helpers -------------------------------------------------------------- */
static bool valid_dtype(fp8mix_dtype t) { return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16; }
static bool valid_gran(fp8mix_granularity g) { return g >= FP8MIX_GRAN_TENSOR && g <= FP8MIX_GRAN_BLOCK2D; }
static size_t dsize(fp8mix_dtype t) { return t == FP8MIX_F32 ? 4 : 2; }
static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

static bool bad_2d(int64_t rows, int64_t cols, int64_t ld)
{
    return rows < 0 || cols < 0 || ld < cols || (rows > 0 && ld < 1) ||
           (cols > 0 && rows > INT64_MAX / (ld > 0 ? ld : 1));
}

static int64_t scale_count(fp8mix_granularity g, int64_t rows, int64_t cols)
{
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return 1;
    case FP8MIX_GRAN_ROW: return rows;
    case FP8MIX_GRAN_BLOCK: return rows * cdiv(cols, FP8MIX_BLOCK);
    default: return cdiv(rows, FP8MIX_BLOCK) * cdiv(cols, FP8MIX_BLOCK);
    }
}

/* 16-byte vector path for x: every row start 16-byte aligned and cols whole vectors. */
static bool vec_ok_x(const void *x, fp8mix_dtype xt, int64_t cols, int64_t ld_x)
{
    return aligned16(x) && cols % kVec == 0 && ((size_t)ld_x * dsize(xt)) % 16 == 0;
}

static fp8mix_status common_checks(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                   fp8mix_granularity gran)
{
    if (!valid_dtype(xt) || !valid_gran(gran)) return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows > 0 && cols > 0 && !x) return FP8MIX_ERR_NULL_POINTER;
    return FP8MIX_OK;
}

static fp8mix_status out_checks(int64_t rows, int64_t cols, const uint8_t *q, int64_t ld_q, const uint8_t *qt,
                                int64_t ld_qt)
{
    if (!q && !qt) return FP8MIX_ERR_NULL_POINTER;
    if (q && bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    if (qt && bad_2d(cols, rows, ld_qt)) return FP8MIX_ERR_BAD_SHAPE;
    return FP8MIX_OK;
}

static CastArgs make_args(const void *x, int64_t rows, int64_t cols, int64_t ld_x, fp8mix_granularity gran,
                          const Fp8Params &p, const fp8mix_cast_opts *o)
{
    CastArgs A;
    memset(&A, 0, sizeof A);
    A.x = (const uint8_t *)x;
    A.rows = rows;
    A.cols = cols;
    A.ld_x = ld_x;
    A.gran = gran;
    A.nbc = cdiv(cols, FP8MIX_BLOCK);
    A.p = p;
    A.fmax = format_max(p.fmt);
    A.seed = o->seed;
    A.offset = o->offset;
    A.hw = fp8mix_cuda_get_hw_convert() && p.saturate && !p.stochastic;
    return A;
}

/* Launch the x -> q (and qt) kernels for A (scales given or current mode). */
static fp8mix_status launch_cast(const CastArgs &A, fp8mix_dtype xt, cudaStream_t st)
{
    if (A.rows == 0 || A.cols == 0) return FP8MIX_OK;
    const int sr = A.p.stochastic;
#define FP8MIX_DISPATCH_XT(MACRO)                                                                                   \
    switch (xt) {                                                                                                   \
    case FP8MIX_F32: MACRO(FP8MIX_F32); break;                                                                      \
    case FP8MIX_BF16: MACRO(FP8MIX_BF16); break;                                                                    \
    default: MACRO(FP8MIX_F16); break;                                                                              \
    }
    if (A.qt) {
        const int vx = vec_ok_x(A.x, xt, kVec, A.ld_x); /* per segment: rows aligned, full segments only */
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
    const bool vec = vec_ok_x(A.x, xt, A.cols, A.ld_x) && aligned16(A.q) && A.ld_q % 16 == 0;
    if (vec) {
        const unsigned grid = grid_for(A.rows * (A.cols / kVec), kThreads);
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
        const unsigned grid = grid_for(vec ? rows * (cols / kVec) : rows * cols, kThreads);
#define FP8MIX_LAUNCH_A(XT)                                                                                         \
    amax_tensor_kernel<XT><<<grid, kThreads, 0, st>>>((const uint8_t *)x, rows, cols, ld_x, vec, (uint32_t *)out);
        FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_A)
#undef FP8MIX_LAUNCH_A
        return check_launch("fp8mix_cuda_amax (amax_tensor_kernel)");
    }
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
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

extern "C" fp8mix_status fp8mix_cuda_cast(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                          fp8mix_granularity gran, const float *scale, uint8_t *q, int64_t ld_q,
                                          uint8_t *qt, int64_t ld_qt, float *amax, int *scale_status,
                                          const fp8mix_cast_opts *opts, cudaStream_t stream)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if ((st = out_checks(rows, cols, q, ld_q, qt, ld_qt))) return st;
    Fp8Params p;
    if ((st = params_init(&p, opts))) return st;
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

extern "C" fp8mix_status fp8mix_cuda_amax(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                          fp8mix_granularity gran, float *out, cudaStream_t stream)
{
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if (scale_count(gran, rows, cols) > 0 && !out) return FP8MIX_ERR_NULL_POINTER;
    return launch_amax(x, xt, rows, cols, ld_x, gran, out, stream);
}

extern "C" fp8mix_status fp8mix_cuda_quantize_current(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                                      int64_t ld_x, fp8mix_granularity gran, int margin, int pow2,
                                                      float amax_epsilon, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                                      int64_t ld_qt, float *scale_inv, float *amax_out,
                                                      const fp8mix_cast_opts *opts, cudaStream_t stream)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if ((st = out_checks(rows, cols, q, ld_q, qt, ld_qt))) return st;
    Fp8Params p;
    if ((st = params_init(&p, opts))) return st;
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

extern "C" fp8mix_status fp8mix_cuda_dequantize(const uint8_t *q, fp8mix_format fmt, int64_t rows, int64_t cols,
                                                int64_t ld_q, fp8mix_granularity gran, const float *scale_inv,
                                                void *out, fp8mix_dtype out_t, int64_t ld_out, int *scale_status,
                                                cudaStream_t stream)
{
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || !valid_dtype(out_t) || !valid_gran(gran))
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_q) || bad_2d(rows, cols, ld_out)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!q || !out || !scale_inv) return FP8MIX_ERR_NULL_POINTER;
    DqArgs D = {q, rows, cols, ld_q, ld_out, gran, cdiv(cols, FP8MIX_BLOCK), scale_inv, (uint8_t *)out, fmt,
                scale_status};
    const int vec = aligned16(q) && aligned16(out) && cols % kVec == 0 && ld_q % 16 == 0 &&
                    ((size_t)ld_out * dsize(out_t)) % 16 == 0;
    const unsigned grid = grid_for(vec ? rows * (cols / kVec) : rows * cols, kThreads);
    switch (out_t) {
    case FP8MIX_F32: dequant_kernel<FP8MIX_F32><<<grid, kThreads, 0, stream>>>(D, vec); break;
    case FP8MIX_BF16: dequant_kernel<FP8MIX_BF16><<<grid, kThreads, 0, stream>>>(D, vec); break;
    default: dequant_kernel<FP8MIX_F16><<<grid, kThreads, 0, stream>>>(D, vec); break;
    }
    return check_launch("fp8mix_cuda_dequantize");
}
