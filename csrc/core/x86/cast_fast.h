/*
 * cast_fast.h — the fast-path dispatch shared by the x86 cast kernels,
 * included by cast_avx2.c and cast_avx512.c after each defines its
 * always-inline loops amax_run_t and cast_sat_run_t: picks the instance
 * (input dtype x significand shift 23 - mbits x inf_to_nan) and runs it over
 * the longest prefix it covers.  The callers finish the remaining tail (and
 * every other case) with their general loop.
 */
#ifndef FP8MIX_X86_CAST_FAST_H
#define FP8MIX_X86_CAST_FAST_H

/* Elements of x[0..n) done by the fast loops: all amax-only work, and the
 * saturating round-to-nearest cast; 0 for anything else. */
static int64_t fast_prefix(const void *x, fp8mix_dtype xt, int64_t n, float scale, uint8_t *q, uint32_t *amax,
                           const fp8_params *p)
{
    if (!q) {
        switch (xt) {
        case FP8MIX_F32: return amax_run_t(x, FP8MIX_F32, n, amax);
        case FP8MIX_BF16: return amax_run_t(x, FP8MIX_BF16, n, amax);
        default: return amax_run_t(x, FP8MIX_F16, n, amax);
        }
    }
    if (!p->saturate || p->stochastic) return 0;
#define RUN(T)                                                                                   \
    (p->fmt == FP8MIX_E4M3 ? (p->inf_to_nan ? cast_sat_run_t(x, T, 20, 1, n, scale, q, amax, p)  \
                                            : cast_sat_run_t(x, T, 20, 0, n, scale, q, amax, p)) \
                           : (p->inf_to_nan ? cast_sat_run_t(x, T, 21, 1, n, scale, q, amax, p)  \
                                            : cast_sat_run_t(x, T, 21, 0, n, scale, q, amax, p)))
    switch (xt) {
    case FP8MIX_F32: return RUN(FP8MIX_F32);
    case FP8MIX_BF16: return RUN(FP8MIX_BF16);
    default: return RUN(FP8MIX_F16);
    }
#undef RUN
}

#endif /* FP8MIX_X86_CAST_FAST_H */
