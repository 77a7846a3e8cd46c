/*
 * scale.c — scales from amax (the delayed / current rule and the MX block
 * rule), scale counts per granularity, and checks of caller-given scales.
 * A leaf: the arithmetic itself is fp8_rules.h's (shared with CUDA); every
 * cast and GEMM file may call here, nothing here calls them.
 */
#include <float.h>
#include <math.h>

#include "internal.h"

int64_t fp8mix_scale_count(fp8mix_granularity gran, int64_t rows, int64_t cols)
{
    switch (gran) {
    case FP8MIX_GRAN_TENSOR: return 1;
    case FP8MIX_GRAN_ROW: return rows;
    case FP8MIX_GRAN_BLOCK: return rows * ceil_div(cols, FP8MIX_BLOCK);
    case FP8MIX_GRAN_BLOCK2D: return ceil_div(rows, FP8MIX_BLOCK) * ceil_div(cols, FP8MIX_BLOCK);
    case FP8MIX_GRAN_MX: return rows * ceil_div(cols, FP8MIX_MX_BLOCK);
    }
    return -1;
}

int fp8mix_scales_bad(const float *s, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t a = f32_bits(s[i]);
        /* not (finite and > 0): sign set, zero, or exponent all ones */
        if ((a >> 31) || a == 0 || (a & 0x7F800000u) == 0x7F800000u) return 1;
    }
    return 0;
}

fp8mix_status fp8mix_compute_scale(const float *amax, int64_t n, fp8mix_format fmt,
                                   int margin, int pow2, float amax_epsilon,
                                   float *scale, float *scale_inv)
{
    if (n < 0) return FP8MIX_ERR_BAD_SHAPE;
    if (n > 0 && !amax) return FP8MIX_ERR_NULL_POINTER;
    float fmax = fp8mix_format_max(fmt);
    if (fmax == 0.0f) return FP8MIX_ERR_BAD_ENUM;
    if (margin < 0 || margin > 126 || !(amax_epsilon >= 0.0f) || isinf(amax_epsilon))
        return FP8MIX_ERR_BAD_ARG;
    for (int64_t i = 0; i < n; i++) {
        float s = fp8r_scale_from_amax(amax[i], fmax, margin, pow2, amax_epsilon);
        if (scale) scale[i] = s;
        if (scale_inv) scale_inv[i] = 1.0f / s;
    }
    return FP8MIX_OK;
}

int fp8mix_mx_exponent(float amax, fp8mix_format fmt, fp8mix_mx_rule rule, int margin, float amax_epsilon)
{
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || (rule != FP8MIX_MX_RCEIL && rule != FP8MIX_MX_FLOOR))
        return 0;
    return fp8r_mx_exponent(amax, fmt == FP8MIX_E5M2, rule == FP8MIX_MX_FLOOR, margin, amax_epsilon);
}

/* The MX scale of one block (OCP MX v1.0) from its amax bits as the casts fold
 * them (max |x| bits; any NaN pattern is NaN): scale 2^-e, scale_inv 2^e. */
void fp8mix_mx_block_scale(uint32_t amax_bits, fp8mix_format fmt, fp8mix_mx_rule rule, int margin, float eps,
                           float *scale, float *scale_inv)
{
    float a = amax_bits > 0x7F800000u ? bits_f32(0x7FC00000u) : bits_f32(amax_bits);
    int e = fp8r_mx_exponent(a, fmt == FP8MIX_E5M2, rule == FP8MIX_MX_FLOOR, margin, eps);
    *scale = fp8r_exp2i(-e);
    *scale_inv = fp8r_exp2i(e);
}
