/*
 * cast_kernels.cuh — what the cast kernels of cast.cu (given scales) and quantize.cu
 * (per-tile amax, current scaling) share: the argument block, 16-byte input loads,
 * encoding of one 16-byte unit, the block-wide amax commit, and the host-side
 * checks and launch helpers.
 *
 * Work unit: one 16-byte load of x, i.e. U = 4 float32 or 8 bfloat16/float16
 * elements.  Consecutive threads take consecutive units, so a warp's loads are one
 * contiguous 512-byte span (fully coalesced) and its stores U bytes each, also
 * contiguous.  A unit never straddles a 128-element scale tile (tiles start at
 * multiples of 128, units at multiples of U).
 * Not here: the kernels themselves (cast.cu, quantize.cu, dequant.cu).
 */
#ifndef FP8MIX_CUDA_CAST_KERNELS_CUH
#define FP8MIX_CUDA_CAST_KERNELS_CUH

#include <cstring>

#include "encode.cuh"

namespace fp8mix_cuda {

constexpr int kThreads = 256;
constexpr int kVec = 16; /* the vector paths need cols % 16 == 0 and 16-byte aligned rows */

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
    uint64_t seed, offset;   /* stochastic rounding, when rng is NULL */
    const int64_t *rng;      /* device int64 [key, offset] or NULL: the stream read on the device */
    uint64_t rng_skip;       /* words from rng's offset + rng_skip on */
    int hw;                  /* saturating nearest: use the cvt instruction */
};

/* The stochastic-rounding key and first counter of this cast: a tensor-held stream
 * (rng, read on the device, so a CUDA graph replays it with the stream's current
 * state) or the launch's seed / offset. */
__device__ __forceinline__ uint64_t sr_seed(const CastArgs &A)
{
    return A.rng ? (uint64_t)__ldg((const long long *)A.rng) : A.seed;
}
__device__ __forceinline__ uint64_t sr_offset(const CastArgs &A)
{
    return A.rng ? (uint64_t)__ldg((const long long *)A.rng + 1) + A.rng_skip : A.offset;
}

__device__ __forceinline__ int64_t scale_index(const CastArgs &A, int64_t i, int64_t j)
{
    return scale_tile(A.gran, i, j, A.nbc);
}

/* The scale of tile si: given, or derived from the tile's amax (current mode). */
__device__ __forceinline__ float tile_scale(const CastArgs &A, int64_t si)
{
    if (A.amax_src) return compute_scale_one(A.amax_src[si], A.fmax, A.margin, A.pow2, A.eps);
    float s = A.scale[si];
    if (!scale_ok(s) && A.scale_status) *A.scale_status = FP8MIX_ERR_BAD_SCALE;
    return s;
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return f32_bits(v) & 0x7FFFFFFFu; }

/* ---- loads: one element, or one 16-byte unit of U elements ------------------ */
template <int XT> struct In;
template <> struct In<FP8MIX_F32> {
    static constexpr int size = 4, U = 4;
    __device__ static __forceinline__ float one(const uint8_t *row, int64_t j) { return ((const float *)row)[j]; }
    __device__ static __forceinline__ void unit(const uint8_t *row, int64_t j, float (&v)[U])
    {
        float4 f = __ldg((const float4 *)((const float *)row + j));
        v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    }
};
template <int XT> struct In16 {
    static constexpr int size = 2, U = 8;
    __device__ static __forceinline__ float cvt(uint32_t h)
    {
        return XT == FP8MIX_BF16 ? bf16_to_f32((uint16_t)h) : f16_to_f32((uint16_t)h);
    }
    __device__ static __forceinline__ float one(const uint8_t *row, int64_t j)
    {
        return cvt(((const uint16_t *)row)[j]);
    }
    __device__ static __forceinline__ void unit(const uint8_t *row, int64_t j, float (&v)[U])
    {
        uint4 u = __ldg((const uint4 *)((const uint16_t *)row + j));
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int t = 0; t < 4; t++) {
            v[2 * t] = cvt(w[t] & 0xFFFFu);
            v[2 * t + 1] = cvt(w[t] >> 16);
        }
    }
};
template <> struct In<FP8MIX_BF16> : In16<FP8MIX_BF16> {};
template <> struct In<FP8MIX_F16> : In16<FP8MIX_F16> {};

/* ---- encode one unit (elements n0 .. n0+U-1 of the logical tensor) ---------- */
/* Bytes of the unit packed little-endian into U/4 words (element t in byte t). */
template <int U, bool STOCH>
__device__ __forceinline__ void encode_unit(const CastArgs &A, const float (&v)[U], float s, uint64_t n0,
                                            uint32_t (&w)[U / 4])
{
#pragma unroll
    for (int k = 0; k < U / 4; k++) w[k] = 0;
    if constexpr (STOCH) {
        uint32_t r[U];
        random_words<U>(sr_seed(A), sr_offset(A) + n0, r);
#pragma unroll
        for (int t = 0; t < U; t++) w[t >> 2] |= (uint32_t)encode_value(A.p, v[t], s, r[t]) << (8 * (t & 3));
    } else if (A.hw) {
#pragma unroll
        for (int t = 0; t < U; t += 2)
            w[t >> 2] |= (uint32_t)fp8_encode2_hw(A.p, v[t], v[t + 1], s) << (8 * (t & 3));
    } else {
#pragma unroll
        for (int t = 0; t < U; t++) w[t >> 2] |= (uint32_t)encode_value(A.p, v[t], s, 0u) << (8 * (t & 3));
    }
}

/* Store a unit's U bytes at dst (U-byte aligned). */
template <int U>
__device__ __forceinline__ void store_unit(uint8_t *dst, const uint32_t (&w)[U / 4])
{
    if constexpr (U == 4) *(uint32_t *)dst = w[0];
    else *(uint2 *)dst = make_uint2(w[0], w[1]);
}

/* Scalar encode of one element (element number n). */
__device__ __forceinline__ uint8_t encode1(const CastArgs &A, float v, float s, uint64_t n)
{
    uint32_t r = A.p.stochastic ? random_word(sr_seed(A), sr_offset(A) + n) : 0u;
    return encode_value(A.p, v, s, r);
}

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

/* ---- host helpers ---------------------------------------------------------------- */
inline bool valid_dtype(fp8mix_dtype t) { return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16; }
inline bool valid_gran(fp8mix_granularity g) { return g >= FP8MIX_GRAN_TENSOR && g <= FP8MIX_GRAN_BLOCK2D; }
inline size_t dsize(fp8mix_dtype t) { return t == FP8MIX_F32 ? 4 : 2; }
inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
__host__ __device__ inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline bool bad_2d(int64_t rows, int64_t cols, int64_t ld)
{
    return rows < 0 || cols < 0 || ld < cols || (rows > 0 && ld < 1) ||
           (cols > 0 && rows > INT64_MAX / (ld > 0 ? ld : 1));
}

inline int64_t scale_count(fp8mix_granularity g, int64_t rows, int64_t cols)
{
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return 1;
    case FP8MIX_GRAN_ROW: return rows;
    case FP8MIX_GRAN_BLOCK: return rows * cdiv(cols, FP8MIX_BLOCK);
    default: return cdiv(rows, FP8MIX_BLOCK) * cdiv(cols, FP8MIX_BLOCK);
    }
}

/* 16-byte vector path for x: every row start 16-byte aligned and cols whole vectors. */
inline bool vec_ok_x(const void *x, fp8mix_dtype xt, int64_t cols, int64_t ld_x)
{
    return aligned16(x) && cols % kVec == 0 && ((size_t)ld_x * dsize(xt)) % 16 == 0;
}

inline fp8mix_status common_checks(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                   fp8mix_granularity gran)
{
    if (!valid_dtype(xt) || !valid_gran(gran)) return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows > 0 && cols > 0 && !x) return FP8MIX_ERR_NULL_POINTER;
    return FP8MIX_OK;
}

/* The C core's rule: q and qt may both be NULL only for an empty tensor. */
inline fp8mix_status out_checks(int64_t rows, int64_t cols, const uint8_t *q, int64_t ld_q, const uint8_t *qt,
                                int64_t ld_qt)
{
    if (!q && !qt && rows > 0 && cols > 0) return FP8MIX_ERR_NULL_POINTER;
    if (q && bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    if (qt && bad_2d(cols, rows, ld_qt)) return FP8MIX_ERR_BAD_SHAPE;
    return FP8MIX_OK;
}

inline CastArgs make_args(const void *x, int64_t rows, int64_t cols, int64_t ld_x, fp8mix_granularity gran,
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

/* A tensor-held stochastic-rounding stream (device int64 [key, offset], or NULL for
 * the opts' seed / offset): turns stochastic rounding on, as the C core's torch ops do. */
inline void with_rng(CastArgs &A, const int64_t *rng, uint64_t rng_skip)
{
    if (!rng) return;
    A.rng = rng;
    A.rng_skip = rng_skip;
    A.p.stochastic = 1;
    A.hw = 0;
}

/* The argument checks fp8mix_cuda_cast and fp8mix_cuda_quantize_current share
 * (before anything is enqueued); fills *p from opts. */
inline fp8mix_status cast_prologue(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                   fp8mix_granularity gran, const uint8_t *q, int64_t ld_q, const uint8_t *qt,
                                   int64_t ld_qt, const fp8mix_cast_opts *opts, Fp8Params *p)
{
    if (!opts) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status st = common_checks(x, xt, rows, cols, ld_x, gran);
    if (st) return st;
    if ((st = out_checks(rows, cols, q, ld_q, qt, ld_qt))) return st;
    return params_init(p, opts);
}

/* Launch the x -> q (and qt) kernels for A (scales given or current mode); cast.cu. */
fp8mix_status launch_cast(const CastArgs &A, fp8mix_dtype xt, cudaStream_t st);

/* Whole-tensor current scaling (A: TENSOR granularity, margin / pow2 / eps set): the
 * amax pre-pass and the cast, whose last block writes *scale_inv and *amax_out;
 * work: fp8mix_cuda_recipe_work_bytes() bytes; recipe.cu. */
fp8mix_status launch_current_tensor(const CastArgs &A, fp8mix_dtype xt, float *scale_inv, float *amax_out, void *work,
                                    cudaStream_t st);

#define FP8MIX_DISPATCH_XT(MACRO)                                                                                   \
    switch (xt) {                                                                                                   \
    case FP8MIX_F32: MACRO(FP8MIX_F32); break;                                                                      \
    case FP8MIX_BF16: MACRO(FP8MIX_BF16); break;                                                                    \
    default: MACRO(FP8MIX_F16); break;                                                                              \
    }

} // namespace fp8mix_cuda

#endif /* FP8MIX_CUDA_CAST_KERNELS_CUH */
