/*
 * gemm_avx512.c — AVX-512 float32 GEMM microkernel, 14 x 32 tile (28 zmm
 * accumulators, A broadcast from the packed panel).  Packed panels and the
 * summation order are defined in gemm_internal.h; FMA equals mul+add here
 * because FP8 products are exact.
 */
#include "gemm_internal.h"

#if FP8MIX_X86
#include <immintrin.h>

#define ROWS14(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13)

static inline __attribute__((always_inline)) void
ukernel_f32_14x32(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc, int load_c, const float *rs,
                  const float *cs)
{
    const float *a = (const float *)ap, *b = (const float *)bp;
    int init = load_c && !rs;
    /* The driver's next tile is usually the next 14 rows of C: start fetching
     * it into L2 now (C rows are often 4 KiB multiples apart and collide in L1). */
    for (int r = 0; r < 14 && !cs; r++) { /* (MX: once per tile, by the caller) */
        _mm_prefetch((const char *)(c + (14 + r) * ldc), _MM_HINT_T1);
        _mm_prefetch((const char *)(c + (14 + r) * ldc + 31), _MM_HINT_T1);
    }
#define DECL(r)                                                                    \
    __m512 c##r##0 = init ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();   \
    __m512 c##r##1 = init ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
    ROWS14(DECL)
#undef DECL
    /* Four k-steps per iteration (fewer loop uops per FMA); the empty asm
     * keeps GCC from hoisting the next step's loads and spilling accumulators. */
#define STEP(r, u)                                              \
    {                                                           \
        __m512 av = _mm512_set1_ps(a[14 * (u) + (r)]);          \
        c##r##0 = _mm512_fmadd_ps(av, b0, c##r##0);             \
        c##r##1 = _mm512_fmadd_ps(av, b1, c##r##1);             \
    }
#define KSTEP(u)                                                                           \
    {                                                                                      \
        __m512 b0 = _mm512_loadu_ps(b + 32 * (u)), b1 = _mm512_loadu_ps(b + 32 * (u) + 16); \
        STEP(0, u) STEP(1, u) STEP(2, u) STEP(3, u) STEP(4, u) STEP(5, u) STEP(6, u)       \
        STEP(7, u) STEP(8, u) STEP(9, u) STEP(10, u) STEP(11, u) STEP(12, u) STEP(13, u)   \
    }
    int64_t t = 0;
    for (; t + 4 <= kc; t += 4, a += 56, b += 128) {
        KSTEP(0) __asm__ volatile("" ::: "memory");
        KSTEP(1) __asm__ volatile("" ::: "memory");
        KSTEP(2) __asm__ volatile("" ::: "memory");
        KSTEP(3)
    }
    for (; t < kc; t++, a += 14, b += 32) KSTEP(0)
#undef KSTEP
#undef STEP
    if (!rs) {
#define STORE(r)                               \
    _mm512_storeu_ps(c + r * ldc, c##r##0);    \
    _mm512_storeu_ps(c + r * ldc + 16, c##r##1);
        ROWS14(STORE)
#undef STORE
        return;
    }
    /* Block scales: C = (load_c ? C : +0) + part * rs[r], mul then add; MX (cs, the
     * columns' scales): C = (load_c ? C : +0) + part * (rs[r] * cs[c]). */
#define SCALE(r)                                                                    \
    {                                                                               \
        __m512 s0 = _mm512_set1_ps(rs[r]), s1 = s0;                                 \
        if (cs) s0 = _mm512_mul_ps(s0, _mm512_loadu_ps(cs)), s1 = _mm512_mul_ps(s1, _mm512_loadu_ps(cs + 16)); \
        __m512 o0 = load_c ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();    \
        __m512 o1 = load_c ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps(); \
        _mm512_storeu_ps(c + r * ldc, _mm512_add_ps(o0, _mm512_mul_ps(c##r##0, s0)));      \
        _mm512_storeu_ps(c + r * ldc + 16, _mm512_add_ps(o1, _mm512_mul_ps(c##r##1, s1))); \
    }
    ROWS14(SCALE)
#undef SCALE
}

void fp8mix_gemm_ukernel_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp,
                                           float *c, int64_t ldc, int load_c,
                                           const float *rs)
{
    ukernel_f32_14x32(kc, ap, bp, c, ldc, load_c, rs, NULL);
}

/* MX scales over a whole K step (gemm_internal.h's fp8mix_gemm_ukernel_mx_fn): one
 * kernel pass per 32-deep block, its part scaled and added into C from registers. */
void fp8mix_gemm_ukernel_mx_f32_14x32__avx512(int64_t kc, const void *ap, const void *bp, float *c, int64_t ldc,
                                              int load_c, const float *sa, const float *sb)
{
    const unsigned char *a = (const unsigned char *)ap, *b = (const unsigned char *)bp;
    for (int r = 0; r < 14; r++) {
        _mm_prefetch((const char *)(c + (14 + r) * ldc), _MM_HINT_T1);
        _mm_prefetch((const char *)(c + (14 + r) * ldc + 31), _MM_HINT_T1);
    }
    for (int64_t q = 0; q * 32 < kc; q++) { /* a block: 32 k-steps of 14 A and 32 B values, 4 bytes each */
        int64_t kk = kc - q * 32 < 32 ? kc - q * 32 : 32; /* even: kc is */
        ukernel_f32_14x32(kk, a + q * 32 * 14 * 4, b + q * 32 * 32 * 4, c, ldc, load_c || q > 0, sa + q * 14,
                          sb + q * 32);
    }
}
#endif /* FP8MIX_X86 */
