/*
 * gemm_mx.c — the plain-loop reference of the GEMM with MX scales on both
 * operands (fp8mix_gemm_mx, called by fp8mix_gemm_ref after the checks):
 * 32-deep K runs, each scaled by (sa[i][kb] * sb[j][kb]) (the rule in gemm.c),
 * in the documented order, threaded over rows.  The oracle of the blocked
 * driver's MX path (gemm_blocked.c), which fp8mix_gemm uses.  Not here: MX
 * quantisation (cast_mx.c), the epilogue (gemm_epilogue.c).
 */
#include <stdlib.h>
#include <string.h>

#include "gemm_internal.h"

#define MX FP8MIX_MX_BLOCK

typedef struct mxg_job {
    const fp8mix_gemm_args *g;
    const float *bt; /* B decoded, N x K (K contiguous) */
    float *ws;       /* per worker: a row of A (K), then a row of outputs (N) */
    int64_t nkb;
} mxg_job;

/* Rows [i, i+1): decode row i of A, then every output of the row. */
static void mxg_task(void *ctx, int64_t i, int worker)
{
    const mxg_job *J = (const mxg_job *)ctx;
    const fp8mix_gemm_args *g = J->g;
    const float *ta = fp8mix_decode_table(g->fmt_a);
    int64_t K = g->k;
    float *a = J->ws + (size_t)worker * (size_t)(K + g->n), *v = a + K;
    for (int64_t p = 0; p < K; p++) a[p] = ta[fp8mix_gemm_a_at(g, i, p)];
    const float *sa = g->scale_a + i * J->nkb;
    for (int64_t j = 0; j < g->n; j++) {
        const float *b = J->bt + j * K, *sb = g->scale_b + j * J->nkb;
        float acc = 0.0f;
        for (int64_t kb = 0; kb < J->nkb; kb++) {
            int64_t p0 = kb * MX, p1 = p0 + MX < K ? p0 + MX : K;
            float part = 0.0f;
            for (int64_t p = p0; p < p1; p += 2) { /* the canonical pair order: 1, 0, 3, 2, ... */
                if (p + 1 < p1) part = part + a[p + 1] * b[p + 1];
                part = part + a[p] * b[p];
            }
            acc = acc + part * (sa[kb] * sb[kb]);
        }
        v[j] = acc;
    }
    fp8mix_gemm_epilogue(g, i, 1, 0, g->n, v, g->n);
}

fp8mix_status fp8mix_gemm_mx(const fp8mix_gemm_args *g)
{
    int64_t M = g->m, N = g->n, K = g->k;
    if (K == 0) { /* every sum is +0: only the epilogue */
        float *v = calloc((size_t)N, sizeof(float));
        if (!v) return FP8MIX_ERR_NO_MEMORY;
        for (int64_t i = 0; i < M; i++) {
            memset(v, 0, (size_t)N * sizeof(float));
            fp8mix_gemm_epilogue(g, i, 1, 0, N, v, N);
        }
        free(v);
        return FP8MIX_OK;
    }
    double work = (double)M * (double)N * (double)K;
    int workers = fp8mix_workers_for(work > 4e18 ? INT64_MAX : (int64_t)work, 1 << 20);
    if ((uint64_t)N * (uint64_t)K > SIZE_MAX / sizeof(float) / 4 ||
        (uint64_t)(K + N) * (uint64_t)workers > SIZE_MAX / sizeof(float) / 4)
        return FP8MIX_ERR_NO_MEMORY;
    float *bt = malloc((size_t)(N * K) * sizeof(float));
    float *ws = malloc((size_t)(K + N) * (size_t)workers * sizeof(float));
    if (!bt || !ws) {
        free(bt);
        free(ws);
        return FP8MIX_ERR_NO_MEMORY;
    }
    const float *tb = fp8mix_decode_table(g->fmt_b);
    for (int64_t j = 0; j < N; j++)
        for (int64_t p = 0; p < K; p++) bt[j * K + p] = tb[fp8mix_gemm_b_at(g, p, j)];
    mxg_job J = {g, bt, ws, ceil_div(K, MX)};
    fp8mix_parallel_for(M, workers, mxg_task, &J);
    free(bt);
    free(ws);
    return FP8MIX_OK;
}
