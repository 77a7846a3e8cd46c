/* test_mm_layout.c — fp8mix_mm_layout_plan (cuBLASLt's FP8 layout rules) on the
 * GEMMs fp8mix.Linear runs: forward, dgrad and wgrad for M in {1, 77, 128, 4096},
 * N and K in {16, 48, 144, 4096, 11008}, with per-tensor scales (delayed and
 * current scaling) and 128-block scales (block scaling), in the operand layouts
 * the module passes today (row-major b in dgrad / wgrad) and with the FP8
 * transposes (column-major b everywhere); then every refusal and bad-input rule.
 * Expected values are written from the cuBLAS documentation's rules (fp8mix.h,
 * R1-R9), not read back from the plan.  Then the op layer's decisions beside it:
 * fp8mix_gemm_operand_layout (every layout rule and the copies), fp8mix_mm_scale_kinds
 * (each kind stated and inferred, each error) and fp8mix_quantize_current_read. */
#include <string.h>

#include "check.h"
#include "fp8mix.h"

static int64_t ru(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* One GEMM out[M,N] = a[M,K] b[K,N]; b column-major (K-contiguous) or row-major. */
static fp8mix_mm_problem problem(int64_t m, int64_t n, int64_t k, int b_col_major, fp8mix_mm_scale kind, int sm)
{
    fp8mix_mm_problem p;
    memset(&p, 0, sizeof p);
    p.m = m; p.n = n; p.k = k;
    p.fmt_a = FP8MIX_E4M3; p.fmt_b = FP8MIX_E4M3;
    p.a_stride0 = k; p.a_stride1 = 1;
    if (b_col_major) { p.b_stride0 = 1; p.b_stride1 = k; }
    else { p.b_stride0 = n; p.b_stride1 = 1; }
    p.a_addr = 0x10000; p.b_addr = 0x20000; p.sa_addr = 0x30000; p.sb_addr = 0x40000; p.out_addr = 0x50000;
    p.scale_a_kind = kind; p.scale_b_kind = kind;
    p.out_t = FP8MIX_BF16;
    p.sm = sm;
    p.blas_version = 131000;
    return p;
}

/* The scratch sub-buffers lie inside scratch_bytes, 256-byte aligned, disjoint. */
static int scratch_ok(const fp8mix_mm_plan *pl, const fp8mix_mm_problem *p)
{
    struct { int used; size_t off, len; } b[7] = {
        {1, pl->off_ws, pl->workspace_bytes},
        {pl->copy_a != FP8MIX_MM_IN_PLACE, pl->off_a, (size_t)(pl->mp * pl->kp)},
        {pl->copy_b != FP8MIX_MM_IN_PLACE, pl->off_b, (size_t)(pl->np * pl->kp)},
        {pl->sa.repack, pl->off_sa, (size_t)(pl->sa.rows * pl->sa.cols) * 4},
        {pl->sb.repack, pl->off_sb, (size_t)(pl->sb.rows * pl->sb.cols) * 4},
        {pl->copy_bias, pl->off_bias, (size_t)pl->np * (p->bias_t == FP8MIX_F32 ? 4 : 2)},
        {pl->d_in_scratch, pl->off_d, (size_t)(pl->mp * pl->np) * (pl->d_t == FP8MIX_F32 ? 4 : 2)}};
    for (int i = 0; i < 7; i++) {
        if (!b[i].used) continue;
        if (b[i].off % 256 || b[i].off + b[i].len > pl->scratch_bytes) return 0;
        for (int j = 0; j < i; j++)
            if (b[j].used && b[i].off < b[j].off + b[j].len && b[j].off < b[i].off + b[i].len) return 0;
    }
    return 1;
}

/* Check one planned GEMM against the rules. */
static void check_gemm(const char *what, int64_t m, int64_t n, int64_t k, int b_col_major, fp8mix_mm_scale kind)
{
    fp8mix_mm_problem p = problem(m, n, k, b_col_major, kind, 90);
    fp8mix_mm_plan pl;
    fp8mix_status st = fp8mix_mm_layout_plan(&p, &pl);
    CHECK(st == FP8MIX_OK && pl.rule == FP8MIX_MM_RULE_OK, "%s %lldx%lldx%lld: status %d rule %d", what,
          (long long)m, (long long)n, (long long)k, (int)st, (int)pl.rule);
    if (st != FP8MIX_OK) return;
    const int block = kind == FP8MIX_MM_SCALE_BLOCK;
    CHECK(pl.mp == (block ? ru(m, 4) : m) && pl.np == ru(n, 16) && pl.kp == ru(k, block ? 128 : 16),
          "%s padded sizes", what);
    const int a_in = k % (block ? 128 : 16) == 0 && (!block || m % 4 == 0);
    CHECK(pl.copy_a == (a_in ? FP8MIX_MM_IN_PLACE : FP8MIX_MM_COPY_PAD), "%s copy_a %d", what, (int)pl.copy_a);
    /* a row-major b needs a transpose, except when K == 1 (one row is both layouts) */
    const fp8mix_mm_copy b_want = !b_col_major && k > 1 ? FP8MIX_MM_COPY_TRANSPOSE
                                  : (b_col_major && k % (block ? 128 : 16) == 0 && n % 16 == 0) ? FP8MIX_MM_IN_PLACE
                                                                                              : FP8MIX_MM_COPY_PAD;
    CHECK(pl.copy_b == b_want, "%s copy_b %d, want %d", what, (int)pl.copy_b, (int)b_want);
    CHECK(pl.lda % 16 == 0 && pl.ldb % 16 == 0 && pl.lda >= pl.kp && pl.ldb >= pl.kp, "%s leading dims", what);
    if (block) {
        const int64_t nkb = cdiv(k, 128);
        CHECK(pl.kind == FP8MIX_MM_SCALE_BLOCK && pl.sa.repack && pl.sb.repack, "%s block repack", what);
        CHECK(pl.sa.rows == nkb && pl.sa.cols == ru(m, 4) && pl.sa.valid_cols == m, "%s VEC128 layout", what);
        CHECK(pl.sb.rows == cdiv(ru(n, 16), 128) && pl.sb.cols == ru(nkb, 4) && pl.sb.valid_rows == cdiv(n, 128) &&
                  pl.sb.valid_cols == nkb, "%s BLK128x128 layout", what);
        CHECK(pl.fast_accum == 0, "%s no fast accumulation with blocks", what);
    } else {
        CHECK(pl.kind == FP8MIX_MM_SCALE_TENSOR && !pl.sa.repack && !pl.sb.repack, "%s tensor scales", what);
    }
    const int direct = pl.mp == m && n % 16 == 0;
    CHECK(pl.d_in_scratch == !direct, "%s output in scratch %d", what, pl.d_in_scratch);
    CHECK(scratch_ok(&pl, &p), "%s scratch layout", what);
}

/* Linear(in=K, out=N) on M tokens: forward, dgrad, wgrad. */
static void check_linear(int64_t m, int64_t n, int64_t k, fp8mix_mm_scale kind, int transposes)
{
    check_gemm("forward", m, n, k, 1, kind);         /* y = x . (w.t())   */
    check_gemm("dgrad", m, k, n, transposes, kind);  /* dx = dy . w       */
    check_gemm("wgrad", n, k, m, transposes, kind);  /* dw = dy^T . x     */
}

static void check_bias(void)
{
    fp8mix_mm_plan pl;
    fp8mix_mm_problem p = problem(128, 48, 64, 1, FP8MIX_MM_SCALE_TENSOR, 90);
    p.has_bias = 1;
    p.bias_t = FP8MIX_BF16;
    p.bias_addr = 0x60000;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.bias_epilogue && !pl.copy_bias && !pl.bias_add &&
              pl.d_t == FP8MIX_BF16, "bf16 bias, bf16 out: epilogue");
    p.bias_addr = 0x60002; /* a view at an odd offset (M1): copied, still in the epilogue */
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.bias_epilogue && pl.copy_bias, "misaligned bias copied");
    p.n = 40; /* padded N: the bias is padded too */
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.bias_epilogue && pl.copy_bias && pl.np == 48, "bias padded");
    p.n = 48;
    p.bias_t = FP8MIX_F32; /* mixed types: float32 product + bias add */
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && !pl.bias_epilogue && pl.bias_add && pl.d_t == FP8MIX_F32 &&
              pl.d_in_scratch, "f32 bias, bf16 out: bias add from a float32 scratch");
    p.out_t = FP8MIX_F32; /* F32 output: accumulate in out itself, bias added in place (M2) */
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && !pl.bias_epilogue && pl.bias_add && !pl.d_in_scratch,
          "f32 out: bias added in place");
    p.out_t = FP8MIX_BF16;
    p.bias_t = FP8MIX_BF16;
    p.scale_a_kind = p.scale_b_kind = FP8MIX_MM_SCALE_BLOCK;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && !pl.bias_epilogue && pl.bias_add, "block scales: bias add");
}

static void check_outer(void)
{
    fp8mix_mm_plan pl;
    fp8mix_mm_problem p = problem(77, 40, 64, 1, FP8MIX_MM_SCALE_OUTER, 90);
    p.scale_b_kind = FP8MIX_MM_SCALE_TENSOR; /* tensor partner: expanded to N (padded to 48) */
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.kind == FP8MIX_MM_SCALE_OUTER, "outer + tensor");
    CHECK(!pl.sa.repack && pl.sa.cols == 77 && pl.sa.src_stride_c == 1, "row scales used as given");
    CHECK(pl.sb.repack && pl.sb.cols == 48 && pl.sb.valid_cols == 40 && pl.sb.src_stride_c == 0,
          "tensor scale broadcast to the padded N");
    p.scale_b_kind = FP8MIX_MM_SCALE_OUTER;
    p.n = 48;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && !pl.sa.repack && !pl.sb.repack, "outer x outer, aligned: in place");
    p.sb_addr = 0x40004;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.sb.repack, "misaligned column scales copied");
    p.fast_accum = 1;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.fast_accum, "fast accumulation kept with outer scales");
}

static void check_refusals(void)
{
    fp8mix_mm_plan pl;
    fp8mix_mm_problem p = problem(64, 64, 64, 1, FP8MIX_MM_SCALE_BLOCK, 89);
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_UNSUPPORTED && pl.rule == FP8MIX_MM_RULE_SCALE_ARCH,
          "block scales on sm_89 refused");
    p.sm = 100;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_UNSUPPORTED && pl.rule == FP8MIX_MM_RULE_SCALE_ARCH,
          "block scales on sm_100 refused");
    p.sm = 90;
    p.blas_version = 120800;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_UNSUPPORTED && pl.rule == FP8MIX_MM_RULE_SCALE_VERSION,
          "block scales with cuBLASLt 12.8 refused");
    p = problem(64, 64, 64, 1, FP8MIX_MM_SCALE_TENSOR, 89);
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_OK, "tensor scales on sm_89");
    p.sm = 86;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_UNSUPPORTED && pl.rule == FP8MIX_MM_RULE_ARCH, "sm_86");
    p.sm = 90;
    p.fmt_a = p.fmt_b = FP8MIX_E5M2;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_UNSUPPORTED && pl.rule == FP8MIX_MM_RULE_FORMATS,
          "e5m2 x e5m2 refused");
    CHECK(strstr(fp8mix_mm_rule_string(pl.rule), "E5M2") != NULL, "rule sentence names the formats");
}

static void check_bad_input(void)
{
    fp8mix_mm_plan pl;
    fp8mix_mm_problem p = problem(64, 64, 64, 1, FP8MIX_MM_SCALE_BLOCK, 90);
    p.scale_b_kind = FP8MIX_MM_SCALE_TENSOR;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_BAD_ARG && pl.rule == FP8MIX_MM_RULE_SCALE_MIX,
          "block with tensor");
    p = problem(0, 64, 64, 1, FP8MIX_MM_SCALE_TENSOR, 90);
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_BAD_SHAPE, "m = 0");
    p = problem((int64_t)1 << 41, 64, 64, 1, FP8MIX_MM_SCALE_TENSOR, 90);
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_BAD_SHAPE, "m too large");
    p = problem(64, 64, 64, 1, FP8MIX_MM_SCALE_TENSOR, 90);
    p.out_t = (fp8mix_dtype)7;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_BAD_ENUM, "bad out dtype");
    p.out_t = FP8MIX_F32;
    p.a_stride0 = -1;
    CHECK(fp8mix_mm_layout_plan(&p, &pl) == FP8MIX_ERR_BAD_SHAPE, "negative stride");
    CHECK(fp8mix_mm_layout_plan(NULL, &pl) == FP8MIX_ERR_NULL_POINTER, "NULL problem");
    /* an M x K operand with K-stride != 1 (column-major a) is a transposing copy */
    p = problem(64, 64, 64, 1, FP8MIX_MM_SCALE_TENSOR, 90);
    p.a_stride0 = 1;
    p.a_stride1 = 64;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.copy_a == FP8MIX_MM_COPY_TRANSPOSE, "column-major a");
    p = problem(64, 64, 64, 1, FP8MIX_MM_SCALE_TENSOR, 90);
    p.a_addr = 0x10008;
    CHECK(!fp8mix_mm_layout_plan(&p, &pl) && pl.copy_a == FP8MIX_MM_COPY_PAD, "misaligned a copied");
}

/* ---- the op layer's decisions: operand layouts, scale kinds, the quantize source ---- */

static fp8mix_strided2d sd(int64_t rows, int64_t cols, int64_t s0, int64_t s1)
{
    fp8mix_strided2d t = {rows, cols, s0, s1};
    return t;
}

/* a (M x K) with strides (sa0, sa1) against a contiguous column-major b. */
static void check_a(const char *what, int64_t m, int64_t k, int64_t s0, int64_t s1, fp8mix_a_layout layout,
                    int64_t lda, int copy)
{
    fp8mix_strided2d a = sd(m, k, s0, s1), b = sd(k, 4, 1, k > 0 ? k : 1);
    fp8mix_gemm_operands o;
    fp8mix_status st = fp8mix_gemm_operand_layout(&a, &b, &o);
    CHECK(st == FP8MIX_OK && o.a_layout == layout && o.lda == lda && o.copy_a == copy,
          "a %s: status %d layout %d lda %lld copy %d", what, (int)st, (int)o.a_layout, (long long)o.lda, o.copy_a);
}

/* b (K x N) with strides (s0, s1) against a contiguous row-major a. */
static void check_b(const char *what, int64_t k, int64_t n, int64_t s0, int64_t s1, fp8mix_b_layout layout,
                    int64_t ldb, int copy)
{
    fp8mix_strided2d a = sd(3, k, k > 0 ? k : 1, 1), b = sd(k, n, s0, s1);
    fp8mix_gemm_operands o;
    fp8mix_status st = fp8mix_gemm_operand_layout(&a, &b, &o);
    CHECK(st == FP8MIX_OK && o.b_layout == layout && o.ldb == ldb && o.copy_b == copy,
          "b %s: status %d layout %d ldb %lld copy %d", what, (int)st, (int)o.b_layout, (long long)o.ldb, o.copy_b);
}

static void check_operand_layout(void)
{
    check_a("row-major", 4, 8, 8, 1, FP8MIX_A_MK, 8, 0);
    check_a("row-major, padded rows", 4, 8, 16, 1, FP8MIX_A_MK, 16, 0);
    check_a("one row, any row stride", 1, 8, 3, 1, FP8MIX_A_MK, 8, 0);
    check_a("one row of a broadcast", 1, 8, 0, 1, FP8MIX_A_MK, 8, 0);
    check_a("K = 0", 3, 0, 1, 1, FP8MIX_A_MK, 1, 0);
    check_a("column-major (dy^T)", 4, 8, 1, 4, FP8MIX_A_KM, 4, 0);
    check_a("column-major, padded columns", 4, 8, 1, 6, FP8MIX_A_KM, 6, 0);
    check_a("column-major with K = 1 is copied", 4, 1, 1, 4, FP8MIX_A_MK, 1, 1);
    check_a("overlapping rows copied", 4, 8, 2, 1, FP8MIX_A_MK, 8, 1);
    check_a("broadcast rows copied", 3, 4, 0, 1, FP8MIX_A_MK, 4, 1);
    check_a("overlapping columns copied", 4, 8, 1, 3, FP8MIX_A_MK, 8, 1);
    check_a("neither layout copied", 4, 8, 16, 2, FP8MIX_A_MK, 8, 1);

    check_b("column-major (w.t())", 8, 4, 1, 8, FP8MIX_B_NK, 8, 0);
    check_b("column-major, padded", 8, 4, 1, 10, FP8MIX_B_NK, 10, 0);
    check_b("one column", 8, 1, 1, 5, FP8MIX_B_NK, 8, 0);
    check_b("row-major", 8, 4, 4, 1, FP8MIX_B_KN, 4, 0);
    check_b("row-major, padded", 8, 4, 6, 1, FP8MIX_B_KN, 6, 0);
    check_b("one row", 1, 4, 4, 1, FP8MIX_B_KN, 4, 0);
    check_b("one row with unit strides: the first rule wins", 1, 4, 1, 1, FP8MIX_B_NK, 1, 0);
    check_b("K = 0", 0, 4, 4, 1, FP8MIX_B_KN, 4, 0);
    check_b("K = 0 and N = 0 copied", 0, 0, 1, 1, FP8MIX_B_KN, 1, 1);
    check_b("overlapping rows copied", 8, 4, 2, 1, FP8MIX_B_KN, 4, 1);
    check_b("neither layout copied", 8, 4, 8, 2, FP8MIX_B_KN, 4, 1);

    fp8mix_gemm_operands o;
    fp8mix_strided2d a = sd(4, 8, 8, 1), b = sd(8, 4, 1, 8);
    CHECK(fp8mix_gemm_operand_layout(NULL, &b, &o) == FP8MIX_ERR_NULL_POINTER, "NULL a");
    CHECK(fp8mix_gemm_operand_layout(&a, NULL, &o) == FP8MIX_ERR_NULL_POINTER, "NULL b");
    CHECK(fp8mix_gemm_operand_layout(&a, &b, NULL) == FP8MIX_ERR_NULL_POINTER, "NULL out");
    b.rows = 7;
    CHECK(fp8mix_gemm_operand_layout(&a, &b, &o) == FP8MIX_ERR_BAD_SHAPE, "inner sizes differ");
    b.rows = 8;
    a.rows = -1;
    CHECK(fp8mix_gemm_operand_layout(&a, &b, &o) == FP8MIX_ERR_BAD_SHAPE, "negative size");
    a.rows = 4;
    b.stride1 = -8;
    CHECK(fp8mix_gemm_operand_layout(&a, &b, &o) == FP8MIX_ERR_BAD_SHAPE, "negative stride");
}

/* A scale array: dim 0 (one value) when rows < 0, else rows x cols. */
static fp8mix_mm_scale_given sg(int64_t rows, int64_t cols, int64_t kind)
{
    fp8mix_mm_scale_given g = {2, rows * cols, rows, cols, kind};
    if (rows < 0) {
        g.dim = 0;
        g.numel = 1;
        g.rows = g.cols = 0;
    }
    return g;
}

static fp8mix_mm_scale_query sq(int64_t m, int64_t n, int64_t k, fp8mix_mm_scale_given a, fp8mix_mm_scale_given b)
{
    fp8mix_mm_scale_query q;
    memset(&q, 0, sizeof q);
    q.m = m; q.n = n; q.k = k;
    q.a = a; q.b = b;
    q.backend = FP8MIX_MM_BACKEND_CPU;
    return q;
}

/* Expect the kinds (when both fit) or the errors. */
static void expect_kinds(const char *what, fp8mix_mm_scale_query q, fp8mix_mm_scale_error err_a,
                         fp8mix_mm_scale_error err_b, fp8mix_mm_scale_error pair, fp8mix_mm_scale kind_a,
                         fp8mix_mm_scale kind_b)
{
    fp8mix_mm_scale_choice c;
    const fp8mix_status st = fp8mix_mm_scale_kinds(&q, &c);
    const int fine = err_a == FP8MIX_MM_SCALE_FITS && err_b == FP8MIX_MM_SCALE_FITS && pair == FP8MIX_MM_SCALE_FITS;
    CHECK(st == (fine ? FP8MIX_OK : FP8MIX_ERR_BAD_ARG), "%s: status %d", what, (int)st);
    CHECK(c.err_a == err_a && c.err_b == err_b && c.pair == pair, "%s: errors %d %d %d", what, (int)c.err_a,
          (int)c.err_b, (int)c.pair);
    if (err_a == FP8MIX_MM_SCALE_FITS && pair != FP8MIX_MM_SCALE_HALF_GIVEN)
        CHECK(c.kind_a == kind_a, "%s: kind_a %d, want %d", what, (int)c.kind_a, (int)kind_a);
    if (err_b == FP8MIX_MM_SCALE_FITS && pair != FP8MIX_MM_SCALE_HALF_GIVEN)
        CHECK(c.kind_b == kind_b, "%s: kind_b %d, want %d", what, (int)c.kind_b, (int)kind_b);
}

static void check_scale_kinds(void)
{
    /* M 256, N 384, K 300: ceil(K/128) = 3, ceil(N/128) = 3, ceil(K/32) = 10 */
    const int64_t M = 256, N = 384, K = 300;
    const fp8mix_mm_scale_error F = FP8MIX_MM_SCALE_FITS;
    const fp8mix_mm_scale T = FP8MIX_MM_SCALE_TENSOR, O = FP8MIX_MM_SCALE_OUTER, B = FP8MIX_MM_SCALE_BLOCK,
                          X = FP8MIX_MM_SCALE_MX;
    /* inferred from the shapes */
    expect_kinds("inferred tensor", sq(M, N, K, sg(-1, 0, -1), sg(-1, 0, -1)), F, F, F, T, T);
    expect_kinds("inferred tensor, (1, 1) arrays", sq(M, N, K, sg(1, 1, -1), sg(1, 1, -1)), F, F, F, T, T);
    expect_kinds("one value each is per tensor even in block shapes", sq(1, 100, 100, sg(1, 1, -1), sg(1, 1, -1)),
                 F, F, F, T, T);
    expect_kinds("inferred outer", sq(M, N, K, sg(M, 1, -1), sg(1, N, -1)), F, F, F, O, O);
    expect_kinds("inferred outer with a tensor partner", sq(M, N, K, sg(M, 1, -1), sg(-1, 0, -1)), F, F, F, O, T);
    expect_kinds("inferred block", sq(M, N, K, sg(M, 3, -1), sg(3, 3, -1)), F, F, F, B, B);
    expect_kinds("any negative kind infers", sq(M, N, K, sg(M, 3, -7), sg(3, 3, -2)), F, F, F, B, B);
    expect_kinds("block a without a block b fits nothing", sq(M, N, K, sg(M, 3, -1), sg(-1, 0, -1)),
                 FP8MIX_MM_SCALE_NO_FIT, F, F, T, T);
    expect_kinds("b as a column fits nothing", sq(M, N, K, sg(M, 1, -1), sg(N, 1, -1)), F, FP8MIX_MM_SCALE_NO_FIT, F,
                 O, T);
    expect_kinds("both fit nothing", sq(M, N, K, sg(2, 2, -1), sg(2, 2, -1)), FP8MIX_MM_SCALE_NO_FIT,
                 FP8MIX_MM_SCALE_NO_FIT, F, T, T);
    fp8mix_mm_scale_query q = sq(M, N, K, sg(-1, 0, -1), sg(-1, 0, -1));
    q.a.dim = 3; /* one value in a 3-D array is no per-tensor scale */
    expect_kinds("a 3-D single value fits nothing", q, FP8MIX_MM_SCALE_NO_FIT, F, F, T, T);
    q.a.dim = 1;
    expect_kinds("a 1-D single value is per tensor", q, F, F, F, T, T);
    /* stated */
    expect_kinds("stated tensor", sq(M, N, K, sg(-1, 0, 0), sg(1, 1, 0)), F, F, F, T, T);
    expect_kinds("stated tensor, row scales given", sq(M, N, K, sg(M, 1, 0), sg(-1, 0, 0)), FP8MIX_MM_SCALE_NOT_KIND,
                 F, F, T, T);
    expect_kinds("stated outer", sq(M, N, K, sg(M, 1, 1), sg(1, N, 1)), F, F, F, O, O);
    expect_kinds("stated outer, one value given", sq(M, N, K, sg(-1, 0, 1), sg(1, N, 1)), FP8MIX_MM_SCALE_NOT_KIND, F,
                 F, O, O);
    expect_kinds("stated outer, b transposed", sq(M, N, K, sg(M, 1, 1), sg(N, 1, 1)), F, FP8MIX_MM_SCALE_NOT_KIND, F,
                 O, O);
    expect_kinds("stated block", sq(M, N, K, sg(M, 3, 2), sg(3, 3, 2)), F, F, F, B, B);
    expect_kinds("stated block, a's shape wrong", sq(M, N, K, sg(M, 4, 2), sg(3, 3, 2)), FP8MIX_MM_SCALE_NOT_KIND,
                 FP8MIX_MM_SCALE_NOT_KIND, F, B, B);
    expect_kinds("stated block b needs a stated block a", sq(1, 100, 100, sg(1, 1, 0), sg(1, 1, 2)), F,
                 FP8MIX_MM_SCALE_NOT_KIND, F, T, B);
    expect_kinds("stated block a with a tensor b is the GEMM's to refuse", sq(1, 100, 100, sg(1, 1, 2), sg(1, 1, 0)),
                 F, F, F, B, T);
    expect_kinds("stated kind 4", sq(M, N, K, sg(-1, 0, 4), sg(-1, 0, 0)), FP8MIX_MM_SCALE_BAD_KIND, F, F, T, T);
    expect_kinds("stated kind 7 on b", sq(M, N, K, sg(-1, 0, 0), sg(-1, 0, 7)), F, FP8MIX_MM_SCALE_BAD_KIND, F, T, T);
    /* MX */
    expect_kinds("stated MX", sq(M, N, K, sg(M, 10, 3), sg(N, 10, 3)), F, F, F, X, X);
    q = sq(M, N, K, sg(M, 10, 3), sg(N, 10, 3));
    q.backend = FP8MIX_MM_BACKEND_CUBLASLT;
    expect_kinds("MX on cuBLASLt", q, FP8MIX_MM_SCALE_NO_MX, FP8MIX_MM_SCALE_NO_MX, F, X, X);
    q = sq(M, N, K, sg(-1, 0, 0), sg(1, N, 1));
    q.backend = FP8MIX_MM_BACKEND_CUBLASLT;
    expect_kinds("cuBLASLt takes the other kinds", q, F, F, F, T, O);
    expect_kinds("stated MX, a's rows wrong", sq(M, N, K, sg(M + 1, 10, 3), sg(N, 10, 3)), FP8MIX_MM_SCALE_NOT_KIND, F,
                 F, X, X);
    q = sq(M, N, K, sg(M, 10, 3), sg(N, 10, 3));
    q.b.dim = 1;
    expect_kinds("stated MX, b 1-D", q, F, FP8MIX_MM_SCALE_NOT_KIND, F, X, X);
    expect_kinds("MX a with a tensor b", sq(M, N, K, sg(M, 10, 3), sg(-1, 0, 0)), F, F, FP8MIX_MM_SCALE_MX_PAIR, X, T);
    expect_kinds("tensor a with an MX b", sq(M, N, K, sg(-1, 0, 0), sg(N, 10, 3)), F, F, FP8MIX_MM_SCALE_MX_PAIR, T, X);
    expect_kinds("MX a with K/32 + 1 blocks", sq(M, N, K, sg(M, 11, 3), sg(N, 10, 3)), F, F, FP8MIX_MM_SCALE_MX_PAIR,
                 X, X);
    expect_kinds("MX b with K/32 - 1 blocks", sq(M, N, K, sg(M, 10, 3), sg(N, 9, 3)), F, F, FP8MIX_MM_SCALE_MX_PAIR,
                 X, X);
    /* one kind stated: nothing else decided */
    expect_kinds("only a stated", sq(M, N, K, sg(-1, 0, 0), sg(-1, 0, -1)), F, F, FP8MIX_MM_SCALE_HALF_GIVEN, T, T);
    expect_kinds("only b stated (even a bad shape is not looked at)", sq(M, N, K, sg(2, 2, -1), sg(-1, 0, 2)), F, F,
                 FP8MIX_MM_SCALE_HALF_GIVEN, T, T);
    /* empty GEMMs still decide: K = 0 gives zero 128-blocks and zero MX blocks */
    expect_kinds("K = 0, block shapes", sq(4, 4, 0, sg(4, 0, -1), sg(0, 1, -1)), F, F, F, B, B);
    expect_kinds("K = 0, MX", sq(4, 4, 0, sg(4, 0, 3), sg(4, 0, 3)), F, F, F, X, X);
    /* bad input */
    fp8mix_mm_scale_choice c;
    q = sq(M, N, K, sg(-1, 0, -1), sg(-1, 0, -1));
    CHECK(fp8mix_mm_scale_kinds(NULL, &c) == FP8MIX_ERR_NULL_POINTER, "NULL query");
    CHECK(fp8mix_mm_scale_kinds(&q, NULL) == FP8MIX_ERR_NULL_POINTER, "NULL choice");
    q.backend = (fp8mix_mm_backend)2;
    CHECK(fp8mix_mm_scale_kinds(&q, &c) == FP8MIX_ERR_BAD_ENUM, "unknown backend");
    q.backend = FP8MIX_MM_BACKEND_CPU;
    q.k = -1;
    CHECK(fp8mix_mm_scale_kinds(&q, &c) == FP8MIX_ERR_BAD_SHAPE, "negative K");
    q.k = K;
    q.b.numel = -1;
    CHECK(fp8mix_mm_scale_kinds(&q, &c) == FP8MIX_ERR_BAD_SHAPE, "negative numel");
    q.b = sg(3, 3, -1);
    q.b.rows = -3;
    CHECK(fp8mix_mm_scale_kinds(&q, &c) == FP8MIX_ERR_BAD_SHAPE, "negative size of a 2-D array");
    q.b = sg(-1, 0, -1);
    q.a.dim = -1;
    CHECK(fp8mix_mm_scale_kinds(&q, &c) == FP8MIX_ERR_BAD_SHAPE, "negative dim");
}

static void expect_read(const char *what, int64_t ndim, const fp8mix_strided2d *x, int64_t gran,
                        unsigned outputs, int transposed, int64_t rows, int64_t cols, int64_t ld)
{
    fp8mix_quantize_read r;
    const fp8mix_status st = fp8mix_quantize_current_read(ndim, x, gran, outputs, &r);
    const fp8mix_quantize_source want = transposed ? FP8MIX_READ_TRANSPOSED : FP8MIX_READ_ROWS;
    CHECK(st == FP8MIX_OK && r.source == want && r.rows == rows && r.cols == cols && r.ld == ld,
          "%s: status %d source %d (%lld, %lld, ld %lld)", what, (int)st, (int)r.source, (long long)r.rows,
          (long long)r.cols, (long long)r.ld);
}

static void check_quantize_read(void)
{
    const int64_t BL = FP8MIX_GRAN_BLOCK;
    const fp8mix_strided2d yt = sd(5, 8, 1, 5);     /* y (8, 5) row-major, x = y.t() (5, 8) */
    const fp8mix_strided2d yt_pad = sd(5, 8, 1, 7); /* y with row stride 7 */
    expect_read("x = y.t()", 2, &yt, BL, FP8MIX_OUT_Q, 1, 8, 5, 5);
    expect_read("x = y.t(), y's rows padded", 2, &yt_pad, BL, FP8MIX_OUT_Q, 1, 8, 5, 7);
    expect_read("with qt", 2, &yt, BL, FP8MIX_OUT_Q | FP8MIX_OUT_QT, 0, 0, 0, 0);
    expect_read("qt only", 2, &yt, BL, FP8MIX_OUT_QT, 0, 0, 0, 0);
    expect_read("no outputs", 2, &yt, BL, 0, 0, 0, 0, 0);
    const int64_t others[] = {FP8MIX_GRAN_TENSOR, FP8MIX_GRAN_ROW, FP8MIX_GRAN_BLOCK2D, FP8MIX_GRAN_MX, 9, -2};
    for (int i = 0; i < 6; i++) expect_read("another granularity", 2, &yt, others[i], FP8MIX_OUT_Q, 0, 0, 0, 0);
    expect_read("3-D (its sizes are not read)", 3, NULL, BL, FP8MIX_OUT_Q, 0, 0, 0, 0);
    expect_read("1-D", 1, NULL, BL, FP8MIX_OUT_Q, 0, 0, 0, 0);
    const fp8mix_strided2d one_row = sd(1, 8, 1, 1), one_col = sd(5, 1, 1, 5), rowmajor = sd(5, 8, 8, 1),
                           overlap = sd(5, 8, 1, 4);
    expect_read("one row", 2, &one_row, BL, FP8MIX_OUT_Q, 0, 0, 0, 0);
    expect_read("one column", 2, &one_col, BL, FP8MIX_OUT_Q, 0, 0, 0, 0);
    expect_read("row-major x", 2, &rowmajor, BL, FP8MIX_OUT_Q, 0, 0, 0, 0);
    expect_read("overlapping columns", 2, &overlap, BL, FP8MIX_OUT_Q, 0, 0, 0, 0);
    fp8mix_quantize_read r;
    const fp8mix_strided2d neg = sd(5, 8, 1, -5);
    CHECK(fp8mix_quantize_current_read(2, &yt, BL, FP8MIX_OUT_Q, NULL) == FP8MIX_ERR_NULL_POINTER, "NULL out");
    CHECK(fp8mix_quantize_current_read(2, NULL, BL, FP8MIX_OUT_Q, &r) == FP8MIX_ERR_NULL_POINTER, "2-D, NULL x");
    CHECK(fp8mix_quantize_current_read(-1, NULL, BL, FP8MIX_OUT_Q, &r) == FP8MIX_ERR_BAD_SHAPE, "negative ndim");
    CHECK(fp8mix_quantize_current_read(2, &neg, BL, FP8MIX_OUT_Q, &r) == FP8MIX_ERR_BAD_SHAPE, "negative stride");
}

int main(void)
{
    const int64_t ms[] = {1, 77, 128, 4096}, nk[] = {16, 48, 144, 4096, 11008};
    const fp8mix_mm_scale kinds[] = {FP8MIX_MM_SCALE_TENSOR, FP8MIX_MM_SCALE_BLOCK};
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 5; j++)
                    for (int l = 0; l < 5; l++) check_linear(ms[i], nk[j], nk[l], kinds[s], t);
    check_bias();
    check_outer();
    check_refusals();
    check_bad_input();
    check_operand_layout();
    check_scale_kinds();
    check_quantize_read();
    return check_report("test_mm_layout");
}
