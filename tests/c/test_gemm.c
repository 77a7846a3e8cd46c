/*
 * test_gemm.c — the scaled FP8 GEMM (fp8mix_gemm) against a float64 oracle
 * computed here from fp8mix_decode_ref, and against the scalar reference
 * fp8mix_gemm_ref bit for bit on every ISA this CPU has and for 1 to 4
 * threads; the packing of every ISA against its definition (the decode
 * table) over every byte.  Also: the FP22 accumulation model (error grows
 * without promotion, stays bounded with it), NaN/inf propagation, bad
 * arguments, and a report of which microkernels were compared.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "fp8mix.h"
#include "gemm_internal.h"
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

/* A random finite FP8 byte (no NaN, no inf). */
static uint8_t rnd_fp8(fp8mix_format f)
{
    for (;;) {
        uint8_t q = (uint8_t)rnd();
        if (f == FP8MIX_E4M3 ? (q & 0x7F) != 0x7F : (q & 0x7C) != 0x7C) return q;
    }
}

static float rnd_scale(void) { return ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, (int)(rnd() % 9) - 4); }

typedef struct problem {
    fp8mix_gemm_args g;
    uint8_t *a, *b;
    float *sa, *sb;
    void *bias;
    int64_t nsa, nsb;
} problem;

static int64_t nscale(fp8mix_mm_scale kind, int64_t rows, int64_t k, int64_t n, int is_a)
{
    if (kind == FP8MIX_MM_SCALE_TENSOR) return 1;
    if (kind == FP8MIX_MM_SCALE_OUTER) return is_a ? rows : n;
    if (kind == FP8MIX_MM_SCALE_MX) return (is_a ? rows : n) * ((k + 31) / 32);
    int64_t nkb = (k + 127) / 128;
    return is_a ? rows * nkb : nkb * ((n + 127) / 128);
}

/* A's layout of the next problems: -1 random, else that layout. */
static int a_layout_mode = -1;

/* Random operands with padded leading dimensions. */
static void make_problem(problem *p, int64_t m, int64_t n, int64_t k, fp8mix_format fa,
                         fp8mix_format fb, fp8mix_b_layout lay, fp8mix_mm_scale kind,
                         int bias, fp8mix_dtype out_t, fp8mix_accum accum, int64_t interval)
{
    memset(p, 0, sizeof *p);
    fp8mix_gemm_args *g = &p->g;
    g->m = m; g->n = n; g->k = k;
    g->fmt_a = fa; g->fmt_b = fb; g->b_layout = lay;
    g->a_layout = (fp8mix_a_layout)(a_layout_mode >= 0 ? a_layout_mode : (int)(rnd() & 1));
    /* ld >= max(cols, 1), sometimes padded */
    g->lda = (g->a_layout == FP8MIX_A_MK ? (k > 0 ? k : 1) : (m > 0 ? m : 1)) + (int64_t)(rnd() % 3);
    g->ldb = (lay == FP8MIX_B_KN ? n : (k > 0 ? k : 1)) + (int64_t)(rnd() % 3);
    g->ldo = n + (int64_t)(rnd() % 3);
    int64_t brows = lay == FP8MIX_B_KN ? k : n;
    int64_t arows = g->a_layout == FP8MIX_A_MK ? m : k;
    p->a = malloc((size_t)(arows * g->lda + 1));
    p->b = malloc((size_t)(brows * g->ldb + 1));
    for (int64_t i = 0; i < arows * g->lda; i++) p->a[i] = rnd_fp8(fa);
    for (int64_t i = 0; i < brows * g->ldb; i++) p->b[i] = rnd_fp8(fb);
    p->nsa = nscale(kind, m, k, n, 1);
    p->nsb = nscale(kind, m, k, n, 0);
    p->sa = malloc((size_t)(p->nsa + 1) * 4);
    p->sb = malloc((size_t)(p->nsb + 1) * 4);
    for (int64_t i = 0; i < p->nsa; i++) p->sa[i] = rnd_scale();
    for (int64_t i = 0; i < p->nsb; i++) p->sb[i] = rnd_scale();
    g->a = p->a; g->b = p->b;
    g->scale_a = p->sa; g->scale_b = p->sb;
    g->scale_a_kind = g->scale_b_kind = kind;
    g->out_t = out_t;
    g->accum = accum;
    g->promote_interval = interval;
    if (bias) {
        /* bias in float32 or in the output dtype */
        g->bias_t = (rnd() & 1) ? FP8MIX_F32 : out_t;
        float *bf = malloc((size_t)n * 4 + 4);
        uint16_t *bh = malloc((size_t)n * 2 + 2);
        for (int64_t j = 0; j < n; j++) bf[j] = (float)((int)(rnd() % 2001) - 1000) / 7.0f;
        if (g->bias_t == FP8MIX_F32) {
            p->bias = bf;
            free(bh);
        } else {
            for (int64_t j = 0; j < n; j++) bh[j] = (uint16_t)(rnd() & 0x3BFF); /* finite */
            p->bias = bh;
            free(bf);
        }
        g->bias = p->bias;
    }
}

static void free_problem(problem *p)
{
    free(p->a); free(p->b); free(p->sa); free(p->sb); free(p->bias);
}

static size_t out_bytes(const fp8mix_gemm_args *g)
{
    return (size_t)(g->m * g->ldo) * (g->out_t == FP8MIX_F32 ? 4 : 2) + 4;
}

static double bias_at(const fp8mix_gemm_args *g, int64_t j)
{
    if (!g->bias) return 0.0;
    if (g->bias_t == FP8MIX_F32) return ((const float *)g->bias)[j];
    uint16_t h = ((const uint16_t *)g->bias)[j];
    if (g->bias_t == FP8MIX_BF16) {
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    /* f16 */
    int e = (h >> 10) & 31, mnt = h & 1023;
    double v = e ? ldexp(1.0 + mnt / 1024.0, e - 15) : ldexp(mnt / 1024.0, -14);
    return (h & 0x8000) ? -v : v;
}

/* float64 oracle of the exact math (no float32 rounding anywhere). */
static double *oracle(const fp8mix_gemm_args *g)
{
    double *o = malloc((size_t)(g->m * g->n + 1) * sizeof(double));
    const int mx = g->scale_a_kind == FP8MIX_MM_SCALE_MX, blocked = mx || g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    const int64_t bk = mx ? 32 : 128; /* K block of the scales */
    int64_t nkb = (g->k + bk - 1) / bk, nnb = (g->n + 127) / 128;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            double tot = 0.0;
            for (int64_t p0 = 0; p0 < g->k || (p0 == 0 && g->k == 0); p0 += bk) {
                int64_t p1 = blocked ? (p0 + bk < g->k ? p0 + bk : g->k) : g->k;
                double s = 0.0;
                for (int64_t p = p0; p < p1; p++) {
                    uint8_t bq = g->b_layout == FP8MIX_B_KN ? g->b[p * g->ldb + j]
                                                            : g->b[j * g->ldb + p];
                    s += (double)fp8mix_decode_ref(fp8mix_gemm_a_at(g, i, p), g->fmt_a) *
                         (double)fp8mix_decode_ref(bq, g->fmt_b);
                }
                if (mx) {
                    tot += s * (double)(g->scale_a[i * nkb + p0 / bk] * g->scale_b[j * nkb + p0 / bk]);
                } else if (g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK) {
                    tot += s * (double)(g->scale_a[i * nkb + p0 / 128] *
                                        g->scale_b[(p0 / 128) * nnb + j / 128]);
                } else {
                    double sa = g->scale_a[g->scale_a_kind == FP8MIX_MM_SCALE_TENSOR ? 0 : i];
                    double sb = g->scale_b[g->scale_b_kind == FP8MIX_MM_SCALE_TENSOR ? 0 : j];
                    tot = s * sa * sb;
                    break;
                }
                if (p1 >= g->k) break;
            }
            o[i * g->n + j] = tot + bias_at(g, j);
        }
    return o;
}

/* Relative Frobenius error of a float32 output against the oracle. */
static double rel_err(const fp8mix_gemm_args *g, const float *out, const double *o)
{
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            double d = (double)out[i * g->ldo + j] - o[i * g->n + j];
            num += d * d;
            den += o[i * g->n + j] * o[i * g->n + j];
        }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Compare the m x n valid region of two outputs bit for bit. */
static int same_out(const fp8mix_gemm_args *g, const void *x, const void *y)
{
    size_t es = g->out_t == FP8MIX_F32 ? 4 : 2;
    for (int64_t i = 0; i < g->m; i++)
        if (memcmp((const char *)x + (size_t)(i * g->ldo) * es,
                   (const char *)y + (size_t)(i * g->ldo) * es, (size_t)g->n * es))
            return 0;
    return 1;
}

static const fp8mix_isa isas[] = {FP8MIX_ISA_SCALAR, FP8MIX_ISA_AVX2, FP8MIX_ISA_AVX512,
                                  FP8MIX_ISA_AVX512BF16};

/* GEMM runs compared with the reference, per microkernel (by name). */
enum { MAX_UK = 8 };
static const char *uk_names[MAX_UK];
static long uk_runs[MAX_UK];

static void count_kernel(const fp8mix_gemm_ukernel *uk)
{
    const char *name = uk->name;
    for (int i = 0; i < MAX_UK; i++) {
        if (!uk_names[i]) uk_names[i] = name;
        if (uk_names[i] == name) {
            uk_runs[i]++;
            return;
        }
    }
}

/* Run p through fp8mix_gemm under every ISA limit, and (float32 accumulation)
 * through every microkernel this CPU can run, whether or not dispatch picks
 * it here, in both of the driver's tile orders (its own a_outer and the other: each
 * order then runs on every CPU, whatever kernel uses it) (1 to 4 threads when
 * `threads`); compare with the reference bit for bit; for F32 output compare with
 * float64. */
static void check_problem(problem *p, int threads, double tol)
{
    fp8mix_gemm_args g = p->g;
    size_t nb = out_bytes(&g);
    void *ref = malloc(nb), *out = malloc(nb);
    memset(ref, 0, nb);
    g.out = ref;
    fp8mix_status st = fp8mix_gemm_ref(&g);
    CHECK(st == FP8MIX_OK, "ref status %d", st);
    if (g.out_t == FP8MIX_F32 && tol > 0) {
        double *o = oracle(&g);
        double e = rel_err(&g, (const float *)ref, o);
        CHECK(e <= tol, "m=%lld n=%lld k=%lld fa=%d fb=%d lay=%d kind=%d err=%g",
              (long long)g.m, (long long)g.n, (long long)g.k, g.fmt_a, g.fmt_b,
              g.b_layout, g.scale_a_kind, e);
        free(o);
    }
    fp8mix_isa best = fp8mix_cpu_isa();
    for (int t = 1; t <= (threads ? 4 : 1); t++) {
        fp8mix_set_num_threads(threads ? t : 0);
        const fp8mix_gemm_ukernel *uks[MAX_UK];
        int nuk = fp8mix_gemm_ukernels(uks, MAX_UK);
        for (int u = 0; g.accum == FP8MIX_ACCUM_FP32 && u < nuk; u++) {
            count_kernel(uks[u]);
            fp8mix_gemm_ukernel other = *uks[u];
            other.a_outer = !other.a_outer;
            for (int o = 0; o < 2; o++) {
                memset(out, 0, nb);
                g.out = out;
                st = fp8mix_gemm_blocked_with(&g, o ? &other : uks[u]);
                CHECK(st == FP8MIX_OK && same_out(&g, ref, out),
                      "kernel=%s a_outer=%d threads=%d m=%lld n=%lld k=%lld fa=%d fb=%d lay=%d kind=%d out=%d bias=%d "
                      "st=%d",
                      uks[u]->name, o ? other.a_outer : uks[u]->a_outer, t, (long long)g.m, (long long)g.n,
                      (long long)g.k, g.fmt_a, g.fmt_b, g.b_layout, g.scale_a_kind, g.out_t, g.bias != NULL, st);
            }
        }
        for (size_t v = 0; v < sizeof isas / sizeof isas[0] && isas[v] <= best; v++) {
            fp8mix_set_max_isa(isas[v]);
            memset(out, 0, nb);
            g.out = out;
            st = fp8mix_gemm(&g);
            CHECK(st == FP8MIX_OK && same_out(&g, ref, out),
                  "isa=%s threads=%d m=%lld n=%lld k=%lld fa=%d fb=%d lay=%d kind=%d "
                  "out=%d bias=%d accum=%d st=%d",
                  fp8mix_isa_name(isas[v]), t, (long long)g.m, (long long)g.n,
                  (long long)g.k, g.fmt_a, g.fmt_b, g.b_layout, g.scale_a_kind, g.out_t,
                  g.bias != NULL, g.accum, st);
        }
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    fp8mix_set_num_threads(0);
    free(ref);
    free(out);
}

static void test_shapes(void)
{
    static const int64_t shapes[][3] = {
        {1, 1, 1},    {1, 1, 2},     {2, 3, 1},     {1, 37, 5},    {13, 1, 129},
        {14, 32, 128}, {15, 33, 127}, {28, 64, 256}, {29, 65, 257}, {17, 31, 200},
        {31, 17, 383}, {6, 16, 3},    {7, 15, 130},  {67, 97, 61},  {43, 129, 300},
        {3, 100, 700}, {100, 5, 511}, {1, 130, 1000},
    };
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < n; s++) {
        for (int c = 0; c < 6; c++) {
            problem p;
            fp8mix_format fa = (fp8mix_format)((s + c) & 1), fb = (fp8mix_format)(((s + c) >> 1) & 1);
            fp8mix_b_layout lay = (fp8mix_b_layout)(c & 1);
            fp8mix_mm_scale kind = (fp8mix_mm_scale)(c % 3);
            fp8mix_dtype out_t = (fp8mix_dtype)((s + c) % 3 == 2 ? (c & 2 ? 1 : 2) : 0);
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], fa, fb, lay, kind,
                         (c + s) & 1, out_t, FP8MIX_ACCUM_FP32, 0);
            check_problem(&p, 0, 1e-6);
            free_problem(&p);
        }
    }
    /* Every format pair x layout x scale kind x bias on one awkward shape. */
    for (int fa = 0; fa < 2; fa++)
        for (int fb = 0; fb < 2; fb++)
            for (int lay = 0; lay < 2; lay++)
                for (int kind = 0; kind < 3; kind++)
                    for (int bias = 0; bias < 2; bias++) {
                        problem p;
                        make_problem(&p, 19, 45, 259, (fp8mix_format)fa, (fp8mix_format)fb,
                                     (fp8mix_b_layout)lay, (fp8mix_mm_scale)kind, bias,
                                     FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
                        check_problem(&p, 0, 1e-6);
                        free_problem(&p);
                    }
    /* Every output dtype. */
    for (int ot = 0; ot < 3; ot++) {
        problem p;
        make_problem(&p, 9, 70, 140, FP8MIX_E4M3, FP8MIX_E5M2, FP8MIX_B_NK,
                     FP8MIX_MM_SCALE_BLOCK, 1, (fp8mix_dtype)ot, FP8MIX_ACCUM_FP32, 0);
        check_problem(&p, 0, 1e-6);
        free_problem(&p);
    }
}

/* Big enough to use threads, column splits, and (huge K) several packed
 * chunks of B columns or of A rows. */
static void test_threads(void)
{
    static const int64_t shapes[][3] = {
        {150, 300, 400}, {3, 100, 70001}, {40, 1030, 900}, {200, 20, 40001}, {37, 4500, 300}};
    /* FP8MIX_QUICK=1 (the valgrind run): only the first shape */
    int nshapes = getenv("FP8MIX_QUICK") ? 1 : 5;
    for (int s = 0; s < nshapes; s++)
        for (int kind = 0; kind < 3; kind += 2) {
            problem p;
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], FP8MIX_E4M3,
                         FP8MIX_E4M3, (fp8mix_b_layout)(s & 1), (fp8mix_mm_scale)kind, 1,
                         FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
            check_problem(&p, 1, s == 0 ? 1e-6 : 0);
            free_problem(&p);
        }
}

/* Per-row A scales with a per-tensor B scale (torchao's rowwise forward, the
 * epilogue's common case that the AVX2 kernel fuses into its last store), with and
 * without bias, over whole and ragged tiles and several K steps. */
static void test_row_tensor_scales(void)
{
    static const int64_t shapes[][3] = {{12, 32, 64}, {37, 50, 300}, {60, 96, 1100}, {7, 16, 513}};
    for (int s = 0; s < 4; s++)
        for (int bias = 0; bias < 2; bias++) {
            problem p;
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], FP8MIX_E4M3, FP8MIX_E5M2,
                         (fp8mix_b_layout)(s & 1), FP8MIX_MM_SCALE_OUTER, bias, FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
            p.g.scale_b_kind = FP8MIX_MM_SCALE_TENSOR; /* reads sb[0] */
            check_problem(&p, 1, 1e-6);
            free_problem(&p);
        }
}

/* MX scales (32-deep K runs) through the blocked driver and every microkernel (the
 * kernels' own MX mode and the driver's generic loop) against the plain-loop
 * reference fp8mix_gemm_mx, bit for bit: K below, at and between 32-multiples,
 * odd K, several K steps, ragged tiles, both layouts of each operand, every output
 * dtype, bias, 1 to 4 threads on the larger shapes. */
static void test_mx_shapes(void)
{
    static const int64_t shapes[][3] = {
        {1, 1, 1},    {1, 1, 2},    {2, 3, 31},   {6, 16, 32},   {7, 17, 33},  {5, 15, 63},
        {12, 32, 64}, {13, 33, 95}, {14, 31, 128}, {6, 16, 160}, {19, 45, 259}, {37, 50, 511},
        {8, 40, 512}, {9, 23, 513}, {3, 100, 1100}, {30, 70, 2049},
    };
    int n = (int)(sizeof shapes / sizeof shapes[0]);
    for (int s = 0; s < n; s++)
        for (int c = 0; c < 4; c++) {
            problem p;
            fp8mix_dtype out_t = (fp8mix_dtype)((s + c) % 3);
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], (fp8mix_format)(c & 1),
                         (fp8mix_format)((s + c) >> 1 & 1), (fp8mix_b_layout)((c >> 1) & 1), FP8MIX_MM_SCALE_MX,
                         (s + c) & 1, out_t, FP8MIX_ACCUM_FP32, 0);
            check_problem(&p, 0, 1e-6);
            free_problem(&p);
        }
    static const int64_t big[][3] = {{150, 300, 400}, {40, 1030, 900}, {3, 100, 7001}};
    for (int s = 0; s < (getenv("FP8MIX_QUICK") ? 1 : 3); s++) {
        problem p;
        make_problem(&p, big[s][0], big[s][1], big[s][2], FP8MIX_E4M3, FP8MIX_E4M3, (fp8mix_b_layout)(s & 1),
                     FP8MIX_MM_SCALE_MX, 1, FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
        check_problem(&p, 1, 1e-6);
        free_problem(&p);
    }
}

/* MX scales that are powers of two (what MX quantisation makes: the kernels' exponent-add
 * mode, fn_mx_pow2) through every kernel and ISA against fp8mix_gemm_mx, bit for bit:
 * moderate exponents; scale products at the ends of the normal range (2^-126, 2^127:
 * still that mode); products beyond them (overflow to inf, subnormal) and a scale that
 * is not a power of two, which send the tiles that hold them back to the multiply; in
 * a few rows or columns only, so that both modes meet in one GEMM. */
static float pow2_scale(int e) { return ldexpf(1.0f, e); }

static void test_mx_pow2(void)
{
    static const int64_t shapes[][3] = {{30, 70, 600}, {29, 33, 257}, {15, 64, 95}};
    for (int s = 0; s < 3; s++)
        for (int mode = 0; mode < 5; mode++) {
            problem p;
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], (fp8mix_format)(mode & 1),
                         (fp8mix_format)(s & 1), (fp8mix_b_layout)((s + mode) & 1), FP8MIX_MM_SCALE_MX,
                         mode & 1, FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
            for (int64_t i = 0; i < p.nsa; i++) p.sa[i] = pow2_scale((int)(rnd() % 17) - 8);
            for (int64_t i = 0; i < p.nsb; i++) p.sb[i] = pow2_scale((int)(rnd() % 17) - 8);
            int64_t nkb = (p.g.k + 31) / 32, late = p.nsa - 1; /* the last row's last block */
            if (mode == 1) { /* products of exactly 2^-126 and 2^127: the exponent-add mode */
                for (int64_t i = 0; i < nkb; i++) p.sa[i] = pow2_scale(-63), p.sb[i] = pow2_scale(-63);
                p.sa[late] = pow2_scale(64);
                p.sb[p.nsb - 1] = pow2_scale(63);
            } else if (mode == 2) { /* a product past 2^127: inf in those outputs */
                p.sa[late] = pow2_scale(120);
                p.sb[p.nsb - 1] = pow2_scale(10);
            } else if (mode == 3) { /* subnormal products */
                for (int64_t i = 0; i < nkb; i++) p.sa[i] = pow2_scale(-120);
                p.sb[0] = pow2_scale(-10);
            } else if (mode == 4) { /* one scale of one row block not a power of two */
                p.sa[nkb + 1] = 1.5f;
            }
            check_problem(&p, mode == 0 || mode == 4, mode == 0 ? 1e-6 : 0);
            free_problem(&p);
        }
}

/* MX scales that allow the prescaled mode (fn_mx_scaled: every scale a power of two in
 * [2^-45, 2^45], the panels packed times their scales) at the ends of that range, over
 * several K steps (K 1100: a partial last block), E5M2 operands whose products span
 * 2^-32 .. 2^30: bit for bit fp8mix_gemm_mx through every kernel and ISA.  Then one
 * scale just outside the range (2^46, 2^-46) in a late block, which sends the whole
 * GEMM back to the other modes, and scale products of 2^110 and 2^-120 everywhere, where
 * a scaled panel's partial sums would overflow or turn subnormal (a driver that prescaled
 * there differs). */
static void test_mx_prescaled(void)
{
    static const int64_t shapes[][3] = {{31, 1100, 70}, {14, 545, 33}};
    for (int s = 0; s < 2; s++)
        for (int mode = 0; mode < 5; mode++) {
            problem p;
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], FP8MIX_E5M2, (fp8mix_format)(mode & 1),
                         (fp8mix_b_layout)((s + mode) & 1), FP8MIX_MM_SCALE_MX, mode & 1, FP8MIX_F32,
                         FP8MIX_ACCUM_FP32, 0);
            static const int ends[] = {-45, 45, -44, 44, 0};
            for (int64_t i = 0; i < p.nsa; i++) p.sa[i] = pow2_scale(ends[rnd() % 5]);
            for (int64_t i = 0; i < p.nsb; i++) p.sb[i] = pow2_scale(ends[rnd() % 5]);
            if (mode == 1) p.sa[p.nsa - 1] = pow2_scale(46);
            if (mode == 2) p.sb[p.nsb / 2] = pow2_scale(-46);
            for (int64_t i = 0; mode >= 3 && i < p.nsa; i++) p.sa[i] = pow2_scale(mode == 3 ? 55 : -60);
            for (int64_t i = 0; mode >= 3 && i < p.nsb; i++) p.sb[i] = pow2_scale(mode == 3 ? 55 : -60);
            check_problem(&p, 1, 0);
            free_problem(&p);
        }
}

/* bf16 / f16 output with many rows: the float32 accumulator is capped, so the
 * columns come in several chunks. */
static void test_acc_chunks(void)
{
    if (getenv("FP8MIX_QUICK")) return;
    for (int ot = 1; ot < 3; ot++) {
        problem p;
        make_problem(&p, 2100, 1300, 40, FP8MIX_E5M2, FP8MIX_E4M3, FP8MIX_B_KN, FP8MIX_MM_SCALE_OUTER, 1,
                     (fp8mix_dtype)ot, FP8MIX_ACCUM_FP32, 0);
        check_problem(&p, 1, 0);
        free_problem(&p);
    }
}

/* The packing of every ISA, over every byte, against its definition: slot
 * t holds the decoded k = t ^ 1 (float32) or the bf16 pair (2q, 2q+1), zero
 * beyond nv and beyond kc. */
static void test_packing_once(long *bad, long *runs);

static void test_packing(void)
{
    long bad = 0, runs = 0;
    test_packing_once(&bad, &runs);
#if defined(__x86_64__)
    /* again with denormals-are-zero and flush-to-zero set, as a caller may have
     * them (torch.set_flush_denormal): the decoding must not depend on them */
    unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u);
    test_packing_once(&bad, &runs);
    _mm_setcsr(csr);
#endif
    CHECK(bad == 0 && runs > 0, "%ld of %ld packed panels differ from the decode table", bad, runs);
}

static void test_packing_once(long *bad_out, long *runs_out)
{
    enum { KMAX = 73, W = 32, LD = 77 };
    uint8_t src[W * LD + KMAX * LD];
    uint32_t got[(KMAX + 2) * W], want[(KMAX + 1) * W];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)(i * 73 + 5); /* every byte value */
    fp8mix_isa best = fp8mix_cpu_isa();
    long bad = 0, runs = 0;
    for (int fmt = 0; fmt < 2; fmt++) {
        const float *t = fp8mix_decode_table((fp8mix_format)fmt);
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int kcols = 0; kcols < 2; kcols++)
                for (int w = 4; w <= W; w += (w < 16 ? 2 : 8))
                    for (int nv = 0; nv <= w; nv += (nv < 8 ? 1 : 3))
                        for (int kc = 0; kc <= KMAX; kc += (kc < 18 ? 1 : 5)) {
                            int64_t kce = kc + (kc & 1), slots = bf16 ? kce / 2 : kce;
                            for (int64_t sl = 0; sl < slots; sl++)
                                for (int r = 0; r < w; r++) {
                                    float v[2] = {0.0f, 0.0f};
                                    for (int h = 0; h < 2; h++) {
                                        int64_t k = bf16 ? 2 * sl + h : sl ^ 1;
                                        if ((bf16 || h == 0) && r < nv && k < kc)
                                            v[h] = t[kcols ? src[k * LD + r] : src[r * LD + k]];
                                    }
                                    uint32_t b0, b1;
                                    memcpy(&b0, &v[0], 4);
                                    memcpy(&b1, &v[1], 4);
                                    want[sl * w + r] = bf16 ? (b0 >> 16) | (b1 & 0xFFFF0000u) : b0;
                                }
                            for (size_t v = 0; v < sizeof isas / sizeof isas[0] && isas[v] <= best; v++) {
                                fp8mix_set_max_isa(isas[v]);
                                const fp8mix_gemm_ukernel *uk = fp8mix_gemm_ukernel_active();
                                memset(got, 0xCD, sizeof got);
                                (kcols ? uk->pack_kcols : uk->pack_krows)(src, LD, nv, w, kc, (fp8mix_format)fmt,
                                                                          bf16, got);
                                int past = 0; /* nothing written past the panel */
                                for (size_t x = (size_t)(slots * w); x < sizeof got / sizeof got[0]; x++)
                                    past |= got[x] != 0xCDCDCDCDu;
                                bad += memcmp(got, want, (size_t)(slots * w) * 4) != 0 || past;
                                runs++;
                            }
                        }
    }
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
    *bad_out += bad;
    *runs_out += runs;
}

/* What the comparisons covered; fails when a kernel this CPU can run (or
 * the one a level dispatches to) compared nothing. */
static void report_coverage(void)
{
    printf("microkernels compared with fp8mix_gemm_ref (each in both tile orders):");
    for (int i = 0; i < MAX_UK && uk_names[i]; i++) printf(" %s (%ld runs)", uk_names[i], uk_runs[i]);
    const fp8mix_gemm_ukernel *uks[MAX_UK];
    int nuk = fp8mix_gemm_ukernels(uks, MAX_UK);
    printf("; dispatch at %s: %s\n", fp8mix_isa_name(fp8mix_cpu_isa()), fp8mix_gemm_ukernel_active()->name);
    CHECK(nuk >= 1 + (fp8mix_cpu_isa() >= FP8MIX_ISA_AVX2) + (fp8mix_cpu_isa() >= FP8MIX_ISA_AVX512),
          "only %d kernels for %s", nuk, fp8mix_isa_name(fp8mix_cpu_isa()));
    for (int u = 0; u < nuk; u++) {
        long runs = 0;
        for (int i = 0; i < MAX_UK && uk_names[i]; i++)
            if (uk_names[i] == uks[u]->name) runs = uk_runs[i];
        CHECK(runs > 0, "%s was never compared", uks[u]->name);
    }
}

/* ---- the AMX kernel (emulated tiles) and the NATIVE order ---------------- */

/* One output's K run [p0, p1) in tdpbf16ps's order (fp8mix.h, fp8mix_gemm_order),
 * written from the definition: per 32-deep chunk (aligned to p0) the even and the odd
 * k's products summed apart from +0, then acc = acc + (even + odd). */
static float amx_run(const fp8mix_gemm_args *g, int64_t i, int64_t j, int64_t p0, int64_t p1)
{
    const float *ta = fp8mix_decode_table(g->fmt_a), *tb = fp8mix_decode_table(g->fmt_b);
    float acc = 0.0f;
    for (int64_t c = p0; c < p1; c += 32) {
        float ev = 0.0f, od = 0.0f;
        for (int64_t k = c; k < c + 32 && k < p1; k++) {
            float prod = ta[fp8mix_gemm_a_at(g, i, k)] * tb[fp8mix_gemm_b_at(g, k, j)];
            if ((k - c) % 2 == 0) ev = ev + prod;
            else od = od + prod;
        }
        acc = acc + (ev + od);
    }
    return acc;
}

/* The whole GEMM in the AMX order: K runs as gemm.c's rules (all of K, 128-deep
 * BLOCK runs, 32-deep MX runs), the same epilogue. */
static void amx_reference(const fp8mix_gemm_args *g)
{
    int mx = g->scale_a_kind == FP8MIX_MM_SCALE_MX, block = g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    int64_t bk = mx ? 32 : 128, nkb = (g->k + bk - 1) / bk;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            float v = 0.0f;
            if (!mx && !block) {
                v = amx_run(g, i, j, 0, g->k);
            } else {
                for (int64_t kb = 0; kb < nkb; kb++) {
                    int64_t p1 = (kb + 1) * bk < g->k ? (kb + 1) * bk : g->k;
                    float s = mx ? g->scale_a[i * nkb + kb] * g->scale_b[j * nkb + kb]
                                 : fp8mix_gemm_block_scale(g, i, kb, j);
                    v = v + amx_run(g, i, j, kb * bk, p1) * s;
                }
            }
            fp8mix_gemm_epilogue(g, i, 1, j, 1, &v, 1);
        }
}

/* The NATIVE bound (docs/gemm_order.md): with unit scales and no bias, every output
 * s of a K-deep run whose products pass through at most D float32 additions obeys
 * |s - sum a_k b_k| <= gamma_D * sum |a_k b_k|, gamma_D = D u / (1 - D u), u = 2^-24.
 * Returns the outputs beyond it. */
static long beyond_bound(const fp8mix_gemm_args *g, const float *out, double depth)
{
    /* the float64 reference's own error (below K * 2^-53 * sum |a_k b_k|) is added */
    double u = ldexp(1.0, -24), gam = depth * u / (1.0 - depth * u) + 1.01 * (double)g->k * ldexp(1.0, -53);
    long bad = 0;
    for (int64_t i = 0; i < g->m; i++)
        for (int64_t j = 0; j < g->n; j++) {
            double s = 0.0, mag = 0.0;
            for (int64_t p = 0; p < g->k; p++) {
                double t = (double)fp8mix_decode_ref(fp8mix_gemm_a_at(g, i, p), g->fmt_a) *
                           (double)fp8mix_decode_ref(fp8mix_gemm_b_at(g, p, j), g->fmt_b);
                s += t;
                mag += fabs(t);
            }
            bad += fabs((double)out[i * g->ldo + j] - s) > gam * mag;
        }
    return bad;
}

/* The emulated AMX kernel through the blocked driver against amx_reference, bit for
 * bit, over every scale kind, both layouts of each operand, every output dtype, bias,
 * ragged tiles, K around the 32-deep chunks and several K steps, 1 to 4 threads; and,
 * where this CPU has AMX, the hardware kernel against the emulated one. */
static void test_amx_kernel(void)
{
    static const int64_t shapes[][3] = {{1, 1, 1},    {3, 5, 31},    {32, 32, 32},  {33, 31, 33}, {17, 40, 64},
                                        {40, 70, 130}, {31, 33, 257}, {64, 64, 512}, {5, 100, 700}};
    const fp8mix_gemm_ukernel *emu = fp8mix_gemm_ukernel_amx_emulated(), *hw = fp8mix_gemm_ukernel_amx_hardware();
    long runs = 0, hw_runs = 0;
    for (int s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); s++)
        for (int kind = 0; kind < 4; kind++) {
            problem p;
            fp8mix_dtype out_t = (fp8mix_dtype)((s + kind) % 3);
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], (fp8mix_format)(kind & 1),
                         (fp8mix_format)(s & 1), (fp8mix_b_layout)((s + kind) & 1), (fp8mix_mm_scale)kind,
                         (s + kind) & 1, out_t, FP8MIX_ACCUM_FP32, 0);
            fp8mix_gemm_args g = p.g;
            size_t nb = out_bytes(&g);
            void *want = calloc(1, nb), *got = calloc(1, nb), *got_hw = calloc(1, nb);
            g.out = want;
            amx_reference(&g);
            for (int t = 1; t <= (shapes[s][0] * shapes[s][1] * shapes[s][2] > 100000 ? 4 : 1); t++) {
                fp8mix_set_num_threads(t);
                memset(got, 0, nb);
                g.out = got;
                fp8mix_status st = fp8mix_gemm_blocked_with(&g, emu);
                runs++;
                CHECK(st == FP8MIX_OK && same_out(&g, want, got), "amx emu threads=%d m=%lld n=%lld k=%lld kind=%d out=%d",
                      t, (long long)g.m, (long long)g.n, (long long)g.k, kind, out_t);
                if (hw) {
                    memset(got_hw, 0, nb);
                    g.out = got_hw;
                    st = fp8mix_gemm_blocked_with(&g, hw);
                    hw_runs++;
                    CHECK(st == FP8MIX_OK && same_out(&g, got, got_hw),
                          "AMX hardware vs emulation: m=%lld n=%lld k=%lld kind=%d", (long long)g.m, (long long)g.n,
                          (long long)g.k, kind);
                }
            }
            fp8mix_set_num_threads(0);
            free(want);
            free(got);
            free(got_hw);
            free_problem(&p);
        }
    printf("AMX kernel: emulation vs the tdpbf16ps order %ld runs; hardware vs emulation: %s (%ld runs)\n", runs,
           hw ? "compared" : "no AMX on this CPU / OS / build", hw_runs);
}

/* The error bound of docs/gemm_order.md on hard data (E5M2's wide range, both signs):
 * the emulated AMX kernel with D = 16 + ceil(K/32), every kernel and order this CPU
 * runs with D = K (the canonical order's depth, which bounds every native kernel's);
 * and the NATIVE order: the same bits run to run and for 1 to 4 threads. */
static void test_native_order(void)
{
    static const int64_t shapes[][3] = {{7, 9, 5000}, {40, 33, 1024}, {64, 64, 300}};
    for (int s = 0; s < 3; s++) {
        problem p;
        make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], FP8MIX_E5M2, FP8MIX_E5M2, (fp8mix_b_layout)(s & 1),
                     FP8MIX_MM_SCALE_TENSOR, 0, FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
        p.sa[0] = p.sb[0] = 1.0f;
        fp8mix_gemm_args g = p.g;
        size_t nb = out_bytes(&g);
        float *a = calloc(1, nb), *b = calloc(1, nb);
        int64_t K = g.k;
        g.out = a;
        CHECK(fp8mix_gemm_blocked_with(&g, fp8mix_gemm_ukernel_amx_emulated()) == FP8MIX_OK, "amx emu");
        long bad = beyond_bound(&g, a, 16.0 + (double)((K + 31) / 32));
        CHECK(bad == 0, "AMX order: %ld outputs beyond gamma_(16 + K/32) at k=%lld", bad, (long long)K);
        g.order = FP8MIX_GEMM_NATIVE;
        CHECK(fp8mix_gemm(&g) == FP8MIX_OK, "native");
        bad = beyond_bound(&g, a, (double)K);
        CHECK(bad == 0, "NATIVE order: %ld outputs beyond gamma_K at k=%lld", bad, (long long)K);
        for (int t = 1; t <= 4; t++) {
            fp8mix_set_num_threads(t);
            for (int rep = 0; rep < 2; rep++) {
                memset(b, 0, nb);
                g.out = b;
                CHECK(fp8mix_gemm(&g) == FP8MIX_OK && same_out(&g, a, b), "NATIVE not deterministic: threads=%d rep=%d",
                      t, rep);
            }
        }
        fp8mix_set_num_threads(0);
        g.order = (fp8mix_gemm_order)2;
        CHECK(fp8mix_gemm(&g) == FP8MIX_ERR_BAD_ENUM, "an unknown order is refused");
        free(a);
        free(b);
        free_problem(&p);
    }
    printf("NATIVE order kernel here: %s\n", fp8mix_gemm_ukernel_native()->name);
}

static void test_k_zero(void)
{
    for (int kind = 0; kind < 3; kind++)
        for (int bias = 0; bias < 2; bias++) {
            problem p;
            make_problem(&p, 5, 7, 0, FP8MIX_E4M3, FP8MIX_E4M3, FP8MIX_B_KN,
                         (fp8mix_mm_scale)kind, bias, FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
            float out[5 * 9];
            for (int i = 0; i < 5 * 9; i++) out[i] = 123.0f;
            p.g.out = out;
            CHECK(fp8mix_gemm(&p.g) == FP8MIX_OK, "k=0");
            int good = 1;
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 7; j++)
                    good &= out[i * p.g.ldo + j] == (float)bias_at(&p.g, j);
            CHECK(good, "k=0 gives bias or zeros (kind %d bias %d)", kind, bias);
            free_problem(&p);
        }
    /* Empty output: OK, nothing touched, NULL pointers allowed. */
    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = 0; g.n = 5; g.k = 3; g.lda = 3; g.ldb = 5; g.ldo = 5;
    CHECK(fp8mix_gemm(&g) == FP8MIX_OK, "m=0");
    g.m = 4; g.n = 0; g.ldb = 1; g.ldo = 1;  /* ld >= 1 whenever rows > 0 */
    CHECK(fp8mix_gemm(&g) == FP8MIX_OK, "n=0");
}

/* FP22: bit-exact against the reference; error grows without promotion. */
static void test_fp22(void)
{
    static const int64_t shapes[][3] = {{3, 5, 300}, {17, 300, 129}, {4, 33, 1000}};
    for (int s = 0; s < 3; s++)
        for (int kind = 0; kind < 3; kind++) {
            problem p;
            make_problem(&p, shapes[s][0], shapes[s][1], shapes[s][2], (fp8mix_format)(s & 1),
                         FP8MIX_E4M3, (fp8mix_b_layout)(kind & 1), (fp8mix_mm_scale)kind, s & 1,
                         FP8MIX_F32, FP8MIX_ACCUM_FP22, (int64_t[]){0, 128, 37}[s]);
            check_problem(&p, s == 1, 0);
            free_problem(&p);
        }

    /* All-positive inputs, K = 16384: the unpromoted 14-bit accumulator loses
     * small addends once the sum is large; promotion every 128 keeps it close. */
    problem p;
    int64_t K = 16384;
    make_problem(&p, 4, 4, K, FP8MIX_E4M3, FP8MIX_E4M3, FP8MIX_B_NK, FP8MIX_MM_SCALE_TENSOR, 0,
                 FP8MIX_F32, FP8MIX_ACCUM_FP22, 0);
    for (int64_t i = 0; i < (p.g.a_layout == FP8MIX_A_MK ? 4 : K) * p.g.lda; i++)
        p.a[i] = (uint8_t)(0x30 + rnd() % 0x10); /* 0.5..0.94 */
    for (int64_t i = 0; i < 4 * p.g.ldb; i++) p.b[i] = (uint8_t)(0x30 + rnd() % 0x10);
    double *o = oracle(&p.g);
    float out0[4 * 8], out128[4 * 8], out32[4 * 8];
    p.g.out = out0;
    CHECK(fp8mix_gemm(&p.g) == FP8MIX_OK, "fp22");
    p.g.promote_interval = 128;
    p.g.out = out128;
    CHECK(fp8mix_gemm(&p.g) == FP8MIX_OK, "fp22 promoted");
    p.g.accum = FP8MIX_ACCUM_FP32;
    p.g.out = out32;
    CHECK(fp8mix_gemm(&p.g) == FP8MIX_OK, "fp32");
    p.g.accum = FP8MIX_ACCUM_FP22;
    double e0 = rel_err(&p.g, out0, o), e128 = rel_err(&p.g, out128, o);
    double e32 = rel_err(&p.g, out32, o);
    CHECK(e0 > 10 * e128, "fp22 unpromoted err %g vs promoted %g", e0, e128);
    printf("fp22 K=16384 rel err: unpromoted %.3g, promoted/128 %.3g, fp32 %.3g\n", e0, e128, e32);
    CHECK(e0 > 1e-2 && e128 < 2e-3 && e32 < 1e-6, "fp22 errs %g %g fp32 %g", e0, e128, e32);
    /* Every FP22 sum is truncated, so without promotion it underestimates. */
    int below = 1;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) below &= out0[i * p.g.ldo + j] < o[i * 4 + j];
    CHECK(below, "fp22 truncation rounds toward zero");
    free(o);
    free_problem(&p);
}

/* NaN and inf inputs propagate; no crash. */
static void test_nonfinite(void)
{
    fp8mix_isa best = fp8mix_cpu_isa();
    a_layout_mode = FP8MIX_A_MK; /* the rows of A are written below */
    for (size_t v = 0; v < sizeof isas / sizeof isas[0] && isas[v] <= best; v++) {
        fp8mix_set_max_isa(isas[v]);
        for (int accum = 0; accum < 2; accum++) {
            problem p;
            make_problem(&p, 20, 40, 50, FP8MIX_E5M2, FP8MIX_E4M3, FP8MIX_B_NK,
                         FP8MIX_MM_SCALE_TENSOR, 0, FP8MIX_F32, (fp8mix_accum)accum, 0);
            /* row 0 of A: a NaN; row 1: +inf then zeros; B > 0 everywhere. */
            for (int64_t i = 0; i < 40 * p.g.ldb; i++) p.b[i] = (uint8_t)(0x38 + rnd() % 8);
            memset(p.a + p.g.lda, 0, (size_t)p.g.lda);
            p.a[3] = 0x7F;               /* E5M2 NaN */
            p.a[p.g.lda + 7] = 0x7C;     /* E5M2 +inf */
            float *out = malloc(out_bytes(&p.g));
            p.g.out = out;
            CHECK(fp8mix_gemm(&p.g) == FP8MIX_OK, "nonfinite status");
            int nan_row = 1, inf_row = 1, rest = 1;
            for (int64_t j = 0; j < 40; j++) {
                nan_row &= isnan(out[j]);
                inf_row &= isinf(out[p.g.ldo + j]) && out[p.g.ldo + j] > 0;
                for (int64_t i = 2; i < 20; i++) rest &= isfinite(out[i * p.g.ldo + j]);
            }
            CHECK(nan_row && inf_row && rest, "isa %s accum %d: nan %d inf %d finite %d",
                  fp8mix_isa_name(isas[v]), accum, nan_row, inf_row, rest);
            free(out);
            free_problem(&p);
        }
    }
    a_layout_mode = -1;
    fp8mix_set_max_isa(FP8MIX_ISA_AVX512BF16);
}

static void test_bad_args(void)
{
    problem p;
    a_layout_mode = FP8MIX_A_MK;
    make_problem(&p, 4, 6, 130, FP8MIX_E4M3, FP8MIX_E4M3, FP8MIX_B_NK, FP8MIX_MM_SCALE_BLOCK, 1,
                 FP8MIX_F32, FP8MIX_ACCUM_FP32, 0);
    a_layout_mode = -1;
    float out[4 * 8];
    p.g.out = out;
    CHECK(fp8mix_gemm(&p.g) == FP8MIX_OK, "baseline");
    CHECK(fp8mix_gemm(NULL) == FP8MIX_ERR_NULL_POINTER, "NULL args");
#define EXPECT(field, value, status)                                                       \
    do {                                                                                   \
        fp8mix_gemm_args g = p.g;                                                          \
        g.field = value;                                                                   \
        for (int i = 0; i < 4 * 8; i++) out[i] = 77.0f;                                    \
        fp8mix_status st = fp8mix_gemm(&g);                                                \
        int untouched = 1;                                                                 \
        for (int i = 0; i < 4 * 8; i++) untouched &= out[i] == 77.0f;                      \
        CHECK(st == (status) && untouched, #field " = " #value ": got %d", st);            \
        CHECK(fp8mix_gemm_ref(&g) == (status), "ref: " #field " = " #value);              \
    } while (0)
    EXPECT(m, -1, FP8MIX_ERR_BAD_SHAPE);
    EXPECT(k, -2, FP8MIX_ERR_BAD_SHAPE);
    EXPECT(lda, 129, FP8MIX_ERR_BAD_SHAPE);
    {   /* A as K x M: lda >= M = 4 suffices, 3 does not */
        fp8mix_gemm_args g = p.g;
        g.a_layout = FP8MIX_A_KM;
        g.lda = 3;
        CHECK(fp8mix_gemm(&g) == FP8MIX_ERR_BAD_SHAPE && fp8mix_gemm_ref(&g) == FP8MIX_ERR_BAD_SHAPE, "KM lda");
    }
    EXPECT(ldb, 100, FP8MIX_ERR_BAD_SHAPE);  /* NK: ldb >= k */
    EXPECT(ldo, 5, FP8MIX_ERR_BAD_SHAPE);
    EXPECT(a, NULL, FP8MIX_ERR_NULL_POINTER);
    EXPECT(b, NULL, FP8MIX_ERR_NULL_POINTER);
    EXPECT(out, NULL, FP8MIX_ERR_NULL_POINTER);
    EXPECT(scale_a, NULL, FP8MIX_ERR_NULL_POINTER);
    EXPECT(fmt_a, (fp8mix_format)2, FP8MIX_ERR_BAD_ENUM);
    EXPECT(fmt_b, (fp8mix_format)-1, FP8MIX_ERR_BAD_ENUM);
    EXPECT(out_t, (fp8mix_dtype)3, FP8MIX_ERR_BAD_ENUM);
    EXPECT(bias_t, (fp8mix_dtype)9, FP8MIX_ERR_BAD_ENUM);
    EXPECT(b_layout, (fp8mix_b_layout)2, FP8MIX_ERR_BAD_ENUM);
    EXPECT(a_layout, (fp8mix_a_layout)2, FP8MIX_ERR_BAD_ENUM);
    EXPECT(accum, (fp8mix_accum)5, FP8MIX_ERR_BAD_ENUM);
    EXPECT(scale_b_kind, (fp8mix_mm_scale)4, FP8MIX_ERR_BAD_ENUM);
    EXPECT(scale_b_kind, FP8MIX_MM_SCALE_TENSOR, FP8MIX_ERR_BAD_ARG);
    EXPECT(promote_interval, -1, FP8MIX_ERR_BAD_ARG);
    const float bad[] = {0.0f, -1.0f, NAN, INFINITY};
    for (int s = 0; s < 4; s++) {
        float keep_a = p.sa[p.nsa - 1], keep_b = p.sb[0];
        p.sa[p.nsa - 1] = bad[s];
        EXPECT(m, 4, FP8MIX_ERR_BAD_SCALE);
        p.sa[p.nsa - 1] = keep_a;
        p.sb[0] = bad[s];
        EXPECT(m, 4, FP8MIX_ERR_BAD_SCALE);
        p.sb[0] = keep_b;
    }
#undef EXPECT
    free_problem(&p);
}

int main(void)
{
    test_packing();
    test_shapes();
    test_threads();
    test_row_tensor_scales();
    test_mx_shapes();
    test_mx_pow2();
    test_mx_prescaled();
    test_amx_kernel();
    test_native_order();
    test_acc_chunks();
    test_k_zero();
    test_fp22();
    test_nonfinite();
    test_bad_args();
    report_coverage();
    return check_report("test_gemm");
}
