/*
 * stats_rules.cuh — fp8mix_quant_stats' definitions as host+device code: the
 * parameters of a scale_inv segment, one element's contribution to a lane's running
 * sums (csrc/core/stats_ref.c, fp8mix_stats_seg_ref, step for step), the histogram
 * bin from exact exponent bits, and the fixed tree that reduces a task's 16 lane
 * partials.  stats.cu's kernels run them on the device; the host test
 * (csrc/cuda/tests/host_rules.cu) runs them serially on the CPU in the documented
 * order and checks the result against the C core bit for bit.
 * Every float64 operation is an explicit round-to-nearest step (no FMA contraction).
 * Not here: the decode of FP8 bytes (the caller passes decoded values), kernels.
 */
#ifndef FP8MIX_CUDA_STATS_RULES_CUH
#define FP8MIX_CUDA_STATS_RULES_CUH

#include "../core/fp8_rules.h"
#include "recipe_plan.h"

#if defined(__CUDACC__)
#define FP8S_FN __host__ __device__ __forceinline__
#else
#define FP8S_FN inline
#endif

namespace fp8mix_cuda {

FP8S_FN double d_add(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}
FP8S_FN double d_sub(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}
FP8S_FN double d_mul(double a, double b)
{
#if defined(__CUDA_ARCH__)
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}

/* frexpf of a finite a > 0 from its bits: a = f * 2^e, f in [0.5, 1). */
FP8S_FN float stats_frexp(float a, int *e)
{
    uint32_t u = f32_bits(a);
    uint32_t E = u >> 23, m = u & 0x7FFFFFu;
    if (E == 0) { /* subnormal: shift the significand up to the implicit bit */
        int s = 0;
        while (!(m & 0x800000u)) {
            m <<= 1;
            s++;
        }
        *e = -125 - s;
        return bits_f32((126u << 23) | (m & 0x7FFFFFu));
    }
    *e = (int)E - 126;
    return bits_f32((126u << 23) | m);
}

/* What one element needs of its segment's scale_inv (stats.c seg_init). */
struct StatsSeg {
    float fmax, min_normal;
    double sinv, pivot, ovf_bound;
    int sinv_exp;
    float sinv_frac;
};

FP8S_FN void stats_seg(StatsSeg &s, fp8mix_format fmt, float si, float pivot)
{
    const bool e4 = fmt == FP8MIX_E4M3;
    s.fmax = e4 ? 448.0f : 57344.0f;
    s.min_normal = e4 ? 0x1p-6f : 0x1p-14f;
    s.sinv = (double)si;
    s.pivot = (double)pivot;
    s.ovf_bound = d_mul(e4 ? 464.0 : 59392.0, (double)si); /* exact: 24 + 5 significant bits */
    s.sinv_exp = 0; /* a scale_inv that is not finite and > 0 measures garbage (the caller flags it) */
    s.sinv_frac = (si > 0.0f && si <= 3.40282346638528859812e+38f) ? stats_frexp(si, &s.sinv_exp) : 0.0f;
}

/* One lane's running statistics (a lane of one task). */
struct StatsLane {
    unsigned long long count[kStatsCounts]; /* nonzero, nan, nonfinite, underflow, saturated, overflow, subnormal */
    uint32_t min_bits, max_bits;
    double sum[kStatsSums];                 /* x^2, e^2, t, t^2, t^3, t^4 */
};

FP8S_FN void stats_lane_init(StatsLane &a)
{
    for (int k = 0; k < kStatsCounts; k++) a.count[k] = 0;
    for (int k = 0; k < kStatsSums; k++) a.sum[k] = 0.0;
    a.min_bits = 0x7F800000u;
    a.max_bits = 0u;
}

/* Histogram bin of finite non-zero |x| = ax under s (stats_kernels.h stats_hist_bin). */
FP8S_FN int stats_bin(float ax, const StatsSeg &s)
{
    int ex;
    const float fx = stats_frexp(ax, &ex);
    const int e = ex - s.sinv_exp - (fx < s.sinv_frac ? 1 : 0) - FP8MIX_STATS_HIST_MIN_LOG2;
    return e < 0 ? 0 : e >= FP8MIX_STATS_HIST_BINS ? FP8MIX_STATS_HIST_BINS - 1 : e;
}

/* Element v (its FP8 value d) into lane a: fp8mix_stats_seg_ref's step.  Returns
 * the histogram bin it counts in, or -1. */
FP8S_FN int stats_elem(StatsLane &a, float v, float d, const StatsSeg &s)
{
    const float ax = bits_f32(f32_bits(v) & 0x7FFFFFFFu), ad = bits_f32(f32_bits(d) & 0x7FFFFFFFu);
    a.count[0] += v != 0.0f; /* NaN != 0 */
    if (!(ax <= 3.40282346638528859812e+38f)) { /* NaN or inf: nothing else counts it */
        a.count[2]++;
        a.count[1] += v != v;
        return -1;
    }
    a.count[3] += (v != 0.0f) & (d == 0.0f);
    a.count[4] += ad == s.fmax;
    a.count[6] += (ad != 0.0f) & (ad < s.min_normal);
    a.count[5] += (double)ax > s.ovf_bound;
    const uint32_t ub = f32_bits(ax);
    if (v != 0.0f && ub < a.min_bits) a.min_bits = ub;
    if (ub > a.max_bits) a.max_bits = ub;
    const double xd = (double)v, td = d_sub(xd, s.pivot), t2 = d_mul(td, td);
    a.sum[0] = d_add(a.sum[0], d_mul(xd, xd));
    a.sum[2] = d_add(a.sum[2], td);
    a.sum[3] = d_add(a.sum[3], t2);
    a.sum[4] = d_add(a.sum[4], d_mul(t2, td));
    a.sum[5] = d_add(a.sum[5], d_mul(t2, t2));
    if (ad <= 3.40282346638528859812e+38f) {
        const double e = d_sub(xd, d_mul((double)d, s.sinv));
        a.sum[1] = d_add(a.sum[1], d_mul(e, e));
    }
    return v != 0.0f ? stats_bin(ax, s) : -1;
}

/* A task's sum from its 16 lane partials p[0], p[stride], ...: fp8mix.h's tree
 * ((r0 + r1) with r[k] = t[k] + t[k+2], t[k] = u[k] + u[k+4], u[k] = p[k] + p[k+8]). */
FP8S_FN double stats_tree(const double *p, int stride)
{
    double u[8], t[4];
    for (int k = 0; k < 8; k++) u[k] = d_add(p[k * stride], p[(k + 8) * stride]);
    for (int k = 0; k < 4; k++) t[k] = d_add(u[k], u[k + 4]);
    return d_add(d_add(t[0], t[2]), d_add(t[1], t[3]));
}

/* fp8mix_quant_stats' output entry of sum k (StatsLane::sum order). */
FP8S_FN int stats_sum_entry(int k)
{
    const int e[kStatsSums] = {FP8MIX_STATS_SIGNAL, FP8MIX_STATS_NOISE, FP8MIX_STATS_SUM1,
                               FP8MIX_STATS_SUM2,   FP8MIX_STATS_SUM3,  FP8MIX_STATS_SUM4};
    return e[k];
}
/* ... and of count k (StatsLane::count order). */
FP8S_FN int stats_count_entry(int k)
{
    const int e[kStatsCounts] = {FP8MIX_STATS_NONZERO,   FP8MIX_STATS_NAN,       FP8MIX_STATS_NONFINITE,
                                 FP8MIX_STATS_UNDERFLOW, FP8MIX_STATS_SATURATED, FP8MIX_STATS_OVERFLOW,
                                 FP8MIX_STATS_SUBNORMAL};
    return e[k];
}

} // namespace fp8mix_cuda

#endif /* FP8MIX_CUDA_STATS_RULES_CUH */
