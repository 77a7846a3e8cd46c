/*
 * fp8_rules.h — the FP8 number rules as integer code, ONE copy for the C core
 * and the CUDA kernels: format parameters, the encoder, float32 to bf16/f16,
 * Philox4x32-10, and the scale from an amax.  Plain C11 that nvcc also compiles as host+device code
 * (FP8R_FN), so the CPU oracle and the GPU kernels cannot drift apart.
 *
 * No fast-math: the only float operations are the ones fp8mix.h defines (one
 * division, one multiplication by a power of two), spelled with the
 * round-to-nearest intrinsics on the device so nvcc never fuses them.
 */
#ifndef FP8MIX_FP8_RULES_H
#define FP8MIX_FP8_RULES_H

#include <stdint.h>
#include <string.h>

#include "fp8mix.h"

#if defined(__CUDACC__)
#define FP8R_FN static inline __host__ __device__
#else
#define FP8R_FN static inline
#endif

/* ---- bit helpers (shift semantics of vpsllvd / vpsrlvd: counts >= 32 give 0) */

FP8R_FN uint32_t f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
FP8R_FN float bits_f32(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
FP8R_FN uint32_t shl32(uint32_t x, uint32_t c) { return c >= 32 ? 0u : x << c; }
FP8R_FN uint32_t shr32(uint32_t x, uint32_t c) { return c >= 32 ? 0u : x >> c; }

/* IEEE float32 multiply and divide, never contracted into an FMA. */
FP8R_FN float fp8r_mul(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b; /* the C core is compiled with -ffp-contract=off */
#endif
}
FP8R_FN float fp8r_div(float a, float b)
{
#if defined(__CUDA_ARCH__)
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* ---- format parameters used by the encoders ----------------------------- */

typedef struct fp8_params {
    int32_t mbits;       /* 3 or 2 */
    int32_t bias;        /* 7 or 15 */
    int32_t emin;        /* 1 - bias: exponent of the smallest normal */
    uint32_t max_code;   /* 0x7E or 0x7B */
    uint32_t ovf_code;   /* code for an overflow (sign added later) */
    uint32_t nan_code;   /* 0x7F or 0x7E */
    int stochastic;
    int saturate;
    int inf_to_nan;      /* an infinite input gives nan_code (see fp8mix_cast_opts) */
    fp8mix_format fmt;
} fp8_params;

/* Fill p from opts; FP8MIX_ERR_BAD_ENUM for unknown values. */
FP8R_FN fp8mix_status fp8_params_init(fp8_params *p, const fp8mix_cast_opts *o)
{
    if (o->rounding != FP8MIX_ROUND_NEAREST && o->rounding != FP8MIX_ROUND_STOCHASTIC)
        return FP8MIX_ERR_BAD_ENUM;
    p->stochastic = o->rounding == FP8MIX_ROUND_STOCHASTIC;
    p->saturate = o->saturate ? 1 : 0;
    p->inf_to_nan = o->inf_to_nan ? 1 : 0;
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

/*
 * The FP8 encoder, on the magnitude bits a = |y| of a float32:
 *   E = a >> 23, M = significand with the implicit bit (E = 0: none, and the
 *   exponent counts as 1).  With e = max(E,1) - 127 the unbiased exponent,
 *   the target spacing is reached by shifting M right by
 *       shift = 23 - mbits + max(emin - e, 0)
 *   The kept integer q is the FP8 significand (implicit bit included for
 *   normals), so code = ((max(e, emin) + bias - 1) << mbits) + q holds for
 *   normals and subnormals alike, and a carry out of q moves to the next
 *   binade by itself.  Codes above max_code are overflows (inf lands there
 *   too: its e is 128).  Every SIMD and CUDA variant runs exactly these
 *   integer steps; `r` is the stochastic-rounding word.
 */
FP8R_FN uint8_t fp8_encode(const fp8_params *p, float y, uint32_t r)
{
    uint32_t bits = f32_bits(y);
    uint32_t sign = (bits >> 24) & 0x80u;
    uint32_t a = bits & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint8_t)(p->nan_code | sign);
    int32_t E = (int32_t)(a >> 23);
    uint32_t M = (a & 0x7FFFFFu) | (E ? 0x800000u : 0u);
    int32_t e = (E ? E : 1) - 127;
    int32_t sub = p->emin - e > 0 ? p->emin - e : 0;
    uint32_t shift = (uint32_t)(23 - p->mbits + sub);
    uint32_t q;
    if (!p->stochastic) {
        if (shift > 25) shift = 25; /* M < 2^24 <= half: rounds to 0 either way */
        q = M >> shift;
        uint32_t rem = M & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        q += (rem > half) | ((rem == half) & (q & 1u));
    } else {
        /* Counts >= 32 give 0, so the two terms cover d <= 32 and d >= 32
         * without a branch (both equal M at d = 32). */
        q = shr32(M, shift);
        uint32_t rem = M & (shl32(1u, shift) - 1u);
        uint32_t t = shl32(rem, 32u - shift) | shr32(M, shift - 32u);
        q += r < t;
    }
    int32_t ee = e > p->emin ? e : p->emin;
    uint32_t code = ((uint32_t)(ee + p->bias - 1) << p->mbits) + q;
    if (code > p->max_code) code = p->ovf_code;
    return (uint8_t)(code | sign);
}

/* ---- float32 to bfloat16 / float16 (round to nearest even, NaN kept quiet) ---- */

FP8R_FN uint16_t fp8r_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* The same significand-shift scheme as the FP8 encoder (mbits 10, bias 15), with IEEE
 * overflow to infinity. */
FP8R_FN uint16_t fp8r_f32_to_f16(float f)
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

/* ---- Philox4x32-10 (Salmon et al., SC'11; Random123 / cuRAND constants) ---- */

FP8R_FN void fp8r_philox(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n1 = (uint32_t)p1;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        uint32_t n3 = (uint32_t)p0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The four words of Philox block `blk` (counter {lo32, hi32, 0, 0}) under seed. */
FP8R_FN void fp8r_philox_block(uint64_t blk, uint64_t seed, uint32_t out[4])
{
    uint32_t ctr[4] = {(uint32_t)blk, (uint32_t)(blk >> 32), 0u, 0u};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    fp8r_philox(ctr, key, out);
}

/* ---- the scale from one amax (fp8mix_compute_scale's rule) ------------------
 * margin in [0, 126] and eps finite >= 0 are the caller's checks. */
#define FP8R_FLT_MAX 3.40282346638528859812e+38f
#define FP8R_FLT_MIN 1.17549435082228750797e-38f

FP8R_FN float fp8r_scale_from_amax(float a, float fmax, int margin, int pow2, float eps)
{
    if (a < eps) a = eps; /* NaN compares false: stays NaN */
    uint32_t ab = f32_bits(a);
    if (!(a > 0.0f) || (ab & 0x7FFFFFFFu) == 0x7F800000u) return 1.0f; /* 0, NaN, inf */
    float step = bits_f32((uint32_t)(127 - margin) << 23);              /* 2^-margin */
    float s = fp8r_mul(fp8r_div(fmax, a), step);                        /* exact unless it underflows */
    if ((f32_bits(s) & 0x7FFFFFFFu) == 0x7F800000u) s = pow2 ? 0x1p127f : FP8R_FLT_MAX;
    else if (s < FP8R_FLT_MIN) s = FP8R_FLT_MIN;
    if (pow2) { /* 2^floor(log2(s)) from the exponent bits */
        uint32_t u = f32_bits(s);
        s = (u & 0x7F800000u) == 0 ? FP8R_FLT_MIN : bits_f32(u & 0x7F800000u);
    }
    return s;
}

/* ---- MX blocks: the shared exponent of one block (fp8mix_mx_exponent) ------
 * e5m2 / floor_rule: 0 or 1; margin in [0, 126] and eps finite >= 0 are the
 * caller's checks.  Integer code on a's bits: no rounded log2 or division. */
FP8R_FN int fp8r_mx_exponent(float a, int e5m2, int floor_rule, int margin, float eps)
{
    if (a < eps) a = eps; /* NaN compares false: stays NaN */
    uint32_t u = f32_bits(a) & 0x7FFFFFFFu;
    if (u >= 0x7F800000u) return 0; /* NaN or inf: scale 1 */
    if (u == 0) return -127;
    int e;          /* floor(log2(a)) */
    uint32_t frac;  /* a's 23 fraction bits after its leading one */
    if (u >= 0x00800000u) {
        e = (int)(u >> 23) - 127;
        frac = u & 0x7FFFFFu;
    } else { /* subnormal: normalise */
        int lead = 31;
        while (!(u >> lead)) lead--;
        e = lead - 149;
        frac = shl32(u, (uint32_t)(23 - lead)) & 0x7FFFFFu;
    }
    int emax = e5m2 ? 15 : 8; /* fmt_max = 1.75 * 2^emax for both formats */
    e -= emax;
    if (!floor_rule && frac > 0x600000u) e += 1; /* mantissa above 1.75: one step up */
    e += margin;
    return e < -127 ? -127 : (e > 127 ? 127 : e);
}

/* 2^e as float32 for e in [-149, 127] (exact; subnormal below -126). */
FP8R_FN float fp8r_exp2i(int e)
{
    return e >= -126 ? bits_f32((uint32_t)(e + 127) << 23) : bits_f32(1u << (e + 149));
}

/* ---- delayed scaling: the rules of one record (fp8mix_delayed_record) ------ */

/* The value a history stores for an amax: a non-finite amax (an overflowing step,
 * which a gradient scaler skips) counts as 0, "no information", so that it cannot
 * freeze the scale for the length of the history.  -0 becomes +0. */
FP8R_FN float fp8r_history_value(float amax)
{
    uint32_t a = f32_bits(amax) & 0x7FFFFFFFu;
    return a >= 0x7F800000u ? 0.0f : bits_f32(a);
}

/* The role's scale after a record.  `steps` counts the records including this
 * one, `first` is the value just recorded, `a` the history's max (or newest
 * entry) after it.  The first record scales from its own amax (a role's first
 * use has no history); after that the scale is recomputed every `interval`
 * records.  An amax of 0 keeps the previous scale. */
FP8R_FN float fp8r_delayed_scale(float old, int64_t steps, float first, float a, int64_t interval, float fmax,
                                 int margin, int pow2)
{
    float s = old;
    if (steps == 1 && first > 0.0f) s = fp8r_scale_from_amax(first, fmax, margin, pow2, 0.0f);
    if (steps % interval == 0 && a > 0.0f) s = fp8r_scale_from_amax(a, fmax, margin, pow2, 0.0f);
    return s;
}

#endif /* FP8MIX_FP8_RULES_H */
