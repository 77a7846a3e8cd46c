/*
 * gemm_blocked.c — the float32-accumulation GEMM driver (ACCUM_FP32): the
 * Goto/BLIS loop nest, with FP8 decoded exactly once per packed panel so
 * that the microkernel only multiplies and adds.
 *
 *   for jc over N in chunks of NC columns:
 *     for pc over K in steps of KC (per kernel: its B sliver is 32 KiB):
 *       pack B[pc : pc+KC, jc : jc+NC]         -> shared B panel (parallel over NR slivers)
 *       parallel over tasks = (MC-row block) x (group of slivers), each worker
 *       first taking its own contiguous range of them (see affine_task):
 *         pack A[rows, pc : pc+KC]              -> the worker's A block
 *         for each sliver, for each MR panel:   C tile (+)= A panel x B sliver
 *         (or for each panel, for each sliver: the kernel's a_outer, below)
 *         after the last K step, each tile's epilogue right after its last microkernel
 *
 * C is the float32 output itself, or, for a bf16 / f16 output, a float32
 * accumulator of M x NC.  Each C element is owned by one task per K step and
 * its K run is walked in order, so results do not depend on the tiling or the
 * thread count (gemm_internal.h).  Scales and bias are applied once, in the
 * epilogue (gemm_epilogue.c; the rules are gemm.c's).
 *
 * Memory: the B panel (KC x NC values, 1-4 MiB), one A block per worker
 * (MC x KC, about 144 KiB) and, for non-float32 outputs, the accumulator
 * (8 MiB at most: NC shrinks with M).  They come from one workspace that is kept for the next
 * call (a freshly mapped one page-faults on every call), up to WS_KEEP bytes.
 * Not covered: the microkernels and packing (gemm_ref.c, x86/gemm_*.c) and their
 * choice (dispatch.c).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

#include "gemm_internal.h"

/* Block sizes, in values (float32 words or bf16 pairs' halves):
 *   KC = SLIVER_VALUES / NR   K step (at most KC_MAX, a multiple of 128 for block
 *                             scales): 512 for the 32-wide kernels that run A panels
 *                             outer (float32 and AVX512-BF16); half of it for a
 *                             bf16-pair kernel that keeps its B sliver in L1 (AMX,
 *                             256; not measured on hardware)
 *   MC = ABLOCK_VALUES / KC   rows of an A block (rounded to the kernel's MR)
 *   NC                        columns of a B panel
 * A longer K step amortises each C tile's load and store over more FMAs, and a
 * tile's first FMAs wait for its C loads (C rows 4-8 KiB apart share a few L1
 * sets, so C comes from L2): on a Zen 3 EPYC (AVX2, 6x16 tiles) KC 512 ran a
 * 1024^3 GEMM 4% faster than 256 (88 -> 91.5 GFLOP/s), with MC 72 rather than
 * 144 (the A block's size kept); on a Sapphire Rapids class Xeon (AVX-512, 14x32
 * tiles, B sliver 64 KiB for a 48 KiB L1) 512 ran 2048^3 3-4% faster than 256 on
 * one thread and 7-8% on two (paired runs); 1024 and 2048 were no faster.
 * NC: 1024 columns ran 1.6-3.9% faster than 2048 on a Xeon with 2 MiB of L2
 * (paired runs, 2048^3, KC 256), and 1-2% faster than 512 on the EPYC (512 KiB
 * of L2); a narrower panel packs A once more per chunk.
 * Tile order (the kernel's a_outer): the AVX-512 float32 kernel's B sliver (512 x 32
 * floats, 64 KiB) overflows a 48 KiB L1 whatever the order, so there the A panel (14 x
 * 512, 28 KiB) is kept in L1 instead, with the B slivers streaming from L2 in chunks of
 * NC_A_OUTER columns (a 1 MiB panel that stays in a 2 MiB L2): 1.04-1.07x the sliver-outer
 * order with 1024 columns at 1024^3-2048^3, 1-2 threads, on a Sapphire Rapids class Xeon
 * (bench_ab.py, one process); 256 or 768 columns, or KC 640, were no faster, nor was
 * packing A once per K step for all column chunks (read back from L3 it cost what
 * repacking does).  The AVX512-BF16 kernel (two k-steps per vdpbf16ps) on Zen 4 (32 KiB
 * L1d, 1 MiB L2): A panels outer with KC 512 (A panel 14 KiB, B sliver 32 KiB, B panel
 * 512 KiB) ran 1.07-1.16x its former B-sliver-outer order with KC 256 at 1024^3-2048^3,
 * 1-2 threads; A outer alone at KC 256, 0.99-1.04x.  There a wider column chunk
 * (NC_A_OUTER_BF16) paid although its B panel (4 MiB) streams from L3: each chunk
 * repacks A, and at two k-steps per instruction that packing weighs twice what it does
 * for the float32 kernel; 1024 / 2048 / 4096 columns ran 1.01-1.02x / 1.01-1.04x /
 * 1.02-1.04x the 512 of the float32 kernel at 2048^3 and 2048x4096x11008, 1-2 threads.  None of the sizes or orders changes a sum: a K run is never split
 * by the tiling. */
#define SLIVER_VALUES 16384
#define KC_MAX 512            /* (bounds the per-block scale buffer below)      */
#define ABLOCK_VALUES (144 * 256)
#define NC 1024
#define NC_A_OUTER 512
#define NC_A_OUTER_BF16 4096
#define ACC_WORDS (2 << 20)   /* accumulator cap for non-float32 outputs       */
#define MAX_TILE (32 * 32)    /* MR x NR of the widest kernel                   */
#define GEMM_GRAIN (1 << 22)  /* multiply-adds worth a thread                  */
#define WS_KEEP (24u << 20)   /* largest workspace kept between calls           */

/* MX scales of a panel or sliver over one K step: the least and greatest biased
 * exponent of its valid scales when every one is a normal power of two; lo > hi
 * when one is not (fn_mx_pow2's condition, checked per tile in mx_pow2). */
typedef struct mx_range {
    int lo, hi;
} mx_range;

#define MX_MAX_SLIVERS (NC / 4)  /* NR slivers of a column chunk (NR >= 4)        */
#define MX_MAX_PANELS 32         /* A panels of a task with fn_mx_pow2 (MR >= 14)  */

typedef struct plan {
    const fp8mix_gemm_args *g;
    const fp8mix_gemm_ukernel *uk;
    int64_t mr, nr, mc, nc, n_ic;
    int64_t kcmax;             /* the K step (KC)                                */
    int block;                 /* BLOCK scales                                   */
    int mx;                    /* MX scales (32-deep K runs)                     */
    int mx_scaled;             /* MX on panels packed times their scales (the
                                  kernel's fn_mx_scaled; mx_prescalable)          */
    int fused_epi;             /* whole tiles' epilogue in the last microkernel  */
    int64_t nkb, nnb;          /* BLOCK / MX: scale blocks along K; BLOCK: along N */
    /* the current column chunk and K step */
    int64_t jc, ncc, nsl;      /* chunk start, width, NR slivers                 */
    int64_t n_jg, sl_per_jg;   /* column groups of the compute tasks             */
    int64_t pc, kc, kce, ksl;  /* K step start, depth, even depth, packed slots  */
    int last;                  /* this is the last K step                        */
    uint32_t *bpanel;          /* nsl slivers of ksl * nr words                  */
    uint32_t *ablk;            /* per worker: mc / mr panels of ksl * mr words   */
    size_t ablk_words;
    float *acc;                /* non-float32 output: M x ldacc accumulator      */
    int64_t ldacc;
    int64_t mxq;               /* MX: 32-deep blocks per K step (at most)        */
    float *mxsb;               /* MX: per sliver mxq x NR column scales           */
    float *mxsa;               /* MX: per worker, per A panel mxq x MR row scales */
    size_t mxsa_words;
    mx_range mxrb[MX_MAX_SLIVERS]; /* MX: each sliver's scales (mx_range)         */
} plan;

static inline int64_t slots(const plan *pl, int64_t k) { return pl->uk->bf16 ? k / 2 : k; }
static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
/* k rounded up to the kernel's packed depth (even, or the AMX kernel's 32). */
static inline int64_t kpad(const plan *pl, int64_t k)
{
    int64_t a = pl->uk->kalign > 0 ? pl->uk->kalign : 2;
    return (k + a - 1) / a * a;
}

/* The float32 C element (i, j): the output itself or the accumulator. */
static inline float *c_at(const plan *pl, int64_t i, int64_t j)
{
    const fp8mix_gemm_args *g = pl->g;
    if (!pl->acc) return (float *)g->out + i * g->ldo + j;
    return pl->acc + i * pl->ldacc + (j - pl->jc);
}

static inline int64_t c_ld(const plan *pl) { return pl->acc ? pl->ldacc : pl->g->ldo; }

/* ---- the workspace kept between calls ----------------------------------- */

static pthread_mutex_t ws_mu = PTHREAD_MUTEX_INITIALIZER;
static void *ws_buf;
static size_t ws_bytes;

/* A 64-byte aligned workspace of at least `bytes`; *got is its size.  Takes
 * the kept one when it is large enough and nobody else holds it. */
static void *ws_take(size_t bytes, size_t *got)
{
    void *p = NULL;
    if (pthread_mutex_trylock(&ws_mu) == 0) {
        if (ws_buf && ws_bytes >= bytes) {
            p = ws_buf;
            *got = ws_bytes;
            ws_buf = NULL;
        }
        pthread_mutex_unlock(&ws_mu);
    }
    if (!p) {
        if (posix_memalign(&p, 64, bytes) != 0) return NULL;
        *got = bytes;
    }
    return p;
}

/* Give a workspace back: keep the larger of it and the kept one (up to WS_KEEP). */
static void ws_give(void *p, size_t bytes)
{
    if (bytes <= WS_KEEP && pthread_mutex_trylock(&ws_mu) == 0) {
        if (!ws_buf || ws_bytes < bytes) {
            void *old = ws_buf;
            ws_buf = p;
            ws_bytes = bytes;
            p = old;
        }
        pthread_mutex_unlock(&ws_mu);
    }
    free(p);
}

/* ---- tasks -------------------------------------------------------------- */
/* Ask for the first `bytes` of `rows` rows (stride ld) ahead of their use:
 * the rows of the next panel are far apart, and the hardware prefetchers
 * follow only a few such streams. */
static inline void prefetch_rows(const uint8_t *p, int64_t ld, int64_t rows, int64_t bytes)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(p + r * ld + b);
}


/* The MX scales of a K step beside the packed panels, 1 outside the nv valid rows or
 * columns (those outputs are dropped; 1 keeps their scale products finite, and powers
 * of two where the valid ones are): dst[q * w + r] = src[(r0 + r) * nkb + kb0 + q]
 * (A's rows, or B's columns: both are indexed [row or column][k block]).  Returns
 * the valid scales' exponent range (mx_range). */
static mx_range mx_scales(const plan *pl, const float *src, int64_t r0, int nv, int64_t w, float *dst)
{
    int64_t nq = ceil_div(pl->kc, FP8MIX_MX_BLOCK), kb0 = pl->pc / FP8MIX_MX_BLOCK;
    uint32_t frac = 0; /* any mantissa bit, or a zero exponent field, makes it non-pow2 */
    int lo = 255, hi = 0;
    for (int64_t r = 0; r < w; r++) {
        if (r >= nv) {
            for (int64_t q = 0; q < nq; q++) dst[q * w + r] = 1.0f;
            continue;
        }
        const float *sr = src + (r0 + r) * pl->nkb + kb0;
        for (int64_t q = 0; q < nq; q++) {
            uint32_t u;
            memcpy(&u, sr + q, sizeof u);
            int e = (int)(u >> 23); /* the scales are > 0 (checked): no sign bit */
            frac |= (u & 0x7FFFFFu) | (uint32_t)(e == 0);
            lo = e < lo ? e : lo;
            hi = e > hi ? e : hi;
            dst[q * w + r] = sr[q];
        }
    }
    mx_range m = {lo, hi};
    if (frac) m.lo = 1, m.hi = 0;
    return m;
}

/* Whether a tile with these row and column scale ranges may run fn_mx_pow2: both all
 * normal powers of two, and every product 2^(ea + eb - 254) normal (biased exponent
 * ea + eb - 127 in 1 .. 254). */
static inline int mx_pow2(mx_range a, mx_range b)
{
    return a.lo <= a.hi && b.lo <= b.hi && a.lo + b.lo - 127 >= 1 && a.hi + b.hi - 127 <= 254;
}

/* Whether the n MX scales at s allow fn_mx_scaled: each a power of two in [2^-45, 2^45]
 * (biased exponent 82 .. 172, no mantissa bit).  Then a packed value times its scale
 * (FP8 magnitudes lie in [2^-16, 2^16)) is normal, each product of two in [2^-122,
 * 2^122] (FP8 products are multiples of 2^-32 below 2^32) and each 32-deep partial sum
 * under 2^127: no rounding ever meets the subnormal range or overflows, where scaling by
 * a power of two would not commute with it. */
static int mx_prescalable(const float *s, int64_t n)
{
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, s + i, sizeof u);
        bad |= (u & 0x807FFFFFu) | (uint32_t)((u >> 23) - 82u > 90u);
    }
    return bad == 0;
}

static void pack_b_task(void *ctx, int64_t s, int worker)
{
    (void)worker;
    plan *pl = (plan *)ctx; /* (writes its own sliver's mxrb entry) */
    const fp8mix_gemm_args *g = pl->g;
    int64_t j = pl->jc + s * pl->nr;
    int nv = (int)min64(pl->nr, g->n - j);
    uint32_t *dst = pl->bpanel + s * pl->ksl * pl->nr;
    if (pl->mx) {
        mx_range e = mx_scales(pl, g->scale_b, j, nv, pl->nr, pl->mxsb + s * pl->mxq * pl->nr);
        if (s < MX_MAX_SLIVERS) pl->mxrb[s] = e;
    }
    if (g->b_layout == FP8MIX_B_NK && j + pl->nr < g->n) /* the next sliver's columns */
        prefetch_rows(g->b + (j + pl->nr) * g->ldb + pl->pc, g->ldb, min64(pl->nr, g->n - j - pl->nr), pl->kc);
    const int kn = g->b_layout == FP8MIX_B_KN;
    const uint8_t *src = kn ? g->b + pl->pc * g->ldb + j : g->b + j * g->ldb + pl->pc;
    if (pl->mx_scaled)
        pl->uk->pack_mx(src, g->ldb, nv, (int)pl->nr, pl->kc, g->fmt_b, kn, pl->mxsb + s * pl->mxq * pl->nr, dst);
    else
        (kn ? pl->uk->pack_kcols : pl->uk->pack_krows)(src, g->ldb, nv, (int)pl->nr, pl->kc, g->fmt_b, pl->uk->bf16,
                                                       dst);
}

/* MX scales over the K step of one tile (C at c, stride ld; sa, sb its rows' and
 * columns' scales per 32-deep block; pow2: mx_pow2 holds for them): the kernel's MX
 * mode, or fn once per block into a tile buffer and the rule C = C + part * (sa * sb)
 * here (gemm.c), each operation rounded, in the same order. */
static void run_mx(const plan *pl, const uint32_t *as, const uint32_t *bs, const float *sa, const float *sb,
                   float *c, int64_t ld, int load, int pow2)
{
    const fp8mix_gemm_ukernel *uk = pl->uk;
    int64_t mr = pl->mr, nr = pl->nr, nq = ceil_div(pl->kc, FP8MIX_MX_BLOCK);
    if (pl->mx_scaled) {
        uk->fn_mx_scaled(pl->kce, as, bs, c, ld, load, sa, sb);
        return;
    }
    if (uk->fn_mx) {
        (pow2 && uk->fn_mx_pow2 ? uk->fn_mx_pow2 : uk->fn_mx)(pl->kce, as, bs, c, ld, load, sa, sb);
        return;
    }
    float part[MAX_TILE];
    for (int64_t q = 0; q < nq; q++) {
        int64_t k0 = q * FP8MIX_MX_BLOCK, kk = min64(FP8MIX_MX_BLOCK, pl->kc - k0);
        uk->fn(kpad(pl, kk), as + slots(pl, k0) * mr, bs + slots(pl, k0) * nr, part, nr, 0, NULL);
        const int add = load || q > 0;
        for (int64_t r = 0; r < mr; r++)
            for (int64_t x = 0; x < nr; x++) {
                float o = add ? c[r * ld + x] : 0.0f;
                c[r * ld + x] = o + part[r * nr + x] * (sa[q * mr + r] * sb[q * nr + x]);
            }
    }
}

/* One MR x NR tile at rows i.., columns j.. (mv x nv of them valid); msa, msb: its MX
 * scales (NULL without MX), pow2: mx_pow2 holds for them. */
static void run_tile(const plan *pl, const uint32_t *as, const uint32_t *bs, const float *msa, const float *msb,
                     int pow2, int64_t i, int64_t j, int mv, int nv)
{
    const fp8mix_gemm_args *g = pl->g;
    const fp8mix_gemm_ukernel *uk = pl->uk;
    int64_t mr = pl->mr, nr = pl->nr, ld = c_ld(pl);
    float *c = c_at(pl, i, j), tmp[MAX_TILE];
    int edge = mv < mr || nv < nr, load = pl->pc > 0;
    if (edge) { /* through a full-size tile: the kernel always writes MR x NR */
        memset(tmp, 0, sizeof(float) * (size_t)(mr * nr));
        if (load)
            for (int r = 0; r < mv; r++) memcpy(tmp + r * nr, c + r * ld, sizeof(float) * (size_t)nv);
        c = tmp;
        ld = nr;
    }
    if (pl->last && pl->fused_epi && !edge) { /* the kernel's store applies the epilogue */
        float s[32];
        const int per_row = g->scale_a_kind == FP8MIX_MM_SCALE_OUTER;
        for (int r = 0; r < mr; r++) s[r] = g->scale_a[per_row ? i + r : 0] * g->scale_b[0];
        uk->fn_final(pl->kce, as, bs, c, ld, load, s, g->bias ? (const float *)g->bias + j : NULL);
        return;
    }
    if (pl->mx) {
        run_mx(pl, as, bs, msa, msb, c, ld, load, pow2);
    } else if (!pl->block) {
        uk->fn(pl->kce, as, bs, c, ld, load, NULL);
    } else {
        float rs[KC_MAX / FP8MIX_BLOCK * 32]; /* per 128-deep block of the K step: MR (<= 32) row scales */
        for (int64_t sb = 0; sb < pl->kc; sb += FP8MIX_BLOCK) {
            int64_t kb = (pl->pc + sb) / FP8MIX_BLOCK;
            /* fp8mix_gemm_block_scale(g, i + r, kb, j), with the block counts hoisted */
            const float *sa = g->scale_a + i * pl->nkb + kb;
            float sbv = g->scale_b[kb * pl->nnb + j / FP8MIX_BLOCK], *rq = rs + (sb / FP8MIX_BLOCK) * mr;
            for (int r = 0; r < mr; r++) rq[r] = r < mv ? sa[r * pl->nkb] * sbv : 0.0f;
        }
        if (uk->fn_blocks) {
            uk->fn_blocks(pl->kce, as, bs, c, ld, load, rs);
        } else {
            for (int64_t sb = 0; sb < pl->kc; sb += FP8MIX_BLOCK) {
                int64_t kk = min64(FP8MIX_BLOCK, pl->kc - sb);
                uk->fn(kpad(pl, kk), as + slots(pl, sb) * mr, bs + slots(pl, sb) * nr, c, ld, pl->pc + sb > 0,
                       rs + (sb / FP8MIX_BLOCK) * mr);
            }
        }
    }
    if (edge)
        for (int r = 0; r < mv; r++) memcpy(c_at(pl, i + r, j), tmp + r * nr, sizeof(float) * (size_t)nv);
    if (pl->last) /* the tile's sums are final: scales, bias, rounding while it is in L1 */
        fp8mix_gemm_epilogue_rows(g, uk->scale_rows, i, mv, j, nv, c_at(pl, i, j), c_ld(pl));
}


static void compute_task(void *ctx, int64_t t, int worker)
{
    const plan *pl = (const plan *)ctx;
    const fp8mix_gemm_args *g = pl->g;
    int64_t mr = pl->mr, nr = pl->nr, ksl = pl->ksl;
    int64_t i0 = (t / pl->n_jg) * pl->mc, mcc = min64(pl->mc, g->m - i0);
    int64_t s0 = (t % pl->n_jg) * pl->sl_per_jg, s1 = min64(pl->nsl, s0 + pl->sl_per_jg);
    int64_t npan = ceil_div(mcc, mr);
    uint32_t *ab = pl->ablk + (size_t)worker * pl->ablk_words;
    const fp8mix_gemm_pack_fn pack_krows = pl->uk->pack_a_krows ? pl->uk->pack_a_krows : pl->uk->pack_krows;
    const fp8mix_gemm_pack_fn pack_kcols = pl->uk->pack_a_kcols ? pl->uk->pack_a_kcols : pl->uk->pack_kcols;
    float *msa = pl->mx ? pl->mxsa + (size_t)worker * pl->mxsa_words : NULL;
    mx_range ra[MX_MAX_PANELS]; /* the panels' MX scales, where fn_mx_pow2 can use them */
    const int ranges = msa && pl->uk->fn_mx_pow2 && npan <= MX_MAX_PANELS && pl->nsl <= MX_MAX_SLIVERS;
    for (int64_t p = 0; p < npan; p++) {
        int64_t i = i0 + p * mr;
        int nv = (int)min64(mr, mcc - p * mr);
        uint32_t *dst = ab + p * ksl * mr;
        if (msa) {
            if (p + 1 < npan) /* the next panel's scale rows (nkb floats apart: a miss each) */
                prefetch_rows((const uint8_t *)(g->scale_a + (i + mr) * pl->nkb + pl->pc / FP8MIX_MX_BLOCK),
                              pl->nkb * (int64_t)sizeof(float), min64(mr, mcc - (p + 1) * mr),
                              ceil_div(pl->kc, FP8MIX_MX_BLOCK) * (int64_t)sizeof(float));
            mx_range e = mx_scales(pl, g->scale_a, i, nv, mr, msa + p * pl->mxq * mr);
            if (ranges) ra[p] = e;
        }
        const int km = g->a_layout == FP8MIX_A_KM;
        const uint8_t *a = km ? g->a + pl->pc * g->lda + i : g->a + i * g->lda + pl->pc;
        if (!km && p + 1 < npan) prefetch_rows(a + mr * g->lda, g->lda, min64(mr, mcc - (p + 1) * mr), pl->kc);
        if (pl->mx_scaled)
            pl->uk->pack_mx(a, g->lda, nv, (int)mr, pl->kc, g->fmt_a, km, msa + p * pl->mxq * mr, dst);
        else
            (km ? pack_kcols : pack_krows)(a, g->lda, nv, (int)mr, pl->kc, g->fmt_a, pl->uk->bf16, dst);
    }
    /* tile (p, s) for p < npan, s0 <= s < s1: p outer with a_outer, s outer without */
    const int64_t ns = s1 - s0, outer = pl->uk->a_outer ? npan : ns, inner = pl->uk->a_outer ? ns : npan;
    for (int64_t u = 0; u < outer; u++)
        for (int64_t v = 0; v < inner; v++) {
            int64_t p = pl->uk->a_outer ? u : v, s = s0 + (pl->uk->a_outer ? v : u);
            int64_t j = pl->jc + s * nr;
            run_tile(pl, ab + p * ksl * mr, pl->bpanel + s * ksl * nr, msa ? msa + p * pl->mxq * mr : NULL,
                     pl->mx ? pl->mxsb + s * pl->mxq * nr : NULL, ranges && mx_pow2(ra[p], pl->mxrb[s]), i0 + p * mr,
                     j, (int)min64(mr, mcc - p * mr), (int)min64(nr, g->n - j));
        }
}

/* The compute loop's tasks, handed out worker-affine: the tasks are cut into one
 * contiguous range per worker, and a worker first takes the tasks of its own
 * range (the same rows in every K step, so the C tiles it loads and stores stay
 * in its core's caches), then what is left of the others' ranges (a slow or
 * absent worker's share is not waited for).  Handed out first come, first served
 * instead, a row block's C tiles moved between cores from one K step to the next:
 * a 2-thread 2048^3 GEMM ran at 156 GFLOP/s against 176 in the same minutes
 * (EPYC VM, C harness; torch's float32 GEMM ran at 180 there).  Which worker computes a
 * tile changes no sum. */
#define MAX_RANGES 256 /* the pool's worker cap (parallel.c) */

typedef struct affine_job {
    const plan *pl;
    int64_t ntasks;
    int ranges;
    atomic_llong next[MAX_RANGES]; /* tasks taken from each range */
} affine_job;

static void affine_task(void *ctx, int64_t t, int worker)
{
    (void)t; /* the worker's id, not the slot it took, picks its range */
    affine_job *J = (affine_job *)ctx;
    int home = worker % J->ranges;
    for (int k = 0; k < J->ranges; k++) {
        int r = (home + k) % J->ranges;
        int64_t lo = J->ntasks * r / J->ranges, hi = J->ntasks * (r + 1) / J->ranges;
        for (;;) {
            int64_t u = lo + atomic_fetch_add_explicit(&J->next[r], 1, memory_order_relaxed);
            if (u >= hi) break;
            compute_task((void *)J->pl, u, worker);
        }
    }
}

static void run_compute(const plan *pl, int workers)
{
    int64_t n = pl->n_ic * pl->n_jg;
    if (workers <= 1 || workers > MAX_RANGES) {
        fp8mix_parallel_for(n, workers, compute_task, (void *)pl);
        return;
    }
    affine_job J;
    J.pl = pl;
    J.ntasks = n;
    J.ranges = workers;
    for (int r = 0; r < workers; r++) atomic_init(&J.next[r], 0);
    fp8mix_parallel_for(workers, workers, affine_task, &J);
}

/* K == 0: every sum is +0; only the epilogue runs. */
static void k0_task(void *ctx, int64_t i, int worker)
{
    (void)worker;
    const fp8mix_gemm_args *g = (const fp8mix_gemm_args *)ctx;
    float v[256];
    for (int64_t j0 = 0; j0 < g->n; j0 += 256) {
        int64_t n = min64(256, g->n - j0);
        memset(v, 0, sizeof v);
        fp8mix_gemm_epilogue(g, i, 1, j0, n, v, 256);
    }
}

/* ---- the plan and the loop nest ----------------------------------------- */

/* The K step for this kernel (see SLIVER_VALUES): a sliver-outer bf16-pair kernel (AMX)
 * keeps its B sliver in L1 at half the k-steps; an A-outer one streams B and takes the
 * longer step. */
static int64_t kc_for(const fp8mix_gemm_ukernel *uk)
{
    int64_t kc = SLIVER_VALUES / (uk->bf16 && !uk->a_outer ? 2 : 1) / uk->nr / FP8MIX_BLOCK * FP8MIX_BLOCK;
    return kc < FP8MIX_BLOCK ? FP8MIX_BLOCK : kc > KC_MAX ? KC_MAX : kc;
}

/* Block sizes for the shape and worker count; returns the workspace bytes. */
static size_t plan_sizes(plan *pl, int workers)
{
    const fp8mix_gemm_args *g = pl->g;
    int64_t M = g->m, N = g->n, mr = pl->mr, nr = pl->nr;
    /* With A panels outer an A block is not reused from L2, so on several workers each task
     * is one panel: a K step's tasks then split evenly (2048 rows in blocks of 84 made 25
     * tasks, 13 on one worker and 12 on the other): 1.01-1.05x at 512^3-2048^3 on 2 threads
     * (bench_ab, the Sapphire Rapids class Xeon).  One worker keeps the blocks, whose packing
     * prefetches each next panel's rows (0.98x without, 2048^3). */
    int64_t rows = pl->uk->a_outer && workers > 1 ? mr : ABLOCK_VALUES / pl->kcmax;
    pl->n_ic = ceil_div(M, rows);
    pl->mc = ceil_div(ceil_div(M, pl->n_ic), mr) * mr;
    pl->n_ic = ceil_div(M, pl->mc);
    int64_t nc_cap = !pl->uk->a_outer ? NC : pl->uk->bf16 ? NC_A_OUTER_BF16 : NC_A_OUTER;
    if (g->out_t != FP8MIX_F32) { /* the accumulator is M x NC floats */
        int64_t fit = (ACC_WORDS / M) / nr * nr;
        nc_cap = fit < nr ? nr : (fit < nc_cap ? fit : nc_cap);
    }
    int64_t n_jc = ceil_div(N, nc_cap);
    pl->nc = ceil_div(ceil_div(N, n_jc), nr) * nr;
    int64_t ksl = slots(pl, pl->kcmax);
    pl->ablk_words = (size_t)(pl->mc * ksl);
    size_t words = (size_t)(pl->nc * ksl) + pl->ablk_words * (size_t)workers;
    if (g->out_t != FP8MIX_F32) {
        pl->ldacc = pl->nc + 16; /* rows 4 KiB apart would alias in L1 */
        words += (size_t)(M * pl->ldacc);
    }
    if (pl->mx) { /* the MX scales beside the B panel and each worker's A block */
        pl->mxq = pl->kcmax / FP8MIX_MX_BLOCK;
        pl->mxsa_words = (size_t)(pl->mc * pl->mxq);
        words += (size_t)(pl->nc * pl->mxq) + pl->mxsa_words * (size_t)workers;
    }
    return words * 4;
}

/* Tasks of the compute loop: row blocks, split into column groups when there
 * are too few of them to keep the workers busy (and balanced). */
static void plan_groups(plan *pl, int workers)
{
    pl->n_jg = 1;
    if (workers > 1 && pl->n_ic < 4 * workers) pl->n_jg = ceil_div(4 * workers, pl->n_ic);
    if (pl->n_jg > pl->nsl) pl->n_jg = pl->nsl;
    pl->sl_per_jg = ceil_div(pl->nsl, pl->n_jg);
    pl->n_jg = ceil_div(pl->nsl, pl->sl_per_jg);
}

fp8mix_status fp8mix_gemm_blocked(const fp8mix_gemm_args *g)
{
    return fp8mix_gemm_blocked_with(g, fp8mix_gemm_ukernel_active());
}

fp8mix_status fp8mix_gemm_blocked_with(const fp8mix_gemm_args *g, const fp8mix_gemm_ukernel *uk)
{
    int64_t M = g->m, N = g->n, K = g->k;
    double work = (double)M * (double)N * (double)(K > 0 ? K : 1);
    int workers = fp8mix_workers_for(work > 4e18 ? INT64_MAX : (int64_t)work, GEMM_GRAIN);
    if (K == 0) {
        fp8mix_parallel_for(M, fp8mix_workers_for(M * N, 1 << 16), k0_task, (void *)g);
        return FP8MIX_OK;
    }
    plan pl;
    memset(&pl, 0, sizeof pl);
    pl.g = g;
    pl.uk = uk;
    pl.mr = pl.uk->mr;
    pl.nr = pl.uk->nr;
    pl.block = g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    pl.mx = g->scale_a_kind == FP8MIX_MM_SCALE_MX;
    pl.fused_epi = uk->fn_final && !pl.block && fp8mix_gemm_epilogue_simple(g);
    pl.nkb = ceil_div(K, pl.mx ? FP8MIX_MX_BLOCK : FP8MIX_BLOCK);
    pl.mx_scaled = pl.mx && uk->fn_mx_scaled && uk->pack_mx && !uk->pack_a_krows &&
                   mx_prescalable(g->scale_a, M * pl.nkb) &&
                   mx_prescalable(g->scale_b, N * pl.nkb);
    pl.nnb = ceil_div(N, FP8MIX_BLOCK);
    pl.kcmax = kc_for(uk);
    size_t got = 0, bytes = plan_sizes(&pl, workers);
    uint32_t *ws = (uint32_t *)ws_take(bytes, &got);
    if (!ws) return FP8MIX_ERR_NO_MEMORY;
    pl.bpanel = ws;
    pl.ablk = ws + pl.nc * slots(&pl, pl.kcmax);
    float *rest = (float *)(pl.ablk + pl.ablk_words * (size_t)workers);
    if (g->out_t != FP8MIX_F32) {
        pl.acc = rest;
        rest += M * pl.ldacc;
    }
    if (pl.mx) {
        pl.mxsb = rest;
        pl.mxsa = rest + pl.nc * pl.mxq;
    }
    int pack_workers = fp8mix_workers_for(N * min64(K, pl.kcmax), 1 << 16);
    for (pl.jc = 0; pl.jc < N; pl.jc += pl.nc) {
        pl.ncc = min64(pl.nc, N - pl.jc);
        pl.nsl = ceil_div(pl.ncc, pl.nr);
        plan_groups(&pl, workers);
        for (pl.pc = 0; pl.pc < K; pl.pc += pl.kcmax) {
            pl.kc = min64(pl.kcmax, K - pl.pc);
            pl.kce = kpad(&pl, pl.kc);
            pl.ksl = slots(&pl, pl.kce);
            pl.last = pl.pc + pl.kcmax >= K;
            fp8mix_parallel_for(pl.nsl, pack_workers, pack_b_task, &pl);
            run_compute(&pl, workers);
        }
    }
    ws_give(ws, got);
    return FP8MIX_OK;
}
