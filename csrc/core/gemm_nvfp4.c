/*
 * gemm_nvfp4.c — C = A B^T of two NVFP4 tensors (fp8mix_gemm_nvfp4), scalar,
 * in the summation order fp8mix.h states.  Each block of 16 products is exact
 * in float32 and so is its scaling by the two E4M3 block scales, so the only
 * roundings are the accumulation over blocks (ascending k) and the final
 * tensor-scale product: the result does not depend on how rows are split
 * over threads.
 */
#include "internal.h"

#define NB FP8MIX_NVFP4_BLOCK
#define NV_ROWS 8 /* rows of C per task */

typedef struct nvg_job {
    int64_t M, N, K;
    const uint8_t *a, *sa, *b, *sb;
    int64_t lda, ldb, ldc;
    float alpha;
    float *c;
} nvg_job;

static void unpack_row(const uint8_t *q, int64_t K, float *v)
{
    for (int64_t k = 0; k < K; k += 2) {
        v[k] = fp8mix_e2m1_decode(q[k / 2]);
        v[k + 1] = fp8mix_e2m1_decode((uint8_t)(q[k / 2] >> 4));
    }
}

static void nvg_task(void *ctx, int64_t task, int worker)
{
    (void)worker;
    const nvg_job *J = (const nvg_job *)ctx;
    int64_t nb = J->K / NB;
    float va[4096], vb[4096]; /* one K-slab of 4096 at a time */
    int64_t i0 = task * NV_ROWS, i1 = i0 + NV_ROWS < J->M ? i0 + NV_ROWS : J->M;
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < J->N; j++) {
            float acc = 0.0f;
            for (int64_t k0 = 0; k0 < J->K; k0 += 4096) {
                int64_t kn = J->K - k0 < 4096 ? J->K - k0 : 4096;
                unpack_row(J->a + i * J->lda + k0 / 2, kn, va);
                unpack_row(J->b + j * J->ldb + k0 / 2, kn, vb);
                for (int64_t kb = 0; kb < kn; kb += NB) {
                    float s = 0.0f;
                    for (int t = 0; t < NB; t++) s += fp8r_mul(va[kb + t], vb[kb + t]);
                    int64_t blk = (k0 + kb) / NB;
                    float d = fp8r_mul(fp8mix_decode_ref(J->sa[i * nb + blk], FP8MIX_E4M3),
                                       fp8mix_decode_ref(J->sb[j * nb + blk], FP8MIX_E4M3));
                    acc += fp8r_mul(s, d);
                }
            }
            J->c[i * J->ldc + j] = fp8r_mul(acc, J->alpha);
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
    nvg_job J = {M, N, K, a, sa, b, sb, lda, ldb, ldc, fp8r_mul(sinv_a, sinv_b), c};
    int64_t ntasks = ceil_div(M, NV_ROWS);
    fp8mix_parallel_for(ntasks, fp8mix_workers_for(M * N * (K ? K : 1), 1 << 20), nvg_task, &J);
    return FP8MIX_OK;
}
