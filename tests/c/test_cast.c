/*
 * test_cast.c — the casting core without Python: Philox known answers, the
 * scalar encoder's invariants, every SIMD variant bit-exact against the
 * scalar path over a stride of the float32 bit space (every exponent; set
 * FP8MIX_FULL=1 for all 2^32 patterns), every bf16/f16 pattern, the entry
 * points' granularities, transpose, amax rules, thread-count independence,
 * scale computation and bad arguments; and dispatch.c's tables (the scalar
 * level runs the _ref kernels, so every comparison "against the scalar path"
 * through the ISA limit is one against the oracle).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fused.h"
#include "gemm_internal.h"
#include "internal.h"
#include "stats_kernels.h"

static const fp8mix_isa ISAS[] = {FP8MIX_ISA_AVX2, FP8MIX_ISA_AVX512};

/* Runs of each SIMD level compared with the scalar path (issue #13: a sweep
 * that compared nothing must say so, and fail where a variant should have run). */
static long compared[FP8MIX_ISA_AVX512BF16 + 1];

static void test_philox(void)
{
    /* Known-answer vectors of Random123 (kat_vectors, philox4x32_10). */
    struct { uint32_t c[4], k[2], o[4]; } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int i = 0; i < 3; i++) {
        uint32_t o[4];
        fp8mix_philox4x32_10(kat[i].c, kat[i].k, o);
        for (int w = 0; w < 4; w++) CHECK(o[w] == kat[i].o[w], "kat %d word %d: %08x", i, w, o[w]);
    }
    /* the bulk generator agrees with the per-element definition */
    uint32_t r[37];
    fp8mix_random_words(0x1234567890abcdefull, 5, 37, r);
    for (int i = 0; i < 37; i++)
        CHECK(r[i] == fp8mix_random_word(0x1234567890abcdefull, 5, (uint64_t)i), "word %d", i);
}

static void test_encode_ref(void)
{
    for (int f = 0; f < 2; f++) {
        fp8mix_format fmt = (fp8mix_format)f;
        for (int c = 0; c < 256; c++) {
            float v = fp8mix_decode_ref((uint8_t)c, fmt);
            if (isnan(v) || isinf(v)) continue;
            for (int sat = 0; sat < 2; sat++)
                CHECK(fp8mix_encode_ref(v, fmt, sat, FP8MIX_ROUND_NEAREST, 0) == c,
                      "fmt %d code %02x round trip", f, c);
            /* exact values never move under stochastic rounding */
            CHECK(fp8mix_encode_ref(v, fmt, 1, FP8MIX_ROUND_STOCHASTIC, 0) == c, "sr exact %02x", c);
        }
    }
    /* the documented edge cases */
    CHECK(fp8mix_encode_ref(464.0f, FP8MIX_E4M3, 0, FP8MIX_ROUND_NEAREST, 0) == 0x7E, "464 ties to 448");
    CHECK(fp8mix_encode_ref(nextafterf(464.0f, 1e9f), FP8MIX_E4M3, 0, FP8MIX_ROUND_NEAREST, 0) == 0x7F,
          "above 464 is NaN");
    CHECK(fp8mix_encode_ref(1e9f, FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0) == 0x7E, "saturate");
    CHECK(fp8mix_encode_ref(-INFINITY, FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0) == 0xFE, "-inf sat");
    CHECK(fp8mix_encode_ref(INFINITY, FP8MIX_E5M2, 0, FP8MIX_ROUND_NEAREST, 0) == 0x7C, "inf e5m2");
    CHECK(fp8mix_encode_ref(61440.0f, FP8MIX_E5M2, 0, FP8MIX_ROUND_NEAREST, 0) == 0x7C, "61440 tie up");
    CHECK(fp8mix_encode_ref(61440.0f, FP8MIX_E5M2, 1, FP8MIX_ROUND_NEAREST, 0) == 0x7B, "61440 sat");
    CHECK(fp8mix_encode_ref(-NAN, FP8MIX_E5M2, 1, FP8MIX_ROUND_NEAREST, 0) == 0xFE, "-nan e5m2");
    CHECK(fp8mix_encode_ref(ldexpf(1, -10), FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0) == 0x00, "2^-10 ties to 0");
    CHECK(fp8mix_encode_ref(ldexpf(3, -11), FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0) == 0x01, "1.5*2^-10 up");
    CHECK(fp8mix_encode_ref(-0.0f, FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0) == 0x80, "-0");
    /* stochastic: r = 0 always rounds up an inexact value, r = max never */
    CHECK(fp8mix_encode_ref(1.0625f, FP8MIX_E4M3, 1, FP8MIX_ROUND_STOCHASTIC, 0) == 0x39, "sr up");
    CHECK(fp8mix_encode_ref(1.0625f, FP8MIX_E4M3, 1, FP8MIX_ROUND_STOCHASTIC, 0xFFFFFFFFu) == 0x38,
          "sr down");
    CHECK(fp8mix_encode_ref(1.0625f, FP8MIX_E4M3, 1, FP8MIX_ROUND_STOCHASTIC, 0x7FFFFFFFu) == 0x39,
          "sr half");
    CHECK(fp8mix_encode_ref(1.0625f, FP8MIX_E4M3, 1, FP8MIX_ROUND_STOCHASTIC, 0x80000000u) == 0x38,
          "sr half+");
}

/* Cast n float32 patterns through one segment kernel of the given ISA. */
static void run_seg(fp8mix_isa isa, const void *x, fp8mix_dtype xt, int64_t n, float scale,
                    uint8_t *q, uint32_t *amax, const fp8_params *p, uint64_t seed, uint64_t start)
{
    fp8mix_set_max_isa(isa);
    compared[fp8mix_active_isa()]++;
    fp8mix_kernels_active()->cast_seg(x, xt, n, scale, q, amax, p, seed, start);
}

static void test_simd_sweep(void)
{
    int full = getenv("FP8MIX_FULL") != NULL;
    uint64_t stride = full ? 1 : 997; /* prime: every exponent, mantissa bits vary */
    enum { CH = 1 << 16 };
    uint32_t *xs = malloc(CH * 4);
    uint8_t *ref = malloc(CH), *got = malloc(CH);
    const float scales[] = {1.0f, 0.3f * 7.0f, 1.0f / 1024.0f};
    long mismatches = 0;
    for (int f = 0; f < 2; f++)
        for (int sat = 0; sat < 3; sat++) /* 2: saturating with inf_to_nan */
            for (int sr = 0; sr < 2; sr++) {
                fp8mix_cast_opts o = {(fp8mix_format)f, sat > 0, sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST,
                                      42, 0, sat == 2};
                fp8_params p;
                fp8_params_init(&p, &o);
                for (int si = 0; si < 3; si++) {
                    if (si > 0 && sat == 0) continue;
                    uint64_t b = (uint64_t)f * 31 + (uint64_t)sr * 7; /* vary the phase */
                    while (b < (1ull << 32)) {
                        int64_t n = 0;
                        for (; n < CH - 3 && b < (1ull << 32); n++, b += stride) xs[n] = (uint32_t)b;
                        uint32_t am_ref = 0;
                        run_seg(FP8MIX_ISA_SCALAR, xs, FP8MIX_F32, n, scales[si], ref, &am_ref, &p, 7, b);
                        for (size_t k = 0; k < sizeof ISAS / sizeof ISAS[0]; k++) {
                            if (fp8mix_cpu_isa() < ISAS[k]) continue;
                            uint32_t am = 0;
                            run_seg(ISAS[k], xs, FP8MIX_F32, n, scales[si], got, &am, &p, 7, b);
                            if (memcmp(ref, got, (size_t)n) || am != am_ref) mismatches++;
                        }
                    }
                }
            }
    CHECK(mismatches == 0, "%ld chunks differ between SIMD and scalar", mismatches);
    /* the scalar segment kernel agrees with fp8mix_encode_ref element by element */
    for (int64_t i = 0; i < CH; i++) xs[i] = (uint32_t)(i * 65537u + 12345u);
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_STOCHASTIC, 99, 0, 0};
    fp8_params p;
    fp8_params_init(&p, &o);
    uint32_t am = 0;
    run_seg(FP8MIX_ISA_SCALAR, xs, FP8MIX_F32, CH, 2.0f, ref, &am, &p, 99, 1000);
    long bad = 0;
    for (int64_t i = 0; i < CH; i++) {
        float y = bits_f32(xs[i]) * 2.0f;
        uint8_t e = fp8mix_encode_ref(y, FP8MIX_E4M3, 1, FP8MIX_ROUND_STOCHASTIC,
                                      fp8mix_random_word(99, 1000, (uint64_t)i));
        bad += e != ref[i];
    }
    CHECK(bad == 0, "%ld scalar kernel vs ref", bad);
    free(xs);
    free(ref);
    free(got);
}

/* The values where encoders go wrong, through every SIMD level's fast and
 * general loops: every FP8 value of both formats, the midpoints between
 * neighbours (ties) and the float32 values next to those, +-0, +-inf, NaNs,
 * float32 extremes and denormals. */
static void test_simd_specials(void)
{
    enum { MAXN = 8192 };
    float *xs = malloc(MAXN * sizeof(float));
    uint8_t ref[MAXN], got[MAXN];
    int n = 0;
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 255; c++) {
            float v = fp8mix_decode_ref((uint8_t)c, (fp8mix_format)f), w = fp8mix_decode_ref((uint8_t)(c + 1), (fp8mix_format)f);
            if (!isfinite(v)) continue;
            float mid = isfinite(w) && (c & 0x7F) != 0x7F ? v + (w - v) * 0.5f : v * 1.03125f;
            float cand[] = {v, nextafterf(v, INFINITY), nextafterf(v, -INFINITY), mid, nextafterf(mid, INFINITY),
                            nextafterf(mid, -INFINITY)};
            for (int k = 0; k < 6; k++) xs[n++] = cand[k];
        }
    const float extra[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, bits_f32(0x7F800001u), bits_f32(0xFFC00123u),
                           FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, bits_f32(1u), bits_f32(0x80000001u), 464.0f, 480.0f,
                           61440.0f, 65536.0f, 1e30f};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) xs[n++] = extra[k];
    long bad = 0;
    for (int f = 0; f < 2; f++)
        for (int sat = 0; sat < 3; sat++)
            for (int sr = 0; sr < 2; sr++) {
                fp8mix_cast_opts o = {(fp8mix_format)f, sat > 0, sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST,
                                      11, 0, sat == 2};
                fp8_params p;
                fp8_params_init(&p, &o);
                uint32_t am_ref = 0;
                run_seg(FP8MIX_ISA_SCALAR, xs, FP8MIX_F32, n, 1.0f, ref, &am_ref, &p, 11, 0);
                for (size_t k = 0; k < sizeof ISAS / sizeof ISAS[0]; k++) {
                    if (fp8mix_cpu_isa() < ISAS[k]) continue;
                    uint32_t am = 0;
                    run_seg(ISAS[k], xs, FP8MIX_F32, n, 1.0f, got, &am, &p, 11, 0);
                    for (int i = 0; i < n; i++) bad += got[i] != ref[i];
                    bad += am != am_ref;
                }
            }
    CHECK(bad == 0 && n > 3000, "%ld special-value codes differ between SIMD and scalar (of %d values)", bad, n);
    free(xs);
}

/* inf_to_nan: an infinite input gives NaN (sign kept) on every ISA and for
 * every rounding, while a finite value whose PRODUCT overflows still saturates,
 * and NaN stays NaN.  Expected bytes written from the header's rules. */
static void test_inf_to_nan(void)
{
    enum { N = 137 }; /* the 32/64-wide fast loops, then a tail */
    const float big = 3.0e38f;
    float x[N];
    for (int i = 0; i < N; i++) x[i] = (float)(i % 5) - 2.0f;
    x[0] = INFINITY; x[5] = -INFINITY; x[9] = NAN; x[17] = big; x[18] = -big; x[33] = INFINITY; x[36] = -INFINITY;
    x[130] = INFINITY; x[133] = -INFINITY; /* in the tail */
    for (int f = 0; f < 2; f++)
        for (int sr = 0; sr < 2; sr++) {
            const uint8_t nan = f == 0 ? 0x7F : 0x7E, mx = f == 0 ? 0x7E : 0x7B;
            fp8mix_cast_opts o = {(fp8mix_format)f, 1, sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST, 5, 0, 1};
            fp8_params p;
            fp8_params_init(&p, &o);
            for (size_t k = 0; k < sizeof ISAS / sizeof ISAS[0] + 1; k++) {
                fp8mix_isa isa = k == 0 ? FP8MIX_ISA_SCALAR : ISAS[k - 1];
                if (fp8mix_cpu_isa() < isa) continue;
                uint8_t q[N];
                uint32_t am = 0;
                run_seg(isa, x, FP8MIX_F32, N, 10.0f, q, &am, &p, 5, 0); /* 10 * 3e38 overflows float32 */
                CHECK(q[0] == nan && q[33] == nan && q[130] == nan, "%s: +inf -> 0x%02x/0x%02x/0x%02x",
                      fp8mix_isa_name(isa), q[0], q[33], q[130]);
                CHECK(q[5] == (nan | 0x80) && q[36] == (nan | 0x80) && q[133] == (nan | 0x80), "%s: -inf -> 0x%02x",
                      fp8mix_isa_name(isa), q[5]);
                CHECK((q[9] & 0x7F) == nan, "%s: NaN -> 0x%02x", fp8mix_isa_name(isa), q[9]);
                CHECK(q[17] == mx && q[18] == (mx | 0x80), "%s: finite overflow -> 0x%02x/0x%02x (saturate)",
                      fp8mix_isa_name(isa), q[17], q[18]);
                o.inf_to_nan = 0;
                fp8_params_init(&p, &o);
                run_seg(isa, x, FP8MIX_F32, N, 10.0f, q, &am, &p, 5, 0);
                CHECK(q[0] == mx && q[5] == (mx | 0x80), "%s: without inf_to_nan, inf saturates", fp8mix_isa_name(isa));
                o.inf_to_nan = 1;
                fp8_params_init(&p, &o);
            }
        }
}

static void test_half_inputs(void)
{
    uint16_t *h = malloc(65536 * 2);
    uint8_t *ref = malloc(65536), *got = malloc(65536);
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    long mismatches = 0;
    for (int t = 1; t <= 2; t++)
        for (int f = 0; f < 2; f++)
            for (int sr = 0; sr < 2; sr++) {
                fp8mix_cast_opts o = {(fp8mix_format)f, 1, sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST, 3, 0, 0};
                fp8_params p;
                fp8_params_init(&p, &o);
                uint32_t am_ref = 0;
                run_seg(FP8MIX_ISA_SCALAR, h, (fp8mix_dtype)t, 65533, 1.5f, ref, &am_ref, &p, 3, 0);
                for (size_t k = 0; k < 2; k++) {
                    if (fp8mix_cpu_isa() < ISAS[k]) continue;
                    uint32_t am = 0;
                    run_seg(ISAS[k], h, (fp8mix_dtype)t, 65533, 1.5f, got, &am, &p, 3, 0);
                    mismatches += memcmp(ref, got, 65533) != 0 || am != am_ref;
                }
            }
    CHECK(mismatches == 0, "%ld half-input configs differ", mismatches);
    /* dequantisation to every output type, every code */
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 3; t++) {
            uint8_t codes[259];
            for (int i = 0; i < 259; i++) codes[i] = (uint8_t)i;
            uint8_t o_ref[259 * 4], o_got[259 * 4];
            fp8mix_set_max_isa(FP8MIX_ISA_SCALAR);
            fp8mix_kernels_active()->dequant_seg(codes, 259, fp8mix_decode_table((fp8mix_format)f), 0.75f,
                                                 o_ref, (fp8mix_dtype)t);
            for (size_t k = 0; k < 2; k++) {
                if (fp8mix_cpu_isa() < ISAS[k]) continue;
                fp8mix_set_max_isa(ISAS[k]);
                compared[fp8mix_active_isa()]++;
                fp8mix_kernels_active()->dequant_seg(codes, 259, fp8mix_decode_table((fp8mix_format)f), 0.75f,
                                                     o_got, (fp8mix_dtype)t);
                CHECK(!memcmp(o_ref, o_got, 259 * dtype_size((fp8mix_dtype)t)), "dequant fmt %d type %d isa %d",
                      f, t, (int)ISAS[k]);
            }
        }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    free(h);
    free(ref);
    free(got);
}

static float urand(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / 16777216.0f * 2.0f - 1.0f;
}

static void test_entry_points(void)
{
    const int64_t R = 300, C = 333, LD = 340;
    float *x = malloc(sizeof(float) * R * LD);
    uint32_t s = 1;
    for (int64_t i = 0; i < R * LD; i++) x[i] = urand(&s) * 100.0f;
    x[5 * LD + 7] = -1234.5f;
    const fp8mix_granularity grans[] = {FP8MIX_GRAN_TENSOR, FP8MIX_GRAN_ROW, FP8MIX_GRAN_BLOCK, FP8MIX_GRAN_BLOCK2D};
    uint8_t *q = malloc(R * C), *q2 = malloc(R * C), *qt = malloc(C * R);
    float *scales = malloc(sizeof(float) * R * 3);
    for (int g = 0; g < 4; g++) {
        int64_t ns = fp8mix_scale_count(grans[g], R, C);
        for (int64_t t = 0; t < ns; t++) scales[t] = 0.5f + (float)t * 0.01f;
        fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
        float am = 0;
        CHECK(fp8mix_cast(x, FP8MIX_F32, R, C, LD, grans[g], scales, q, C, qt, R, &am, &o) == FP8MIX_OK, "cast");
        CHECK(am == 1234.5f, "amax %g", am);
        long bad = 0, badt = 0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                float sc = scales[scale_index(grans[g], i, j, C)];
                bad += q[i * C + j] != fp8mix_encode_ref(x[i * LD + j] * sc, FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0);
                badt += qt[j * R + i] != q[i * C + j];
            }
        CHECK(bad == 0 && badt == 0, "gran %d: %ld wrong, %ld wrong in transpose", g, bad, badt);
        /* only the transpose; and one thread vs many */
        memset(qt, 0, (size_t)R * C);
        fp8mix_set_num_threads(1);
        CHECK(fp8mix_cast(x, FP8MIX_F32, R, C, LD, grans[g], scales, NULL, 0, qt, R, NULL, &o) == FP8MIX_OK, "qt");
        fp8mix_set_num_threads(0);
        badt = 0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) badt += qt[j * R + i] != q[i * C + j];
        CHECK(badt == 0, "qt-only gran %d", g);
        /* amax per granularity, and quantize_current equal to amax -> scale -> cast */
        float *am_g = malloc(sizeof(float) * ns), *am_c = malloc(sizeof(float) * ns);
        float *sc = malloc(sizeof(float) * ns), *inv = malloc(sizeof(float) * ns), *inv_c = malloc(sizeof(float) * ns);
        CHECK(fp8mix_amax(x, FP8MIX_F32, R, C, LD, grans[g], am_g) == FP8MIX_OK, "amax");
        bad = 0;
        for (int64_t t = 0; t < ns; t++) am_c[t] = 0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                int64_t t = scale_index(grans[g], i, j, C);
                if (fabsf(x[i * LD + j]) > am_c[t]) am_c[t] = fabsf(x[i * LD + j]);
            }
        for (int64_t t = 0; t < ns; t++) bad += am_c[t] != am_g[t];
        CHECK(bad == 0, "amax gran %d", g);
        fp8mix_compute_scale(am_g, ns, FP8MIX_E5M2, 1, 1, 0.0f, sc, inv);
        fp8mix_cast_opts o2 = {FP8MIX_E5M2, 1, FP8MIX_ROUND_STOCHASTIC, 5, 64, 0};
        CHECK(fp8mix_cast(x, FP8MIX_F32, R, C, LD, grans[g], sc, q, C, NULL, 0, NULL, &o2) == FP8MIX_OK, "c");
        CHECK(fp8mix_quantize_current(x, FP8MIX_F32, R, C, LD, grans[g], 1, 1, 0.0f, q2, C, NULL, 0, inv_c,
                                      am_c, &o2) == FP8MIX_OK, "qc");
        CHECK(!memcmp(q, q2, (size_t)R * C) && !memcmp(inv, inv_c, sizeof(float) * ns) &&
                  !memcmp(am_g, am_c, sizeof(float) * ns), "quantize_current gran %d", g);
        /* dequantize inverts within half an ulp (exact for power-of-two scales) */
        float *dq = malloc(sizeof(float) * R * C);
        CHECK(fp8mix_dequantize(q2, FP8MIX_E5M2, R, C, C, grans[g], inv_c, dq, FP8MIX_F32, C) == FP8MIX_OK, "dq");
        bad = 0;
        for (int64_t i = 0; i < R; i++)
            for (int64_t j = 0; j < C; j++) {
                float v = fp8mix_decode_ref(q2[i * C + j], FP8MIX_E5M2) * inv_c[scale_index(grans[g], i, j, C)];
                bad += dq[i * C + j] != v;
            }
        CHECK(bad == 0, "dequantize gran %d", g);
        free(dq);
        free(am_g); free(am_c); free(sc); free(inv); free(inv_c);
    }
    /* amax NaN / inf rules */
    float y[5] = {1, -INFINITY, 3, NAN, 2};
    float am;
    fp8mix_amax(y, FP8MIX_F32, 1, 5, 5, FP8MIX_GRAN_TENSOR, &am);
    CHECK(isnan(am), "nan wins");
    fp8mix_amax(y, FP8MIX_F32, 1, 3, 3, FP8MIX_GRAN_TENSOR, &am);
    CHECK(isinf(am) && am > 0, "inf next");
    fp8mix_amax(y, FP8MIX_F32, 0, 3, 3, FP8MIX_GRAN_TENSOR, &am);
    CHECK(am == 0.0f, "empty amax 0");
    /* bad arguments */
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    float bads[] = {0.0f, -1.0f, NAN, INFINITY};
    for (int i = 0; i < 4; i++)
        CHECK(fp8mix_cast(x, FP8MIX_F32, 2, 2, 2, FP8MIX_GRAN_TENSOR, &bads[i], q, 2, NULL, 0, NULL, &o) ==
                  FP8MIX_ERR_BAD_SCALE, "bad scale %g", bads[i]);
    float one = 1.0f;
    CHECK(fp8mix_cast(x, FP8MIX_F32, 2, 4, 3, FP8MIX_GRAN_TENSOR, &one, q, 4, NULL, 0, NULL, &o) == FP8MIX_ERR_BAD_SHAPE, "ld");
    CHECK(fp8mix_cast(x, (fp8mix_dtype)9, 2, 2, 2, FP8MIX_GRAN_TENSOR, &one, q, 2, NULL, 0, NULL, &o) == FP8MIX_ERR_BAD_ENUM, "dt");
    CHECK(fp8mix_cast(x, FP8MIX_F32, 2, 2, 2, FP8MIX_GRAN_TENSOR, &one, NULL, 2, NULL, 0, NULL, &o) == FP8MIX_ERR_NULL_POINTER, "np");
    o.fmt = (fp8mix_format)5;
    CHECK(fp8mix_cast(x, FP8MIX_F32, 2, 2, 2, FP8MIX_GRAN_TENSOR, &one, q, 2, NULL, 0, NULL, &o) == FP8MIX_ERR_BAD_ENUM, "fmt");
    free(x); free(q); free(q2); free(qt); free(scales);
}

static void test_compute_scale(void)
{
    float am[] = {0.0f, NAN, INFINITY, 448.0f, 1.0f, 3.0f, 1e-38f, 1e-45f};
    float s[8], inv[8];
    CHECK(fp8mix_compute_scale(am, 8, FP8MIX_E4M3, 0, 0, 0.0f, s, inv) == FP8MIX_OK, "ok");
    CHECK(s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1 && s[4] == 448 && s[5] == 448.0f / 3.0f, "values");
    CHECK(s[7] == FLT_MAX && inv[7] == 1.0f / FLT_MAX, "overflowing scale becomes FLT_MAX");
    CHECK(fp8mix_compute_scale(am, 8, FP8MIX_E4M3, 2, 1, 0.0f, s, inv) == FP8MIX_OK, "ok");
    CHECK(s[4] == 64.0f && s[5] == 32.0f && inv[5] == 1.0f / 32.0f, "pow2 with margin: %g %g", s[4], s[5]);
    CHECK(s[7] == 0x1p127f, "pow2 cap");
    float eps = 0.5f, a2 = 0.25f;
    fp8mix_compute_scale(&a2, 1, FP8MIX_E5M2, 0, 0, eps, s, NULL);
    CHECK(s[0] == 57344.0f / 0.5f, "epsilon floor");
    CHECK(fp8mix_compute_scale(am, 1, FP8MIX_E4M3, -1, 0, 0.0f, s, inv) == FP8MIX_ERR_BAD_ARG, "margin");
}

static void test_transpose(void)
{
    /* every size below, at and between the 8x8 tile edges, with padded strides */
    uint8_t src[40 * 45], ref[45 * 43], got[45 * 43];
    for (int i = 0; i < 40 * 45; i++) src[i] = (uint8_t)(i * 37 + 11);
    long bad = 0;
    for (int r = 0; r <= 40; r++)
        for (int c = 0; c <= 40; c += (c < 20 ? 1 : 7)) {
            memset(ref, 0xAA, sizeof ref);
            memset(got, 0xAA, sizeof got);
            fp8mix_transpose_u8_ref(src, 45, ref, 43, r, c);
            fp8mix_transpose_u8(src, 45, got, 43, r, c);
            bad += memcmp(ref, got, sizeof ref) != 0;
        }
    CHECK(bad == 0, "%ld transpose shapes differ from the reference", bad);
    /* the whole-line tile of cast+transpose, plain and streamed, into an
     * aligned and a misaligned destination */
    enum { TR = 64, TC = 70, LDS = 75, LDD = 80 };
    uint8_t *s2 = malloc(TR * LDS), *r2 = malloc(TC * LDD + 16), *g2 = malloc(TC * LDD + 16);
    for (int i = 0; i < TR * LDS; i++) s2[i] = (uint8_t)(i * 101 + 7);
    bad = 0;
    for (int rows = 0; rows <= TR; rows += 8)
        for (int cols = 0; cols <= TC; cols += 9)
            for (int stream = 0; stream < 2; stream++)
                for (int off = 0; off < 2; off++) {
                    memset(r2, 0xAA, TC * LDD + 16);
                    memset(g2, 0xAA, TC * LDD + 16);
                    fp8mix_transpose_u8_ref(s2, LDS, r2 + off, LDD, rows, cols);
                    fp8mix_transpose_u8_tile(s2, LDS, g2 + off, LDD, rows, cols, stream);
                    bad += memcmp(r2, g2, TC * LDD + 16) != 0;
                }
    CHECK(bad == 0, "%ld transpose tiles differ from the reference", bad);
    free(s2); free(r2); free(g2);
}

/* cast+transpose on a tensor large enough for the streamed qt, several threads */
static void test_big_transpose(void)
{
    const int64_t R = 1000, C = 2304;
    float *x = malloc(sizeof(float) * R * C);
    uint32_t s = 3;
    for (int64_t i = 0; i < R * C; i++) x[i] = urand(&s) * 500.0f;
    uint8_t *q = malloc(R * C), *qt = malloc(R * C);
    float sc = 0.75f;
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    CHECK(fp8mix_cast(x, FP8MIX_F32, R, C, C, FP8MIX_GRAN_TENSOR, &sc, q, C, qt, R, NULL, &o) == FP8MIX_OK, "big");
    long bad = 0, badt = 0;
    for (int64_t i = 0; i < R; i++)
        for (int64_t j = 0; j < C; j++) {
            bad += q[i * C + j] != fp8mix_encode_ref(x[i * C + j] * sc, FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0);
            badt += qt[j * R + i] != q[i * C + j];
        }
    CHECK(bad == 0 && badt == 0, "big cast+transpose: %ld wrong, %ld wrong in qt", bad, badt);
    free(x); free(q); free(qt);
}

/* dispatch.c's choice at each ISA limit this CPU reaches: the scalar level is
 * the _ref kernels of every family, each x86 level its own variants.  (Above
 * AVX-512 the GEMM kernel depends on a timing; test_gemm runs every one.) */
static void test_dispatch_tables(void)
{
    fp8mix_set_max_isa(FP8MIX_ISA_SCALAR);
    const fp8mix_kernels *k = fp8mix_kernels_active();
    const fp8mix_fused_kernels *f = fp8mix_fused_kernels_active();
    const fp8mix_gemm_ukernel *uk = fp8mix_gemm_ukernel_active();
    CHECK(k->cast_seg == fp8mix_cast_seg_ref && k->dequant_seg == fp8mix_dequant_seg_ref &&
              k->widen_t == fp8mix_widen_t_ref, "scalar: the cast kernels are the _ref ones");
    CHECK(fp8mix_stats_kernel_active() == fp8mix_stats_seg_ref, "scalar: the stats kernel is the _ref one");
    CHECK(f->widen == fp8mix_fused_widen_ref && f->lane_sums == fp8mix_fused_lane_sums_ref &&
              f->norm_apply == fp8mix_fused_norm_apply_ref && f->act == fp8mix_fused_act_ref,
          "scalar: the fused kernels are the _ref ones");
    CHECK(uk->fn == fp8mix_gemm_ukernel_f32_4x16_ref && uk->pack_krows == fp8mix_gemm_pack_krows_ref &&
              uk->pack_kcols == fp8mix_gemm_pack_kcols_ref && uk->scale_rows == fp8mix_gemm_scale_rows_ref &&
              !uk->fn_final && !uk->fn_blocks,
          "scalar: the GEMM kernels are the _ref ones");
#if FP8MIX_X86
    if (fp8mix_cpu_isa() >= FP8MIX_ISA_AVX2) {
        fp8mix_set_max_isa(FP8MIX_ISA_AVX2);
        k = fp8mix_kernels_active();
        f = fp8mix_fused_kernels_active();
        uk = fp8mix_gemm_ukernel_active();
        CHECK(k->cast_seg == fp8mix_cast_seg__avx2 && k->dequant_seg == fp8mix_dequant_seg__avx2 &&
                  k->widen_t == fp8mix_widen_t__avx2, "avx2: the cast kernels");
        CHECK(fp8mix_stats_kernel_active() == fp8mix_stats_seg__avx2, "avx2: the stats kernel");
        CHECK(f->widen == fp8mix_fused_widen__avx2 && f->lane_sums == fp8mix_fused_lane_sums__avx2 &&
                  f->norm_apply == fp8mix_fused_norm_apply__avx2 && f->act == fp8mix_fused_act__avx2,
              "avx2: the fused kernels");
        CHECK(uk->fn == fp8mix_gemm_ukernel_f32_6x16__avx2 && uk->pack_krows == fp8mix_gemm_pack_krows__avx2 &&
                  uk->scale_rows == fp8mix_gemm_scale_rows__avx2 &&
                  uk->fn_final == fp8mix_gemm_ukernel_final_f32_6x16__avx2,
              "avx2: the GEMM kernels");
    }
    if (fp8mix_cpu_isa() >= FP8MIX_ISA_AVX512) {
        fp8mix_set_max_isa(FP8MIX_ISA_AVX512);
        k = fp8mix_kernels_active();
        f = fp8mix_fused_kernels_active();
        CHECK(k->cast_seg == fp8mix_cast_seg__avx512 && k->dequant_seg == fp8mix_dequant_seg__avx512 &&
                  k->widen_t == fp8mix_widen_t__avx2, "avx512: the cast kernels (AVX2's widen_t)");
        CHECK(fp8mix_stats_kernel_active() == fp8mix_stats_seg__avx512, "avx512: the stats kernel");
        CHECK(f->widen == fp8mix_fused_widen__avx512 && f->lane_sums == fp8mix_fused_lane_sums__avx512 &&
                  f->norm_apply == fp8mix_fused_norm_apply__avx512 && f->act == fp8mix_fused_act__avx512,
              "avx512: the fused kernels");
        CHECK(fp8mix_gemm_ukernel_active()->fn == fp8mix_gemm_ukernel_f32_14x32__avx512, "avx512: the GEMM kernel");
    }
#endif
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
}

static int parse_isa_name(const char *s)
{
    for (int i = FP8MIX_ISA_SCALAR; i <= FP8MIX_ISA_AVX512BF16; i++)
        if (!strcmp(s, fp8mix_isa_name((fp8mix_isa)i))) return i;
    return -1;
}

/* What the SIMD comparisons covered; fails when a level this CPU has (by an
 * independent CPUID check) compared nothing, or when FP8MIX_EXPECT_ISA names
 * a level the detected one is below (CI machines of a known kind). */
static void report_coverage(void)
{
    fp8mix_isa best = fp8mix_cpu_isa();
    printf("SIMD variants compared with the scalar path:");
    for (size_t k = 0; k < sizeof ISAS / sizeof ISAS[0]; k++) {
        if (ISAS[k] > best) {
            printf(" %s (not on this CPU)", fp8mix_isa_name(ISAS[k]));
            continue;
        }
        printf(" %s (%ld runs)", fp8mix_isa_name(ISAS[k]), compared[ISAS[k]]);
        CHECK(compared[ISAS[k]] > 0, "%s is available but no comparison ran on it", fp8mix_isa_name(ISAS[k]));
    }
    printf("%s\n", best < FP8MIX_ISA_AVX2 ? " -- none: scalar only" : "");
#if FP8MIX_X86 && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    CHECK(!avx2 || best >= FP8MIX_ISA_AVX2, "the CPU has AVX2 but fp8mix detected %s", fp8mix_isa_name(best));
    CHECK(!avx512 || best >= FP8MIX_ISA_AVX512, "the CPU has AVX-512 but fp8mix detected %s", fp8mix_isa_name(best));
#endif
    const char *want = getenv("FP8MIX_EXPECT_ISA");
    if (want) {
        int w = parse_isa_name(want);
        CHECK(w >= 0 && (int)best >= w, "FP8MIX_EXPECT_ISA=%s but this CPU runs %s", want, fp8mix_isa_name(best));
    }
}

/* fp8mix_quantize_current_t: x^T's BLOCK quantisation read from x equals
 * fp8mix_quantize_current on a contiguous copy of x^T (bytes, scale_inv, amax),
 * for each input dtype, ISA, thread count and rounding, with non-finite values,
 * a padded row stride and ragged tiles; other granularities are refused. */
static void test_quantize_t(void)
{
    enum { R = 300, C = 70, LD = 75 }; /* x is R x C (row stride LD); x^T is C x R */
    float *xf = malloc(sizeof(float) * R * LD), *xt = malloc(sizeof(float) * R * C);
    uint16_t *xh = malloc(sizeof(uint16_t) * R * LD), *xht = malloc(sizeof(uint16_t) * R * C);
    uint8_t *q1 = malloc(R * C), *q2 = malloc(R * C);
    const int64_t nt = (int64_t)C * ((R + 127) / 128);
    float *s1 = malloc(sizeof(float) * nt * 4), *s2 = s1 + nt, *a1 = s2 + nt, *a2 = a1 + nt;
    uint32_t st = 99;
    for (int i = 0; i < R * LD; i++) {
        st = st * 1664525u + 1013904223u;
        xf[i] = ldexpf((float)(int32_t)st / 2147483648.0f, (int)(st >> 28) - 6);
    }
    xf[5 * LD + 3] = INFINITY;
    xf[200 * LD + 9] = -INFINITY;
    xf[131 * LD + 60] = NAN;
    for (int i = 0; i < R * LD; i++) xh[i] = (uint16_t)(f32_bits(xf[i]) >> 16); /* bf16 */
    for (int i = 0; i < R; i++)
        for (int j = 0; j < C; j++) xt[j * R + i] = xf[i * LD + j], xht[j * R + i] = xh[i * LD + j];
    for (int dt = 0; dt < 3; dt++) { /* f32, bf16, f16 (the bf16 bits read as f16) */
        fp8mix_dtype t = dt == 0 ? FP8MIX_F32 : dt == 1 ? FP8MIX_BF16 : FP8MIX_F16;
        const void *x = dt ? (const void *)xh : (const void *)xf, *xtr = dt ? (const void *)xht : (const void *)xt;
        for (int k = -1; k < 2; k++)
            for (int sr = 0; sr < 2; sr++)
                for (int th = 1; th <= 3; th += 2) {
                    fp8mix_set_max_isa(k < 0 ? FP8MIX_ISA_SCALAR : ISAS[k]);
                    fp8mix_set_num_threads(th);
                    fp8mix_cast_opts o = {sr ? FP8MIX_E5M2 : FP8MIX_E4M3, 1,
                                          sr ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST, 5, 17, 1};
                    memset(q1, 0, R * C);
                    memset(q2, 1, R * C);
                    CHECK(fp8mix_quantize_current(xtr, t, C, R, R, FP8MIX_GRAN_BLOCK, 1, sr, 0.0f, q1, R, NULL, 0,
                                                  s1, a1, &o) == FP8MIX_OK, "quantize_current of x^T");
                    CHECK(fp8mix_quantize_current_t(x, t, R, C, LD, FP8MIX_GRAN_BLOCK, 1, sr, 0.0f, q2, R, s2, a2,
                                                    &o) == FP8MIX_OK, "quantize_current_t");
                    int same = memcmp(q1, q2, R * C) == 0 && memcmp(s1, s2, sizeof(float) * nt) == 0;
                    for (int64_t i = 0; i < nt; i++) same &= f32_bits(a1[i]) == f32_bits(a2[i]);
                    CHECK(same, "x^T read from x: same bytes, scales and amax (dtype %d isa %d sr %d threads %d)",
                          dt, k, sr, th);
                }
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    fp8mix_set_num_threads(0);
    fp8mix_cast_opts o = {FP8MIX_E4M3, 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    CHECK(fp8mix_quantize_current_t(xf, FP8MIX_F32, R, C, LD, FP8MIX_GRAN_TENSOR, 0, 0, 0.0f, q2, R, s2, a2, &o) ==
              FP8MIX_ERR_BAD_ARG, "only 1x128 blocks");
    CHECK(fp8mix_quantize_current_t(xf, FP8MIX_F32, R, C, C - 1, FP8MIX_GRAN_BLOCK, 0, 0, 0.0f, q2, R, s2, a2,
                                    &o) == FP8MIX_ERR_BAD_SHAPE, "row stride below the width");
    CHECK(fp8mix_quantize_current_t(xf, FP8MIX_F32, R, C, LD, FP8MIX_GRAN_BLOCK, 0, 0, 0.0f, q2, R - 1, s2, a2,
                                    &o) == FP8MIX_ERR_BAD_SHAPE, "qt's row stride below rows");
    CHECK(fp8mix_quantize_current_t(xf, FP8MIX_F32, R, C, LD, FP8MIX_GRAN_BLOCK, -1, 0, 0.0f, q2, R, s2, a2, &o) ==
              FP8MIX_ERR_BAD_ARG, "negative margin");
    CHECK(fp8mix_quantize_current_t(xf, FP8MIX_F32, R, C, LD, FP8MIX_GRAN_BLOCK, 0, 0, 0.0f, q2, R, NULL, a2, &o) ==
              FP8MIX_ERR_NULL_POINTER, "scale_inv_t is required");
    CHECK(fp8mix_quantize_current_t(xf, FP8MIX_F32, 0, C, LD, FP8MIX_GRAN_BLOCK, 0, 0, 0.0f, NULL, 1, NULL, NULL,
                                    &o) == FP8MIX_OK, "empty x");
    free(xf), free(xt), free(xh), free(xht), free(q1), free(q2), free(s1);
}

/* The active ISA's widen_t kernel (the transposed widening read of
 * fp8mix_quantize_current_t) against the scalar one: every shape up to 19 x 19
 * (the 8x8 tiles, the ragged right and bottom strips, fewer than 8 rows or
 * columns), padded row strides, all three input types over random bit
 * patterns.  Same bits, except that F16C returns a float16 signalling NaN
 * quiet (widen_t_avx2.c): two NaNs of the same sign count as equal. */
static void test_widen_t(void)
{
    enum { MAXR = 19, MAXC = 19, PAD = 3, LDB = 24 };
    uint32_t xw[MAXR * (MAXC + PAD)];
    float ref[MAXC * LDB], got[MAXC * LDB];
    uint32_t st = 12345;
    for (size_t i = 0; i < sizeof xw / sizeof xw[0]; i++) {
        st = st * 1664525u + 1013904223u;
        xw[i] = st;
    }
    for (size_t k = 0; k < sizeof ISAS / sizeof ISAS[0]; k++) {
        if (fp8mix_cpu_isa() < ISAS[k]) continue;
        fp8mix_set_max_isa(ISAS[k]);
        const fp8mix_kernels *kern = fp8mix_kernels_active();
        long bad = 0, cases = 0;
        for (int dt = 0; dt < 3; dt++) {
            fp8mix_dtype t = dt == 0 ? FP8MIX_F32 : dt == 1 ? FP8MIX_BF16 : FP8MIX_F16;
            for (int64_t r = 0; r <= MAXR; r++)
                for (int64_t c = 0; c <= MAXC; c++)
                    for (int64_t pad = 0; pad <= PAD; pad += PAD) {
                        memset(ref, 0xA5, sizeof ref);
                        memset(got, 0xA5, sizeof got);
                        fp8mix_widen_t_ref(xw, t, c + pad, r, c, ref, LDB);
                        kern->widen_t(xw, t, c + pad, r, c, got, LDB);
                        for (int i = 0; i < MAXC * LDB; i++) {
                            uint32_t a = f32_bits(ref[i]), b = f32_bits(got[i]);
                            int both_nan = (a & 0x7FFFFFFFu) > 0x7F800000u && (b & 0x7FFFFFFFu) > 0x7F800000u &&
                                           (a >> 31) == (b >> 31);
                            bad += a != b && !both_nan;
                        }
                        cases++;
                    }
        }
        CHECK(bad == 0, "widen_t (%s) differs from the scalar read in %ld floats over %ld shapes",
              fp8mix_isa_name(ISAS[k]), bad, cases);
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
}

int main(void)
{
    test_transpose();
    printf("cpu isa: %s\n", fp8mix_isa_name(fp8mix_cpu_isa()));
    test_philox();
    test_encode_ref();
    test_simd_sweep();
    test_simd_specials();
    test_inf_to_nan();
    test_half_inputs();
    test_entry_points();
    test_big_transpose();
    test_quantize_t();
    test_widen_t();
    test_compute_scale();
    test_dispatch_tables();
    report_coverage();
    return check_report("test_cast");
}
