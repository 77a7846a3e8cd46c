/*
 * gemm_amx.c — the AMX GEMM microkernel on the hardware: gemm_amx_kernel.h
 * compiled with tileloadd / tdpbf16ps / tilestored (-mamx-tile -mamx-bf16).
 * Bit for bit the emulated kernel of gemm_amx_ref.c, which is its oracle
 * (tests/c/test_gemm_amx.c runs both where AMX exists).  Used only by the
 * NATIVE order, after dispatch.c saw AMX in CPUID and Linux granted the tile
 * state (x86/amx_os.c).  The tile configuration is loaded on every call: a
 * host library (oneDNN) may have loaded its own on this thread in between.
 */
#include "gemm_internal.h"

#if FP8MIX_X86 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <immintrin.h>

const int fp8mix_gemm_have_amx = 1;

#define AMX_NAME(x) x##_hw
#define AMX_PUBLIC(x) x
#define AMX_STATE (void)0
#define AMX_CFG() _tile_loadconfig(cfg_hw)
#define AMX_ZERO(t) _tile_zero(t)
#define AMX_LOAD(t, p, s) _tile_loadd(t, p, s)
#define AMX_STORE(t, p, s) _tile_stored(t, p, s)
#define AMX_DP(d, a, b) _tile_dpbf16ps(d, a, b)
#include "gemm_amx_kernel.h"

#elif FP8MIX_X86
/* Built without AMX support: never selected. */
const int fp8mix_gemm_have_amx = 0;
void fp8mix_gemm_ukernel_bf16_32x32__amx(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                         int load_c, const float *rs)
{
    (void)kc; (void)a; (void)b; (void)c; (void)ldc; (void)load_c; (void)rs;
}
void fp8mix_gemm_ukernel_mx_bf16_32x32__amx(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                            int load_c, const float *sa, const float *sb)
{
    (void)kc; (void)a; (void)b; (void)c; (void)ldc; (void)load_c; (void)sa; (void)sb;
}
#endif
