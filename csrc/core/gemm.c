/*
 * gemm.c — the scaled FP8 GEMM: out = (A * scale_a) @ (B * scale_b) + bias.
 *
 * Covers: the numerics contract (below) and the entry point, which checks the
 * arguments (gemm_check.c) and routes to a driver: gemm_fp22.c for the FP22
 * model, gemm_blocked.c for everything else (MX scales included: gemm_mx.c is
 * their plain-loop reference).  Not
 * here, and none of it calls back here: the drivers, the epilogue they share
 * (gemm_epilogue.c), the scalar reference fp8mix_gemm_ref with the portable
 * microkernel and packing (gemm_ref.c), the SIMD microkernels and packing
 * (x86/gemm_*.c) and the choice among them (dispatch.c).
 *
 * Numerics of ACCUM_FP32 (identical on every ISA and thread count):
 *   - every product of two FP8 values is exact in float32;
 *   - a "K run" is the whole K (TENSOR / OUTER scales) or one 128-deep K block
 *     (BLOCK scales); its float32 sum starts at +0 and adds the products in
 *     the canonical pair order of gemm_internal.h (k = 1, 0, 3, 2, 5, 4, ...),
 *     each addition rounded to float32;
 *   - TENSOR / OUTER: v = (sa_i * sb_j) * sum;
 *     BLOCK: acc = +0; for kb = 0, 1, ...: acc = acc + part_kb * (sa[i][kb] *
 *     sb[kb][j / 128]) (each operation rounded to float32, no FMA); v = acc;
 *     MX: the same with 32-deep K runs and (sa[i][kb] * sb[j][kb]);
 *   - with bias: v = v + bias_j (bias widened to float32 exactly);
 *   - v is rounded once to out_t (nearest even, NaN stays NaN).
 *
 * The FP22 model (ACCUM_FP22), a study tool for Hopper FP8 tensor cores,
 * whose accumulator keeps only about 14 significant bits (DeepSeek-V3 tech
 * report, sec. 3.3.2):
 *   - products are exact (float32);
 *   - inside a K run (as above) the products are taken in plain order
 *     k = 0, 1, 2, ...; the running partial s starts at +0 and after every
 *     addition becomes trunc22(fl32(s + a_k * b_k)): the float32 sum (round to
 *     nearest even) truncated toward zero to 13 explicit mantissa bits (the
 *     1-8-13 "fp22" format: the low 10 bits of the float32 pattern cleared;
 *     inf and NaN are kept as they are);
 *   - every promote_interval products (counted from the start of the K run;
 *     0 = never) the partial is promoted: P = P + s in float32, s = +0;
 *     at the end of the run P = P + s (P starts at +0);
 *   - P then plays the role of the float32 sum above (scales, BLOCK
 *     accumulation, bias, output rounding unchanged).
 *   With BLOCK scales a run is 128 deep, so the partial is promoted at least
 *   every 128 products whatever promote_interval says, as on Hopper with
 *   DeepSeek's recipe.  Plain C (the compiler vectorises it), threaded over
 *   rows.
 */
#include "gemm_internal.h"

fp8mix_status fp8mix_gemm(const fp8mix_gemm_args *g)
{
    fp8mix_status st = fp8mix_gemm_check_args(g);
    if (st != FP8MIX_OK || g->m == 0 || g->n == 0) return st;
    fp8mix_prefault(g->out, (size_t)((g->m - 1) * g->ldo + g->n) * dtype_size(g->out_t),
                    fp8mix_workers_for(g->m * g->n, 1 << 18));
    if (g->accum == FP8MIX_ACCUM_FP22) return fp8mix_gemm_fp22(g);
    if (g->order == FP8MIX_GEMM_NATIVE) return fp8mix_gemm_blocked_with(g, fp8mix_gemm_ukernel_native());
    return fp8mix_gemm_blocked(g);
}
