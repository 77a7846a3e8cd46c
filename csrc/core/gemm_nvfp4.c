/*
 * gemm_nvfp4.c — C = A B^T of two NVFP4 tensors (fp8mix_gemm_nvfp4), in the
 * summation order fp8mix.h states.
 *
 * Why it may run on decoded operands: a block's 16 products of E2M1 values are
 * multiples of 1/4 below 36 and their sum is below 576 (at most 12 significant
 * bits); the two E4M3 block scales multiply to at most 8 significant bits.  So
 * (a_k d_a)(b_k d_b), their partial sums within a block and the block's sum
 * times d_a d_b are all exact in float32 and equal: decoding each element
 * with its block scale first and summing the 16 scaled products in order gives
 * the header's bits.  B is decoded once into a K x N float32 panel, so the
 * innermost loop runs over N (independent sums: the compiler may vectorise it
 * without reordering any one sum), and A one row at a time.  The only
 * roundings left are the accumulation over blocks (ascending k) and the final
 * tensor-scale product, so the result does not depend on how rows are split
 * over threads.
 */
#include <stdlib.h>

#include "internal.h"

#define NB FP8MIX_NVFP4_BLOCK
#define NV_ROWS 4 /* rows of C per task */

typedef struct nvg_job {
    int64_t M, N, K;
    const uint8_t *a, *sa;
    int64_t lda, ldc;
    const float *bt; /* K x N: b(j, k) * d_b(j, k / 16) */
    float alpha;
    float *c;
    float *scratch; /* per worker: a row of A (K) + block sums (N) + accumulators (N) */
} nvg_job;

static float decode_scaled(const uint8_t *q, const uint8_t *s, int64_t k)
{
    float v = fp8mix_e2m1_decode((uint8_t)((k & 1) ? q[k / 2] >> 4 : q[k / 2]));
    return fp8r_mul(v, fp8mix_decode_ref(s[k / NB], FP8MIX_E4M3));
}

static void nvg_task(void *ctx, int64_t task, int worker)
{
    const nvg_job *J = (const nvg_job *)ctx;
    int64_t N = J->N, K = J->K, nb = K / NB;
    float *arow = J->scratch + (size_t)worker * (size_t)(K + 2 * N), *s = arow + K, *acc = s + N;
    int64_t i0 = task * NV_ROWS, i1 = i0 + NV_ROWS < J->M ? i0 + NV_ROWS : J->M;
    for (int64_t i = i0; i < i1; i++) {
        const uint8_t *qa = J->a + i * J->lda, *sa = J->sa + i * nb;
        for (int64_t k = 0; k < K; k++) arow[k] = decode_scaled(qa, sa, k);
        for (int64_t j = 0; j < N; j++) acc[j] = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += NB) {
            for (int64_t j = 0; j < N; j++) s[j] = 0.0f;
            for (int64_t t = 0; t < NB; t++) {
                const float av = arow[k0 + t], *brow = J->bt + (k0 + t) * N;
                for (int64_t j = 0; j < N; j++) s[j] += fp8r_mul(av, brow[j]);
            }
            for (int64_t j = 0; j < N; j++) acc[j] += s[j];
        }
        for (int64_t j = 0; j < N; j++) J->c[i * J->ldc + j] = fp8r_mul(acc[j], J->alpha);
    }
}

fp8mix_status fp8mix_gemm_nvfp4(int64_t M, int64_t N, int64_t K, const uint8_t *a, int64_t lda,
                                const uint8_t *sa, float sinv_a, const uint8_t *b, int64_t ldb,
                                const uint8_t *sb, float sinv_b, float *c, int64_t ldc)
{
    if (M < 0 || N < 0 || K < 0 || K % NB != 0 || (M && lda < K / 2) || (N && ldb < K / 2) ||
        bad_2d(M, N, ldc))
        return FP8MIX_ERR_BAD_SHAPE;
    if (!(sinv_a > 0.0f) || !(sinv_a <= FP8R_FLT_MAX) || !(sinv_b > 0.0f) || !(sinv_b <= FP8R_FLT_MAX))
        return FP8MIX_ERR_BAD_SCALE;
    if (M == 0 || N == 0) return FP8MIX_OK;
    if (!c || (K && (!a || !b || !sa || !sb))) return FP8MIX_ERR_NULL_POINTER;
    if (K > (INT64_MAX / 4) / (N > M ? N : M) - 2) return FP8MIX_ERR_BAD_SHAPE; /* the panels' sizes */
    int64_t ntasks = ceil_div(M, NV_ROWS);
    int workers = fp8mix_workers_for(M * N * (K ? K : 1), 1 << 20);
    if (workers < 1) workers = 1;
    float *bt = malloc(((size_t)K * (size_t)N + (size_t)workers * (size_t)(K + 2 * N)) * sizeof(float));
    if (!bt) return FP8MIX_ERR_NO_MEMORY;
    int64_t nb = K / NB;
    for (int64_t j = 0; j < N; j++)
        for (int64_t k = 0; k < K; k++) bt[k * N + j] = decode_scaled(b + j * ldb, sb + j * nb, k);
    nvg_job J = {M, N, K, a, sa, lda, ldc, bt, fp8r_mul(sinv_a, sinv_b), c, bt + (size_t)K * (size_t)N};
    fp8mix_parallel_for(ntasks, workers, nvg_task, &J);
    free(bt);
    return FP8MIX_OK;
}
