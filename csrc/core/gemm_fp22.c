/*
 * gemm_fp22.c — the driver of the FP22 accumulation model (ACCUM_FP22; its
 * rules are in gemm.c): a study tool for Hopper's FP8 tensor-core
 * accumulator, plain C that the compiler vectorises, threaded over rows.
 * Not a fast path: the float32 GEMM is gemm_blocked.c.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

static void *fp22_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
    return p;
}

/*  * Columns in chunks of FP22_NB decoded to a K x FP22_NB float block; tasks are
 * single rows; each row runs the model on FP22_NB columns at once (a loop the
 * compiler can vectorise: the truncation is an integer mask). */

#define FP22_NB 256

typedef struct fp22_plan {
    const fp8mix_gemm_args *g;
    const float *ta;
    const float *bdec;   /* K x FP22_NB, the current chunk               */
    int64_t j0, nb;      /* chunk start and width                        */
    float *scratch;      /* per worker: arow (K) + 3 x FP22_NB           */
    size_t scratch_words;
} fp22_plan;

/* s[x] = trunc22(s[x] + a * b[x]) over one chunk; branch-free and
 * restrict-qualified so that -O2 vectorises it. */
static void fp22_step(float *restrict s, float a, const float *restrict b)
{
    for (int x = 0; x < FP22_NB; x++) {
        uint32_t u = f32_bits(s[x] + a * b[x]);
        uint32_t keep = (u & 0x7F800000u) == 0x7F800000u ? 0xFFFFFFFFu : 0xFFFFFC00u;
        s[x] = bits_f32(u & keep);
    }
}

static void fp22_row_task(void *ctx, int64_t i, int worker)
{
    const fp22_plan *pl = (const fp22_plan *)ctx;
    const fp8mix_gemm_args *g = pl->g;
    int64_t K = g->k, iv = g->promote_interval;
    int block = g->scale_a_kind == FP8MIX_MM_SCALE_BLOCK;
    int64_t run = block ? FP8MIX_BLOCK : (K > 0 ? K : 1);
    float *arow = pl->scratch + (size_t)worker * pl->scratch_words;
    float *acc = arow + K, *P = acc + FP22_NB, *s = P + FP22_NB;
    if (K > 0) { /* A may be NULL when K == 0 */
        for (int64_t p = 0; p < K; p++) arow[p] = pl->ta[fp8mix_gemm_a_at(g, i, p)];
    }
    for (int64_t x = 0; x < FP22_NB; x++) acc[x] = 0.0f;
    for (int64_t p0 = 0; p0 < K; p0 += run) {
        int64_t p1 = p0 + run < K ? p0 + run : K, cnt = 0;
        for (int64_t x = 0; x < FP22_NB; x++) P[x] = s[x] = 0.0f;
        for (int64_t p = p0; p < p1; p++) {
            const float *brow = pl->bdec + p * FP22_NB;
            float a = arow[p];
            fp22_step(s, a, brow);
            if (iv > 0 && ++cnt == iv) {
                for (int64_t x = 0; x < FP22_NB; x++) {
                    P[x] = P[x] + s[x];
                    s[x] = 0.0f;
                }
                cnt = 0;
            }
        }
        for (int64_t x = 0; x < FP22_NB; x++) P[x] = P[x] + s[x];
        if (!block) {
            memcpy(acc, P, sizeof(float) * FP22_NB);
        } else {
            int64_t kb = p0 / FP8MIX_BLOCK;
            for (int64_t x = 0; x < pl->nb; x++)
                acc[x] = acc[x] + P[x] * fp8mix_gemm_block_scale(g, i, kb, pl->j0 + x);
        }
    }
    fp8mix_gemm_epilogue(g, i, 1, pl->j0, pl->nb, acc, FP22_NB);
}

fp8mix_status fp8mix_gemm_fp22(const fp8mix_gemm_args *g)
{
    fp22_plan pl;
    pl.g = g;
    pl.ta = fp8mix_decode_table(g->fmt_a);
    const float *tb = fp8mix_decode_table(g->fmt_b);
    if (!pl.ta || !tb) return FP8MIX_ERR_BAD_ENUM;
    int64_t K = g->k;
    double work = (double)g->m * (double)g->n * (double)(K > 0 ? K : 1);
    int workers = fp8mix_workers_for(work > 4e18 ? INT64_MAX : (int64_t)work, 1 << 20);
    if ((uint64_t)K > SIZE_MAX / 8 / FP22_NB) return FP8MIX_ERR_NO_MEMORY;
    pl.scratch_words = ((size_t)K + 3 * FP22_NB + 15) & ~(size_t)15;
    float *bdec = (float *)fp22_alloc((size_t)K * FP22_NB * 4);
    pl.scratch = (float *)fp22_alloc(pl.scratch_words * 4 * (size_t)workers);
    if (!bdec || !pl.scratch) {
        free(bdec);
        free(pl.scratch);
        return FP8MIX_ERR_NO_MEMORY;
    }
    pl.bdec = bdec;
    for (pl.j0 = 0; pl.j0 < g->n; pl.j0 += FP22_NB) {
        pl.nb = g->n - pl.j0 < FP22_NB ? g->n - pl.j0 : FP22_NB;
        for (int64_t p = 0; p < K; p++)
            for (int64_t x = 0; x < FP22_NB; x++)
                bdec[p * FP22_NB + x] = x < pl.nb ? tb[fp8mix_gemm_b_at(g, p, pl.j0 + x)] : 0.0f;
        fp8mix_parallel_for(g->m, workers, fp22_row_task, &pl);
    }
    free(bdec);
    free(pl.scratch);
    return FP8MIX_OK;
}
