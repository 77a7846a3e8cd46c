/*
 * test_grouped.c — fp8mix_gemm_grouped: every group's rows against fp8mix_gemm
 * of that group alone (bit for bit) and against a float64 reference decoded
 * here from the FP8 bytes (the GEMM's documented bound), for every scale kind,
 * both B layouts, bias, empty groups and group sizes that are not multiples of
 * anything, 1 and 2 threads; and the errors (offs that decrease or do not end
 * at m, negative counts, overlapping B, a bad scale in a late group: nothing
 * written).
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "internal.h"

static uint64_t st = 0x243F6A8885A308D3ull;
static uint32_t rnd(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return (uint32_t)(st >> 32);
}
static float frand(float lo, float hi) { return lo + (hi - lo) * (float)(rnd() >> 8) / 16777216.0f; }

static uint8_t finite_byte(void) /* an E4M3 byte that is not NaN */
{
    uint8_t b;
    do b = (uint8_t)rnd(); while ((b & 0x7F) == 0x7F);
    return b;
}

static int64_t count_b(fp8mix_mm_scale kind, int64_t n, int64_t k)
{
    switch (kind) {
    case FP8MIX_MM_SCALE_TENSOR: return 1;
    case FP8MIX_MM_SCALE_OUTER: return n;
    case FP8MIX_MM_SCALE_MX: return n * ceil_div(k, FP8MIX_MX_BLOCK);
    default: return ceil_div(k, FP8MIX_BLOCK) * ceil_div(n, FP8MIX_BLOCK);
    }
}
static int64_t count_a_rows(fp8mix_mm_scale kind, int64_t k) /* per row of A (TENSOR: per group) */
{
    switch (kind) {
    case FP8MIX_MM_SCALE_OUTER: return 1;
    case FP8MIX_MM_SCALE_MX: return ceil_div(k, FP8MIX_MX_BLOCK);
    case FP8MIX_MM_SCALE_BLOCK: return ceil_div(k, FP8MIX_BLOCK);
    default: return 0;
    }
}

static void run_case(int64_t groups, const int64_t *sizes, int64_t n, int64_t k, fp8mix_mm_scale kind,
                     fp8mix_b_layout bl, int with_bias, int threads)
{
    int64_t m = 0, offs[16];
    for (int64_t g = 0; g < groups; g++) offs[g] = (m += sizes[g]);
    int64_t ldb = bl == FP8MIX_B_KN ? n : k, bsz = bl == FP8MIX_B_KN ? k * n : n * k;
    uint8_t *a = malloc((size_t)(m * k + 1)), *b = malloc((size_t)(groups * bsz + 1));
    for (int64_t i = 0; i < m * k; i++) a[i] = finite_byte();
    for (int64_t i = 0; i < groups * bsz; i++) b[i] = finite_byte();
    int64_t na = kind == FP8MIX_MM_SCALE_TENSOR ? groups : m * count_a_rows(kind, k), nbg = count_b(kind, n, k);
    float *sa = malloc((size_t)(na + 1) * 4), *sb = malloc((size_t)(groups * nbg + 1) * 4);
    for (int64_t i = 0; i < na; i++) sa[i] = kind == FP8MIX_MM_SCALE_MX ? ldexpf(1.0f, (int)(rnd() % 9) - 4) : frand(0.01f, 2.0f);
    for (int64_t i = 0; i < groups * nbg; i++) sb[i] = kind == FP8MIX_MM_SCALE_MX ? ldexpf(1.0f, (int)(rnd() % 9) - 4) : frand(0.01f, 2.0f);
    float *bias = malloc((size_t)(groups * n + 1) * 4);
    for (int64_t i = 0; i < groups * n; i++) bias[i] = frand(-1.0f, 1.0f);
    float *out = malloc((size_t)(m * n + 1) * 4), *one = malloc((size_t)(m * n + 1) * 4);
    fp8mix_gemm_args G;
    memset(&G, 0, sizeof G);
    G.m = m; G.n = n; G.k = k; G.a = a; G.fmt_a = FP8MIX_E4M3; G.lda = k ? k : 1;
    G.b = b; G.fmt_b = FP8MIX_E4M3; G.ldb = ldb ? ldb : 1; G.b_layout = bl;
    G.scale_a = sa; G.scale_a_kind = kind; G.scale_b = sb; G.scale_b_kind = kind;
    G.bias = with_bias ? bias : NULL; G.bias_t = FP8MIX_F32; G.out = out; G.out_t = FP8MIX_F32; G.ldo = n ? n : 1;
    fp8mix_set_num_threads(threads);
    fp8mix_status s = fp8mix_gemm_grouped(&G, groups, offs, bsz);
    CHECK(s == FP8MIX_OK, "grouped status %d (kind %d, layout %d)", s, kind, bl);
    /* each group alone, through fp8mix_gemm */
    int64_t r0 = 0;
    int exact = 1, bound = 1;
    const float *tab = fp8mix_decode_table(FP8MIX_E4M3);
    for (int64_t g = 0; g < groups; g++) {
        int64_t rows = offs[g] - r0;
        if (rows) {
            fp8mix_gemm_args A = G;
            A.m = rows; A.a = a + r0 * k; A.b = b + g * bsz; A.out = one;
            A.scale_a = kind == FP8MIX_MM_SCALE_TENSOR ? sa + g : sa + r0 * count_a_rows(kind, k);
            A.scale_b = sb + g * nbg;
            A.bias = with_bias ? bias + g * n : NULL;
            CHECK(fp8mix_gemm(&A) == FP8MIX_OK, "single gemm");
            exact &= !memcmp(one, out + r0 * n, (size_t)(rows * n) * 4);
            /* float64 from the bytes: scale each product by its operands' scales */
            for (int64_t i = 0; i < rows; i++)
                for (int64_t j = 0; j < n; j++) {
                    double ref = 0, mag = 0;
                    for (int64_t p = 0; p < k; p++) {
                        double av = tab[a[(r0 + i) * k + p]];
                        double bv = tab[bl == FP8MIX_B_KN ? b[g * bsz + p * n + j] : b[g * bsz + j * k + p]];
                        double s_a, s_b;
                        if (kind == FP8MIX_MM_SCALE_TENSOR) { s_a = sa[g]; s_b = sb[g]; }
                        else if (kind == FP8MIX_MM_SCALE_OUTER) { s_a = sa[r0 + i]; s_b = sb[g * n + j]; }
                        else if (kind == FP8MIX_MM_SCALE_MX) {
                            int64_t kb = p / 32, nkb = ceil_div(k, 32);
                            s_a = sa[(r0 + i) * nkb + kb]; s_b = sb[g * nbg + j * nkb + kb];
                        } else {
                            int64_t kb = p / 128, nkb = ceil_div(k, 128), nnb = ceil_div(n, 128);
                            s_a = sa[(r0 + i) * nkb + kb]; s_b = sb[g * nbg + kb * nnb + j / 128];
                        }
                        ref += av * bv * s_a * s_b;
                        mag += fabs(av * bv * s_a * s_b);
                    }
                    if (with_bias) ref += bias[g * n + j];
                    double got = out[(r0 + i) * n + j];
                    bound &= fabs(got - ref) <= (k + 8) * FLT_EPSILON * (mag + fabs(ref)) + 1e-30;
                }
        }
        r0 = offs[g];
    }
    CHECK(exact, "every group equals its single GEMM bit for bit (kind %d, layout %d, bias %d, %d threads)", kind,
          bl, with_bias, threads);
    CHECK(bound, "float64 bound (kind %d, layout %d)", kind, bl);
    fp8mix_set_num_threads(1);
    free(a); free(b); free(sa); free(sb); free(bias); free(out); free(one);
}

static void test_errors(void)
{
    uint8_t a[64] = {0}, b[256] = {0};
    float sa[4] = {1, 1, 1, 1}, sb[4] = {1, 1, 1, 1}, out[64];
    for (int i = 0; i < 64; i++) out[i] = -7.0f;
    fp8mix_gemm_args G;
    memset(&G, 0, sizeof G);
    G.m = 4; G.n = 4; G.k = 4; G.a = a; G.lda = 4; G.b = b; G.ldb = 4; G.b_layout = FP8MIX_B_NK;
    G.scale_a = sa; G.scale_b = sb; G.out = out; G.out_t = FP8MIX_F32; G.ldo = 4;
    int64_t bad1[2] = {3, 2}, bad2[2] = {1, 3}, good[2] = {1, 4};
    CHECK(fp8mix_gemm_grouped(&G, 2, bad1, 16) == FP8MIX_ERR_BAD_ARG, "decreasing offs");
    CHECK(fp8mix_gemm_grouped(&G, 2, bad2, 16) == FP8MIX_ERR_BAD_ARG, "offs not ending at m");
    CHECK(fp8mix_gemm_grouped(&G, -1, good, 16) == FP8MIX_ERR_BAD_ARG, "negative groups");
    CHECK(fp8mix_gemm_grouped(&G, 2, good, 8) == FP8MIX_ERR_BAD_SHAPE, "overlapping B");
    CHECK(fp8mix_gemm_grouped(&G, 2, NULL, 16) == FP8MIX_ERR_NULL_POINTER, "NULL offs");
    sb[1] = NAN; /* the second group's scale */
    CHECK(fp8mix_gemm_grouped(&G, 2, good, 16) == FP8MIX_ERR_BAD_SCALE, "bad scale in group 1");
    int untouched = 1;
    for (int i = 0; i < 16; i++) untouched &= out[i] == -7.0f;
    CHECK(untouched, "an error writes nothing, not even the groups before");
    sb[1] = 1;
    int64_t none[1] = {0};
    G.m = 0;
    CHECK(fp8mix_gemm_grouped(&G, 1, none, 16) == FP8MIX_OK, "one empty group");
    CHECK(fp8mix_gemm_grouped(&G, 0, NULL, 16) == FP8MIX_OK, "no groups, no rows");
}

int main(void)
{
    static const int64_t sizes_a[5] = {7, 0, 33, 1, 17}, sizes_b[3] = {0, 0, 50}, sizes_c[4] = {129, 3, 0, 64};
    static const fp8mix_mm_scale kinds[4] = {FP8MIX_MM_SCALE_TENSOR, FP8MIX_MM_SCALE_OUTER, FP8MIX_MM_SCALE_BLOCK,
                                             FP8MIX_MM_SCALE_MX};
    for (int t = 0; t < 4; t++)
        for (int bl = 0; bl < 2; bl++) {
            run_case(5, sizes_a, 24, 40, kinds[t], (fp8mix_b_layout)bl, bl, 1);
            run_case(3, sizes_b, 16, 160, kinds[t], (fp8mix_b_layout)bl, 1, 2);
        }
    run_case(4, sizes_c, 136, 264, FP8MIX_MM_SCALE_TENSOR, FP8MIX_B_NK, 1, 2);
    run_case(4, sizes_c, 136, 264, FP8MIX_MM_SCALE_BLOCK, FP8MIX_B_NK, 0, 2);
    test_errors();
    return check_report("test_grouped");
}
