/*
 * fuzz_stats.c — libFuzzer target for fp8mix_quant_stats.
 *
 * Arbitrary shapes, strides, element types, formats, granularities, scales
 * (bad ones too), x drawn from the interesting floats and q from any bytes.
 * Checks: the documented status; on error `out` untouched; on success the
 * counts and min equal a reference written here from the header's
 * definitions, the energies agree to rounding, and the result is the same
 * bits for 1 and 3 threads.
 */
#include "fuzz_common.h"

FUZZ_NOCOV static void ref_stats(const void *x, int xt, int64_t rows, int64_t cols, int64_t ld_x, const uint8_t *q,
                                 int64_t ld_q, int fmt, int gran, const float *sinv, double *o)
{
    double fmax = fmt == 0 ? 448.0 : 57344.0, bound = fmt == 0 ? 464.0 : 59392.0;
    double minn = fmt == 0 ? ldexp(1.0, -6) : ldexp(1.0, -14);
    for (int k = 0; k < FP8MIX_STATS_N; k++) o[k] = 0;
    o[FP8MIX_STATS_MIN_NONZERO] = INFINITY;
    size_t es = esize((fp8mix_dtype)xt);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double v = ref_load((const uint8_t *)x + (size_t)(i * ld_x) * es, (fp8mix_dtype)xt, j);
            double d = ref_fp8_decode(q[i * ld_q + j], (fp8mix_format)fmt);
            double s = sinv[ref_scale_index(gran, i, j, cols)];
            o[FP8MIX_STATS_NUMEL] += 1;
            if (v != 0) o[FP8MIX_STATS_NONZERO] += 1;
            if (!isfinite(v)) { o[FP8MIX_STATS_NONFINITE] += 1; continue; }
            if (v != 0 && fabs(v) < o[FP8MIX_STATS_MIN_NONZERO]) o[FP8MIX_STATS_MIN_NONZERO] = fabs(v);
            if (v != 0 && d == 0) o[FP8MIX_STATS_UNDERFLOW] += 1;
            if (fabs(d) == fmax) o[FP8MIX_STATS_SATURATED] += 1;
            if (fabs(v) > bound * s) o[FP8MIX_STATS_OVERFLOW] += 1;
            if (d != 0 && fabs(d) < minn) o[FP8MIX_STATS_SUBNORMAL] += 1;
            o[FP8MIX_STATS_SIGNAL] += v * v;
            if (isfinite(d)) o[FP8MIX_STATS_NOISE] += (v - d * s) * (v - d * s);
        }
}

static int close_rel(double a, double b)
{
    if (a == b) return 1;
    if (isinf(a) || isinf(b) || isnan(a) || isnan(b)) return 0;
    return fabs(a - b) <= 1e-9 * fmax(fabs(a), fabs(b));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    uint8_t sc = fz_u8(&f);
    int64_t rows = (sc & 3) == 3 ? 0 : fz_below(&f, (sc & 4) ? 200 : 9);
    int64_t cols = (sc & 0x18) == 0x18 ? 0 : fz_below(&f, (sc & 0x20) ? 300 : 140);
    if (rows * cols > 12000) cols = 12000 / (rows ? rows : 1);
    uint8_t k = fz_u8(&f);
    int fmt = (k & 15) == 15 ? (int)fz_below(&f, 5) - 1 : (k & 1);
    int gran = (k & 0x70) == 0x70 ? (int)fz_below(&f, 7) - 2 : (int)fz_below(&f, 4);
    int xt = (k & 0x80) && fz_bool(&f) ? (int)fz_below(&f, 6) - 2 : (int)fz_below(&f, 3);
    uint8_t k2 = fz_u8(&f);
    int64_t ld_x = cols + ((k2 & 3) == 3 ? fz_below(&f, 4) : 0);
    if ((k2 & 0x0C) == 0x0C) ld_x = cols - 1;
    int64_t ld_q = cols + (((k2 >> 4) & 3) == 3 ? fz_below(&f, 4) : 0);
    if ((k2 & 0xC0) == 0xC0) ld_q = cols - 1;
    uint8_t k3 = fz_u8(&f);
    int x_null = (k3 & 15) == 15, q_null = (k3 & 0xF0) == 0xF0, s_null = (fz_u8(&f) & 31) == 31;
    int out_null = (fz_u8(&f) & 63) == 63;
    int bad_ok = (fz_u8(&f) & 7) == 7;

    int64_t n = gran_valid(gran) ? ref_scale_count(gran, rows, cols) : 1;
    float *sinv = (!s_null && n > 0) ? (float *)xmalloc((size_t)n * 4, 0) : NULL;
    for (int64_t t = 0; sinv && t < n; t++) sinv[t] = fz_scale(&f, bad_ok);
    int xtv = dtype_valid(xt) ? xt : 0;
    int64_t ldx_alloc = ld_x >= cols ? ld_x : cols, ldq_alloc = ld_q >= cols ? ld_q : cols;
    size_t x_bytes = mat_bytes(rows, cols, ldx_alloc, esize((fp8mix_dtype)xtv));
    void *x = x_null ? NULL : xmalloc(x_bytes, 0);
    if (x) fill_hp(&f, x, x_bytes, xtv, rows, cols, ldx_alloc);
    size_t q_bytes = mat_bytes(rows, cols, ldq_alloc, 1);
    uint8_t *q = q_null ? NULL : (uint8_t *)xmalloc(q_bytes, 0);
    for (size_t t = 0; q && t < q_bytes; t++) q[t] = fz_left(&f) ? fz_u8(&f) : (uint8_t)(t * 37u + 11u);

    int nonempty = rows > 0 && cols > 0;
    expect e = {0, 0};
    if (out_null) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
    if (!fmt_valid(fmt) || !gran_valid(gran) || !dtype_valid(xt)) exp_must(&e, FP8MIX_ERR_BAD_ENUM);
    exp_shape(&e, rows, cols, ld_x, 0);
    exp_shape(&e, rows, cols, ld_q, 0);
    if (nonempty && (x_null || q_null || (n > 0 && !sinv))) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
    if (!nonempty && (x_null || q_null || !sinv)) exp_may(&e, FP8MIX_ERR_NULL_POINTER);
    int bad = 0;
    for (int64_t t = 0; sinv && t < n; t++) bad |= !scale_ok(sinv[t]);
    if (bad) {
        if (nonempty) exp_must(&e, FP8MIX_ERR_BAD_SCALE);
        else exp_may(&e, FP8MIX_ERR_BAD_SCALE);
    }

    double out1[FP8MIX_STATS_N], out3[FP8MIX_STATS_N], ref[FP8MIX_STATS_N];
    for (int t = 0; t < FP8MIX_STATS_N; t++) out1[t] = out3[t] = -7.0;
    fp8mix_set_num_threads(1);
    fp8mix_status st = fp8mix_quant_stats(x, (fp8mix_dtype)xt, rows, cols, ld_x, q, ld_q, (fp8mix_format)fmt,
                                          (fp8mix_granularity)gran, sinv, out_null ? NULL : out1);
    exp_check(&e, st, "quant_stats");
    if (st == FP8MIX_OK) {
        fp8mix_set_num_threads(3);
        fp8mix_status st3 = fp8mix_quant_stats(x, (fp8mix_dtype)xt, rows, cols, ld_x, q, ld_q, (fp8mix_format)fmt,
                                               (fp8mix_granularity)gran, sinv, out3);
        FUZZ_CHECK(st3 == FP8MIX_OK, "3 threads: status %d", (int)st3);
        FUZZ_CHECK(memcmp(out1, out3, sizeof out1) == 0, "result depends on the thread count");
        if (nonempty) {
            ref_stats(x, xt, rows, cols, ld_x, q, ld_q, fmt, gran, sinv, ref);
            for (int t = 0; t < FP8MIX_STATS_N; t++) {
                if (t == FP8MIX_STATS_SIGNAL || t == FP8MIX_STATS_NOISE)
                    FUZZ_CHECK(close_rel(out1[t], ref[t]), "entry %d: %.17g vs reference %.17g", t, out1[t], ref[t]);
                else
                    FUZZ_CHECK(out1[t] == ref[t], "entry %d: %.17g vs reference %.17g", t, out1[t], ref[t]);
            }
        } else {
            FUZZ_CHECK(out1[FP8MIX_STATS_NUMEL] == 0 && isinf(out1[FP8MIX_STATS_MIN_NONZERO]), "empty input");
        }
    }
    fp8mix_set_num_threads(0);
    free(sinv);
    free(x);
    free(q);
    return 0;
}
