/*
 * encode.cuh — the device side of the FP8 number rules, shared by every .cu file:
 * the encoder (a port of fp8_encode in csrc/core/internal.h, integer step for
 * integer step), the decoder, float16/bfloat16 conversions, Philox4x32-10 and
 * the random-word layout, amax bit helpers, compute_scale for one value, and the
 * status / error plumbing of the launchers.  Everything here must give the same
 * bits as the C core (csrc/core/format.c, scale.c); the CPU code is the oracle.
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

#if defined(__USE_FAST_MATH__)
#error "fp8mix CUDA sources must not be compiled with -use_fast_math (it breaks NaN and rounding rules)"
#endif

namespace fp8mix_cuda {

/* ---- format parameters (the fields of the C core's fp8_params) ------------- */
struct Fp8Params {
    int32_t mbits, bias, emin;
    uint32_t max_code, ovf_code, nan_code;
    int stochastic, saturate;
    fp8mix_format fmt;
};

/* Host: fill p from opts; BAD_ENUM for unknown values (as fp8_params_init). */
inline fp8mix_status params_init(Fp8Params *p, const fp8mix_cast_opts *o)
{
    if (o->rounding != FP8MIX_ROUND_NEAREST && o->rounding != FP8MIX_ROUND_STOCHASTIC) return FP8MIX_ERR_BAD_ENUM;
    p->stochastic = o->rounding == FP8MIX_ROUND_STOCHASTIC;
    p->saturate = o->saturate ? 1 : 0;
    p->fmt = o->fmt;
    switch (o->fmt) {
    case FP8MIX_E4M3:
        p->mbits = 3; p->bias = 7; p->max_code = 0x7E; p->nan_code = 0x7F;
        p->ovf_code = o->saturate ? 0x7E : 0x7F;
        break;
    case FP8MIX_E5M2:
        p->mbits = 2; p->bias = 15; p->max_code = 0x7B; p->nan_code = 0x7E;
        p->ovf_code = o->saturate ? 0x7B : 0x7C;
        break;
    default:
        return FP8MIX_ERR_BAD_ENUM;
    }
    p->emin = 1 - p->bias;
    return FP8MIX_OK;
}

__host__ __device__ inline float format_max(fp8mix_format f) { return f == FP8MIX_E4M3 ? 448.0f : 57344.0f; }

/* ---- bit helpers (shift semantics of the C core: counts >= 32 give 0) ------ */
__device__ __forceinline__ uint32_t f32_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float bits_f32(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t shl32(uint32_t x, uint32_t c) { return c >= 32 ? 0u : x << c; }
__device__ __forceinline__ uint32_t shr32(uint32_t x, uint32_t c) { return c >= 32 ? 0u : x >> c; }

/* ---- the encoder: fp8_encode of internal.h, the same integer steps --------- */
__device__ __forceinline__ uint8_t fp8_encode(const Fp8Params &p, float y, uint32_t r)
{
    uint32_t bits = f32_bits(y);
    uint32_t sign = (bits >> 24) & 0x80u;
    uint32_t a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(p.nan_code | sign);
    int32_t E = (int32_t)(a >> 23);
    uint32_t M = (a & 0x7FFFFFu) | (E ? 0x800000u : 0u);
    int32_t e = (E ? E : 1) - 127;
    int32_t sub = p.emin - e > 0 ? p.emin - e : 0;
    uint32_t shift = (uint32_t)(23 - p.mbits + sub);
    uint32_t q;
    if (!p.stochastic) {
        if (shift > 25) shift = 25; /* M < 2^24 <= half: rounds to 0 either way */
        q = M >> shift;
        uint32_t rem = M & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        q += (rem > half) | ((rem == half) & (q & 1u));
    } else {
        q = shr32(M, shift);
        uint32_t rem = M & (shl32(1u, shift) - 1u);
        uint32_t t = shl32(rem, 32u - shift) | shr32(M, shift - 32u);
        q += r < t;
    }
    int32_t ee = e > p.emin ? e : p.emin;
    uint32_t code = ((uint32_t)(ee + p.bias - 1) << p.mbits) + q;
    if (code > p.max_code) code = p.ovf_code;
    return (uint8_t)(code | sign);
}

/* Saturating round-to-nearest of two values with the sm_89+ cvt instruction
 * (cvt.rn.satfinite.{e4m3,e5m2}x2.f32), then NaN fixed up to the sign-preserving
 * code of the rules.  Equal to fp8_encode for saturate=1, NEAREST: satfinite maps
 * +-inf and every finite |y| that rounds above max to +-max, exactly like the
 * rule (any y > max rounds to >= max); subnormals are kept and ties go to even.
 * Used only when the launcher's hardware-convert switch is on (tests compare both
 * paths with the CPU). */
__device__ __forceinline__ uint16_t fp8_encode2_hw(const Fp8Params &p, float y0, float y1)
{
    __nv_fp8_interpretation_t it = p.fmt == FP8MIX_E4M3 ? __NV_E4M3 : __NV_E5M2;
    uint16_t v = (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(y0, y1), __NV_SATFINITE, it);
    uint32_t b0 = f32_bits(y0), b1 = f32_bits(y1);
    if ((b0 & 0x7FFFFFFFu) > 0x7F800000u) v = (uint16_t)((v & 0xFF00u) | p.nan_code | ((b0 >> 24) & 0x80u));
    if ((b1 & 0x7FFFFFFFu) > 0x7F800000u) v = (uint16_t)((v & 0x00FFu) | ((p.nan_code | ((b1 >> 24) & 0x80u)) << 8));
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

__device__ __forceinline__ uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

__device__ __forceinline__ uint16_t f32_to_f16(float f)
{
    uint32_t bits = f32_bits(f);
    uint32_t sign = (bits >> 16) & 0x8000u;
    uint32_t a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    int32_t E = (int32_t)(a >> 23);
    uint32_t M = (a & 0x7FFFFFu) | (E ? 0x800000u : 0u);
    int32_t e = (E ? E : 1) - 127;
    int32_t sub = -14 - e > 0 ? -14 - e : 0;
    uint32_t shift = (uint32_t)(13 + sub);
    if (shift > 25) shift = 25;
    uint32_t q = M >> shift;
    uint32_t rem = M & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    q += (rem > half) | ((rem == half) & (q & 1u));
    int32_t ee = e > -14 ? e : -14;
    uint32_t code = ((uint32_t)(ee + 14) << 10) + q;
    if (code >= 0x7C00u) code = 0x7C00u;
    return (uint16_t)(code | sign);
}

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
    uint32_t c0 = (uint32_t)blk, c1 = (uint32_t)(blk >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int round = 0; round < 10; round++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return make_uint4(c0, c1, c2, c3);
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
 * checked by the host). */
__device__ __forceinline__ float compute_scale_one(float a, float fmax, int margin, int pow2, float eps)
{
    if (a < eps) a = eps; /* NaN compares false: stays NaN */
    uint32_t ab = f32_bits(a);
    if (!(a > 0.0f) || (ab & 0x7FFFFFFFu) == 0x7F800000u) return 1.0f;
    float step = bits_f32((uint32_t)(127 - margin) << 23); /* 2^-margin, a normal */
    float s = __fdiv_rn(fmax, a);
    s = __fmul_rn(s, step);
    if ((f32_bits(s) & 0x7FFFFFFFu) == 0x7F800000u) s = pow2 ? 0x1p127f : 3.40282346638528859812e+38f;
    else if (s < 1.17549435082228750797e-38f) s = 1.17549435082228750797e-38f;
    if (pow2) {
        uint32_t u = f32_bits(s);
        s = (u & 0x7F800000u) == 0 ? 1.17549435082228750797e-38f : bits_f32(u & 0x7F800000u);
    }
    return s;
}

__device__ __forceinline__ float amax_from_bits(uint32_t b) { return bits_f32(canon_amax_bits(b)); }

/* ---- host-side error plumbing ----------------------------------------------- */
/* Records a detail message for fp8mix_cuda_last_error (thread-local). */
void set_error(const char *fmt, ...);
/* Maps a CUDA runtime error to a status (and records the message); OK for cudaSuccess. */
fp8mix_status cuda_status(cudaError_t e, const char *where);
/* Launch check: cudaGetLastError after a launch. */
inline fp8mix_status check_launch(const char *where) { return cuda_status(cudaGetLastError(), where); }

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
