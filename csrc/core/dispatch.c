/*
 * dispatch.c — read the CPU's features once and pick the kernel table.
 * The only place that knows which ISAs exist; a limit (fp8mix_set_max_isa or
 * FP8MIX_MAX_ISA) lets tests run every variant on one machine.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#if FP8MIX_X86 && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
/* F16C from CPUID (leaf 1, ECX bit 29): clang 14 has no __builtin_cpu_supports("f16c"). */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}
#endif

static fp8mix_isa detect(void)
{
#if FP8MIX_X86 && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    if (!avx2) return FP8MIX_ISA_SCALAR;
    int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    if (!avx512) return FP8MIX_ISA_AVX2;
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 10)
    if (__builtin_cpu_supports("avx512bf16")) return FP8MIX_ISA_AVX512BF16;
#endif
    return FP8MIX_ISA_AVX512;
#else
    return FP8MIX_ISA_SCALAR;
#endif
}

static atomic_int g_best = -1;
static atomic_int g_limit = -1;

static int parse_isa(const char *s)
{
    if (!s) return -1;
    if (!strcmp(s, "scalar")) return FP8MIX_ISA_SCALAR;
    if (!strcmp(s, "avx2")) return FP8MIX_ISA_AVX2;
    if (!strcmp(s, "avx512")) return FP8MIX_ISA_AVX512;
    if (!strcmp(s, "avx512bf16")) return FP8MIX_ISA_AVX512BF16;
    return -1;
}

fp8mix_isa fp8mix_cpu_isa(void)
{
    int b = atomic_load(&g_best);
    if (b < 0) {
        b = (int)detect();
        atomic_store(&g_best, b);
    }
    return (fp8mix_isa)b;
}

fp8mix_isa fp8mix_active_isa(void)
{
    int best = (int)fp8mix_cpu_isa();
    int lim = atomic_load(&g_limit);
    if (lim == -1) {
        int env = parse_isa(getenv("FP8MIX_MAX_ISA"));
        lim = env >= 0 ? env : FP8MIX_ISA_AVX512BF16;
        int expected = -1;
        atomic_compare_exchange_strong(&g_limit, &expected, lim);
        lim = atomic_load(&g_limit);
    }
    return (fp8mix_isa)(lim < best ? lim : best);
}

void fp8mix_set_max_isa(fp8mix_isa limit)
{
    int l = (int)limit;
    if (l < FP8MIX_ISA_SCALAR) l = FP8MIX_ISA_SCALAR;
    if (l > FP8MIX_ISA_AVX512BF16) l = FP8MIX_ISA_AVX512BF16;
    atomic_store(&g_limit, l);
}

const char *fp8mix_isa_name(fp8mix_isa isa)
{
    switch (isa) {
    case FP8MIX_ISA_SCALAR: return "scalar";
    case FP8MIX_ISA_AVX2: return "avx2";
    case FP8MIX_ISA_AVX512: return "avx512";
    case FP8MIX_ISA_AVX512BF16: return "avx512bf16";
    }
    return "unknown";
}

static const fp8mix_kernels k_scalar = {fp8mix_cast_seg_scalar, fp8mix_dequant_seg_scalar};
#if FP8MIX_X86
static const fp8mix_kernels k_avx2 = {fp8mix_cast_seg_avx2, fp8mix_dequant_seg_avx2};
static const fp8mix_kernels k_avx512 = {fp8mix_cast_seg_avx512, fp8mix_dequant_seg_avx512};
#endif

const fp8mix_kernels *fp8mix_kernels_active(void)
{
    fp8mix_isa isa = fp8mix_active_isa();
#if FP8MIX_X86
    if (isa >= FP8MIX_ISA_AVX512) return &k_avx512;
    if (isa >= FP8MIX_ISA_AVX2) return &k_avx2;
#endif
    (void)isa;
    return &k_scalar;
}

const char *fp8mix_status_string(fp8mix_status s)
{
    switch (s) {
    case FP8MIX_OK: return "ok";
    case FP8MIX_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FP8MIX_ERR_BAD_SHAPE: return "invalid shape or leading dimension";
    case FP8MIX_ERR_BAD_ENUM: return "unknown format, dtype, granularity or layout";
    case FP8MIX_ERR_BAD_SCALE: return "a scale is not finite and positive";
    case FP8MIX_ERR_UNSUPPORTED: return "unsupported by this build";
    case FP8MIX_ERR_NO_MEMORY: return "out of memory";
    case FP8MIX_ERR_BAD_ARG: return "invalid argument";
    }
    return "unknown status";
}
