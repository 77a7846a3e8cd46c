/*
 * fuzz_stats.c — libFuzzer target for fp8mix_quant_stats.
 *
 * Arbitrary shapes, strides, element types, formats, granularities, scales
 * (bad ones too, with and without bad_scale_as_one), x drawn from the
 * interesting floats and q from any bytes.  Checks: the documented status; on
 * error `out` untouched; on success every entry (counts, extremes, histogram
 * and the float64 sums in the header's summation order) equals the
 * independent reference of tests/c/stats_ref.h bit for bit, and the result is
 * the same bits for 1 and 3 threads and for the scalar kernel and the best
 * SIMD variant.
 */
#include "fuzz_common.h"
#include "../c/stats_ref.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    uint8_t sc = fz_u8(&f);
    int64_t rows = (sc & 3) == 3 ? 0 : fz_below(&f, (sc & 4) ? 200 : 9);
    int64_t cols = (sc & 0x18) == 0x18 ? 0 : fz_below(&f, (sc & 0x20) ? 300 : 140);
    if (rows * cols > 12000) cols = 12000 / (rows ? rows : 1);
    uint8_t k = fz_u8(&f);
    int fmt = (k & 15) == 15 ? (int)fz_below(&f, 5) - 1 : (k & 1);
    int gran = gran_skip_mx((k & 0x70) == 0x70 ? (int)fz_below(&f, 7) - 2 : (int)fz_below(&f, 4));
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
    int as_one = bad_ok && fz_bool(&f); /* bad_scale_as_one: bad scales are counted, not refused */
    fp8mix_stats_opts opts = {as_one};

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
    if (bad && !as_one) {
        if (nonempty) exp_must(&e, FP8MIX_ERR_BAD_SCALE);
        else exp_may(&e, FP8MIX_ERR_BAD_SCALE);
    }

    double out1[FP8MIX_STATS_N], out3[FP8MIX_STATS_N], ref[FP8MIX_STATS_N];
    for (int t = 0; t < FP8MIX_STATS_N; t++) out1[t] = out3[t] = -7.0;
    fp8mix_set_num_threads(1);
    fp8mix_status st = fp8mix_quant_stats(x, (fp8mix_dtype)xt, rows, cols, ld_x, q, ld_q, (fp8mix_format)fmt,
                                          (fp8mix_granularity)gran, sinv, &opts, out_null ? NULL : out1);
    exp_check(&e, st, "quant_stats");
    if (st != FP8MIX_OK)
        for (int t = 0; !out_null && t < FP8MIX_STATS_N; t++) FUZZ_CHECK(out1[t] == -7.0, "error wrote out[%d]", t);
    if (st == FP8MIX_OK) {
        fp8mix_set_num_threads(3);
        fp8mix_status st3 = fp8mix_quant_stats(x, (fp8mix_dtype)xt, rows, cols, ld_x, q, ld_q, (fp8mix_format)fmt,
                                               (fp8mix_granularity)gran, sinv, &opts, out3);
        FUZZ_CHECK(st3 == FP8MIX_OK, "3 threads: status %d", (int)st3);
        FUZZ_CHECK(memcmp(out1, out3, sizeof out1) == 0, "result depends on the thread count");
        fp8mix_isa best = fp8mix_active_isa();
        fp8mix_set_max_isa(FP8MIX_ISA_SCALAR);
        st3 = fp8mix_quant_stats(x, (fp8mix_dtype)xt, rows, cols, ld_x, q, ld_q, (fp8mix_format)fmt,
                                 (fp8mix_granularity)gran, sinv, &opts, out3);
        fp8mix_set_max_isa(best);
        FUZZ_CHECK(st3 == FP8MIX_OK && memcmp(out1, out3, sizeof out1) == 0,
                   "the %s kernel differs from the scalar one", fp8mix_isa_name(best));
        if (nonempty) {
            sref_stats(x, xt, rows, cols, ld_x, q, ld_q, fmt, gran, sinv, as_one, ref);
            for (int t = 0; t < FP8MIX_STATS_N; t++)
                FUZZ_CHECK(memcmp(&out1[t], &ref[t], sizeof(double)) == 0, "entry %d: %.17g vs reference %.17g", t,
                           out1[t], ref[t]);
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
