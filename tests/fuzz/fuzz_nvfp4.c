/*
 * fuzz_nvfp4.c — libFuzzer target for NVFP4 (fp8mix.h "NVFP4").
 *
 * The first input byte picks a mode:
 *   quantize   fp8mix_quantize_nvfp4 of fuzzed values (specials, NaN, inf,
 *              subnormals, huge), any global_amax (stale, 0, inf, NaN), 1x16
 *              and 16x16 blocks, nearest and stochastic rounding, must equal
 *              tests/c/nvfp4_ref.h's reference byte for byte; the decoding
 *              must equal value * scale * S_dec;
 *   gemm       fp8mix_gemm_nvfp4 of arbitrary codes and scale bytes (NaN
 *              scale bytes included) against the header's order spelled out;
 *   encode     fp8mix_e2m1_encode_ref of arbitrary floats against the
 *              nearest-value search (and the stochastic threshold rule);
 *   hostile    arbitrary shapes, strides, tile sizes, amaxes and scales with
 *              tiny buffers, called only where an error is certain.
 */
#include <float.h>

#include "fuzz_common.h"
#include "internal.h"
#include "../c/nvfp4_ref.h"

static void mode_quantize(fz *f)
{
    int64_t rows = fz_below(f, 40), cols = 16 * (int64_t)fz_below(f, 6);
    int tile = fz_bool(f) ? 16 : 1, sr = fz_bool(f);
    uint64_t seed = fz_u64(f), off = fz_below(f, 1000);
    int64_t n = rows * cols;
    float *x = (float *)xmalloc((size_t)n * 4 + 4, 0);
    for (int64_t i = 0; i < n; i++) x[i] = fz_float(f);
    float gam;
    switch (fz_u8(f) & 3) {
    case 0: gam = 0; for (int64_t i = 0; i < n; i++) if (!(fabsf(x[i]) <= gam)) gam = fabsf(x[i]); break;
    case 1: gam = fabsf(fz_float(f)); break;
    case 2: gam = INFINITY; break;
    default: gam = 0.0f; break;
    }
    if (isnan(gam)) gam = NAN; /* keeps NaN (sign cleared by fabsf already) */
    uint8_t *q = (uint8_t *)xmalloc((size_t)n / 2 + 1, 0), *qr = (uint8_t *)xmalloc((size_t)n / 2 + 1, 0);
    uint8_t *bs = (uint8_t *)xmalloc((size_t)n / 16 + 1, 0), *bsr = (uint8_t *)xmalloc((size_t)n / 16 + 1, 0);
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST, seed, off, 0};
    float sdec = -1.0f, sdec_r = 0.0f;
    fp8mix_set_num_threads(1 + (int)fz_below(f, 2));
    fp8mix_status st = fp8mix_quantize_nvfp4(x, FP8MIX_F32, rows, cols, cols ? cols : 1, tile, gam, q,
                                             cols / 2 ? cols / 2 : 1, bs, &sdec, &o);
    FUZZ_CHECK(st == FP8MIX_OK, "status %d", st);
    nvfp4_ref_quantize(x, rows, cols, tile, gam, sr, seed, off, qr, bsr, &sdec_r);
    FUZZ_CHECK(fbits(sdec) == fbits(sdec_r), "S_dec %a vs %a (amax %a)", (double)sdec, (double)sdec_r, (double)gam);
    FUZZ_CHECK(!memcmp(q, qr, (size_t)n / 2), "codes differ (%lld x %lld, tile %d, sr %d, amax %a)", (long long)rows,
               (long long)cols, tile, sr, (double)gam);
    FUZZ_CHECK(!memcmp(bs, bsr, (size_t)n / 16), "block scales differ");
    if (n) {
        float *y = (float *)xmalloc((size_t)n * 4, 0);
        FUZZ_CHECK(fp8mix_dequantize_nvfp4(q, cols / 2, bs, rows, cols, sdec, y, cols) == FP8MIX_OK, "dequantize");
        for (int64_t i = 0; i < rows; i++)
            for (int64_t j = 0; j < cols; j++) {
                uint8_t c = (uint8_t)((j & 1) ? q[i * cols / 2 + j / 2] >> 4 : q[i * cols / 2 + j / 2] & 15);
                volatile float v = (float)ref_e2m1_value(c) * (float)ref_e4m3_value(bs[i * cols / 16 + j / 16]);
                volatile float w = v * sdec;
                FUZZ_CHECK(fbits(y[i * cols + j]) == fbits(w) || (isnan(w) && isnan(y[i * cols + j])),
                           "dequantized %a vs %a", (double)y[i * cols + j], (double)w);
            }
        free(y);
    }
    fp8mix_set_num_threads(1);
    free(x); free(q); free(qr); free(bs); free(bsr);
}

static void mode_gemm(fz *f)
{
    int64_t M = fz_below(f, 9), N = fz_below(f, 9), K = 16 * (int64_t)fz_below(f, 5);
    uint8_t *a = (uint8_t *)xmalloc((size_t)(M * K / 2) + 1, 0), *b = (uint8_t *)xmalloc((size_t)(N * K / 2) + 1, 0);
    uint8_t *sa = (uint8_t *)xmalloc((size_t)(M * K / 16) + 1, 0), *sb = (uint8_t *)xmalloc((size_t)(N * K / 16) + 1, 0);
    for (int64_t i = 0; i < M * K / 2; i++) a[i] = fz_u8(f);
    for (int64_t i = 0; i < N * K / 2; i++) b[i] = fz_u8(f);
    for (int64_t i = 0; i < M * K / 16; i++) sa[i] = fz_u8(f) & 0x7F; /* E4M3 scales are positive */
    for (int64_t i = 0; i < N * K / 16; i++) sb[i] = fz_u8(f) & 0x7F;
    float da = ldexpf(1.0f + (float)fz_below(f, 8) / 8.0f, (int)fz_below(f, 60) - 30);
    float db = ldexpf(1.0f + (float)fz_below(f, 8) / 8.0f, (int)fz_below(f, 60) - 30);
    float *c = (float *)xmalloc((size_t)(M * N) * 4 + 4, 0);
    fp8mix_set_num_threads(1 + (int)fz_below(f, 2));
    FUZZ_CHECK(fp8mix_gemm_nvfp4(M, N, K, a, K / 2 ? K / 2 : 1, sa, da, b, K / 2 ? K / 2 : 1, sb, db, c,
                                 N ? N : 1) == FP8MIX_OK, "gemm status");
    fp8mix_set_num_threads(1);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            volatile float acc = 0.0f;
            for (int64_t k0 = 0; k0 < K; k0 += 16) {
                double blk = 0; /* exact: 16 products of E2M1 values */
                for (int t = 0; t < 16; t++) {
                    int64_t ka = i * K + k0 + t, kb = j * K + k0 + t;
                    uint8_t ca = (uint8_t)((ka & 1) ? a[ka / 2] >> 4 : a[ka / 2] & 15);
                    uint8_t cb = (uint8_t)((kb & 1) ? b[kb / 2] >> 4 : b[kb / 2] & 15);
                    blk += ref_e2m1_value(ca) * ref_e2m1_value(cb);
                }
                double d = ref_e4m3_value(sa[i * K / 16 + k0 / 16]) * ref_e4m3_value(sb[j * K / 16 + k0 / 16]);
                acc = acc + (float)(blk * d);
            }
            volatile float alpha = da * db;
            volatile float want = acc * alpha;
            float got = c[i * N + j];
            FUZZ_CHECK(fbits(got) == fbits(want) || (isnan(got) && isnan(want)), "C[%lld,%lld] %a vs %a",
                       (long long)i, (long long)j, (double)got, (double)want);
        }
    free(a); free(b); free(sa); free(sb); free(c);
}

static void mode_encode(fz *f)
{
    for (int t = 0; t < 64 && fz_left(f); t++) {
        float y = fz_float(f);
        uint8_t got = fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_NEAREST, 0);
        uint8_t want = isnan(y) ? 0 : ref_e2m1(y);
        FUZZ_CHECK(got == want, "e2m1(%a) = %u, nearest %u", (double)y, got, want);
        /* stochastic: one of the two neighbours, the lower one for r = UINT32_MAX */
        uint32_t r = fz_u32(f);
        uint8_t s = fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_STOCHASTIC, r);
        if (!isnan(y)) {
            double v = ref_e2m1_value(s);
            double lo = 0, hi = 6, a = fabs(y);
            for (int c = 0; c < 8; c++) {
                if (k_mag[c] <= a && k_mag[c] > lo) lo = k_mag[c];
                if (k_mag[c] >= a && k_mag[c] < hi) hi = k_mag[c];
            }
            if (a > 6) lo = hi = 6;
            FUZZ_CHECK(fabs(v) == lo || fabs(v) == hi, "sr e2m1(%a) = %g, neighbours %g %g", (double)y, v, lo, hi);
            if (r == UINT32_MAX) FUZZ_CHECK(fabs(v) == lo, "r = max rounds down");
        }
    }
}

static void mode_hostile(fz *f)
{
    int64_t rows = (int64_t)fz_u64(f), cols = (int64_t)fz_u64(f), ld = (int64_t)fz_u64(f);
    int tile = (int)fz_u8(f);
    float gam = fz_float(f);
    uint8_t buf[64] = {0};
    float fb[16] = {0};
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    int certain = rows < 0 || cols < 0 || (cols % 16) != 0 || (tile != 1 && tile != 16) || gam < 0.0f ||
                  ld < cols;
    if (certain) {
        fp8mix_status st = fp8mix_quantize_nvfp4(fb, FP8MIX_F32, rows, cols, ld, tile, gam, buf, ld, buf + 32,
                                                 NULL, &o);
        FUZZ_CHECK(st != FP8MIX_OK, "quantize accepted rows %lld cols %lld ld %lld tile %d amax %a", (long long)rows,
                   (long long)cols, (long long)ld, tile, (double)gam);
    }
    if (rows < 0 || cols < 0 || cols % 16 != 0) {
        FUZZ_CHECK(fp8mix_rht16(fb, rows, cols, ld, 1, fb, ld) != FP8MIX_OK, "rht accepted a bad shape");
        FUZZ_CHECK(fp8mix_gemm_nvfp4(rows, 1, cols, buf, ld, buf, 1.0f, buf, ld, buf, 1.0f, fb, 1) != FP8MIX_OK,
                   "gemm accepted M %lld K %lld", (long long)rows, (long long)cols);
    }
    float s = fz_float(f);
    if (!(s > 0.0f) || !(s <= FLT_MAX))
        FUZZ_CHECK(fp8mix_dequantize_nvfp4(buf, 8, buf, 1, 16, s, fb, 16) == FP8MIX_ERR_BAD_SCALE, "bad scale_inv");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    switch (fz_u8(&f) % 4) {
    case 0: mode_quantize(&f); break;
    case 1: mode_gemm(&f); break;
    case 2: mode_encode(&f); break;
    default: mode_hostile(&f); break;
    }
    return 0;
}
