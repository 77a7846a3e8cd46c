/*
 * fuzz_common.h — shared by the libFuzzer targets in tests/fuzz/: a byte
 * reader over the fuzz input, exact-size allocation helpers, independent
 * reference conversions (float16/bfloat16 <-> float32, FP8 decode) written
 * from the OCP/IEEE definitions rather than taken from the core, and the
 * "expected status" bookkeeping.
 *
 * Nothing here prints unless a check fails; a failed check prints what it
 * saw and aborts, so libFuzzer records the input as a crash.
 */
#ifndef FP8MIX_FUZZ_COMMON_H
#define FP8MIX_FUZZ_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp8mix.h"

/* ASan: an impossible allocation returns NULL (the API then answers
 * FP8MIX_ERR_NO_MEMORY) instead of aborting the run. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

/* Hot reference / checking loops of the harness carry no coverage
 * instrumentation: their comparisons are not what the fuzzer should steer by,
 * and tracing them costs most of the run time. */
#if defined(__clang__)
#define FUZZ_NOCOV __attribute__((no_sanitize("coverage"), noinline))
#else
#define FUZZ_NOCOV
#endif

/* ---- failing ------------------------------------------------------------ */

#define FUZZ_CHECK(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: ", __FILE__,        \
                    __LINE__, #cond);                                          \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* ---- byte reader (zeros once the input is exhausted) ---------------------- */

typedef struct fz {
    const uint8_t *p;
    size_t n, i;
} fz;

static inline uint8_t fz_u8(fz *f) { return f->i < f->n ? f->p[f->i++] : 0; }
/* (operands sequenced explicitly: the byte order must not depend on the compiler) */
static inline uint16_t fz_u16(fz *f) { uint16_t lo = fz_u8(f); return (uint16_t)(lo | (uint16_t)fz_u8(f) << 8); }
static inline uint32_t fz_u32(fz *f) { uint32_t lo = fz_u16(f); return lo | (uint32_t)fz_u16(f) << 16; }
static inline uint64_t fz_u64(fz *f) { uint64_t lo = fz_u32(f); return lo | (uint64_t)fz_u32(f) << 32; }
/* Uniform-ish in [0, n) (n > 0). */
static inline uint32_t fz_below(fz *f, uint32_t n) { return n ? fz_u16(f) % n : 0; }
static inline int fz_bool(fz *f) { return fz_u8(f) & 1; }
static inline size_t fz_left(const fz *f) { return f->n - f->i; }

static inline uint32_t fbits(float v) { uint32_t u; memcpy(&u, &v, 4); return u; }
static inline float bitsf(uint32_t u) { float v; memcpy(&v, &u, 4); return v; }

/* A float32 drawn to hit the interesting cases often: raw bit patterns,
 * specials, values near the FP8 grid and its edges. */
static inline float fz_float(fz *f)
{
    static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 448.0f, 464.0f, 465.0f, 480.0f,
                                    57344.0f, 61440.0f, 65536.0f, 0x1p-9f, 0x1p-10f, 0x1p-16f,
                                    0x1p-17f, 0x1.8p-10f, 1e-45f, 3.4e38f, 0.5f, 0.25f};
    uint8_t k = fz_u8(f);
    switch (k & 7) {
    case 0: return bitsf(fz_u32(f));
    case 1: {
        float v = special[fz_below(f, sizeof special / sizeof special[0])];
        return (k & 8) ? -v : v;
    }
    case 2: return (k & 8) ? -INFINITY : INFINITY;
    case 3: return bitsf(0x7F800000u | (fz_u32(f) & 0x807FFFFFu) | 1u); /* some NaN */
    case 4: { /* an FP8-representable value plus a few ulps of noise */
        int e = (int)fz_below(f, 40) - 20;
        float m = 1.0f + (float)fz_below(f, 16) / 16.0f;
        float v = ldexpf(m, e);
        uint32_t u = fbits(v) + (uint32_t)((int32_t)(int8_t)fz_u8(f));
        return (k & 8) ? -bitsf(u) : bitsf(u);
    }
    default: { /* moderate random value */
        float v = ((float)(int32_t)fz_u32(f)) * 0x1p-24f;
        return v;
    }
    }
}

/* ---- exact-size allocation --------------------------------------------------
 * Bytes a rows x cols matrix with row stride ld of esz-byte elements needs:
 * the last row ends at its last element (no trailing padding), so any read
 * or write past it is caught by ASan. */
static inline size_t mat_bytes(int64_t rows, int64_t cols, int64_t ld, size_t esz)
{
    if (rows <= 0 || cols <= 0) return 0;
    return ((size_t)(rows - 1) * (size_t)ld + (size_t)cols) * esz;
}

/* malloc of exactly `bytes` (NULL for 0: empty operands are passed as NULL,
 * which the API allows).  Filled with `fill`. */
static inline void *xmalloc(size_t bytes, int fill)
{
    if (bytes == 0) return NULL;
    void *p = malloc(bytes);
    if (!p) abort();
    memset(p, fill, bytes);
    return p;
}

/* ---- independent reference conversions -------------------------------------- */

static inline float ref_bf16_to_f32(uint16_t h) { return bitsf((uint32_t)h << 16); }

FUZZ_NOCOV static inline float ref_f16_to_f32(uint16_t h)
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31) {
        if (m == 0) return s ? -INFINITY : INFINITY;
        /* NaN: payload moved to the top of the float32 mantissa (what a
         * hardware conversion does); the quiet bit stays as it was. */
        return bitsf((uint32_t)s << 31 | 0x7F800000u | (uint32_t)m << 13);
    }
    if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf((float)(1024 + m), e - 25);
    return s ? -v : v;
}

static inline int f16_is_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
static inline int bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

/* float32 -> bfloat16, round to nearest even (NaN: only NaN-ness matters). */
FUZZ_NOCOV static inline uint16_t ref_f32_to_bf16(float v)
{
    uint32_t u = fbits(v);
    if (isnan(v)) return (uint16_t)((u >> 16) | 0x40);
    uint32_t lo = u & 0xFFFF, hi = u >> 16;
    if (lo > 0x8000 || (lo == 0x8000 && (hi & 1))) hi++;
    return (uint16_t)hi;
}

/* float32 -> float16, round to nearest even, overflow to inf; computed in
 * double with nearbyint (the default rounding mode is ties-to-even). */
FUZZ_NOCOV static inline uint16_t ref_f32_to_f16(float v)
{
    uint16_t s = signbit(v) ? 0x8000 : 0;
    if (isnan(v)) return (uint16_t)(s | 0x7E00);
    double a = fabs((double)v);
    if (isinf(v) || a >= 65520.0) return (uint16_t)(s | 0x7C00);
    if (a < 0x1p-14) return (uint16_t)(s | (uint16_t)nearbyint(a * 0x1p24)); /* 0x400 = min normal */
    int ex;
    double m = frexp(a, &ex); /* a = m * 2^ex, m in [0.5, 1) */
    int E = ex - 1;
    uint32_t mant = (uint32_t)nearbyint((m * 2.0 - 1.0) * 1024.0);
    uint32_t code = ((uint32_t)(E + 15) << 10) + mant;
    if (code >= 0x7C00) code = 0x7C00;
    return (uint16_t)(s | code);
}

/* FP8 byte -> float32 from the OCP tables (not the core's decoder). */
FUZZ_NOCOV static inline float ref_fp8_decode(uint8_t q, fp8mix_format fmt)
{
    int s = q >> 7;
    float v;
    if (fmt == FP8MIX_E4M3) {
        int e = (q >> 3) & 15, m = q & 7;
        if (e == 15 && m == 7) return s ? -NAN : NAN;
        v = e ? ldexpf((float)(8 + m), e - 7 - 3) : ldexpf((float)m, -6 - 3);
    } else {
        int e = (q >> 2) & 31, m = q & 3;
        if (e == 31) {
            if (m) return s ? -NAN : NAN;
            v = INFINITY;
        } else {
            v = e ? ldexpf((float)(4 + m), e - 15 - 2) : ldexpf((float)m, -14 - 2);
        }
    }
    return s ? -v : v;
}

/* An FP8 encoder written from the header's prose, independent of the core's
 * bit tricks: find the grid spacing 2^U at |y| (the exponent capped at the
 * format's largest, so the grid extends past max with the same spacing, and
 * floored at the subnormal spacing), split |y| into k * 2^U + rest exactly in
 * double, round k (nearest-even, or up iff r < floor(frac * 2^32)), and map
 * the value back to a code by search.  Used to cross-check fp8mix_encode_ref. */
FUZZ_NOCOV static inline uint8_t indep_encode(float y, fp8mix_format fmt, int saturate, int stochastic, uint32_t r)
{
    const int e4 = fmt == FP8MIX_E4M3;
    const int mbits = e4 ? 3 : 2, emin = e4 ? -6 : -14, emax = e4 ? 8 : 15;
    const double fmax = e4 ? 448.0 : 57344.0;
    const uint8_t max_code = e4 ? 0x7E : 0x7B;
    const uint8_t ovf = saturate ? max_code : (e4 ? 0x7F : 0x7C);
    uint8_t sign = signbit(y) ? 0x80 : 0;
    if (isnan(y)) return (uint8_t)((e4 ? 0x7F : 0x7E) | sign);
    double a = fabs((double)y);
    if (isinf(a)) return (uint8_t)(ovf | sign);
    int ex = 0;
    if (a > 0) frexp(a, &ex);
    int e = ex - 1;
    if (a > 0 && e > emax) return (uint8_t)(ovf | sign);
    int U = (a == 0 || e < emin ? emin : e) - mbits;
    double scaled = ldexp(a, -U);      /* exact: a power-of-two step */
    double k = floor(scaled), frac = scaled - k;
    if (!stochastic) {
        if (frac > 0.5 || (frac == 0.5 && fmod(k, 2.0) == 1.0)) k += 1;
    } else {
        double T = floor(ldexp(frac, 32));
        if ((double)r < T) k += 1;
    }
    double v = ldexp(k, U);
    if (v > fmax) return (uint8_t)(ovf | sign);
    /* the code of v: binary search over the positive codes 0..max_code */
    static float table[2][128];
    static int ready;
    if (!ready) {
        for (int t = 0; t < 2; t++)
            for (int c = 0; c < 128; c++) table[t][c] = ref_fp8_decode((uint8_t)c, (fp8mix_format)t);
        ready = 1;
    }
    const float *tab = table[e4 ? 0 : 1];
    int lo = 0, hi = max_code;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if ((double)tab[mid] < v) lo = mid + 1;
        else hi = mid;
    }
    FUZZ_CHECK((double)tab[lo] == v, "indep_encode: %a not on the grid", v);
    return (uint8_t)(lo | sign);
}

/* Load element k of a row of dtype t. */
FUZZ_NOCOV static inline float ref_load(const void *row, fp8mix_dtype t, int64_t k)
{
    switch (t) {
    case FP8MIX_F32: { float v; memcpy(&v, (const char *)row + 4 * k, 4); return v; }
    case FP8MIX_BF16: return ref_bf16_to_f32(((const uint16_t *)row)[k]);
    default: return ref_f16_to_f32(((const uint16_t *)row)[k]);
    }
}

static inline size_t esize(fp8mix_dtype t) { return t == FP8MIX_F32 ? 4 : 2; }
static inline int dtype_valid(int t) { return t >= 0 && t <= 2; }
static inline int gran_valid(int g) { return g >= 0 && g <= 3; }
/* MX (FP8MIX_GRAN_MX) is valid but not fuzzed here yet (tests/c/test_mx.c covers it): an
 * out-of-range draw that lands on it is moved past it, so it stays an invalid value. */
static inline int gran_skip_mx(int g) { return g == FP8MIX_GRAN_MX ? FP8MIX_GRAN_MX + 1 : g; }
static inline int fmt_valid(int f) { return f == 0 || f == 1; }

/* Scales of granularity g for rows x cols (the header's table). */
static inline int64_t ref_scale_count(int g, int64_t rows, int64_t cols)
{
    /* ceil(n / 128) without overflow for n near INT64_MAX */
    int64_t cb = cols / 128 + (cols % 128 != 0), rb = rows / 128 + (rows % 128 != 0);
    switch (g) {
    case 0: return 1;
    case 1: return rows;
    case 2: return rows * cb;
    default: return rb * cb;
    }
}
static inline int64_t ref_scale_index(int g, int64_t i, int64_t j, int64_t cols)
{
    int64_t cb = cols / 128 + (cols % 128 != 0);
    switch (g) {
    case 0: return 0;
    case 1: return i;
    case 2: return i * cb + j / 128;
    default: return (i / 128) * cb + j / 128;
    }
}
static inline int scale_ok(float s) { return isfinite(s) && s > 0.0f; }

/* The documented shape rule: sizes >= 0, ld >= cols, and the element count
 * rows * ld must fit in int64. */
static inline int shape_bad(int64_t rows, int64_t cols, int64_t ld)
{
    if (rows < 0 || cols < 0 || ld < cols) return 1;
    if (cols > 0 && rows > 0 && rows > INT64_MAX / ld) return 1;
    return 0;
}
/* rows > 0 with cols == 0 and ld == 0: fp8mix_gemm documents "every ld >= 1",
 * the casts only "ld >= cols" (and refuse it: BAD_SHAPE).  Treated as a must
 * for the GEMM, a may for the casts. */
static inline int shape_ld0(int64_t rows, int64_t cols, int64_t ld)
{
    return rows > 0 && cols >= 0 && ld < 1 && ld >= cols;
}

/* ---- expected status ----------------------------------------------------------
 * Each violated rule adds its status to `must`; the call has to return one of
 * them (the API does not order its checks).  Cases the header leaves open add
 * to `may`: then either OK or that status is accepted. */
typedef struct expect {
    unsigned must, may;
} expect;

#define EXP_BIT(s) (1u << (unsigned)(s))
static inline void exp_must(expect *e, fp8mix_status s) { e->must |= EXP_BIT(s); }
static inline void exp_may(expect *e, fp8mix_status s) { e->may |= EXP_BIT(s); }
static inline int exp_error(const expect *e) { return e->must != 0; }

static inline void exp_check(const expect *e, fp8mix_status got, const char *what)
{
    if (e->must) {
        FUZZ_CHECK((e->must | e->may) & EXP_BIT(got) && got != FP8MIX_OK,
                   "%s: status %d (%s), expected one of mask 0x%x", what, (int)got,
                   fp8mix_status_string(got), e->must | e->may);
    } else {
        FUZZ_CHECK(got == FP8MIX_OK || (e->may & EXP_BIT(got)),
                   "%s: status %d (%s), expected OK (or mask 0x%x)", what, (int)got,
                   fp8mix_status_string(got), e->may);
    }
}

static inline void exp_shape(expect *e, int64_t rows, int64_t cols, int64_t ld, int ld0_is_error)
{
    if (shape_bad(rows, cols, ld) || (ld0_is_error && shape_ld0(rows, cols, ld))) exp_must(e, FP8MIX_ERR_BAD_SHAPE);
    else if (shape_ld0(rows, cols, ld)) exp_may(e, FP8MIX_ERR_BAD_SHAPE);
}

/* ISAs worth comparing on this CPU, scalar first. */
static inline int isa_list(fp8mix_isa *out)
{
    int n = 0;
    fp8mix_isa best = fp8mix_cpu_isa();
    /* (AMX adds a GEMM kernel of another order only, never a variant of these ops) */
    for (int i = FP8MIX_ISA_SCALAR; i <= (int)best && i <= FP8MIX_ISA_AVX512BF16; i++) out[n++] = (fp8mix_isa)i;
    return n;
}

/* A positive finite scale over a wide range, or (when allow_bad, rarely) a
 * bad one: 0, -0, negative, +-inf, NaN. */
static inline float fz_scale(fz *f, int allow_bad)
{
    uint8_t k = fz_u8(f);
    if (allow_bad && (k & 31) == 31) {
        static const float bad[] = {0.0f, -0.0f, -1.0f, INFINITY, -INFINITY, NAN, -NAN, -1e-30f};
        return bad[fz_below(f, 8)];
    }
    switch (k & 7) {
    case 0: return 1.0f;
    case 1: return ldexpf(1.0f, (int)fz_below(f, 60) - 30);  /* power of two */
    case 2: { /* moderate, random mantissa */
        float m = 1.0f + (float)fz_u16(f) / 65536.0f;
        return ldexpf(m, (int)fz_below(f, 20) - 10);
    }
    case 3: { /* any positive finite float, subnormals included */
        uint32_t u = fz_u32(f) & 0x7FFFFFFFu;
        if (u == 0 || u >= 0x7F800000u) u = 0x3F800001u;
        return bitsf(u);
    }
    default: /* 448 / amax-like */
        return 448.0f / (1.0f + (float)fz_u16(f) / 64.0f);
    }
}

/* Fill a rows x cols matrix of dtype xt (row stride ld, buffer of `bytes`)
 * from the input; padding elements get all-ones bytes (NaN), which no
 * result may depend on.  When the input runs out, a deterministic stream
 * keyed by the input length continues (so large shapes are not all zero). */
FUZZ_NOCOV static inline void fill_hp(fz *f, void *buf, size_t bytes, int xt, int64_t rows, int64_t cols, int64_t ld)
{
    uint64_t lcg = 0x2545F4914F6CDD1Dull ^ f->n;
    size_t es = esize((fp8mix_dtype)xt);
    uint8_t *xb = (uint8_t *)buf;
    for (int64_t i = 0; i < rows; i++) {
        for (int64_t j = 0; j < ld; j++) {
            size_t off = ((size_t)i * (size_t)ld + (size_t)j) * es;
            if (off + es > bytes) break;
            if (j >= cols) { memset(xb + off, 0xFF, es); continue; }
            float v;
            uint16_t h;
            if (fz_left(f) > 0) {
                if (es == 2 && (fz_u8(f) & 1)) { /* any 16-bit pattern */
                    h = fz_u16(f);
                    memcpy(xb + off, &h, 2);
                    continue;
                }
                v = fz_float(f);
            } else {
                lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t u = (uint32_t)(lcg >> 32);
                v = ((lcg >> 20) & 15) == 0 ? bitsf(u) : (float)(int32_t)u * 0x1p-26f;
            }
            if (es == 4) memcpy(xb + off, &v, 4);
            else if (xt == FP8MIX_BF16) { h = ref_f32_to_bf16(v); memcpy(xb + off, &h, 2); }
            else { h = ref_f32_to_f16(v); memcpy(xb + off, &h, 2); }
        }
    }
}

#endif /* FP8MIX_FUZZ_COMMON_H */
