/*
 * gemm_avx2.c — AVX2/FMA float32 GEMM microkernel, 6 x 16 tile: 12 ymm
 * accumulators, 2 for the B row, 1 for the broadcast A value (15 of the 16
 * registers); per k-step 12 FMAs against 8 loads, so the two FMA ports set the
 * pace.  Packed panels and the summation order are defined in
 * gemm_internal.h; FMA equals mul+add here because FP8 products are exact.
 */
#include "gemm_internal.h"

#if FP8MIX_X86
#include <immintrin.h>

#define ROWS6(X) X(0) X(1) X(2) X(3) X(4) X(5)

void fp8mix_gemm_ukernel_f32_6x16__avx2(int64_t kc, const void *ap, const void *bp,
                                        float *c, int64_t ldc, int load_c,
                                        const float *rs)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    int init = load_c && !rs;
    /* The driver's next tile is usually the next 6 rows of C: start fetching
     * it into L2 now (C rows are often 4 KiB multiples apart and collide in L1). */
    for (int r = 0; r < 6; r++) {
        _mm_prefetch((const char *)(c + (6 + r) * ldc), _MM_HINT_T1);
        _mm_prefetch((const char *)(c + (6 + r) * ldc + 15), _MM_HINT_T1);
    }
#define DECL(r)                                                                   \
    __m256 c##r##0 = init ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();  \
    __m256 c##r##1 = init ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
    ROWS6(DECL)
#undef DECL
    /* Four k-steps per iteration: fewer loop and pointer uops per FMA (on a
     * core shared with a hyperthread sibling the front end is the limit). */
#define STEP(r, u)                                              \
    {                                                           \
        __m256 av = _mm256_broadcast_ss(a + 6 * (u) + (r));     \
        c##r##0 = _mm256_fmadd_ps(av, b0, c##r##0);             \
        c##r##1 = _mm256_fmadd_ps(av, b1, c##r##1);             \
    }
#define KSTEP(u)                                                                      \
    {                                                                                 \
        __m256 b0 = _mm256_loadu_ps(b + 16 * (u)), b1 = _mm256_loadu_ps(b + 16 * (u) + 8); \
        STEP(0, u) STEP(1, u) STEP(2, u) STEP(3, u) STEP(4, u) STEP(5, u)             \
    }
    int64_t t = 0;
    for (; t + 4 <= kc; t += 4, a += 24, b += 64) {
        /* the empty asm keeps GCC from hoisting the next steps' loads (and
         * spilling accumulators to make room for them) */
        KSTEP(0) __asm__ volatile("" ::: "memory");
        KSTEP(1) __asm__ volatile("" ::: "memory");
        KSTEP(2) __asm__ volatile("" ::: "memory");
        KSTEP(3)
    }
    for (; t < kc; t++, a += 6, b += 16) KSTEP(0)
#undef KSTEP
#undef STEP
    if (!rs) {
#define STORE(r)                              \
    _mm256_storeu_ps(c + r * ldc, c##r##0);   \
    _mm256_storeu_ps(c + r * ldc + 8, c##r##1);
        ROWS6(STORE)
#undef STORE
        return;
    }
    /* Block scales: C = (load_c ? C : +0) + part * rs[r], mul then add. */
#define SCALE(r)                                                                   \
    {                                                                              \
        __m256 s = _mm256_set1_ps(rs[r]);                                          \
        __m256 o0 = load_c ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();   \
        __m256 o1 = load_c ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps(); \
        _mm256_storeu_ps(c + r * ldc, _mm256_add_ps(o0, _mm256_mul_ps(c##r##0, s)));     \
        _mm256_storeu_ps(c + r * ldc + 8, _mm256_add_ps(o1, _mm256_mul_ps(c##r##1, s))); \
    }
    ROWS6(SCALE)
#undef SCALE
}
#endif /* FP8MIX_X86 */
