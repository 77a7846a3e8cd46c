/*
 * fuzz_grouped.c — libFuzzer target for fp8mix_gemm_grouped.
 *
 * The first input byte picks a mode:
 *   groups   arbitrary group counts and sizes (empty ones included), FP8 bytes
 *            (NaN and inf codes included), scale kinds, B layouts, bias, output
 *            types and summation orders: every group's rows must equal
 *            fp8mix_gemm of that group alone, bit for bit (NaN for NaN);
 *   hostile  arbitrary offs (decreasing, negative, not ending at m), group counts
 *            and B strides: an error must leave the output untouched, and the
 *            call must fail exactly when the header says it does.
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = {data, size, 0};
    if (fz_u8(&f) & 1) mode_hostile(&f);
    else mode_groups(&f);
    return 0;
}
