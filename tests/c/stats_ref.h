/*
 * stats_ref.h — an independent reference of fp8mix_quant_stats, written from
 * fp8mix.h's words in float64 with its own FP8 / float16 / bfloat16 decoders
 * and the header's summation order spelled out, so that every entry of the
 * output (the float64 sums included) can be compared bit for bit.  Shared by
 * tests/c/test_stats.c and tests/fuzz/fuzz_stats.c; nothing from the core.
 */
#ifndef FP8MIX_STATS_REF_H
#define FP8MIX_STATS_REF_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fp8mix.h"

static inline double sref_fp8_value(uint8_t b, int fmt)
{
    double sgn = (b & 0x80) ? -1.0 : 1.0;
    int e, m;
    if (fmt == FP8MIX_E4M3) {
        e = (b >> 3) & 15, m = b & 7;
        if (e == 15 && m == 7) return NAN;
        return sgn * (e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10));
    }
    e = (b >> 2) & 31, m = b & 3;
    if (e == 31) return m == 0 ? sgn * INFINITY : NAN;
    return sgn * (e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17));
}

static inline double sref_hp_value(const void *row, int xt, int64_t j)
{
    if (xt == FP8MIX_F32) return ((const float *)row)[j];
    uint16_t h = ((const uint16_t *)row)[j];
    if (xt == FP8MIX_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    double sgn = (h & 0x8000) ? -1.0 : 1.0;
    int e = (h >> 10) & 31, m = h & 1023;
    if (e == 31) return m ? NAN : sgn * INFINITY;
    return sgn * (e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25));
}

static inline int64_t sref_scale_index(int gran, int64_t i, int64_t j, int64_t cols)
{
    int64_t cb = (cols + 127) / 128;
    return gran == 0 ? 0 : gran == 1 ? i : gran == 2 ? i * cb + j / 128 : (i / 128) * cb + j / 128;
}

/* The header's summation order, literally. */
typedef struct sref_order {
    double p[6][16]; /* x^2, e^2, t, t^2, t^3, t^4 */
    double total[6];
} sref_order;

static inline double sref_tree16(const double p[16])
{
    double u[8], t[4], r[2];
    for (int k = 0; k < 8; k++) u[k] = p[k] + p[k + 8];
    for (int k = 0; k < 4; k++) t[k] = u[k] + u[k + 4];
    for (int k = 0; k < 2; k++) r[k] = t[k] + t[k + 2];
    return r[0] + r[1];
}

/* The whole output of fp8mix_quant_stats for a valid call (bad_as_one: the
 * bad_scale_as_one option). */
static inline void sref_stats(const void *x, int xt, int64_t rows, int64_t cols, int64_t ld_x, const uint8_t *q,
                              int64_t ld_q, int fmt, int gran, const float *sinv, int bad_as_one, double *o)
{
    double fmax = fmt == 0 ? 448 : 57344, bound = fmt == 0 ? 464 : 59392, minn = fmt == 0 ? 0x1p-6 : 0x1p-14;
    size_t es = xt == FP8MIX_F32 ? 4 : 2;
    for (int k = 0; k < FP8MIX_STATS_N; k++) o[k] = 0;
    o[FP8MIX_STATS_MIN_NONZERO] = INFINITY;
    double c = 0; /* the pivot: the first finite x */
    for (int64_t i = 0, found = 0; i < rows && !found; i++)
        for (int64_t j = 0; j < cols && !found; j++) {
            double v = sref_hp_value((const uint8_t *)x + (size_t)(i * ld_x) * es, xt, j);
            if (isfinite(v)) c = v, found = 1;
        }
    int64_t per = 64 * ((((rows + 63) / 64) + 4095) / 4096);
    sref_order ord;
    memset(&ord, 0, sizeof ord);
    for (int64_t i = 0; i < rows; i++) {
        if (i % per == 0) memset(ord.p, 0, sizeof ord.p);
        for (int64_t j = 0; j < cols; j++) {
            double v = sref_hp_value((const uint8_t *)x + (size_t)(i * ld_x) * es, xt, j);
            double d = sref_fp8_value(q[i * ld_q + j], fmt);
            double s = sinv[sref_scale_index(gran, i, j, cols)];
            if (bad_as_one && !(s > 0 && s <= FLT_MAX)) s = 1;
            o[FP8MIX_STATS_NUMEL]++;
            o[FP8MIX_STATS_NONZERO] += v != 0;
            if (!isfinite(v)) {
                o[FP8MIX_STATS_NONFINITE]++;
                o[FP8MIX_STATS_NAN] += isnan(v);
                continue;
            }
            double a = fabs(v);
            o[FP8MIX_STATS_UNDERFLOW] += v != 0 && d == 0;
            o[FP8MIX_STATS_SATURATED] += fabs(d) == fmax;
            o[FP8MIX_STATS_SUBNORMAL] += d != 0 && fabs(d) < minn;
            o[FP8MIX_STATS_OVERFLOW] += a > bound * s;
            if (v != 0 && a < o[FP8MIX_STATS_MIN_NONZERO]) o[FP8MIX_STATS_MIN_NONZERO] = a;
            if (a > o[FP8MIX_STATS_MAX_FINITE]) o[FP8MIX_STATS_MAX_FINITE] = a;
            int l = (int)(j % 16);
            double t = v - c;
            ord.p[0][l] += v * v;
            if (isfinite(d)) {
                double e = v - d * s;
                ord.p[1][l] += e * e;
            }
            ord.p[2][l] += t;
            ord.p[3][l] += t * t;
            ord.p[4][l] += (t * t) * t;
            ord.p[5][l] += (t * t) * (t * t);
            if (v != 0) { /* floor(log2(|x| / s)): the float64 quotient never crosses a power of 2 */
                int b = (int)floor(log2(a / s)) - FP8MIX_STATS_HIST_MIN_LOG2;
                b = b < 0 ? 0 : b > FP8MIX_STATS_HIST_BINS - 1 ? FP8MIX_STATS_HIST_BINS - 1 : b;
                o[FP8MIX_STATS_HIST + b]++;
            }
        }
        if ((i + 1) % per == 0 || i + 1 == rows)
            for (int k = 0; k < 6; k++) ord.total[k] += sref_tree16(ord.p[k]);
    }
    o[FP8MIX_STATS_SIGNAL] = ord.total[0];
    o[FP8MIX_STATS_NOISE] = ord.total[1];
    o[FP8MIX_STATS_PIVOT] = c;
    for (int k = 0; k < 4; k++) o[FP8MIX_STATS_SUM1 + k] = ord.total[2 + k];
    int64_t cb = (cols + 127) / 128;
    int64_t ns = rows == 0 || cols == 0 ? 0 : gran == 0 ? 1 : gran == 1 ? rows : gran == 2 ? rows * cb : ((rows + 127) / 128) * cb;
    double lo = INFINITY, hi = 0;
    for (int64_t t = 0; t < ns; t++) {
        double s = sinv[t];
        if (!(s > 0 && s <= FLT_MAX)) { o[FP8MIX_STATS_BAD_SCALES]++; continue; }
        lo = s < lo ? s : lo;
        hi = s > hi ? s : hi;
    }
    o[FP8MIX_STATS_SCALE_INV_MIN] = lo;
    o[FP8MIX_STATS_SCALE_INV_MAX] = hi;
}

#endif /* FP8MIX_STATS_REF_H */
