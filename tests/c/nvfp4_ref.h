/* nvfp4_ref.h — the NVFP4 reference shared by tests/c/test_nvfp4.c and
 * tests/fuzz/fuzz_nvfp4.c, written from the OCP Microscaling v1.0 bit formulas
 * (E2M1, E4M3 values; encoding by searching the nearest value in float64, ties
 * to the even code, saturating) and Transformer Engine's float32 scale
 * arithmetic spelled out step by step.  Shares nothing with the core but the
 * public API (the stochastic path uses fp8mix_e2m1_encode_ref and the Philox
 * words, tested on their own). */
#ifndef FP8MIX_NVFP4_REF_H
#define FP8MIX_NVFP4_REF_H
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "fp8mix.h"

static const double k_mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

static inline double ref_e2m1_value(uint8_t c) { return (c & 8) ? -k_mag[c & 7] : k_mag[c & 7]; }

/* Nearest E2M1 code (ties to the even code), saturating at 6. */
static inline uint8_t ref_e2m1(double v)
{
    double a = fabs(v);
    if (a >= 6) return (uint8_t)(7 | (signbit(v) ? 8 : 0)); /* inf included */
    int best = 0;
    for (int c = 1; c < 8; c++) {
        double d = fabs(a - k_mag[c]), db = fabs(a - k_mag[best]);
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)(best | (signbit(v) ? 8 : 0));
}

static inline double ref_e4m3_value(uint8_t c)
{
    int ex = (c >> 3) & 15, man = c & 7;
    if (ex == 15 && man == 7) return NAN;
    double v = ex == 0 ? ldexp(man, -9) : ldexp(8 + man, ex - 10);
    return (c & 0x80) ? -v : v;
}

/* Nearest positive E4M3 code (ties to even), saturating at 448. */
static inline uint8_t ref_e4m3(double v)
{
    if (v >= 448) return 0x7E; /* inf included */
    int best = 0;
    for (int c = 1; c <= 0x7E; c++) {
        double d = fabs(v - ref_e4m3_value((uint8_t)c)), db = fabs(v - ref_e4m3_value((uint8_t)best));
        if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    return (uint8_t)best;
}

/* The reference quantisation, TE's arithmetic in float32 step by step. */
static inline void nvfp4_ref_quantize(const float *x, int64_t rows, int64_t cols, int tile, float gamax, int sr, uint64_t seed,
                         uint64_t off, uint8_t *q, uint8_t *bs, float *sdec_out)
{
    float s_enc = 1.0f;
    if (gamax > 0 && isfinite(gamax)) {
        volatile float t = 2688.0f / gamax;
        s_enc = isinf(t) ? FLT_MAX : t;
    }
    volatile float s_dec = 1.0f / s_enc;
    *sdec_out = s_dec;
    volatile float inv6 = 1.0f / 6.0f;
    volatile float st = s_enc * inv6;
    int64_t nb = cols / 16;
    for (int64_t r0 = 0; r0 < rows; r0 += tile)
        for (int64_t b = 0; b < nb; b++) {
            int64_t r1 = r0 + tile < rows ? r0 + tile : rows;
            double am = 0;
            int bad = 0;
            for (int64_t i = r0; i < r1; i++)
                for (int t = 0; t < 16; t++) {
                    float v = x[i * cols + b * 16 + t];
                    if (!isfinite(v)) bad = 1;
                    else if (fabs(v) > am) am = fabs(v);
                }
            uint8_t d = 0x7F;
            volatile float enc = 0;
            if (!bad) {
                volatile float ds = (float)am * st;
                d = ref_e4m3(ds);
                volatile float den = (float)ref_e4m3_value(d) * s_dec;
                enc = 1.0f / den;
                if (!(enc <= FLT_MAX)) enc = FLT_MAX;
            }
            for (int64_t i = r0; i < r1; i++) {
                bs[i * nb + b] = d;
                for (int t = 0; t < 16; t++) {
                    int64_t j = b * 16 + t;
                    uint8_t code = 0;
                    if (!bad) {
                        volatile float y = x[i * cols + j] * enc;
                        if (sr)
                            code = fp8mix_e2m1_encode_ref(y, FP8MIX_ROUND_STOCHASTIC,
                                                          fp8mix_random_word(seed, off, (uint64_t)(i * cols + j)));
                        else
                            code = ref_e2m1(y);
                    }
                    uint8_t *p = &q[i * (cols / 2) + j / 2];
                    *p = (j & 1) ? (uint8_t)((*p & 0x0F) | (code << 4)) : (uint8_t)((*p & 0xF0) | code);
                }
            }
        }
}

#endif
