/*
 * fuzz_grouped.c — libFuzzer target for fp8mix_gemm_grouped, fp8mix_gemm_grouped_k
 * and the grouped per-tensor casts (cast_grouped.c).
 *
 * The first input byte picks a mode:
 *   groups   arbitrary group counts and sizes (empty ones included), FP8 bytes
 *            (NaN and inf codes included), scale kinds, B layouts, bias, output
 *            types and summation orders: every group's rows must equal
 *            fp8mix_gemm of that group alone, bit for bit (NaN for NaN);
 *   hostile  arbitrary offs (decreasing, negative, not ending at m), group counts
 *            and B strides: an error must leave the output untouched, and the
 *            call must fail exactly when the header says it does;
 *   k        groups along K (fp8mix_gemm_grouped_k): both A layouts, TENSOR /
 *            OUTER scales, bias, output types, orders: each output equals
 *            fp8mix_gemm of its K range alone, bit for bit;
 *   casts    arbitrary float values (NaN, inf, subnormals) in row groups
 *            (empty ones included): fp8mix_quantize_current_grouped and
 *            fp8mix_cast_grad_grouped (plans, pending slots, column sums) give each
 *            group exactly what the single-tensor entry point gives it alone.
 */
#include "fuzz_common.h"
#include "gemm_internal.h"

#define MAXG 6

static int same_bits(const void *x, const void *y, size_t n, int f32)
{
    if (!memcmp(x, y, n)) return 1;
    if (!f32) return 0;
    const float *a = (const float *)x, *b = (const float *)y;
    for (size_t i = 0; i < n / 4; i++)
        if (fbits(a[i]) != fbits(b[i]) && !(isnan(a[i]) && isnan(b[i]))) return 0;
    return 1;
}

static void mode_groups(fz *f)
{
    int64_t groups = fz_below(f, MAXG + 1), n = 1 + fz_below(f, 20), k = fz_below(f, 70);
    int64_t offs[MAXG], m = 0;
    for (int64_t g = 0; g < groups; g++) offs[g] = (m += fz_below(f, 4) ? fz_below(f, 9) : 0);
    fp8mix_mm_scale kind = (fp8mix_mm_scale)fz_below(f, 4);
    fp8mix_b_layout bl = (fp8mix_b_layout)fz_below(f, 2);
    fp8mix_dtype ot = (fp8mix_dtype)fz_below(f, 3);
    int with_bias = fz_bool(f);
    int64_t bsz = k * n, kb = (k + 127) / 128, kb32 = (k + 31) / 32, nb = (n + 127) / 128;
    int64_t na = kind == FP8MIX_MM_SCALE_TENSOR ? groups : kind == FP8MIX_MM_SCALE_OUTER ? m
                 : kind == FP8MIX_MM_SCALE_MX ? m * kb32 : m * kb;
    int64_t nbg = kind == FP8MIX_MM_SCALE_TENSOR ? 1 : kind == FP8MIX_MM_SCALE_OUTER ? n
                  : kind == FP8MIX_MM_SCALE_MX ? n * kb32 : kb * nb;
    uint8_t *a = (uint8_t *)xmalloc((size_t)(m * k) + 1, 0), *b = (uint8_t *)xmalloc((size_t)(groups * bsz) + 1, 0);
    for (int64_t i = 0; i < m * k; i++) a[i] = fz_u8(f);
    for (int64_t i = 0; i < groups * bsz; i++) b[i] = fz_u8(f);
    float *sa = (float *)xmalloc((size_t)(na + 1) * 4, 0), *sb = (float *)xmalloc((size_t)(groups * nbg + 1) * 4, 0);
    for (int64_t i = 0; i < na; i++) sa[i] = ldexpf(1.0f, (int)fz_below(f, 16) - 8);
    for (int64_t i = 0; i < groups * nbg; i++) sb[i] = ldexpf(1.0f + (float)fz_below(f, 4) / 4, (int)fz_below(f, 16) - 8);
    float *bias = (float *)xmalloc((size_t)(groups * n + 1) * 4, 0);
    for (int64_t i = 0; i < groups * n; i++) bias[i] = fz_float(f);
    size_t osz = ot == FP8MIX_F32 ? 4 : 2;
    uint8_t *out = (uint8_t *)xmalloc((size_t)(m * n) * osz + 1, 0), *one = (uint8_t *)xmalloc((size_t)(m * n) * osz + 1, 0);
    fp8mix_gemm_args G;
    memset(&G, 0, sizeof G);
    G.m = m; G.n = n; G.k = k; G.a = a; G.fmt_a = (fp8mix_format)fz_below(f, 2); G.lda = k ? k : 1;
    G.b = b; G.fmt_b = (fp8mix_format)fz_below(f, 2); G.ldb = bl == FP8MIX_B_KN ? n : (k ? k : 1); G.b_layout = bl;
    G.scale_a = sa; G.scale_a_kind = kind; G.scale_b = sb; G.scale_b_kind = kind;
    G.bias = with_bias ? bias : NULL; G.bias_t = FP8MIX_F32; G.out = out; G.out_t = ot; G.ldo = n;
    G.order = (fp8mix_gemm_order)fz_below(f, 2);
    fp8mix_set_num_threads(1 + (int)fz_below(f, 2));
    fp8mix_status st = fp8mix_gemm_grouped(&G, groups, offs, bsz);
    FUZZ_CHECK(st == FP8MIX_OK, "grouped status %d", st);
    int64_t r0 = 0;
    for (int64_t g = 0; g < groups; g++) {
        int64_t rows = offs[g] - r0;
        if (rows) {
            fp8mix_gemm_args A = G;
            A.m = rows; A.a = a + r0 * k; A.b = b + g * bsz; A.out = one;
            A.scale_a = kind == FP8MIX_MM_SCALE_TENSOR ? sa + g : sa + r0 * (na / (m ? m : 1));
            A.scale_b = sb + g * nbg;
            A.bias = with_bias ? bias + g * n : NULL;
            FUZZ_CHECK(fp8mix_gemm(&A) == FP8MIX_OK, "single gemm");
            FUZZ_CHECK(same_bits(one, out + (size_t)(r0 * n) * osz, (size_t)(rows * n) * osz, ot == FP8MIX_F32),
                       "group %lld of %lld (%lld rows, kind %d) differs from its single GEMM", (long long)g,
                       (long long)groups, (long long)rows, kind);
        }
        r0 = offs[g];
    }
    fp8mix_set_num_threads(1);
    free(a); free(b); free(sa); free(sb); free(bias); free(out); free(one);
}

static void mode_hostile(fz *f)
{
    uint8_t a[64], b[256];
    float s[8], out[16];
    for (int i = 0; i < 64; i++) a[i] = fz_u8(f);
    for (int i = 0; i < 256; i++) b[i] = fz_u8(f);
    for (int i = 0; i < 8; i++) s[i] = 1.0f;
    for (int i = 0; i < 16; i++) out[i] = -3.0f;
    int64_t groups = (int64_t)(int8_t)fz_u8(f), stride = (int64_t)(int16_t)fz_u16(f), offs[8];
    for (int i = 0; i < 8; i++) offs[i] = (int64_t)(int8_t)fz_u8(f);
    fp8mix_gemm_args G;
    memset(&G, 0, sizeof G);
    G.m = 4; G.n = 4; G.k = 4; G.a = a; G.lda = 4; G.b = b; G.ldb = 4; G.b_layout = FP8MIX_B_NK;
    G.scale_a = s; G.scale_b = s; G.out = out; G.out_t = FP8MIX_F32; G.ldo = 4;
    if (groups > 8) groups = 8;
    /* the header's rules: groups, stride >= 0; offs non-decreasing from 0, ending at m; B's
     * groups not overlapping (B's extent here: (n - 1) * ldb + k = 16) */
    int ok = groups >= 0 && stride >= 0;
    int64_t prev = 0;
    for (int64_t g = 0; ok && g < groups; g++) {
        ok = offs[g] >= prev;
        prev = offs[g];
    }
    ok = ok && prev == G.m && (groups <= 1 || stride >= 16);
    if (ok && groups > 1 && (groups - 1) * stride + 16 > 256) return; /* valid, but past this buffer */
    fp8mix_status st = fp8mix_gemm_grouped(&G, groups, offs, stride);
    if (!ok) {
        FUZZ_CHECK(st != FP8MIX_OK, "accepted groups %lld, stride %lld", (long long)groups, (long long)stride);
        for (int i = 0; i < 16; i++) FUZZ_CHECK(out[i] == -3.0f, "an error wrote the output");
    } else {
        FUZZ_CHECK(st == FP8MIX_OK, "refused good groups: %d", st);
    }
}


static void mode_k(fz *f)
{
    int64_t groups = fz_below(f, MAXG + 1), m = 1 + fz_below(f, 12), n = 1 + fz_below(f, 20);
    int64_t offs[MAXG], k = 0;
    for (int64_t g = 0; g < groups; g++) offs[g] = (k += fz_below(f, 4) ? fz_below(f, 40) : 0);
    fp8mix_mm_scale kind = (fp8mix_mm_scale)fz_below(f, 2);
    fp8mix_a_layout al = (fp8mix_a_layout)fz_below(f, 2);
    fp8mix_dtype ot = (fp8mix_dtype)fz_below(f, 3);
    int with_bias = fz_bool(f);
    uint8_t *a = (uint8_t *)xmalloc((size_t)(m * k) + 1, 0), *b = (uint8_t *)xmalloc((size_t)(k * n) + 1, 0);
    for (int64_t i = 0; i < m * k; i++) a[i] = fz_u8(f);
    for (int64_t i = 0; i < k * n; i++) b[i] = fz_u8(f);
    int64_t pa = kind == FP8MIX_MM_SCALE_OUTER ? m : 1, pb = kind == FP8MIX_MM_SCALE_OUTER ? n : 1;
    float *sa = (float *)xmalloc((size_t)(groups * pa + 1) * 4, 0), *sb = (float *)xmalloc((size_t)(groups * pb + 1) * 4, 0);
    for (int64_t i = 0; i < groups * pa; i++) sa[i] = ldexpf(1.0f, (int)fz_below(f, 16) - 8);
    for (int64_t i = 0; i < groups * pb; i++) sb[i] = ldexpf(1.0f + (float)fz_below(f, 4) / 4, (int)fz_below(f, 16) - 8);
    float *bias = (float *)xmalloc((size_t)(groups * n + 1) * 4, 0);
    for (int64_t i = 0; i < groups * n; i++) bias[i] = fz_float(f);
    size_t osz = ot == FP8MIX_F32 ? 4 : 2;
    uint8_t *out = (uint8_t *)xmalloc((size_t)(groups * m * n) * osz + 1, 0);
    uint8_t *one = (uint8_t *)xmalloc((size_t)(m * n) * osz + 1, 0);
    fp8mix_gemm_args G;
    memset(&G, 0, sizeof G);
    G.m = m; G.n = n; G.k = k; G.a = a; G.fmt_a = (fp8mix_format)fz_below(f, 2); G.a_layout = al;
    G.lda = al == FP8MIX_A_MK ? (k ? k : 1) : m;
    G.b = b; G.fmt_b = (fp8mix_format)fz_below(f, 2); G.ldb = n; G.b_layout = FP8MIX_B_KN;
    G.scale_a = sa; G.scale_a_kind = kind; G.scale_b = sb; G.scale_b_kind = kind;
    G.bias = with_bias ? bias : NULL; G.bias_t = FP8MIX_F32; G.out = out; G.out_t = ot; G.ldo = n;
    G.order = (fp8mix_gemm_order)fz_below(f, 2);
    fp8mix_set_num_threads(1 + (int)fz_below(f, 2));
    fp8mix_status st = fp8mix_gemm_grouped_k(&G, groups, offs, m * n);
    FUZZ_CHECK(st == FP8MIX_OK, "grouped-K status %d", st);
    int64_t k0 = 0;
    for (int64_t g = 0; g < groups; g++) {
        fp8mix_gemm_args A = G;
        A.k = offs[g] - k0;
        A.a = al == FP8MIX_A_MK ? a + k0 : a + k0 * m;
        A.b = b + k0 * n;
        if (A.k == 0 && al == FP8MIX_A_MK) A.lda = k ? k : 1;
        A.scale_a = sa + g * pa; A.scale_b = sb + g * pb;
        A.bias = with_bias ? bias + g * n : NULL;
        A.out = one;
        FUZZ_CHECK(fp8mix_gemm(&A) == FP8MIX_OK, "single gemm");
        FUZZ_CHECK(same_bits(one, out + (size_t)(g * m * n) * osz, (size_t)(m * n) * osz, ot == FP8MIX_F32),
                   "K group %lld of %lld (k %lld, kind %d, layout %d) differs from its single GEMM", (long long)g,
                   (long long)groups, (long long)A.k, kind, al);
        k0 = offs[g];
    }
    fp8mix_set_num_threads(1);
    free(a); free(b); free(sa); free(sb); free(bias); free(out); free(one);
}

static void mode_casts(fz *f)
{
    int64_t groups = fz_below(f, MAXG + 1), cols = 1 + fz_below(f, 40);
    int64_t offs[MAXG], rows = 0;
    for (int64_t g = 0; g < groups; g++) offs[g] = (rows += fz_below(f, 4) ? fz_below(f, 9) : 0);
    float *x = (float *)xmalloc((size_t)(rows * cols + 1) * 4, 0);
    for (int64_t i = 0; i < rows * cols; i++) x[i] = fz_float(f);
    fp8mix_cast_opts o;
    memset(&o, 0, sizeof o);
    o.fmt = (fp8mix_format)fz_below(f, 2);
    o.saturate = fz_bool(f);
    o.inf_to_nan = fz_bool(f);
    int margin = (int)fz_below(f, 3), pow2 = fz_bool(f);
    size_t nq = (size_t)(rows * cols) + 1;
    uint8_t *q = (uint8_t *)xmalloc(nq, 0), *qt = (uint8_t *)xmalloc(nq, 0), *q1 = (uint8_t *)xmalloc(nq, 0);
    uint8_t *qt1 = (uint8_t *)xmalloc(nq, 0);
    float sinv[MAXG], amax[MAXG], plans[2 * MAXG], pend[MAXG * 4], cs[MAXG * 40];
    int64_t slots[MAXG];
    for (int64_t g = 0; g < groups; g++) {
        plans[2 * g] = ldexpf(1.0f, (int)fz_below(f, 20) - 10);
        plans[2 * g + 1] = (float)fz_bool(f);
        slots[g] = fz_below(f, 4);
    }
    for (int i = 0; i < MAXG * 4; i++) pend[i] = -1.0f;
    int grad = fz_bool(f);
    fp8mix_status st = grad
        ? fp8mix_cast_grad_grouped(x, FP8MIX_F32, rows, cols, cols, groups, offs, q, cols, qt, rows ? rows : 1,
                                   plans, margin, pow2, 0.0f, pend, 4, slots, &o, sinv, amax, cs)
        : fp8mix_quantize_current_grouped(x, FP8MIX_F32, rows, cols, cols, groups, offs, margin, pow2, 0.0f, q, cols,
                                          qt, rows ? rows : 1, sinv, amax, &o);
    FUZZ_CHECK(st == FP8MIX_OK, "grouped cast status %d", st);
    int64_t r0 = 0;
    for (int64_t g = 0; g < groups; g++) {
        int64_t m = offs[g] - r0;
        if (m) {
            float s1, a1, p1 = -1.0f, c1[40];
            fp8mix_status s2 = grad
                ? fp8mix_cast_grad(x + r0 * cols, FP8MIX_F32, m, cols, cols, q1, cols, qt1, m, plans + 2 * g, margin,
                                   pow2, 0.0f, &p1, &o, &s1, &a1, c1)
                : fp8mix_quantize_current(x + r0 * cols, FP8MIX_F32, m, cols, cols, FP8MIX_GRAN_TENSOR, margin, pow2,
                                          0.0f, q1, cols, qt1, m, &s1, &a1, &o);
            FUZZ_CHECK(s2 == FP8MIX_OK, "single cast status %d", s2);
            FUZZ_CHECK(!memcmp(q1, q + r0 * cols, (size_t)(m * cols)), "group %lld's bytes", (long long)g);
            for (int64_t j = 0; j < cols; j++)
                FUZZ_CHECK(!memcmp(qt1 + j * m, qt + j * rows + r0, (size_t)m), "group %lld's transposed bytes",
                           (long long)g);
            FUZZ_CHECK(fbits(s1) == fbits(sinv[g]) && same_bits(&a1, &amax[g], 4, 1), "group %lld's scale / amax",
                       (long long)g);
            if (grad) {
                FUZZ_CHECK(same_bits(&p1, &pend[g * 4 + slots[g]], 4, 1), "group %lld's pending amax", (long long)g);
                FUZZ_CHECK(same_bits(c1, cs + g * cols, (size_t)cols * 4, 1), "group %lld's column sums", (long long)g);
            }
        }
        r0 = offs[g];
    }
    free(x); free(q); free(qt); free(q1); free(qt1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    switch (fz_u8(&f) & 3) {
    case 0: mode_groups(&f); break;
    case 1: mode_hostile(&f); break;
    case 2: mode_k(&f); break;
    default: mode_casts(&f); break;
    }
    return 0;
}
