/*
 * fuzz_cast.c — libFuzzer target for fp8mix_cast (scale + cast + transpose +
 * amax).
 *
 * From the input: shape (including 0 rows / 0 columns), leading dimensions
 * (padded, or too small), input dtype (f32 / bf16 / f16 / invalid),
 * granularity (or invalid), scales (good ones over a wide range, and NaN,
 * inf, 0, negative, subnormal), saturate (any int), rounding (or invalid),
 * seed / offset (including offsets that wrap 2^64), which of q / qt / amax are
 * wanted, NULL pointers, thread count.  Every buffer is malloc'ed at its exact
 * size (no slack after the last element) so ASan sees any overrun.
 *
 * Checks:
 *   - the status is OK exactly when the arguments are valid, else one of the
 *     documented errors for what is wrong; on error nothing was written;
 *   - on OK, every q byte equals fp8mix_encode_ref(fp32(x * scale), ...) with
 *     the documented random word fp8mix_random_word(seed, offset, i*cols + j)
 *     for stochastic rounding, and fp8mix_encode_ref agrees with an
 *     independent encoder written from the header's prose;
 *   - qt is the transpose of q; amax follows the NaN > inf > max|x| rules;
 *     padding bytes between rows are untouched and x is unchanged;
 *   - the same bytes come out under every ISA this CPU has (scalar first).
 */
#include "fuzz_common.h"

typedef struct cast_case {
    int64_t rows, cols, ld_x, ld_q, ld_qt;
    int xt, gran;
    int want_q, want_qt, want_amax;
    int x_null, scale_null, opts_null;
    fp8mix_cast_opts opts;
    int fmt_raw, rounding_raw;
    int64_t ns;             /* scales allocated */
    void *x;
    size_t x_bytes;
    float *scale;
    size_t q_bytes, qt_bytes;
} cast_case;

static void read_case(fz *f, cast_case *c)
{
    memset(c, 0, sizeof *c);
    uint8_t sc = fz_u8(f);
    int64_t rmax, cmax;
    switch (sc & 7) {
    case 0: case 1: case 2: case 3: rmax = 8; cmax = 40; break;
    case 4: case 5: rmax = 70; cmax = 140; break;
    case 6: rmax = 140; cmax = 300; break;
    default: /* 1 in 32: big enough for several threads */
        if ((sc & 0x30) == 0x10) { rmax = 300; cmax = 300; } else { rmax = 70; cmax = 140; }
        break;
    }
    c->rows = (sc & 0x30) == 0x30 ? 0 : fz_below(f, (uint32_t)rmax + 1);
    if (rmax == 300 && c->rows == 0) c->rows = 300;
    c->cols = (sc & 0xC0) == 0xC0 ? 0 : fz_below(f, (uint32_t)cmax + 1);
    if ((sc & 7) == 6 && c->rows * c->cols > 12000) c->cols = 12000 / (c->rows ? c->rows : 1);
    uint8_t ldk = fz_u8(f);
    c->ld_x = c->cols + ((ldk & 3) == 3 ? fz_below(f, 5) : 0);
    if ((ldk & 0x1C) == 0x1C) c->ld_x = c->cols - 1 - fz_below(f, 3);   /* too small */
    if ((ldk & 0xE0) == 0xE0) c->ld_x = 0;
    uint8_t ek = fz_u8(f);
    c->xt = (ek & 0x1F) == 0x1F ? (int)fz_below(f, 8) - 2 : (int)fz_below(f, 3);
    c->gran = gran_skip_mx((ek & 0xE0) == 0xE0 ? (int)fz_below(f, 8) - 2 : (int)fz_below(f, 4));
    uint8_t ok = fz_u8(f);
    c->fmt_raw = (ok & 0x1F) == 0x1F ? (int)fz_below(f, 6) - 2 : (int)(ok & 1);
    c->rounding_raw = (ok & 0xE0) == 0xE0 ? (int)fz_below(f, 6) - 2 : (int)((ok >> 1) & 1);
    c->opts.fmt = (fp8mix_format)c->fmt_raw;
    c->opts.rounding = (fp8mix_rounding)c->rounding_raw;
    uint8_t satk = fz_u8(f);
    c->opts.saturate = (satk & 3) == 3 ? (int)(int8_t)fz_u8(f) : (int)(satk & 1);
    c->opts.inf_to_nan = (satk >> 2) & 1;
    c->opts.seed = fz_u64(f);
    uint8_t offk = fz_u8(f);
    c->opts.offset = (offk & 3) == 0 ? 0 : (offk & 3) == 1 ? UINT64_MAX - fz_below(f, 300) : fz_u64(f);
    uint8_t pk = fz_u8(f);
    switch (pk & 7) {
    case 0: case 1: case 2: c->want_q = 1; break;
    case 3: c->want_qt = 1; break;
    case 4: case 5: case 6: c->want_q = c->want_qt = 1; break;
    default: break; /* neither: NULL_POINTER */
    }
    c->want_amax = (pk >> 3) & 1;
    c->x_null = ((pk >> 4) & 7) == 7;
    c->opts_null = (fz_u8(f) & 63) == 63;
    uint8_t lq = fz_u8(f);
    c->ld_q = c->cols + ((lq & 3) == 3 ? fz_below(f, 4) : 0);
    if ((lq & 0x1C) == 0x1C) c->ld_q = c->cols - 1;
    c->ld_qt = c->rows + (((lq >> 5) & 3) == 3 ? fz_below(f, 4) : 0);
    if ((lq & 0x80) && (fz_u8(f) & 15) == 15) c->ld_qt = c->rows - 1;
    fp8mix_set_num_threads(1 + (int)fz_below(f, 4));

    /* scales */
    uint8_t sk = fz_u8(f);
    c->scale_null = (sk & 63) == 63;
    c->ns = gran_valid(c->gran) ? ref_scale_count(c->gran, c->rows, c->cols) : 1;
    if (c->ns > 0 && !c->scale_null) {
        c->scale = (float *)xmalloc((size_t)c->ns * 4, 0);
        int bad_ok = (sk & 0xC0) == 0xC0;
        float common = fz_scale(f, bad_ok);
        for (int64_t t = 0; t < c->ns; t++)
            c->scale[t] = (sk & 0x10) ? common : fz_scale(f, bad_ok);
    }

    /* x: exact size for its (possibly too small) leading dimension */
    size_t es = esize((fp8mix_dtype)(dtype_valid(c->xt) ? c->xt : 0));
    int64_t ldx_alloc = c->ld_x >= c->cols ? c->ld_x : c->cols;
    c->x_bytes = mat_bytes(c->rows, c->cols, ldx_alloc, es);
    if (!c->x_null) {
        c->x = xmalloc(c->x_bytes, 0);
        if (c->x) fill_hp(f, c->x, c->x_bytes, dtype_valid(c->xt) ? c->xt : 0, c->rows, c->cols, ldx_alloc);
    }
    int64_t ldq_alloc = c->ld_q >= c->cols ? c->ld_q : c->cols;
    int64_t ldqt_alloc = c->ld_qt >= c->rows ? c->ld_qt : c->rows;
    c->q_bytes = mat_bytes(c->rows, c->cols, ldq_alloc, 1);
    c->qt_bytes = mat_bytes(c->cols, c->rows, ldqt_alloc, 1);
}

static expect expected(const cast_case *c)
{
    expect e = {0, 0};
    if (c->opts_null) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
    else if (!fmt_valid(c->fmt_raw) || (c->rounding_raw != 0 && c->rounding_raw != 1))
        exp_must(&e, FP8MIX_ERR_BAD_ENUM);
    if (!dtype_valid(c->xt) || !gran_valid(c->gran)) exp_must(&e, FP8MIX_ERR_BAD_ENUM);
    exp_shape(&e, c->rows, c->cols, c->ld_x, 0);
    if (c->want_q) exp_shape(&e, c->rows, c->cols, c->ld_q, 0);
    if (c->want_qt) exp_shape(&e, c->cols, c->rows, c->ld_qt, 0);
    int nonempty = c->rows > 0 && c->cols > 0;
    /* "q and qt must not both be NULL unless the tensor is empty" */
    if (!c->want_q && !c->want_qt) {
        if (nonempty) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        else exp_may(&e, FP8MIX_ERR_NULL_POINTER);
    }
    if (nonempty && c->x_null) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
    if (gran_valid(c->gran)) {
        int bad = 0;
        for (int64_t t = 0; c->scale && t < c->ns; t++) bad |= !scale_ok(c->scale[t]);
        /* An empty tensor needs no scale: a NULL or bad one may be refused. */
        if (c->ns > 0 && c->scale_null) {
            if (nonempty) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
            else exp_may(&e, FP8MIX_ERR_NULL_POINTER);
        }
        if (bad) {
            if (nonempty) exp_must(&e, FP8MIX_ERR_BAD_SCALE);
            else exp_may(&e, FP8MIX_ERR_BAD_SCALE);
        }
    }
    return e;
}

#define SENT_Q 0xA5
#define SENT_AMAX 0x12345678u

typedef struct outbufs {
    uint8_t *q, *qt;
    float amax;
} outbufs;

static fp8mix_status run_cast(const cast_case *c, outbufs *o)
{
    /* a wanted but empty output still gets a non-NULL pointer (1 byte) */
    o->q = c->want_q ? (uint8_t *)xmalloc(c->q_bytes ? c->q_bytes : 1, SENT_Q) : NULL;
    o->qt = c->want_qt ? (uint8_t *)xmalloc(c->qt_bytes ? c->qt_bytes : 1, SENT_Q) : NULL;
    o->amax = bitsf(SENT_AMAX);
    return fp8mix_cast(c->x_null ? NULL : c->x, (fp8mix_dtype)c->xt, c->rows, c->cols, c->ld_x,
                       (fp8mix_granularity)c->gran, c->scale_null ? NULL : c->scale, o->q, c->ld_q,
                       o->qt, c->ld_qt, c->want_amax ? &o->amax : NULL,
                       c->opts_null ? NULL : &c->opts);
}

static void free_out(outbufs *o)
{
    free(o->q);
    free(o->qt);
    o->q = o->qt = NULL;
}

FUZZ_NOCOV static void check_untouched(const cast_case *c, const outbufs *o, const char *isa)
{
    for (size_t t = 0; o->q && t < c->q_bytes; t++)
        FUZZ_CHECK(o->q[t] == SENT_Q, "[%s] error status but q[%zu] written", isa, t);
    for (size_t t = 0; o->qt && t < c->qt_bytes; t++)
        FUZZ_CHECK(o->qt[t] == SENT_Q, "[%s] error status but qt[%zu] written", isa, t);
    FUZZ_CHECK(fbits(o->amax) == SENT_AMAX, "[%s] error status but amax written", isa);
}

/* Reference q (rows x cols, dense) and amax bits. */
FUZZ_NOCOV static void reference(const cast_case *c, uint8_t *ref, uint32_t *amax_bits)
{
    size_t es = esize((fp8mix_dtype)c->xt);
    int sr = c->opts.rounding == FP8MIX_ROUND_STOCHASTIC;
    uint32_t m = 0;
    int any_nan = 0;
    for (int64_t i = 0; i < c->rows && c->cols > 0; i++) {
        const uint8_t *row = (const uint8_t *)c->x + (size_t)i * (size_t)c->ld_x * es;
        for (int64_t j = 0; j < c->cols; j++) {
            float v = ref_load(row, (fp8mix_dtype)c->xt, j);
            if (isnan(v)) any_nan = 1;
            else if (fbits(fabsf(v)) > m) m = fbits(fabsf(v));
            float s = c->scale[ref_scale_index(c->gran, i, j, c->cols)];
            volatile float y = v * s; /* rounded to float32, no contraction */
            uint32_t r = sr ? fp8mix_random_word(c->opts.seed, c->opts.offset, (uint64_t)(i * c->cols + j)) : 0;
            uint8_t b = fp8mix_encode_ref(y, c->opts.fmt, c->opts.saturate, c->opts.rounding, r);
            uint8_t b2 = indep_encode(y, c->opts.fmt, c->opts.saturate != 0, sr, r);
            FUZZ_CHECK(b == b2, "fp8mix_encode_ref(%a (0x%08x), fmt %d, sat %d, sr %d, r 0x%08x) = 0x%02x, "
                       "independent encoder 0x%02x", (double)y, fbits(y), (int)c->opts.fmt, c->opts.saturate,
                       sr, r, b, b2);
            if (c->opts.inf_to_nan && isinf(v)) /* an infinite x, not an overflowing product */
                b = (uint8_t)((c->opts.fmt == FP8MIX_E4M3 ? 0x7F : 0x7E) | (signbit(v) ? 0x80 : 0));
            ref[i * c->cols + j] = b;
        }
    }
    *amax_bits = any_nan ? 0x7FC00000u : m;
}

FUZZ_NOCOV static void check_ok(const cast_case *c, const outbufs *o, const uint8_t *ref, uint32_t amax_bits,
                     const char *isa)
{
    if (o->q)
        for (int64_t i = 0; i < c->rows; i++)
            for (int64_t j = 0; j < c->ld_q; j++) {
                size_t off = (size_t)i * (size_t)c->ld_q + (size_t)j;
                if (off >= c->q_bytes) break;
                if (j < c->cols)
                    FUZZ_CHECK(o->q[off] == ref[i * c->cols + j],
                               "[%s] q[%lld,%lld] = 0x%02x, reference 0x%02x (rows %lld cols %lld gran %d xt %d "
                               "fmt %d sat %d rnd %d)", isa, (long long)i, (long long)j, o->q[off],
                               ref[i * c->cols + j], (long long)c->rows, (long long)c->cols, c->gran, c->xt,
                               (int)c->opts.fmt, c->opts.saturate, (int)c->opts.rounding);
                else
                    FUZZ_CHECK(o->q[off] == SENT_Q, "[%s] q padding [%lld,%lld] written", isa, (long long)i,
                               (long long)j);
            }
    if (o->qt)
        for (int64_t j = 0; j < c->cols; j++)
            for (int64_t i = 0; i < c->ld_qt; i++) {
                size_t off = (size_t)j * (size_t)c->ld_qt + (size_t)i;
                if (off >= c->qt_bytes) break;
                if (i < c->rows)
                    FUZZ_CHECK(o->qt[off] == ref[i * c->cols + j],
                               "[%s] qt[%lld,%lld] = 0x%02x, reference q[%lld,%lld] 0x%02x (rows %lld cols %lld)",
                               isa, (long long)j, (long long)i, o->qt[off], (long long)i, (long long)j,
                               ref[i * c->cols + j], (long long)c->rows, (long long)c->cols);
                else
                    FUZZ_CHECK(o->qt[off] == SENT_Q, "[%s] qt padding [%lld,%lld] written", isa, (long long)j,
                               (long long)i);
            }
    if (c->want_amax)
        FUZZ_CHECK(fbits(o->amax) == amax_bits, "[%s] amax 0x%08x, reference 0x%08x", isa, fbits(o->amax),
                   amax_bits);
}

/* Arbitrary int64 sizes with tiny buffers: only calls that must fail. */
static void hostile(fz *f)
{
    static const int64_t vals[] = {0, 1, 2, 3, -1, -2, 127, 128, 129, INT64_MIN, INT64_MAX, INT64_MAX / 2 + 1,
                                   (int64_t)1 << 31, ((int64_t)1 << 32) + 1, (int64_t)1 << 62, 3037000500LL};
    int64_t d[5];
    for (int t = 0; t < 5; t++) {
        uint8_t k = fz_u8(f);
        d[t] = (k & 1) ? (int64_t)fz_u64(f) : vals[(k >> 1) % 16];
    }
    int64_t rows = d[0], cols = d[1], ldx = d[2], ldq = d[3], ldqt = d[4];
    uint8_t k = fz_u8(f);
    int xt = (int)(k % 3), gran = (int)((k >> 2) % 4), want_q = (k >> 4) & 1, want_qt = (k >> 5) & 1;
    fp8mix_cast_opts o = {(fp8mix_format)(fz_u8(f) & 1), 1, FP8MIX_ROUND_NEAREST, 0, 0, 0};
    /* small buffers, passed only where the shape is valid and fits them */
    enum { SMALL = 64 };
    uint8_t *xb = (uint8_t *)xmalloc(SMALL, 0), *qb = (uint8_t *)xmalloc(SMALL, SENT_Q),
            *qtb = (uint8_t *)xmalloc(SMALL, SENT_Q);
    float *sb = (float *)xmalloc(4 * sizeof(float), 0);
    for (int t = 0; t < 4; t++) sb[t] = 1.0f;
    int fits_x = !shape_bad(rows, cols, ldx) && mat_bytes(rows, cols, ldx, esize((fp8mix_dtype)xt)) <= SMALL;
    int fits_q = !shape_bad(rows, cols, ldq) && mat_bytes(rows, cols, ldq, 1) <= SMALL;
    int fits_qt = !shape_bad(cols, rows, ldqt) && mat_bytes(cols, rows, ldqt, 1) <= SMALL;
    int64_t ns = shape_bad(rows, cols, ldx) ? -1 : ref_scale_count(gran, rows, cols);
    const void *x = fits_x ? xb : NULL;
    uint8_t *q = want_q ? (fits_q || shape_bad(rows, cols, ldq) ? qb : NULL) : NULL;
    uint8_t *qt = want_qt ? (fits_qt || shape_bad(cols, rows, ldqt) ? qtb : NULL) : NULL;
    const float *scale = (ns >= 0 && ns <= 4) ? sb : NULL;
    int lying = (k & 0xC0) == 0xC0;
#ifdef FUZZ_AVOID_KNOWN
    /* known: fp8mix_scale_count computes ceil(n / 128) as (n + 127) / 128,
     * which overflows int64 for n > INT64_MAX - 127 */
    if (rows > INT64_MAX - 127 || cols > INT64_MAX - 127) lying = 0;
#endif
    if (lying && !scale && ns > 0) {
        /* "lying" buffers: valid huge shapes with tiny x / q, but no scale
         * array.  The call must fail with NULL_POINTER before reading x or
         * writing q (and its size arithmetic must not overflow). */
        x = xb;
        q = want_q ? qb : NULL;
        qt = want_qt ? qtb : NULL;
        if (!q && !qt) q = qb;
    }

    expect e = {0, 0};
    int nonempty = rows > 0 && cols > 0;
    exp_shape(&e, rows, cols, ldx, 0);
    if (q) exp_shape(&e, rows, cols, ldq, 0);
    if (qt) exp_shape(&e, cols, rows, ldqt, 0);
    if (!q && !qt) {
        if (nonempty) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        else exp_may(&e, FP8MIX_ERR_NULL_POINTER);
    }
    if (!x && nonempty) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
    if (!scale && ns > 0) {
        if (nonempty) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        else exp_may(&e, FP8MIX_ERR_NULL_POINTER);
    }
    /* a valid empty tensor needs no memory: must succeed, amax +0 */
    int empty_ok = !exp_error(&e) && !nonempty;
#ifdef FUZZ_AVOID_KNOWN
    if (rows > INT64_MAX - 127 || cols > INT64_MAX - 127) empty_ok = 0; /* ceil_div overflow, as above */
#endif
    if (exp_error(&e) || empty_ok) {
        float am = bitsf(SENT_AMAX);
        fp8mix_status st = fp8mix_cast(x, (fp8mix_dtype)xt, rows, cols, ldx, (fp8mix_granularity)gran, scale, q,
                                       ldq, qt, ldqt, &am, &o);
        char what[200];
        snprintf(what, sizeof what, "hostile cast rows %lld cols %lld ldx %lld ldq %lld ldqt %lld",
                 (long long)rows, (long long)cols, (long long)ldx, (long long)ldq, (long long)ldqt);
        if (empty_ok) {
            FUZZ_CHECK(st == FP8MIX_OK || st == FP8MIX_ERR_NO_MEMORY || (e.may & EXP_BIT(st)),
                       "%s: valid empty call gave %d (%s)", what, (int)st, fp8mix_status_string(st));
            if (st == FP8MIX_OK) FUZZ_CHECK(fbits(am) == 0, "%s: amax of an empty tensor 0x%08x", what, fbits(am));
            am = bitsf(SENT_AMAX);
        } else {
            exp_check(&e, st, what);
        }
        FUZZ_CHECK(fbits(am) == SENT_AMAX, "%s: amax written on error", what);
        for (int t = 0; t < SMALL; t++) FUZZ_CHECK(qb[t] == SENT_Q && qtb[t] == SENT_Q, "%s: output written", what);
    }
    free(xb);
    free(qb);
    free(qtb);
    free(sb);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    if ((fz_u8(&f) & 15) == 15) {
        hostile(&f);
        return 0;
    }
    cast_case c;
    read_case(&f, &c);
    expect e = expected(&c);
    void *x_copy = c.x ? xmalloc(c.x_bytes, 0) : NULL;
    if (x_copy) memcpy(x_copy, c.x, c.x_bytes);

    uint8_t *ref = NULL;
    uint32_t amax_bits = 0;
    if (!exp_error(&e)) {
        ref = (uint8_t *)xmalloc((size_t)(c.rows * c.cols) + 1, 0);
        reference(&c, ref, &amax_bits);
    }
    fp8mix_isa isas[4];
    int nisa = isa_list(isas);
    for (int t = 0; t <= nisa; t++) {
        /* t == 0: the default (best) ISA; then every ISA from scalar up */
        fp8mix_set_max_isa(t == 0 ? FP8MIX_ISA_AVX512BF16 : isas[t - 1]);
        const char *name = t == 0 ? "default" : fp8mix_isa_name(isas[t - 1]);
        outbufs o;
        fp8mix_status st = run_cast(&c, &o);
        exp_check(&e, st, name);
        if (st != FP8MIX_OK) check_untouched(&c, &o, name);
        else check_ok(&c, &o, ref, amax_bits, name);
        free_out(&o);
        if (x_copy) FUZZ_CHECK(memcmp(x_copy, c.x, c.x_bytes) == 0, "[%s] x was modified", name);
        if (st != FP8MIX_OK && t == 1) break; /* errors: default + scalar is enough */
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    free(ref);
    free(x_copy);
    free(c.x);
    free(c.scale);
    return 0;
}
