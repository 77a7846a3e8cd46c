/*
 * stats_ref.c — the scalar segment kernel of fp8mix_quant_stats
 * (stats_kernels.h): the scalar ISA's kernel in dispatch.c's choice and the
 * oracle of x86/stats_*.c, which tests/c/test_stats.c compares with it bit
 * for bit.  Not here: the per-segment parameters, the task loop and the
 * reduction (stats.c).
 */
#include <float.h>
#include <math.h>

#include "stats_kernels.h"

/* Written from the header's definitions, on float values; the SIMD variants
 * classify bytes instead and must agree bit for bit. */
void fp8mix_stats_seg_ref(fp8mix_stats_acc *a, const void *x, fp8mix_dtype xt, const uint8_t *q, int64_t n,
                          const fp8mix_stats_seg *s)
{
    const float *tab = s->table;
    for (int64_t t = 0; t < n; t++) {
        float v = load_f32(x, xt, t), ax = fabsf(v);
        float d = tab[q[t]], ad = fabsf(d);
        int lane = (int)(t % FP8MIX_STATS_LANES);
        a->nonzero += v != 0; /* NaN != 0 */
        if (!(ax <= FLT_MAX)) { /* NaN or inf: nothing else counts it (its terms are +0) */
            a->nonfinite++;
            a->nan += v != v;
            continue;
        }
        a->underflow += (v != 0) & (d == 0);
        a->saturated += ad == s->fmax;
        a->subnormal += (ad != 0) & (ad < s->min_normal);
        a->overflow += (double)ax > s->ovf_bound;
        uint32_t ub = f32_bits(ax);
        if (v != 0 && ub < a->min_bits) a->min_bits = ub;
        if (ub > a->max_bits) a->max_bits = ub;
        double xd = (double)v, td = xd - s->pivot, t2 = td * td;
        a->part[STATS_SUM_SIG][lane] += xd * xd;
        a->part[STATS_SUM_T1][lane] += td;
        a->part[STATS_SUM_T2][lane] += t2;
        a->part[STATS_SUM_T3][lane] += t2 * td;
        a->part[STATS_SUM_T4][lane] += t2 * t2;
        if (ad <= FLT_MAX) {
            double e = xd - (double)d * s->sinv;
            a->part[STATS_SUM_E2][lane] += e * e;
        }
        if (v != 0) {
            int ex;
            float fx = frexpf(ax, &ex);
            a->hist[t % FP8MIX_STATS_HIST_COPIES][stats_hist_bin(ex, fx, s)]++;
        }
    }
}
