/*
 * test_nvfp4.c — NVFP4 (fp8mix.h "NVFP4") against a reference written here:
 * E2M1 and E4M3 values from the OCP Microscaling v1.0 bit formulas, encoding
 * by searching the nearest value in float64 (ties to the even code,
 * saturating), and Transformer Engine's float32 scale arithmetic spelled out
 * step by step.  Covered: every E2M1 code, every rounding midpoint, stochastic
 * rounding's threshold and mean, 1x16 and 16x16 blocks, zeros, huge and tiny
 * blocks, NaN / inf blocks, bf16 / f16 inputs, thread counts, dequantisation,
 * the GEMM (exact order and a float64 bound), the Hadamard transform (float64
 * matrix product and orthogonality) and bad arguments.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"
#include "nvfp4_ref.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double urand(void) /* [0, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void test_codes(void)
{
    for (int c = 0; c < 16; c++) {
        CHECK(fp8mix_e2m1_decode((uint8_t)c) == (float)ref_e2m1_value((uint8_t)c), "decode %d", c);
        CHECK(fp8mix_e2m1_decode((uint8_t)(c | 0xF0)) == (float)ref_e2m1_value((uint8_t)c), "high nibble ignored");
        /* every value encodes to its own code */
        CHECK(fp8mix_e2m1_encode_ref((float)ref_e2m1_value((uint8_t)c), FP8MIX_ROUND_NEAREST, 0) == c, "round trip %d",
              c);
    }
    /* midpoints, their neighbours, saturation, NaN */
    for (int c = 0; c < 7; c++) {
        double mid = 0.5 * (k_mag[c] + k_mag[c + 1]);
        float m = (float)mid;
        for (int s = 0; s < 2; s++) {
            float v[3] = {m, nextafterf(m, 0.0f), nextafterf(m, 100.0f)};
            for (int t = 0; t < 3; t++) {
                float y = s ? -v[t] : v[t];
                CHECK(fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_NEAREST, 0) == ref_e2m1(y), "rne %.9g", (double)y);
            }
        }
    }
    for (int i = 0; i < 200000; i++) {
        float y = (float)((urand() - 0.5) * 16.0 * pow(2.0, -8.0 * urand()));
        CHECK(fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_NEAREST, 0) == ref_e2m1(y), "rne %.9g", (double)y);
    }
    CHECK(fp8mix_e2m1_encode_ref(1e30f, FP8MIX_ROUND_NEAREST, 0) == 7, "saturates");
    CHECK(fp8mix_e2m1_encode_ref(-INFINITY, FP8MIX_ROUND_NEAREST, 0) == 15, "-inf saturates");
    CHECK(fp8mix_e2m1_encode_ref(NAN, FP8MIX_ROUND_NEAREST, 0) == 0, "NaN gives 0");
    CHECK(fp8mix_e2m1_encode_ref(-0.0f, FP8MIX_ROUND_NEAREST, 0) == 8, "-0 keeps its sign");
}

static void test_stochastic(void)
{
    /* y = lo + f (hi - lo): up iff r < floor(f * 2^32) */
    for (int c = 0; c < 7; c++) {
        double lo = k_mag[c], hi = k_mag[c + 1];
        double f = 0.3125; /* exact in binary: the threshold is exact */
        float y = (float)(lo + f * (hi - lo));
        uint32_t t = (uint32_t)(f * 4294967296.0);
        CHECK(fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_STOCHASTIC, t - 1) == c + 1, "sr up below T at %d", c);
        CHECK(fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_STOCHASTIC, t) == c, "sr down at T at %d", c);
        CHECK(fp8mix_e2m1_encode_ref(-y, FP8MIX_ROUND_STOCHASTIC, t - 1) == ((c + 1) | 8), "sr negative");
    }
    /* the mean of many stochastic casts is the value (unbiased) */
    float y = 2.3f;
    double sum = 0;
    int n = 40000;
    for (int i = 0; i < n; i++) sum += fp8mix_e2m1_decode(fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_STOCHASTIC,
                                                                               fp8mix_random_word(7, 0, (uint64_t)i)));
    CHECK(fabs(sum / n - 2.3) < 0.01, "sr mean %.5f", sum / n);
    CHECK(fp8mix_e2m1_encode_ref(100.0f, FP8MIX_ROUND_STOCHASTIC, 0) == 7, "sr saturates");
}

static void fill(float *x, int64_t n, int spread)
{
    for (int64_t i = 0; i < n; i++) x[i] = (float)((urand() - 0.5) * pow(2.0, spread * (urand() - 0.5)));
}

static float amax_of(const float *x, int64_t n)
{
    float a = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabsf(x[i]) > a) a = fabsf(x[i]);
    return a;
}

static int quantize_case(int64_t rows, int64_t cols, int tile, int sr, int spread, float gamax_mul, int threads)
{
    int64_t n = rows * cols, nb = cols / 16;
    float *x = malloc((size_t)n * 4);
    uint8_t *q = calloc((size_t)(n / 2 + 1), 1), *qr = calloc((size_t)(n / 2 + 1), 1);
    uint8_t *bs = malloc((size_t)(rows * nb + 1)), *bsr = malloc((size_t)(rows * nb + 1));
    fill(x, n, spread);
    float gam = amax_of(x, n) * gamax_mul, sdec = -1, sdec_r;
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST, 11, 4, 0};
    fp8mix_set_num_threads(threads);
    fp8mix_status st = fp8mix_quantize_nvfp4(x, FP8MIX_F32, rows, cols, cols, tile, gam, q, cols / 2, bs, &sdec, &o);
    fp8mix_set_num_threads(1);
    nvfp4_ref_quantize(x, rows, cols, tile, gam, sr, 11, 4, qr, bsr, &sdec_r);
    int ok = st == FP8MIX_OK && sdec == sdec_r && !memcmp(q, qr, (size_t)(n / 2)) && !memcmp(bs, bsr, (size_t)(rows * nb));
    CHECK(ok, "quantize %lldx%lld tile %d sr %d spread %d amax x%g threads %d (st %d)", (long long)rows,
          (long long)cols, tile, sr, spread, (double)gamax_mul, threads, st);
    if (ok && !sr && gamax_mul == 1.0f) { /* dequantised error within half an E2M1 step of the block's grid */
        float *y = malloc((size_t)n * 4);
        fp8mix_dequantize_nvfp4(q, cols / 2, bs, rows, cols, sdec, y, cols);
        int good = 1;
        for (int64_t i = 0; i < rows && good; i++)
            for (int64_t j = 0; j < cols; j++) {
                double d = ref_e4m3_value(bs[i * nb + j / 16]) * (double)sdec;
                /* spacing of E2M1 at |x|/d is at most 2 (between 4 and 6); half of it, plus rounding slack */
                double v = fabs(x[i * cols + j]) / d, step = v < 2 ? 0.5 : v < 4 ? 1 : 2;
                if (fabs(y[i * cols + j] - x[i * cols + j]) > (0.5 * step * 1.0001 + 1e-6) * d) {
                    good = 0;
                    break;
                }
            }
        CHECK(good, "dequantised error within half a step");
        free(y);
    }
    free(x); free(q); free(qr); free(bs); free(bsr);
    return ok;
}

static void test_quantize(void)
{
    quantize_case(1, 16, 1, 0, 4, 1.0f, 1);
    quantize_case(7, 64, 1, 0, 16, 1.0f, 1);
    quantize_case(33, 160, 16, 0, 16, 1.0f, 1);
    quantize_case(64, 256, 1, 1, 8, 1.0f, 2);
    quantize_case(40, 128, 16, 1, 8, 1.0f, 2);
    quantize_case(129, 512, 1, 0, 30, 1.0f, 2); /* blocks far below the tensor's amax: tiny E4M3 scales */
    quantize_case(16, 32, 1, 0, 8, 0.25f, 1);   /* a stale amax below the data: scales and elements saturate */
    quantize_case(16, 32, 1, 0, 8, 1e-30f, 1);
    quantize_case(16, 32, 16, 0, 8, 1e30f, 1);  /* a huge amax: block scales underflow to 0 */

    /* zeros, NaN and inf blocks; bf16 / f16 inputs equal float32 of the same values */
    float x[2 * 32];
    for (int i = 0; i < 64; i++) x[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < 16; i++) x[16 + i] = 0.0f; /* row 0 block 1: zeros */
    x[32 + 3] = NAN;                              /* row 1 block 0 */
    x[48 + 5] = -INFINITY;                        /* row 1 block 1 */
    uint8_t q[32], bs[4];
    float sdec, gam = 10.5f; /* S_enc = 2688 / 10.5 = 256: every scale below is a power of two */
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 32, 32, 1, gam, q, 16, bs, &sdec, &o) == FP8MIX_OK, "quantize");
    CHECK(bs[1] == 0 && bs[2] == 0x7F && bs[3] == 0x7F && bs[0] != 0x7F, "zero / NaN / inf block scales %x %x %x",
          bs[1], bs[2], bs[3]);
    float y[64];
    CHECK(fp8mix_dequantize_nvfp4(q, 16, bs, 2, 32, sdec, y, 32) == FP8MIX_OK, "dequantize");
    int nan_ok = 1;
    for (int j = 0; j < 32; j++) nan_ok &= isnan(y[32 + j]);
    CHECK(nan_ok, "non-finite blocks decode to NaN");
    for (int j = 0; j < 16; j++) CHECK(y[16 + j] == 0.0f, "zero block");
    for (int j = 0; j < 16; j++) CHECK(y[j] == x[j], "integers up to 3 are exact under power-of-two scales");
    uint16_t xb[64], xh[64];
    for (int i = 0; i < 64; i++) {
        xb[i] = fp8mix_f32_to_bf16_ref(x[i]);
        xh[i] = fp8mix_f32_to_f16_ref(x[i]);
    }
    uint8_t q2[32], bs2[4];
    CHECK(fp8mix_quantize_nvfp4(xb, FP8MIX_BF16, 2, 32, 32, 1, gam, q2, 16, bs2, NULL, &o) == FP8MIX_OK &&
              !memcmp(q, q2, 32) && !memcmp(bs, bs2, 4), "bf16 input");
    CHECK(fp8mix_quantize_nvfp4(xh, FP8MIX_F16, 2, 32, 32, 1, gam, q2, 16, bs2, NULL, &o) == FP8MIX_OK &&
              !memcmp(q, q2, 32) && !memcmp(bs, bs2, 4), "f16 input");
    CHECK(fp8mix_nvfp4_tensor_scale(0.0f) == 1.0f && fp8mix_nvfp4_tensor_scale(INFINITY) == 1.0f &&
              fp8mix_nvfp4_tensor_scale(NAN) == 1.0f && fp8mix_nvfp4_tensor_scale(1e-45f) == FLT_MAX &&
              fp8mix_nvfp4_tensor_scale(2688.0f) == 1.0f, "tensor scale edge cases");

    /* bad arguments */
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 24, 32, 1, 1.0f, q, 16, bs, NULL, &o) == FP8MIX_ERR_BAD_SHAPE,
          "cols not a multiple of 16");
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 32, 32, 3, 1.0f, q, 16, bs, NULL, &o) == FP8MIX_ERR_BAD_ARG,
          "tile_rows 3");
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 32, 32, 1, -1.0f, q, 16, bs, NULL, &o) == FP8MIX_ERR_BAD_ARG,
          "negative amax");
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 32, 32, 1, 1.0f, q, 8, bs, NULL, &o) == FP8MIX_ERR_BAD_SHAPE,
          "ld_q too small");
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 32, 32, 1, 1.0f, NULL, 16, bs, NULL, &o) == FP8MIX_ERR_NULL_POINTER,
          "q NULL");
    fp8mix_cast_opts o5 = {FP8MIX_E5M2, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    CHECK(fp8mix_quantize_nvfp4(x, FP8MIX_F32, 2, 32, 32, 1, 1.0f, q, 16, bs, NULL, &o5) == FP8MIX_ERR_BAD_ENUM,
          "E5M2 block scales");
    CHECK(fp8mix_dequantize_nvfp4(q, 16, bs, 2, 32, 0.0f, y, 32) == FP8MIX_ERR_BAD_SCALE, "scale_inv 0");
    CHECK(fp8mix_dequantize_nvfp4(q, 16, bs, 2, 32, NAN, y, 32) == FP8MIX_ERR_BAD_SCALE, "scale_inv NaN");
}

static void test_gemm(void)
{
    int64_t M = 13, N = 9, K = 96;
    float *a = malloc(M * K * 4), *b = malloc(N * K * 4);
    fill(a, M * K, 10);
    fill(b, N * K, 10);
    uint8_t *qa = malloc(M * K / 2), *qb = malloc(N * K / 2), *sa = malloc(M * K / 16), *sb = malloc(N * K / 16);
    float da, db;
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    fp8mix_quantize_nvfp4(a, FP8MIX_F32, M, K, K, 1, amax_of(a, M * K), qa, K / 2, sa, &da, &o);
    fp8mix_quantize_nvfp4(b, FP8MIX_F32, N, K, K, 16, amax_of(b, N * K), qb, K / 2, sb, &db, &o);
    float *c1 = malloc(M * N * 4), *c2 = malloc(M * N * 4), *ya = malloc(M * K * 4), *yb = malloc(N * K * 4);
    fp8mix_set_num_threads(1);
    CHECK(fp8mix_gemm_nvfp4(M, N, K, qa, K / 2, sa, da, qb, K / 2, sb, db, c1, N) == FP8MIX_OK, "gemm");
    fp8mix_set_num_threads(2);
    CHECK(fp8mix_gemm_nvfp4(M, N, K, qa, K / 2, sa, da, qb, K / 2, sb, db, c2, N) == FP8MIX_OK, "gemm 2 threads");
    fp8mix_set_num_threads(1);
    CHECK(!memcmp(c1, c2, M * N * 4), "the same bits on 1 and 2 threads");
    /* the float64 product of the dequantised operands: the stated order rounds only the block
     * accumulation and the last product, so |C - ref| <= (K/16 + 1) eps32 sum|terms| */
    fp8mix_dequantize_nvfp4(qa, K / 2, sa, M, K, 1.0f, ya, K); /* block-scaled values, tensor scale later */
    fp8mix_dequantize_nvfp4(qb, K / 2, sb, N, K, 1.0f, yb, K);
    int ok = 1, exact = 1;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            float acc = 0; /* the stated order, spelled out */
            for (int64_t k0 = 0; k0 < K; k0 += 16) {
                double blk = 0;
                for (int t = 0; t < 16; t++) blk += (double)ya[i * K + k0 + t] * yb[j * K + k0 + t];
                acc += (float)blk; /* blk is exact in float32 */
                ref += blk;
                mag += fabs(blk);
            }
            volatile float alpha = da * db;
            volatile float want = acc * alpha;
            exact &= c1[i * N + j] == want;
            ref *= (double)da * db;
            mag *= (double)da * db;
            ok &= fabs(c1[i * N + j] - ref) <= (K / 16 + 2) * FLT_EPSILON * mag + 1e-30;
        }
    CHECK(exact, "the stated float32 order");
    CHECK(ok, "float64 bound");
    /* a NaN block scale gives NaN in its row only */
    sa[0] = 0x7F;
    fp8mix_gemm_nvfp4(M, N, K, qa, K / 2, sa, da, qb, K / 2, sb, db, c1, N);
    CHECK(isnan(c1[0]) && isnan(c1[N - 1]) && !isnan(c1[N]), "NaN block scale");
    CHECK(fp8mix_gemm_nvfp4(M, N, 40, qa, K / 2, sa, da, qb, K / 2, sb, db, c1, N) == FP8MIX_ERR_BAD_SHAPE, "K %% 16");
    CHECK(fp8mix_gemm_nvfp4(M, N, K, qa, K / 2, sa, -1.0f, qb, K / 2, sb, db, c1, N) == FP8MIX_ERR_BAD_SCALE,
          "negative scale");
    CHECK(fp8mix_gemm_nvfp4(M, N, K, NULL, K / 2, sa, da, qb, K / 2, sb, db, c1, N) == FP8MIX_ERR_NULL_POINTER,
          "NULL a");
    free(a); free(b); free(qa); free(qb); free(sa); free(sb); free(c1); free(c2); free(ya); free(yb);
}

static void test_rht(void)
{
    int64_t rows = 5, cols = 48;
    float x[5 * 48], z[5 * 48], y[5 * 48], w[5 * 48];
    fill(x, rows * cols, 6);
    fill(z, rows * cols, 6);
    uint16_t signs = 0xB3C5;
    CHECK(fp8mix_rht16(x, rows, cols, cols, signs, y, cols) == FP8MIX_OK, "rht");
    int ok = 1;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t g = 0; g < cols; g += 16)
            for (int r = 0; r < 16; r++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < 16; c++) {
                    int h = 1, v = r & c;
                    while (v) { h = -h; v &= v - 1; }
                    double s = ((signs >> c) & 1) ? -1.0 : 1.0;
                    ref += h * s * x[i * cols + g + c] / 4.0;
                    mag += fabs(x[i * cols + g + c]) / 4.0;
                }
                ok &= fabs(y[i * cols + g + r] - ref) <= 16 * FLT_EPSILON * mag;
            }
    CHECK(ok, "rht against the float64 matrix product");
    /* in place gives the same bits; dot products are kept (orthogonality) */
    memcpy(w, x, sizeof x);
    fp8mix_rht16(w, rows, cols, cols, signs, w, cols);
    CHECK(!memcmp(w, y, sizeof y), "in place");
    fp8mix_rht16(z, rows, cols, cols, signs, w, cols);
    double d0 = 0, d1 = 0, mag = 0;
    for (int64_t t = 0; t < cols; t++) {
        d0 += (double)x[t] * z[cols + t];
        d1 += (double)y[t] * w[cols + t];
        mag += fabs((double)x[t] * z[cols + t]);
    }
    CHECK(fabs(d0 - d1) <= 64 * FLT_EPSILON * mag, "dot products kept: %g vs %g", d0, d1);
    CHECK(fp8mix_rht16(x, rows, 40, cols, signs, y, cols) == FP8MIX_ERR_BAD_SHAPE, "cols %% 16");
    CHECK(fp8mix_rht16(NULL, rows, cols, cols, signs, y, cols) == FP8MIX_ERR_NULL_POINTER, "NULL x");
}

int main(void)
{
    test_codes();
    test_stochastic();
    test_quantize();
    test_gemm();
    test_rht();
    return check_report("test_nvfp4");
}
