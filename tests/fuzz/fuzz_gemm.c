/*
 * fuzz_gemm.c — libFuzzer target for fp8mix_gemm.
 *
 * From the input: M, N, K in 0..70 (sometimes K up to 300 so that several
 * 128-deep K blocks and 256-deep K chunks occur, or N up to 160 for two
 * 128-wide N blocks), FP8 formats of A and B, A's layout (MK / KM) and B's
 * layout (KN / NK) (or invalid ones), leading
 * dimensions (padded, or too small), scale kinds (TENSOR / OUTER / BLOCK, or
 * mixed and invalid ones), scale values (including NaN, inf, 0, negative),
 * bias (none, f32 / bf16 / f16, or an invalid type), output type, FP32 or FP22
 * accumulation with any promote_interval (negative too), NULL pointers, and
 * the operand bytes themselves (NaN and inf codes included).  All buffers are
 * malloc'ed at their exact size.
 *
 * Checks:
 *   - the status is OK exactly when the arguments are valid, else one of the
 *     documented errors; on error the output is untouched;
 *   - on OK the output equals fp8mix_gemm_ref bit for bit (NaN payloads
 *     aside: any NaN matches any NaN) under every ISA this CPU has and with
 *     every microkernel it can run, and the padding between output rows is
 *     untouched;
 *   - fp8mix_gemm_ref returns the same status as fp8mix_gemm.
 */
#include "fuzz_common.h"
#include "gemm_internal.h"

#define SENT 0xA5

static int kind_valid(int k) { return k >= 0 && k <= 3; }

static int64_t nscale(int kind, int64_t m, int64_t n, int64_t k, int is_a)
{
    int64_t kb = k / 128 + (k % 128 != 0);
    if (kind == FP8MIX_MM_SCALE_TENSOR) return 1;
    if (kind == FP8MIX_MM_SCALE_OUTER) return is_a ? m : n;
    if (kind == FP8MIX_MM_SCALE_MX) return (is_a ? m : n) * (k / 32 + (k % 32 != 0));
    return is_a ? m * kb : kb * (n / 128 + (n % 128 != 0));
}

static uint8_t fz_fp8(fz *f, uint64_t *lcg)
{
    if (fz_left(f)) return fz_u8(f);
    *lcg = *lcg * 6364136223846793005ull + 1442695040888963407ull;
    uint8_t b = (uint8_t)(*lcg >> 56);
    /* mostly finite bytes once the input runs out */
    return (b & 0x78) == 0x78 ? (uint8_t)(b & 0xB7) : b;
}

FUZZ_NOCOV static int out_equal(const uint8_t *a, const uint8_t *b, int out_t)
{
    if (out_t == FP8MIX_F32) {
        float x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        return fbits(x) == fbits(y) || (isnan(x) && isnan(y));
    }
    uint16_t x, y;
    memcpy(&x, a, 2);
    memcpy(&y, b, 2);
    if (out_t == FP8MIX_BF16) return x == y || (bf16_is_nan(x) && bf16_is_nan(y));
    return x == y || (f16_is_nan(x) && f16_is_nan(y));
}

static void hostile(fz *f);

/* out against ref element by element (NaN matches NaN); the padding past
 * column N of every row must be untouched in both. */
FUZZ_NOCOV static void compare_out(const uint8_t *out, const uint8_t *ref, size_t o_bytes, size_t oes, int64_t M,
                                   int64_t N, int64_t ldo, int out_t, const char *name, const char *what)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldo; j++) {
            size_t off = ((size_t)i * (size_t)ldo + (size_t)j) * oes;
            if (off + oes > o_bytes) break;
            if (j >= N) {
                for (size_t b = 0; b < oes; b++)
                    FUZZ_CHECK(out[off + b] == SENT && ref[off + b] == SENT,
                               "[%s] output padding (%lld,%lld) written (%s)", name, (long long)i, (long long)j,
                               what);
                continue;
            }
            if (!out_equal(out + off, ref + off, out_t)) {
                uint32_t gv = 0, rv = 0;
                memcpy(&gv, out + off, oes);
                memcpy(&rv, ref + off, oes);
                FUZZ_CHECK(0, "[%s] out(%lld,%lld) = 0x%0*x, fp8mix_gemm_ref 0x%0*x (%s)", name, (long long)i,
                           (long long)j, (int)oes * 2, gv, (int)oes * 2, rv, what);
            }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    uint8_t k0 = fz_u8(&f);
    if ((k0 & 15) == 15) {
        hostile(&f);
        return 0;
    }
    int64_t M = fz_below(&f, 71), N = fz_below(&f, 71), K = fz_below(&f, 71);
    if ((k0 & 0x30) == 0x30) K = fz_below(&f, 301);
    else if ((k0 & 0x30) == 0x20) N = fz_below(&f, 161);
    if (M * N * (K ? K : 1) > 150000) M = 150000 / (N * (K ? K : 1)); /* keep the reference cheap */
    uint8_t k1 = fz_u8(&f);
    int fmt_a = (k1 & 1), fmt_b = (k1 >> 1) & 1, lay = (k1 >> 2) & 1, out_t = (int)fz_below(&f, 3);
    int alay = (k0 >> 6) & 1; /* A as M x K or as K x M */
    if ((k1 & 0xF8) == 0xF8) { /* one invalid enum */
        switch (fz_below(&f, 5)) {
        case 0: fmt_a = 2 + (int)fz_below(&f, 3); break;
        case 1: fmt_b = -1; break;
        case 2: lay = 2 + (int)fz_below(&f, 3); break;
        case 3: alay = 2 + (int)fz_below(&f, 3); break;
        default: out_t = 3 + (int)fz_below(&f, 3); break;
        }
    }
    int alay_v = alay == FP8MIX_A_KM;
    uint8_t k2 = fz_u8(&f);
    int ka = (int)(k2 % 3), kb = (int)((k2 / 3) % 3);
    if ((k2 & 0xC0) != 0xC0 && (ka == 2 || kb == 2)) ka = kb = 2; /* mostly consistent BLOCK */
    if ((k2 & 0xC0) == 0x80) ka = kb = 3;                      /* MX on both (the blocked driver's MX path) */
    else if ((k2 & 0xC0) == 0x40 && (k2 & 1)) ka = 3;          /* MX on one operand: BAD_ARG */
    if ((fz_u8(&f) & 31) == 31) ka = 4 + (int)fz_below(&f, 3); /* invalid kinds */
    uint8_t k3 = fz_u8(&f);
    int accum = (k3 & 1), bias_kind = (int)((k3 >> 1) & 3); /* 0: none, else bias_t = kind - 1 */
    int bias_t = bias_kind ? bias_kind - 1 : 0;
    if ((k3 & 0xF8) == 0xF8) bias_t = 3 + (int)fz_below(&f, 3), bias_kind = 1;
    int64_t interval = (k3 & 0x08) ? 0 : (int64_t)fz_below(&f, 200);
    if ((k3 & 0x70) == 0x70) interval = -1 - (int64_t)fz_below(&f, 3);
    if ((k3 & 0x70) == 0x60) interval = 1 + (int64_t)fz_below(&f, 4);
    /* the FP22 driver works on 256-column chunks: its cost is M * K * 256 */
    if (accum == FP8MIX_ACCUM_FP22 && M * K > 1500) M = 1500 / K;
    uint8_t k4 = fz_u8(&f);
    int64_t a_rows = alay_v ? K : M, a_cols = alay_v ? M : K, b_rows = lay == FP8MIX_B_NK ? N : K, b_cols = lay == FP8MIX_B_NK ? K : N;
    int64_t lda = (a_cols ? a_cols : 1) + ((k4 & 3) == 3 ? fz_below(&f, 4) : 0);
    int64_t ldb = (b_cols ? b_cols : 1) + (((k4 >> 2) & 3) == 3 ? fz_below(&f, 4) : 0);
    int64_t ldo = (N ? N : 1) + (((k4 >> 4) & 3) == 3 ? fz_below(&f, 4) : 0);
    if ((k4 & 0xC0) == 0xC0) {
        switch (fz_below(&f, 4)) {
        case 0: lda = a_cols - 1; break;
        case 1: ldb = b_cols - 1; break;
        case 2: ldo = N - 1; break;
        default: lda = 0; break;
        }
    }
    uint8_t k5 = fz_u8(&f);
    int null_a = (k5 & 7) == 7, null_b = ((k5 >> 3) & 7) == 7, null_out = (k5 >> 6) == 3;
    uint8_t k6 = fz_u8(&f);
    int null_sa = (k6 & 15) == 15, null_sb = ((k6 >> 4) & 15) == 15;
    int bad_scales = (fz_u8(&f) & 15) == 15;

    /* buffers: exact sizes */
    int lay_v = lay == FP8MIX_B_NK ? 1 : 0;
    int64_t lda_a = lda >= a_cols ? lda : a_cols, ldb_a = ldb >= b_cols ? ldb : b_cols;
    int64_t ldo_a = ldo >= N ? ldo : N;
    size_t a_bytes = mat_bytes(a_rows, a_cols, lda_a, 1), b_bytes = mat_bytes(b_rows, b_cols, ldb_a, 1);
    int otv = dtype_valid(out_t) ? out_t : 0;
    size_t oes = esize((fp8mix_dtype)otv);
    size_t o_bytes = mat_bytes(M, N, ldo_a, oes);
    uint64_t lcg = 0x9E3779B97F4A7C15ull ^ size;
    uint8_t *A = null_a ? NULL : (uint8_t *)xmalloc(a_bytes, 0);
    uint8_t *B = null_b ? NULL : (uint8_t *)xmalloc(b_bytes, 0);
#ifdef FUZZ_AVOID_KNOWN
    /* known: with K == 0 and a NULL A, fp8mix_gemm_ref and the FP22 path form
     * NULL + i * lda (UBSan: pointer arithmetic on a null pointer) */
    if (K == 0 && !A) A = (uint8_t *)xmalloc(1, 0);
    if (K == 0 && !B) B = (uint8_t *)xmalloc(1, 0);
#endif
    int kav = kind_valid(ka) ? ka : 0, kbv = kind_valid(kb) ? kb : 0;
    int64_t nsa = nscale(kav, M, N, K, 1), nsb = nscale(kbv, M, N, K, 0);
    float *SA = (null_sa || nsa == 0) ? NULL : (float *)xmalloc((size_t)nsa * 4, 0);
    float *SB = (null_sb || nsb == 0) ? NULL : (float *)xmalloc((size_t)nsb * 4, 0);
    int btv = dtype_valid(bias_t) ? bias_t : 0;
    void *BIAS = bias_kind && N > 0 ? xmalloc((size_t)N * esize((fp8mix_dtype)btv), 0) : NULL;
    for (int64_t t = 0; SA && t < nsa; t++) SA[t] = fz_scale(&f, bad_scales);
    for (int64_t t = 0; SB && t < nsb; t++) SB[t] = fz_scale(&f, bad_scales);
    if (BIAS) fill_hp(&f, BIAS, (size_t)N * esize((fp8mix_dtype)btv), btv, 1, N, N);
    for (size_t t = 0; A && t < a_bytes; t++) A[t] = fz_fp8(&f, &lcg);
    for (size_t t = 0; B && t < b_bytes; t++) B[t] = fz_fp8(&f, &lcg);
    fp8mix_set_num_threads(1 + (int)fz_below(&f, 3));

    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = A; g.fmt_a = (fp8mix_format)fmt_a; g.lda = lda; g.a_layout = (fp8mix_a_layout)alay;
    g.b = B; g.fmt_b = (fp8mix_format)fmt_b; g.ldb = ldb; g.b_layout = (fp8mix_b_layout)lay;
    g.scale_a = SA; g.scale_a_kind = (fp8mix_mm_scale)ka;
    g.scale_b = SB; g.scale_b_kind = (fp8mix_mm_scale)kb;
    g.bias = BIAS; g.bias_t = (fp8mix_dtype)bias_t;
    g.out_t = (fp8mix_dtype)out_t; g.ldo = ldo;
    g.accum = (fp8mix_accum)accum; g.promote_interval = interval;
    (void)lay_v;

    /* expected status */
    expect e = {0, 0};
    int nonempty = M > 0 && N > 0;
    if (!fmt_valid(fmt_a) || !fmt_valid(fmt_b) || !dtype_valid(out_t) || !kind_valid(ka) || !kind_valid(kb) ||
        (lay != 0 && lay != 1) || (alay != 0 && alay != 1) || (BIAS && !dtype_valid(bias_t)))
        exp_must(&e, FP8MIX_ERR_BAD_ENUM);
    if (kind_valid(ka) && kind_valid(kb) && ((ka == 2) != (kb == 2) || (ka == 3) != (kb == 3)))
        exp_must(&e, FP8MIX_ERR_BAD_ARG);
    if (ka == 3 && accum == FP8MIX_ACCUM_FP22) exp_must(&e, FP8MIX_ERR_UNSUPPORTED);
    if (interval < 0) exp_must(&e, FP8MIX_ERR_BAD_ARG);
    exp_shape(&e, a_rows, a_cols, lda, 1);
    exp_shape(&e, b_rows, b_cols, ldb, 1);
    exp_shape(&e, M, N, ldo, 1);
    /* pointers and scales matter only for a non-empty output */
    if (nonempty) {
        if (null_out) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        if (K > 0 && (null_a || null_b)) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        if ((nsa > 0 && !SA) || (nsb > 0 && !SB)) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        int bad = 0;
        for (int64_t t = 0; SA && t < nsa; t++) bad |= !scale_ok(SA[t]);
        for (int64_t t = 0; SB && t < nsb; t++) bad |= !scale_ok(SB[t]);
        if (bad) exp_must(&e, FP8MIX_ERR_BAD_SCALE);
    } else {
        /* empty output: scales / pointers may or may not be looked at */
        exp_may(&e, FP8MIX_ERR_NULL_POINTER);
        exp_may(&e, FP8MIX_ERR_BAD_SCALE);
    }

    uint8_t *ref = null_out ? NULL : (uint8_t *)xmalloc(o_bytes ? o_bytes : 1, SENT);
    uint8_t *out = null_out ? NULL : (uint8_t *)xmalloc(o_bytes ? o_bytes : 1, SENT);
    g.out = ref;
    fp8mix_status st_ref = fp8mix_gemm_ref(&g);
    exp_check(&e, st_ref, "fp8mix_gemm_ref");
    char what[256];
    snprintf(what, sizeof what, "M %lld N %lld K %lld fmt %d/%d layout %d/%d lda %lld ldb %lld ldo %lld kinds %d/%d "
             "bias %d/%d out %d accum %d interval %lld", (long long)M, (long long)N, (long long)K, fmt_a, fmt_b, alay,
             lay, (long long)lda, (long long)ldb, (long long)ldo, ka, kb, bias_kind, bias_t, out_t, accum,
             (long long)interval);

    fp8mix_isa isas[4];
    int nisa = isa_list(isas);
    for (int t = 0; t <= nisa; t++) {
        fp8mix_set_max_isa(t == 0 ? FP8MIX_ISA_AVX512BF16 : isas[t - 1]);
        const char *name = t == 0 ? "default" : fp8mix_isa_name(isas[t - 1]);
        if (out) memset(out, SENT, o_bytes ? o_bytes : 1);
        g.out = out;
        fp8mix_status st = fp8mix_gemm(&g);
        FUZZ_CHECK(st == st_ref, "[%s] fp8mix_gemm status %d, fp8mix_gemm_ref %d (%s)", name, (int)st,
                   (int)st_ref, what);
        if (st != FP8MIX_OK) {
            for (size_t i = 0; out && i < o_bytes; i++)
                FUZZ_CHECK(out[i] == SENT, "[%s] output written on error (%s)", name, what);
            break;
        }
        /* the FP22 model is plain C, the same on every ISA: default + scalar */
        int last = accum == FP8MIX_ACCUM_FP22 && t == 1;
        compare_out(out, ref, o_bytes, oes, M, N, ldo, out_t, name, what);
        if (last) break;
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    /* every microkernel this CPU can run, also those dispatch does not pick here */
    if (st_ref == FP8MIX_OK && accum == FP8MIX_ACCUM_FP32 && out && M > 0 && N > 0) {
        const fp8mix_gemm_ukernel *uks[8];
        int nuk = fp8mix_gemm_ukernels(uks, 8);
        for (int u = 0; u < nuk; u++) {
            memset(out, SENT, o_bytes ? o_bytes : 1);
            g.out = out;
            FUZZ_CHECK(fp8mix_gemm_blocked_with(&g, uks[u]) == FP8MIX_OK, "[%s] status (%s)", uks[u]->name, what);
            compare_out(out, ref, o_bytes, oes, M, N, ldo, out_t, uks[u]->name, what);
        }
        /* the emulated AMX kernel (another order: no reference bytes, but the same memory
         * safety) and the NATIVE order: fp8mix_gemm's status, the same bits twice */
        if (((M + 31) / 32) * ((N + 31) / 32) * K <= 4096) { /* the emulation's tiles are slow: small shapes */
            memset(out, SENT, o_bytes ? o_bytes : 1);
            g.out = out;
            FUZZ_CHECK(fp8mix_gemm_blocked_with(&g, fp8mix_gemm_ukernel_amx_emulated()) == FP8MIX_OK,
                       "[amx emu] (%s)", what);
        }
        g.order = FP8MIX_GEMM_NATIVE;
        uint8_t *again = (uint8_t *)xmalloc(o_bytes ? o_bytes : 1, SENT);
        memset(out, SENT, o_bytes ? o_bytes : 1);
        FUZZ_CHECK(fp8mix_gemm(&g) == FP8MIX_OK, "[native] status (%s)", what);
        g.out = again;
        FUZZ_CHECK(fp8mix_gemm(&g) == FP8MIX_OK && memcmp(out, again, o_bytes) == 0, "[native] not the same bits (%s)",
                   what);
        free(again);
        g.order = FP8MIX_GEMM_CANONICAL;
    }
    free(A); free(B); free(SA); free(SB); free(BIAS); free(ref); free(out);
    return 0;
}

/* Arbitrary int64 sizes and lds with tiny buffers: called only where an
 * error is certain. */
static void hostile(fz *f)
{
    static const int64_t vals[] = {0, 1, 2, 3, -1, -2, 127, 128, 129, INT64_MIN, INT64_MAX, INT64_MAX / 2 + 1,
                                   (int64_t)1 << 31, ((int64_t)1 << 32) + 1, (int64_t)1 << 62, 3037000500LL};
    int64_t d[6];
    for (int t = 0; t < 6; t++) {
        uint8_t k = fz_u8(f);
        d[t] = (k & 1) ? (int64_t)fz_u64(f) : vals[(k >> 1) % 16];
    }
    uint8_t k = fz_u8(f);
    int lay = k & 1, kind = (k >> 1) % 3, lying = (k >> 3) & 1;
    enum { SMALL = 64 };
    uint8_t *a = (uint8_t *)xmalloc(SMALL, 0), *b = (uint8_t *)xmalloc(SMALL, 0);
    uint8_t *o = (uint8_t *)xmalloc(SMALL, SENT);
    float *s = (float *)xmalloc(4 * sizeof(float), 0);
    for (int t = 0; t < 4; t++) s[t] = 1.0f;
    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = d[0]; g.n = d[1]; g.k = d[2]; g.lda = d[3]; g.ldb = d[4]; g.ldo = d[5];
    g.b_layout = (fp8mix_b_layout)lay;
    g.scale_a_kind = g.scale_b_kind = (fp8mix_mm_scale)kind;
    g.out_t = FP8MIX_F32;
    int64_t br = lay ? g.n : g.k, bc = lay ? g.k : g.n;
    int bad_a = shape_bad(g.m, g.k, g.lda) || shape_ld0(g.m, g.k, g.lda);
    int bad_b = shape_bad(br, bc, g.ldb) || shape_ld0(br, bc, g.ldb);
    int bad_o = shape_bad(g.m, g.n, g.ldo) || shape_ld0(g.m, g.n, g.ldo);
    int64_t nsa = (bad_a || bad_b || bad_o) ? -1 : nscale(kind, g.m, g.n, g.k, 1);
    int64_t nsb = (bad_a || bad_b || bad_o) ? -1 : nscale(kind, g.m, g.n, g.k, 0);
    g.a = !bad_a && mat_bytes(g.m, g.k, g.lda, 1) <= SMALL ? a : NULL;
    g.b = !bad_b && mat_bytes(br, bc, g.ldb, 1) <= SMALL ? b : NULL;
    g.out = !bad_o && mat_bytes(g.m, g.n, g.ldo, 4) <= SMALL ? o : NULL;
    g.scale_a = nsa >= 0 && nsa <= 4 ? s : NULL;
    g.scale_b = nsb >= 0 && nsb <= 4 ? s : NULL;
#ifdef FUZZ_AVOID_KNOWN
    /* known: check_args computes ceil(k / 128) as (k + 127) / 128, which
     * overflows int64 for k > INT64_MAX - 127 */
    if (g.k > INT64_MAX - 127 || g.n > INT64_MAX - 127) lying = 0;
    if (g.m > INT64_MAX - 127 || g.n > INT64_MAX - 127 || g.k > INT64_MAX - 127) { free(a); free(b); free(o); free(s); return; }
#endif
    if (lying && (nsa > 4 || nsb > 4)) {
        /* huge valid shapes with tiny operands but a missing scale array:
         * must fail (NULL_POINTER) before touching the operands */
        g.a = a; g.b = b; g.out = o;
        g.scale_a = nsa > 4 ? NULL : s;
        g.scale_b = nsb > 4 ? NULL : s;
    }
    expect e = {0, 0};
    if (g.m < 0 || g.n < 0 || g.k < 0 || bad_a || bad_b || bad_o) exp_must(&e, FP8MIX_ERR_BAD_SHAPE);
    if (g.m > 0 && g.n > 0) {
        if (!g.out || (g.k > 0 && (!g.a || !g.b))) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
        if ((nsa > 0 && !g.scale_a) || (nsb > 0 && !g.scale_b)) exp_must(&e, FP8MIX_ERR_NULL_POINTER);
    }
    /* valid calls that need no operand memory: an empty output, or K == 0 with a small output */
    int empty_ok = !exp_error(&e) && (g.m == 0 || g.n == 0 || (g.k == 0 && g.out && (nsa == 0 || g.scale_a) &&
                                                                (nsb == 0 || g.scale_b)));
    if (empty_ok) {
        char what[200];
        snprintf(what, sizeof what, "empty gemm m %lld n %lld k %lld lda %lld ldb %lld ldo %lld layout %d kind %d",
                 (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.lda, (long long)g.ldb,
                 (long long)g.ldo, lay, kind);
        fp8mix_status st = fp8mix_gemm(&g);
        FUZZ_CHECK(st == FP8MIX_OK || st == FP8MIX_ERR_NO_MEMORY, "%s: status %d", what, (int)st);
        for (int64_t i = 0; st == FP8MIX_OK && g.n > 0 && i < g.m; i++)
            for (int64_t j = 0; j < g.n; j++) {
                float v;
                memcpy(&v, o + 4 * (size_t)(i * g.ldo + j), 4);
                FUZZ_CHECK(fbits(v) == 0, "%s: K == 0 output (%lld,%lld) = %a, not +0", what, (long long)i,
                           (long long)j, (double)v);
            }
    }
    if (exp_error(&e)) {
        char what[200];
        snprintf(what, sizeof what, "hostile gemm m %lld n %lld k %lld lda %lld ldb %lld ldo %lld layout %d kind %d",
                 (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.lda, (long long)g.ldb,
                 (long long)g.ldo, lay, kind);
        exp_check(&e, fp8mix_gemm(&g), what);
        for (int t = 0; t < SMALL; t++) FUZZ_CHECK(o[t] == SENT, "%s: output written on error", what);
        exp_check(&e, fp8mix_gemm_ref(&g), what);
    }
    free(a); free(b); free(o); free(s);
}
