/*
 * dispatch.c — read the CPU's features once and pick the kernels: the cast
 * segment kernels, the quant_stats segment kernel, the fused producer kernels,
 * and the GEMM microkernel with its packing.  The only place that knows which ISAs exist and which variant
 * each one runs; a limit (fp8mix_set_max_isa or FP8MIX_MAX_ISA) lets tests run
 * every variant on one machine.  Its tables name kernels only (the *_ref.c
 * files, gemm_epilogue.c's scale_rows, x86/): nothing it names calls back
 * into it.  Not here: the byte transpose, whose x86-64 variant is SSE2 (the
 * ISA's baseline) and chosen at compile time (transpose.c).
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fused.h"
#include "gemm_internal.h"
#include "stats_kernels.h"

#if FP8MIX_X86 && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
/* F16C from CPUID (leaf 1, ECX bit 29): clang 14 has no __builtin_cpu_supports("f16c"). */
static int has_f16c(void)
{
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
}

/* AMX-BF16 and AMX-TILE (CPUID leaf 7: EDX bits 22, 24), the tile state enabled
 * in XCR0 (bits 17, 18: XTILECFG, XTILEDATA), and the OS's grant for this process
 * (Linux: fp8mix_amx_request); a refusal leaves AMX unused. */
static int has_amx(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 22) & 1u) || !((d >> 24) & 1u)) return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return 0; /* OSXSAVE: xgetbv allowed */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000u) != 0x60000u) return 0;
    return fp8mix_gemm_have_amx && fp8mix_amx_request();
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
    if (__builtin_cpu_supports("avx512bf16")) return has_amx() ? FP8MIX_ISA_AMX : FP8MIX_ISA_AVX512BF16;
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
    if (!strcmp(s, "amx")) return FP8MIX_ISA_AMX;
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
        lim = env >= 0 ? env : FP8MIX_ISA_AMX;
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
    if (l > FP8MIX_ISA_AMX) l = FP8MIX_ISA_AMX;
    atomic_store(&g_limit, l);
}

const char *fp8mix_isa_name(fp8mix_isa isa)
{
    switch (isa) {
    case FP8MIX_ISA_SCALAR: return "scalar";
    case FP8MIX_ISA_AVX2: return "avx2";
    case FP8MIX_ISA_AVX512: return "avx512";
    case FP8MIX_ISA_AVX512BF16: return "avx512bf16";
    case FP8MIX_ISA_AMX: return "amx";
    }
    return "unknown";
}

/* ---- cast segment kernels (internal.h) -------------------------------------- */

static const fp8mix_kernels k_scalar = {fp8mix_cast_seg_ref, fp8mix_dequant_seg_ref, fp8mix_widen_t_ref};
#if FP8MIX_X86
static const fp8mix_kernels k_avx2 = {fp8mix_cast_seg__avx2, fp8mix_dequant_seg__avx2, fp8mix_widen_t__avx2};
static const fp8mix_kernels k_avx512 = {fp8mix_cast_seg__avx512, fp8mix_dequant_seg__avx512, fp8mix_widen_t__avx2};
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

/* ---- quant_stats segment kernels (stats_kernels.h) ---------------------------- */

fp8mix_stats_seg_fn fp8mix_stats_kernel_active(void)
{
    fp8mix_isa isa = fp8mix_active_isa();
#if FP8MIX_X86
    if (isa >= FP8MIX_ISA_AVX512) return fp8mix_stats_seg__avx512;
    if (isa >= FP8MIX_ISA_AVX2) return fp8mix_stats_seg__avx2;
#endif
    (void)isa;
    return fp8mix_stats_seg_ref;
}

/* ---- fused producer kernels (fused.h) -------------------------------------- */

static const fp8mix_fused_kernels fk_scalar = {fp8mix_fused_widen_ref, fp8mix_fused_lane_sums_ref,
                                               fp8mix_fused_norm_apply_ref, fp8mix_fused_act_ref};
#if FP8MIX_X86
static const fp8mix_fused_kernels fk_avx2 = {fp8mix_fused_widen__avx2, fp8mix_fused_lane_sums__avx2,
                                             fp8mix_fused_norm_apply__avx2, fp8mix_fused_act__avx2};
static const fp8mix_fused_kernels fk_avx512 = {fp8mix_fused_widen__avx512, fp8mix_fused_lane_sums__avx512,
                                               fp8mix_fused_norm_apply__avx512, fp8mix_fused_act__avx512};
#endif

const fp8mix_fused_kernels *fp8mix_fused_kernels_active(void)
{
    fp8mix_isa isa = fp8mix_active_isa();
#if FP8MIX_X86
    if (isa >= FP8MIX_ISA_AVX512) return &fk_avx512;
    if (isa >= FP8MIX_ISA_AVX2) return &fk_avx2;
#endif
    (void)isa;
    return &fk_scalar;
}

/* ---- GEMM microkernels ----------------------------------------------------
 * The x86 variants pack with the AVX2 decoder (the AVX-512 kernels: the AVX-512 one)
 * and finish tiles with the AVX2 epilogue, a small part of the work; AVX2 is part of
 * every ISA level above scalar. */

static const fp8mix_gemm_ukernel uk_scalar = {4, 16, 0, fp8mix_gemm_ukernel_f32_4x16_ref,
                                              fp8mix_gemm_pack_krows_ref, fp8mix_gemm_pack_kcols_ref,
                                              fp8mix_gemm_scale_rows_ref, "f32_4x16__scalar", NULL, NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, 0};
#if FP8MIX_X86
static const fp8mix_gemm_ukernel uk_avx2 = {6, 16, 0, fp8mix_gemm_ukernel_f32_6x16__avx2,
                                            fp8mix_gemm_pack_krows__avx2, fp8mix_gemm_pack_kcols__avx2,
                                            fp8mix_gemm_scale_rows__avx2, "f32_6x16__avx2",
                                            fp8mix_gemm_ukernel_final_f32_6x16__avx2,
                                            fp8mix_gemm_ukernel_blocks_f32_6x16__avx2,
                                            fp8mix_gemm_ukernel_mx_f32_6x16__avx2, 0, NULL, NULL, NULL, NULL, NULL, 0};
static const fp8mix_gemm_ukernel uk_avx512 = {14, 32, 0, fp8mix_gemm_ukernel_f32_14x32__avx512,
                                              fp8mix_gemm_pack_krows__avx512, fp8mix_gemm_pack_kcols__avx512,
                                              fp8mix_gemm_scale_rows__avx2, "f32_14x32__avx512",
                                              fp8mix_gemm_ukernel_final_f32_14x32__avx512, NULL,
                                              fp8mix_gemm_ukernel_mx_f32_14x32__avx512, 0, NULL, NULL,
                                              fp8mix_gemm_ukernel_mx_pow2_f32_14x32__avx512,
                                              fp8mix_gemm_ukernel_mx_scaled_f32_14x32__avx512,
                                              fp8mix_gemm_pack_mx__avx512, 1};
static const fp8mix_gemm_ukernel uk_avx512bf16 = {14, 32, 1, fp8mix_gemm_ukernel_bf16_14x32__avx512bf16,
                                                  fp8mix_gemm_pack_krows__avx512, fp8mix_gemm_pack_kcols__avx512,
                                                  fp8mix_gemm_scale_rows__avx2, "bf16_14x32__avx512bf16",
                                                  fp8mix_gemm_ukernel_final_bf16_14x32__avx512bf16,
                                                  fp8mix_gemm_ukernel_blocks_bf16_14x32__avx512bf16,
                                                  fp8mix_gemm_ukernel_mx_bf16_14x32__avx512bf16, 0, NULL, NULL,
                                                  fp8mix_gemm_ukernel_mx_pow2_bf16_14x32__avx512bf16,
                                                  fp8mix_gemm_ukernel_mx_scaled_bf16_14x32__avx512bf16,
                                                  fp8mix_gemm_pack_mx_bf16__avx512, 1};
static const fp8mix_gemm_ukernel uk_amx = {32, 32, 1, fp8mix_gemm_ukernel_bf16_32x32__amx,
                                           fp8mix_gemm_pack_b_krows_amx_ref, fp8mix_gemm_pack_b_kcols_amx_ref,
                                           fp8mix_gemm_scale_rows__avx2, "bf16_32x32__amx", NULL, NULL,
                                           fp8mix_gemm_ukernel_mx_bf16_32x32__amx, 32,
                                           fp8mix_gemm_pack_a_krows_amx_ref, fp8mix_gemm_pack_a_kcols_amx_ref, NULL,
                                           NULL, NULL, 0};

/* vdpbf16ps is specified (Intel SDM) as two separately rounded adds, odd
 * element first, with DAZ/FTZ (harmless here: sums of FP8 products are
 * multiples of 2^-32, never subnormal).  Trust but verify: run both kernels on
 * wide-range data once and use the bf16 one only if every bit agrees. */
static int bf16_probe(void)
{
    enum { MR = 14, NR = 32, KC = 64 };
    float af[KC * MR], bf[KC * NR];
    uint16_t ah[KC * MR], bh[KC * NR];  /* bf16 pairs, read as 32-bit words */
    float c1[MR * NR], c2[MR * NR], rs[MR];
    const float *t = fp8mix_decode_table(FP8MIX_E5M2);
    uint32_t x = 12345u;
    int ok = 1;
    for (int trial = 0; trial < 8 && ok; trial++) {
        /* E5M2 bytes with exponent field 1..30: finite, huge dynamic range. */
        for (int k = 0; k < KC; k++) {
            for (int r = 0; r < MR + NR; r++) {
                x = x * 1664525u + 1013904223u;
                uint8_t q = (uint8_t)(x >> 24);
                if ((q & 0x7C) == 0x7C || (q & 0x7C) == 0) q ^= 0x40;
                float v = t[q];
                uint16_t h = (uint16_t)(f32_bits(v) >> 16);
                if (r < MR) {
                    af[(k ^ 1) * MR + r] = v;
                    ah[((k >> 1) * MR + r) * 2 + (k & 1)] = h;
                } else {
                    bf[(k ^ 1) * NR + r - MR] = v;
                    bh[((k >> 1) * NR + r - MR) * 2 + (k & 1)] = h;
                }
            }
        }
        for (int e = 0; e < MR * NR; e++) c1[e] = c2[e] = t[(e * 37 + trial) & 0x7B];
        for (int r = 0; r < MR; r++) rs[r] = 1.0f + (float)r / 3.0f;
        const float *rsp = (trial & 1) ? rs : NULL;
        uk_avx512.fn(KC, af, bf, c1, NR, trial & 2, rsp);
        uk_avx512bf16.fn(KC, ah, bh, c2, NR, trial & 2, rsp);
        ok = memcmp(c1, c2, sizeof c1) == 0;
    }
    return ok;
}

static uint64_t ticks_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Best time of 40 microkernel calls over 256 k-steps of L1-resident data. */
static uint64_t kernel_ns(const fp8mix_gemm_ukernel *uk, const void *a, const void *b, float *c)
{
    uint64_t best = UINT64_MAX;
    for (int trial = 0; trial < 5; trial++) {
        uint64_t t0 = ticks_ns();
        for (int i = 0; i < 40; i++) uk->fn(256, a, b, c, 32, 1, NULL);
        uint64_t t = ticks_ns() - t0;
        if (t < best) best = t;
    }
    return best;
}

/* Is the bf16 kernel (two k-steps per vdpbf16ps) faster than the float32 one
 * on this CPU?  Not everywhere: some cores run vdpbf16ps at a fraction of the
 * FMA rate.  The two are bit-identical (bf16_probe), so this choice only
 * changes the speed.  Zeros as data: no special values, the same work. */
static int bf16_faster(void)
{
    static float a[256 * 14], b[256 * 32], c[14 * 32];
    uint64_t t32 = UINT64_MAX, t16 = UINT64_MAX;
    for (int round = 0; round < 2; round++) { /* alternate, so that other load hits both alike */
        uint64_t x = kernel_ns(&uk_avx512, a, b, c), y = kernel_ns(&uk_avx512bf16, a, b, c);
        t32 = x < t32 ? x : t32;
        t16 = y < t16 ? y : t16;
    }
    return t16 * 10 < t32 * 9; /* at least 10% faster */
}

/* 1: the bf16 kernel runs here and is faster; decided once. */
static int bf16_wins(void)
{
    static atomic_int decided = -1;
    int d = atomic_load(&decided);
    if (d < 0) {
        d = fp8mix_gemm_have_avx512bf16 && fp8mix_cpu_isa() >= FP8MIX_ISA_AVX512BF16 && bf16_faster();
        atomic_store(&decided, d);
    }
    return d;
}

/* 1: the bf16 kernel is exact and faster here; 0: not; decided once. */
static int use_bf16(void)
{
    static atomic_int decided = -1;
    int d = atomic_load(&decided);
    if (d < 0) {
        d = bf16_wins() && bf16_probe();
        atomic_store(&decided, d);
    }
    return d;
}
#endif

/* The AMX kernel on the tile emulation: every CPU, for tests (plain C throughout). */
static const fp8mix_gemm_ukernel uk_amx_emu = {32, 32, 1, fp8mix_gemm_ukernel_bf16_32x32__amx_emu,
                                               fp8mix_gemm_pack_b_krows_amx_ref, fp8mix_gemm_pack_b_kcols_amx_ref,
                                               fp8mix_gemm_scale_rows_ref, "bf16_32x32__amx_emu", NULL, NULL,
                                               fp8mix_gemm_ukernel_mx_bf16_32x32__amx_emu, 32,
                                               fp8mix_gemm_pack_a_krows_amx_ref, fp8mix_gemm_pack_a_kcols_amx_ref, NULL,
                                           NULL, NULL, 0};

const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_amx_emulated(void) { return &uk_amx_emu; }

const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_amx_hardware(void)
{
#if FP8MIX_X86
    if (fp8mix_cpu_isa() >= FP8MIX_ISA_AMX) return &uk_amx;
#endif
    return NULL;
}

const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_native(void)
{
#if FP8MIX_X86
    fp8mix_isa isa = fp8mix_active_isa();
    if (isa >= FP8MIX_ISA_AMX) return &uk_amx;
    if (isa >= FP8MIX_ISA_AVX512BF16 && bf16_wins()) return &uk_avx512bf16;
#endif
    return fp8mix_gemm_ukernel_active();
}

const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_active(void)
{
    fp8mix_isa isa = fp8mix_active_isa();
#if FP8MIX_X86
    if (isa >= FP8MIX_ISA_AVX512BF16 && use_bf16()) return &uk_avx512bf16;
    if (isa >= FP8MIX_ISA_AVX512) return &uk_avx512;
    if (isa >= FP8MIX_ISA_AVX2) return &uk_avx2;
#endif
    (void)isa;
    return &uk_scalar;
}

const char *fp8mix_gemm_kernel_name(fp8mix_gemm_order order)
{
    if (order == FP8MIX_GEMM_NATIVE) return fp8mix_gemm_ukernel_native()->name;
    if (order == FP8MIX_GEMM_CANONICAL) return fp8mix_gemm_ukernel_active()->name;
    return NULL;
}

int fp8mix_gemm_ukernels(const fp8mix_gemm_ukernel **out, int max)
{
    int n = 0;
    fp8mix_isa cpu = fp8mix_cpu_isa();
    if (n < max) out[n++] = &uk_scalar;
#if FP8MIX_X86
    if (cpu >= FP8MIX_ISA_AVX2 && n < max) out[n++] = &uk_avx2;
    if (cpu >= FP8MIX_ISA_AVX512 && n < max) out[n++] = &uk_avx512;
    if (cpu >= FP8MIX_ISA_AVX512BF16 && fp8mix_gemm_have_avx512bf16 && bf16_probe() && n < max)
        out[n++] = &uk_avx512bf16;
#endif
    (void)cpu;
    return n;
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
