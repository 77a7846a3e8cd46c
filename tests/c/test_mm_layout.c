/* test_mm_layout.c — fp8mix_mm_layout_plan (cuBLASLt's FP8 layout rules) on the
 * GEMMs fp8mix.Linear runs: forward, dgrad and wgrad for M in {1, 77, 128, 4096},
 * N and K in {16, 48, 144, 4096, 11008}, with per-tensor scales (delayed and
 * current scaling) and 128-block scales (block scaling), in the operand layouts
 * the module passes today (row-major b in dgrad / wgrad) and with the FP8
 * transposes (column-major b everywhere); then every refusal and bad-input rule.
 * Expected values are written from the cuBLAS documentation's rules (fp8mix.h,
 * R1-R9), not read back from the plan. */
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
    return check_report("test_mm_layout");
}
