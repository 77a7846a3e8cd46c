/*
 * encode.cuh — the device side of the FP8 number rules, shared by every .cu file.
 * The encoder, the format parameters, Philox4x32-10 and the scale rule are the
 * C core's own code (csrc/core/fp8_rules.h, compiled here as host+device), so
 * they cannot drift from the CPU oracle; this file adds what only the device
 * needs: the hardware-convert path, the decoder, float16/bfloat16 conversions,
 * vectorised random words, amax bit helpers, and the status / error plumbing of
 * the launchers.
 *
 * Not here: kernels and launchers (cast.cu, scale.cu, gemm_cublaslt.cu).
 * No fast-math: every multiply that the rules define is __fmul_rn (never fused
 * into an FMA), divisions are __fdiv_rn / __frcp_rn, denormals are kept.
 */
#ifndef FP8MIX_CUDA_ENCODE_CUH
#define FP8MIX_CUDA_ENCODE_CUH

#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fp8mix.h"
#include "fp8mix_cuda.h"
#include "../core/fp8_rules.h"

#if defined(__USE_FAST_MATH__)
#error "fp8mix CUDA sources must not be compiled with -use_fast_math (it breaks NaN and rounding rules)"
#endif

namespace fp8mix_cuda {

/* ---- format parameters: the C core's fp8_params and fp8_params_init -------- */
typedef ::fp8_params Fp8Params;

inline fp8mix_status params_init(Fp8Params *p, const fp8mix_cast_opts *o) { return ::fp8_params_init(p, o); }

__host__ __device__ inline float format_max(fp8mix_format f) { return f == FP8MIX_E4M3 ? 448.0f : 57344.0f; }


/* ---- the encoder: the C core's fp8_encode itself ---------------------------- */

/* y = fp32(v * s) exactly as the C core gets it on x86, where mulps returns a NaN
 * operand unchanged (quieted, sign and payload kept).  GPU FMUL instead returns the
 * canonical NaN 0x7FFFFFFF, which would drop the sign that the FP8 NaN code and the
 * dequantised NaN carry, so a NaN v is passed through.  Scales are required to be
 * finite and > 0, so only v can be NaN. */
__device__ __forceinline__ float scale_value(float v, float s)
{
    return (f32_bits(v) & 0x7FFFFFFFu) > 0x7F800000u ? v : __fmul_rn(v, s);
}

/* The byte for an input v whose encoding of y = scale_value(v, s) gave `code`: an
 * infinite v becomes the format's NaN with v's sign when p.inf_to_nan is set (the
 * C core's rule, see fp8mix_cast_opts), every other value keeps `code`. */
__device__ __forceinline__ uint8_t inf_fixup(const Fp8Params &p, float v, uint8_t code)
{
    const uint32_t b = f32_bits(v);
    if (p.inf_to_nan && (b & 0x7FFFFFFFu) == 0x7F800000u) return (uint8_t)(p.nan_code | ((b >> 24) & 0x80u));
    return code;
}

/* The whole rule for one input value: scale, encode, inf_to_nan. */
__device__ __forceinline__ uint8_t encode_value(const Fp8Params &p, float v, float s, uint32_t r)
{
    return inf_fixup(p, v, ::fp8_encode(&p, scale_value(v, s), r));
}

/* Saturating round-to-nearest of two inputs v0, v1 (scaled by s) with the sm_89+
 * cvt instruction (cvt.rn.satfinite.{e4m3,e5m2}x2.f32), then the non-finite inputs
 * fixed up from v itself (not from the product, whose NaN the GPU canonicalises):
 * NaN -> the sign-preserving NaN code, inf -> NaN when inf_to_nan.  Equal to
 * encode_value for saturate=1, NEAREST: satfinite maps +-inf and every finite |y|
 * that rounds above max to +-max, exactly like the rule (any y > max rounds to
 * >= max); subnormals are kept and ties go to even.  Used only when the launcher's
 * hardware-convert switch is on (tests compare both paths with the CPU). */
__device__ __forceinline__ uint16_t fp8_encode2_hw(const Fp8Params &p, float v0, float v1, float s)
{
    __nv_fp8_interpretation_t it = p.fmt == FP8MIX_E4M3 ? __NV_E4M3 : __NV_E5M2;
    const float y0 = __fmul_rn(v0, s), y1 = __fmul_rn(v1, s);
    uint16_t v = (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE, it);
    const uint32_t a0 = f32_bits(v0) & 0x7FFFFFFFu, a1 = f32_bits(v1) & 0x7FFFFFFFu;
    const uint32_t lim = p.inf_to_nan ? 0x7F800000u : 0x7F800001u; /* a >= lim: the byte becomes NaN */
    if (a0 >= lim) v = (uint16_t)((v & 0xFF00u) | p.nan_code | ((f32_bits(v0) >> 24) & 0x80u));
    if (a1 >= lim) v = (uint16_t)((v & 0x00FFu) | ((p.nan_code | ((f32_bits(v1) >> 24) & 0x80u)) << 8));
    return v;
}

/* ---- decode (fp8mix_decode_ref, exact) -------------------------------------- */
__device__ __forceinline__ float fp8_decode(uint8_t q, fp8mix_format fmt)
{
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    if (fmt == FP8MIX_E4M3) {
        uint32_t eb = (q >> 3) & 0xFu, m = q & 7u;
        if ((q & 0x7Fu) == 0x7Fu) return bits_f32(sign | 0x7FC00000u);
        if (eb == 0) return bits_f32(sign | f32_bits(__fmul_rn((float)m, 0x1p-9f)));
        return bits_f32(sign | ((eb - 7u + 127u) << 23) | (m << 20));
    }
    uint32_t eb = (q >> 2) & 0x1Fu, m = q & 3u;
    if (eb == 0x1Fu) return bits_f32(sign | (m ? 0x7FC00000u : 0x7F800000u));
    if (eb == 0) return bits_f32(sign | f32_bits(__fmul_rn((float)m, 0x1p-16f)));
    return bits_f32(sign | ((eb - 15u + 127u) << 23) | (m << 21));
}

/* ---- float16 / bfloat16 (the C core's _ref conversions, bit for bit) ------- */
__device__ __forceinline__ float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

__device__ __forceinline__ float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return bits_f32(sign | 0x7F800000u | (m << 13));
    if (e == 0) return bits_f32(sign | f32_bits(__fmul_rn((float)m, 0x1p-24f))); /* exact */
    return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

__device__ __forceinline__ uint16_t f32_to_bf16(float f) { return fp8r_f32_to_bf16(f); }
__device__ __forceinline__ uint16_t f32_to_f16(float f) { return fp8r_f32_to_f16(f); }

/* Store float32 v as element i of a row of type t (rounded as the C core does). */
__device__ __forceinline__ void store_hp(void *row, fp8mix_dtype t, int64_t i, float v)
{
    if (t == FP8MIX_F32) ((float *)row)[i] = v;
    else if (t == FP8MIX_BF16) ((uint16_t *)row)[i] = f32_to_bf16(v);
    else ((uint16_t *)row)[i] = f32_to_f16(v);
}

__device__ __forceinline__ float load_hp(const void *row, fp8mix_dtype t, int64_t i)
{
    if (t == FP8MIX_F32) return ((const float *)row)[i];
    if (t == FP8MIX_BF16) return bf16_to_f32(((const uint16_t *)row)[i]);
    return f16_to_f32(((const uint16_t *)row)[i]);
}

/* ---- Philox4x32-10 and the random-word layout of fp8mix.h ------------------ */
__device__ __forceinline__ uint4 philox4x32_10(uint64_t blk, uint64_t seed)
{
    uint32_t o[4];
    fp8r_philox_block(blk, seed, o);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* fp8mix_random_word(seed, offset, n) with c = offset + n already formed. */
__device__ __forceinline__ uint32_t random_word(uint64_t seed, uint64_t c)
{
    uint4 o = philox4x32_10(c >> 2, seed);
    uint32_t w = (uint32_t)(c & 3u);
    return w == 0 ? o.x : w == 1 ? o.y : w == 2 ? o.z : o.w;
}

/* Words for counters c0 .. c0+N-1 into r[] (N a compile-time constant, so r
 * stays in registers): at most N/4 + 1 Philox calls. */
template <int N>
__device__ __forceinline__ void random_words(uint64_t seed, uint64_t c0, uint32_t (&r)[N])
{
    uint4 o = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int t = 0; t < N; t++) {
        uint64_t c = c0 + (uint64_t)t;
        if (t == 0 || (c & 3u) == 0) o = philox4x32_10(c >> 2, seed);
        uint32_t w = (uint32_t)(c & 3u);
        r[t] = w == 0 ? o.x : w == 1 ? o.y : w == 2 ? o.z : o.w;
    }
}

/* ---- amax and scales -------------------------------------------------------- */
/* Index of element (i, j)'s scale in gran's dense scale array (nbc = ceil(cols/128)). */
__host__ __device__ __forceinline__ int64_t scale_tile(fp8mix_granularity gran, int64_t i, int64_t j, int64_t nbc)
{
    switch (gran) {
    case FP8MIX_GRAN_TENSOR: return 0;
    case FP8MIX_GRAN_ROW: return i;
    case FP8MIX_GRAN_BLOCK: return i * nbc + j / FP8MIX_BLOCK;
    default: return (i / FP8MIX_BLOCK) * nbc + j / FP8MIX_BLOCK;
    }
}

/* Max |x| bits of a block's share, canonicalised before the atomic so that any
 * NaN anywhere gives exactly 0x7FC00000 (greater than +inf and every finite). */
__device__ __forceinline__ uint32_t canon_amax_bits(uint32_t b) { return b > 0x7F800000u ? 0x7FC00000u : b; }

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) { return __reduce_max_sync(0xFFFFFFFFu, v); }

/* Scale validity, as fp8mix_scales_bad: finite and > 0. */
__device__ __forceinline__ bool scale_ok(float s)
{
    uint32_t a = f32_bits(s);
    return !((a >> 31) || a == 0 || (a & 0x7F800000u) == 0x7F800000u);
}

/* fp8mix_compute_scale for one value (margin in [0,126], eps >= 0 finite, both
 * checked by the host): the C core's rule. */
__device__ __forceinline__ float compute_scale_one(float a, float fmax, int margin, int pow2, float eps)
{
    return fp8r_scale_from_amax(a, fmax, margin, pow2, eps);
}

__device__ __forceinline__ float amax_from_bits(uint32_t b) { return bits_f32(canon_amax_bits(b)); }

/* ---- host-side error plumbing ----------------------------------------------- */
/* Records a detail message for fp8mix_cuda_last_error (thread-local). */
void set_error(const char *fmt, ...);
/* Maps a CUDA runtime error to a status (and records the message); OK for cudaSuccess. */
fp8mix_status cuda_status(cudaError_t e, const char *where);
/* Launch check: cudaGetLastError after a launch.  The error it returns can be left
 * by any earlier asynchronous launch on this thread (a torch kernel too), so the
 * message says so. */
fp8mix_status check_launch(const char *where);
/* Every entry point starts with this: empties this thread's last-error message, so
 * that a message is never a stale one (callers need not clear it). */
inline void begin_call() { fp8mix_cuda_clear_error(); }

/* Blocks for a grid-stride loop over `work` items of `per_block` each. */
inline unsigned grid_for(int64_t work, int64_t per_block, unsigned cap = 65535u * 8u)
{
    int64_t g = (work + per_block - 1) / per_block;
    if (g < 1) g = 1;
    if (g > (int64_t)cap) g = cap;
    return (unsigned)g;
}

} // namespace fp8mix_cuda

#endif /* FP8MIX_CUDA_ENCODE_CUH */
