/*
 * cast_body.cuh — the work loops of the x -> q (and qt) casts as device functions,
 * so that the given-scale kernels (cast.cu) and the kernels that also update a
 * recipe's state (recipe.cu) run the same code.  Each body covers a grid-stride share
 * of the tensor (`first`, `stride` in work items: units, elements or 64x64 tiles),
 * takes its scales from a functor S (S(i, j) = the scale of element (i, j)) and
 * returns the max |x| bits this thread read (the caller commits the amax).
 *
 *   rows_vec_body    one 16-byte unit of x per step (U = 4 or 8 elements), U bytes
 *                    stored: coalesced on both sides
 *   rows_scalar_body one element per step (unaligned / odd shapes)
 *   transpose_body   64x64 tiles through shared memory -> q and qt
 *   amax_body        max |x| only (no cast), by units or elements
 * Not here: kernels, launchers, amax commits.
 */
#ifndef FP8MIX_CUDA_CAST_BODY_CUH
#define FP8MIX_CUDA_CAST_BODY_CUH

#include "cast_kernels.cuh"

namespace fp8mix_cuda {

constexpr int kTile = 64; /* cast+transpose tile edge */
constexpr int kPitch = kTile + 4;

/* Scale functors: the given scale array (validated per tile), or one value. */
struct GivenScale {
    const CastArgs &A;
    __device__ __forceinline__ float operator()(int64_t i, int64_t j) const
    {
        return tile_scale(A, scale_index(A, i, j));
    }
};
struct FixedScale {
    float s;
    __device__ __forceinline__ float operator()(int64_t, int64_t) const { return s; }
};

/* Work items of each body for A (the launchers size grids with these). */
inline int64_t vec_units(const CastArgs &A, fp8mix_dtype xt) { return A.rows * (A.cols / (xt == FP8MIX_F32 ? 4 : 8)); }
inline int64_t transpose_tiles(const CastArgs &A) { return cdiv(A.rows, kTile) * cdiv(A.cols, kTile); }

template <int XT, bool STOCH, class S>
__device__ __forceinline__ uint32_t rows_vec_body(const CastArgs &A, const S &scale, int64_t first, int64_t stride)
{
    using L = In<XT>;
    constexpr int U = L::U;
    const int64_t upr = A.cols / U, nu = A.rows * upr;
    uint32_t m = 0;
    for (int64_t u = first; u < nu; u += stride) {
        const int64_t i = u / upr, j = (u - i * upr) * U;
        float x[U];
        L::unit(A.x + (size_t)(i * A.ld_x) * L::size, j, x);
#pragma unroll
        for (int t = 0; t < U; t++) m = max(m, abs_bits(x[t]));
        uint32_t w[U / 4];
        encode_unit<U, STOCH>(A, x, scale(i, j), (uint64_t)(i * A.cols + j), w);
        store_unit<U>(A.q + i * A.ld_q + j, w);
    }
    return m;
}

template <int XT, class S>
__device__ __forceinline__ uint32_t rows_scalar_body(const CastArgs &A, const S &scale, int64_t first, int64_t stride)
{
    using L = In<XT>;
    const int64_t ne = A.rows * A.cols;
    uint32_t m = 0;
    for (int64_t e = first; e < ne; e += stride) {
        const int64_t i = e / A.cols, j = e - i * A.cols;
        float x = L::one(A.x + (size_t)(i * A.ld_x) * L::size, j);
        m = max(m, abs_bits(x));
        A.q[i * A.ld_q + j] = encode1(A, x, scale(i, j), (uint64_t)e);
    }
    return m;
}

/* max |x| bits over a grid-stride share of x (no cast): units of U elements when
 * vec (cols % 16 == 0, 16-byte aligned rows), else elements. */
template <int XT>
__device__ __forceinline__ uint32_t amax_body(const uint8_t *x, int64_t rows, int64_t cols, int64_t ld_x, int vec,
                                              int64_t first, int64_t stride)
{
    using L = In<XT>;
    constexpr int U = L::U;
    uint32_t m = 0;
    if (vec) {
        const int64_t upr = cols / U, nu = rows * upr;
        for (int64_t u = first; u < nu; u += stride) {
            const int64_t i = u / upr, j = (u - i * upr) * U;
            float xv[U];
            L::unit(x + (size_t)(i * ld_x) * L::size, j, xv);
#pragma unroll
            for (int t = 0; t < U; t++) m = max(m, abs_bits(xv[t]));
        }
    } else {
        const int64_t ne = rows * cols;
        for (int64_t e = first; e < ne; e += stride) {
            const int64_t i = e / cols, j = e - i * cols;
            m = max(m, abs_bits(L::one(x + (size_t)(i * ld_x) * L::size, j)));
        }
    }
    return m;
}

/* ---- x -> q and qt through a 64x64 shared tile ------------------------------
 * Load phase, in kTile / rows_per_pass passes: thread t takes unit t % upr of tile
 * row pass * rows_per_pass + t / upr (upr = 64 / U units per tile row), so a warp
 * reads whole contiguous row segments; it encodes the unit, stores it to q and to
 * the tile.  Store phase: thread t owns a 4x4 byte block (tile rows i0..i0+3,
 * columns j0..j0+3), transposes it with byte permutes and writes 4 bytes to each
 * of 4 qt rows; lanes are arranged so that 8 lanes write 32 contiguous bytes of a
 * qt row and the tile reads are free of bank conflicts (row pitch 68 bytes = 17
 * words).  Needs blockDim.x == kThreads. */

/* One unit of the load phase: tile row lr, columns lc .. lc+U-1; its bytes go to
 * q (when wanted) and are returned in w (zeros outside the tensor). */
template <int XT, bool STOCH, class S>
__device__ __forceinline__ uint32_t load_unit_t(const CastArgs &A, const S &scale, int64_t i, int64_t j, int vec_x,
                                                int vec_q, uint32_t (&w)[In<XT>::U / 4])
{
    using L = In<XT>;
    constexpr int U = L::U;
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < U / 4; k++) w[k] = 0;
    if (i >= A.rows || j >= A.cols) return 0;
    const uint8_t *xrow = A.x + (size_t)(i * A.ld_x) * L::size;
    const float s = scale(i, j);
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

/* Tiles first, first + stride, ... of the tensor; `tile` is the block's shared
 * buffer (kTile * kPitch bytes, 16-byte aligned).  Every thread of the block must
 * call it (it synchronises the block). */
template <int XT, bool STOCH, class S>
__device__ __forceinline__ uint32_t transpose_body(const CastArgs &A, const S &scale, int vec_x, int vec_q,
                                                   int vec_qt, int64_t first, int64_t stride, uint8_t *tile)
{
    constexpr int U = In<XT>::U, upr = kTile / U, rpp = kThreads / upr;
    const int64_t ntr = cdiv(A.rows, kTile), ntc = cdiv(A.cols, kTile);
    const int t = threadIdx.x;
    uint32_t m = 0;
    for (int64_t tileno = first; tileno < ntr * ntc; tileno += stride) {
        const int64_t r0 = (tileno / ntc) * kTile, c0 = (tileno % ntc) * kTile;
#pragma unroll
        for (int pass = 0; pass < kTile / rpp; pass++) {
            const int lr = pass * rpp + t / upr, lc = (t % upr) * U;
            uint32_t w[U / 4];
            m = max(m, load_unit_t<XT, STOCH>(A, scale, r0 + lr, c0 + lc, vec_x, vec_q, w));
            uint32_t *dst = (uint32_t *)(tile + lr * kPitch + lc);
#pragma unroll
            for (int k = 0; k < U / 4; k++) dst[k] = w[k];
        }
        __syncthreads();
        store_tile_t(A, tile, r0, c0, vec_qt);
        __syncthreads();
    }
    return m;
}

/* Vector-path flags of the transpose body (per unit: rows aligned, whole units only). */
struct TransposeVec {
    int x, q, qt;
};
inline TransposeVec transpose_vec(const CastArgs &A, fp8mix_dtype xt)
{
    TransposeVec v;
    v.x = vec_ok_x(A.x, xt, kVec, A.ld_x);
    v.q = A.q && aligned16(A.q) && A.ld_q % 16 == 0;
    v.qt = ((uintptr_t)A.qt & 3u) == 0 && A.ld_qt % 4 == 0;
    return v;
}

/* Whether the row paths may use 16-byte units for A. */
inline bool rows_vec_ok(const CastArgs &A, fp8mix_dtype xt)
{
    return vec_ok_x(A.x, xt, A.cols, A.ld_x) && aligned16(A.q) && A.ld_q % 16 == 0;
}

} // namespace fp8mix_cuda

#endif /* FP8MIX_CUDA_CAST_BODY_CUH */
