/*
 * gemm_internal.h — what the GEMM files (gemm*.c, x86/gemm_*.c), dispatch.c
 * and the C tests share: the microkernel and packing contracts, the
 * packed-panel layouts, the shared epilogue, the drivers, the scalar
 * reference.  Not installed, not part of the API.
 *
 * Canonical summation order (every variant, every ISA, every thread count):
 * inside a K run the products are added to the float32 accumulator in PAIRS
 * (p = 2q+1 first, then p = 2q), q = 0, 1, ...  An odd K is padded with one
 * zero product, which changes nothing (a sum started at +0 is never -0, and
 * x + 0 == x).  This is the order AVX512_BF16's vdpbf16ps uses (odd element
 * first, each add rounded), so the bf16 kernel can match the float32 ones.
 * Every product of two FP8 values is exact in float32, so FMA and mul+add
 * give the same sums.  A K run is never split between threads or tiles, so
 * the order cannot depend on the thread count.
 *
 * Packed panels (built by the pack functions below, zero padded):
 *   float32 kernels: k-steps are stored pair-swapped, slot t holds k = t ^ 1
 *     A micro-panel  kc x MR floats:  a[t * MR + r]
 *     B sliver       kc x NR floats:  b[t * NR + c]
 *   bf16 kernels: one uint32 per (pair q, row/col) = bf16(k=2q) | bf16(k=2q+1) << 16
 *     A micro-panel  kc/2 x MR words: a[q * MR + r]
 *     B sliver       kc/2 x NR words: b[q * NR + c]
 *   (kc rounded up to even; every FP8 value is exact in float32 and bf16).
 */
#ifndef FP8MIX_GEMM_INTERNAL_H
#define FP8MIX_GEMM_INTERNAL_H

#include "internal.h"

/* Microkernel: one MR x NR tile of C (row stride ldc) from an A micro-panel
 * and a B sliver, kc (even) k-steps deep.
 *   rs == NULL:  acc = load_c ? C : +0;  acc += products in canonical order;
 *                C = acc.
 *   rs != NULL:  part = +0 + products (canonical order);
 *                C = (load_c ? C : +0) + part * rs[r]    (mul, then add; both
 *                rounded to float32; rs has MR entries, one per row). */
typedef void (*fp8mix_gemm_ukernel_fn)(int64_t kc, const void *a, const void *b,
                                       float *c, int64_t ldc, int load_c,
                                       const float *rs);

/* Packing: decode FP8 bytes into a w-wide panel of kc k-steps (layout above,
 * float32 or bf16 pairs), rows/columns nv .. w-1 and k-steps kc .. even(kc)-1
 * zero.  Element (r, k), r < nv <= w, k < kc, is read from
 *   pack_krows:  src[r * ld + k]   (k contiguous: row-major A, B as N x K)
 *   pack_kcols:  src[k * ld + r]   (r contiguous: B as K x N)
 * Every variant writes the same bits as the scalar one. */
typedef void (*fp8mix_gemm_pack_fn)(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                    fp8mix_format fmt, int bf16, void *dst);

/* The epilogue's common case on `rows` rows of n values (float32 output,
 * per-tensor or per-row A scale, per-tensor B scale, a float32 bias or none):
 *   out[r * ldo + c] = (sa[per_row ? r : 0] * sb) * vals[r * ldv + c]
 *   then += bias[c] when bias is given;
 * the scale product, the multiply and the add each rounded to float32, no
 * FMA (fp8mix_gemm_epilogue's rules).  out may equal vals (ldo == ldv). */
typedef void (*fp8mix_gemm_scale_rows_fn)(float *out, int64_t ldo, const float *vals, int64_t ldv, int64_t rows,
                                          int64_t n, const float *sa, int per_row, float sb, const float *bias);

/* Optional: a tile's last K step with the epilogue's common case in its store, for
 * whole tiles (rs of the plain microkernel is NULL here):
 *   acc = load_c ? C : +0;  acc += products in canonical order;
 *   C = s[r] * acc, then + bias[c] when bias is given (mul, then add, each rounded:
 *   what fn followed by scale_rows with s[r] = sa * sb writes, without a second pass
 *   over the tile).  s has MR entries. */
typedef void (*fp8mix_gemm_ukernel_final_fn)(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                             int load_c, const float *s, const float *bias);

/* Optional: the microkernel's block-scale mode over a whole K step, one call for all
 * its 128-deep blocks: for block q = 0, 1, ... of kc (each 128 deep, the last
 * possibly shorter and then padded to even),
 *   part = +0 + the block's products (canonical order);
 *   C = (load_c || q > 0 ? C : +0) + part * rs[q * MR + r]    (mul, then add)
 * -- what fn with rs does called once per block. */
typedef void (*fp8mix_gemm_ukernel_blocks_fn)(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                              int load_c, const float *rs);

/* Optional: the microkernel's MX mode over a whole K step: for block q = 0, 1, ... of kc
 * (each 32 deep, the last possibly shorter and then padded to even),
 *   part = +0 + the block's products (canonical order);
 *   C = (load_c || q > 0 ? C : +0) + part * (sa[q * MR + r] * sb[q * NR + c])
 * (the scale product, the multiply and the add each rounded to float32, no FMA): what
 * the driver's generic MX loop does with fn, without a pass over a tile buffer per
 * block.  sa has MR and sb NR entries per block. */
typedef void (*fp8mix_gemm_ukernel_mx_fn)(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                          int load_c, const float *sa, const float *sb);

/* fn_mx_scaled's packing: pack_krows (kcols 0) or pack_kcols (kcols 1) with each packed
 * value of 32-deep block q in lane r times sc[q * w + r] (mx_scales' layout; exact where
 * fn_mx_scaled is used), in the same pass. */
typedef void (*fp8mix_gemm_pack_mx_fn)(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                       int kcols, const float *sc, void *dst);

typedef struct fp8mix_gemm_ukernel {
    int mr, nr;            /* tile; nr divides 128 (block scales) */
    int bf16;              /* packed panels hold bf16 pairs       */
    fp8mix_gemm_ukernel_fn fn;
    fp8mix_gemm_pack_fn pack_krows, pack_kcols;
    fp8mix_gemm_scale_rows_fn scale_rows; /* the epilogue's common case */
    const char *name;
    fp8mix_gemm_ukernel_final_fn fn_final; /* NULL: fn, then scale_rows */
    fp8mix_gemm_ukernel_blocks_fn fn_blocks; /* NULL: fn once per block */
    fp8mix_gemm_ukernel_mx_fn fn_mx;         /* NULL: fn once per 32-deep block, then
                                                the scales in the driver          */
    int kalign;            /* packed K depth padded to a multiple of this (0: 2); the
                              kernels get kc and block depths rounded up to it    */
    fp8mix_gemm_pack_fn pack_a_krows, pack_a_kcols; /* A's own layout (NULL: B's) */
    fp8mix_gemm_ukernel_mx_fn fn_mx_pow2; /* NULL: fn_mx; else fn_mx's sums where every
                                             sa and sb is a power of two (a normal
                                             float) and every sa * sb is normal: the
                                             scale product as an exponent add (its
                                             bits: bits(sa) + bits(sb) - bits(1.0f),
                                             what the multiply rounds to there), which
                                             frees the multiply port for the products */
    fp8mix_gemm_ukernel_mx_fn fn_mx_scaled; /* NULL: none; else fn_mx's sums on float32
                                               panels packed already multiplied by their MX
                                               scales (row i of A's block q by sa[i][q],
                                               column j of B's by sb[j][q]; sa and sb are
                                               not read): part = +0 + the block's products,
                                               C = (load_c || q > 0 ? C : +0) + part.  The
                                               driver uses it only where every scale is a
                                               power of two in [2^-45, 2^45]
                                               (gemm_blocked.c's mx_prescalable): there
                                               each product and partial sum is exactly
                                               sa * sb times the unscaled one (normal
                                               powers of two commute with rounding where
                                               nothing leaves the normal range), so the
                                               bits are fn_mx's, with one add per output
                                               and block instead of a multiply and add */
    fp8mix_gemm_pack_mx_fn pack_mx;         /* with fn_mx_scaled: its panels' packing */
    int a_outer;           /* the driver's tile order in a task (gemm_blocked.c): 0, B
                              slivers outer (a sliver stays in L1, the A block comes from
                              L2); 1, A panels outer (an A panel stays in L1, the B
                              slivers stream from L2, in narrower column chunks); the
                              kernel's next-tile C prefetch follows it.  No sum changes */
} fp8mix_gemm_ukernel;

/* The portable kernels (the scalar ISA's, and the oracles of the SIMD ones):
 * microkernel and packing in gemm_ref.c, scale_rows in gemm_epilogue.c. */
void fp8mix_gemm_ukernel_f32_4x16_ref(int64_t kc, const void *a, const void *b,
                                      float *c, int64_t ldc, int load_c,
                                      const float *rs);
void fp8mix_gemm_pack_krows_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                fp8mix_format fmt, int bf16, void *dst);
void fp8mix_gemm_pack_kcols_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                fp8mix_format fmt, int bf16, void *dst);
void fp8mix_gemm_scale_rows_ref(float *out, int64_t ldo, const float *vals, int64_t ldv, int64_t rows, int64_t n,
                                const float *sa, int per_row, float sb, const float *bias);
#if defined(__x86_64__) || defined(_M_X64)
void fp8mix_gemm_ukernel_f32_6x16__avx2(int64_t kc, const void *a, const void *b,
                                        float *c, int64_t ldc, int load_c,
                                        const float *rs);
void fp8mix_gemm_ukernel_final_f32_6x16__avx2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                              int load_c, const float *s, const float *bias);
void fp8mix_gemm_ukernel_blocks_f32_6x16__avx2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                               int load_c, const float *rs);
void fp8mix_gemm_ukernel_mx_f32_6x16__avx2(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                           int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_f32_14x32__avx512(int64_t kc, const void *a, const void *b,
                                           float *c, int64_t ldc, int load_c,
                                           const float *rs);
void fp8mix_gemm_ukernel_mx_f32_14x32__avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                              int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_final_f32_14x32__avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                                 int load_c, const float *s, const float *bias);
void fp8mix_gemm_ukernel_mx_scaled_f32_14x32__avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                                     int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_mx_pow2_f32_14x32__avx512(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                                   int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_mx_bf16_14x32__avx512bf16(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                                   int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_mx_pow2_bf16_14x32__avx512bf16(int64_t kc, const void *a, const void *b, float *c,
                                                        int64_t ldc, int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_mx_scaled_bf16_14x32__avx512bf16(int64_t kc, const void *a, const void *b, float *c,
                                                          int64_t ldc, int load_c, const float *sa, const float *sb);
void fp8mix_gemm_ukernel_blocks_bf16_14x32__avx512bf16(int64_t kc, const void *a, const void *b, float *c,
                                                       int64_t ldc, int load_c, const float *rs);
void fp8mix_gemm_ukernel_final_bf16_14x32__avx512bf16(int64_t kc, const void *a, const void *b, float *c,
                                                      int64_t ldc, int load_c, const float *s, const float *bias);
void fp8mix_gemm_ukernel_bf16_14x32__avx512bf16(int64_t kc, const void *a,
                                                const void *b, float *c,
                                                int64_t ldc, int load_c,
                                                const float *rs);
void fp8mix_gemm_pack_krows__avx2(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst);
void fp8mix_gemm_pack_kcols__avx2(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst);
void fp8mix_gemm_pack_krows__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst);
void fp8mix_gemm_pack_mx__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                 int kcols, const float *sc, void *dst);
void fp8mix_gemm_pack_mx_bf16__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int kcols, const float *sc, void *dst);
void fp8mix_gemm_pack_kcols__avx512(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc,
                                  fp8mix_format fmt, int bf16, void *dst);
void fp8mix_gemm_scale_rows__avx2(float *out, int64_t ldo, const float *vals, int64_t ldv, int64_t rows, int64_t n,
                                  const float *sa, int per_row, float sb, const float *bias);
/* Nonzero when gemm_avx512bf16.c was compiled with AVX512_BF16 support. */
extern const int fp8mix_gemm_have_avx512bf16;
/* The AMX kernel on the hardware (x86/gemm_amx.c; fp8mix_gemm_have_amx: compiled with
 * AMX support) and the OS's grant of the tile state (x86/amx_os.c: 1 granted). */
void fp8mix_gemm_ukernel_bf16_32x32__amx(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                         int load_c, const float *rs);
void fp8mix_gemm_ukernel_mx_bf16_32x32__amx(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                            int load_c, const float *sa, const float *sb);
extern const int fp8mix_gemm_have_amx;
int fp8mix_amx_request(void);
#endif

/* The AMX kernel on the tile emulation, and the AMX packing (gemm_amx_ref.c):
 * A in the tile-row layout, B in the VNNI pair layout, both padded to 32-deep
 * chunks (gemm_amx_kernel.h); fp8mix_gemm_pack_amx_pad zeroes a bf16-packed
 * sliver's pair rows from kc up to the next multiple of 32 k. */
void fp8mix_gemm_ukernel_bf16_32x32__amx_emu(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                             int load_c, const float *rs);
void fp8mix_gemm_ukernel_mx_bf16_32x32__amx_emu(int64_t kc, const void *a, const void *b, float *c, int64_t ldc,
                                                int load_c, const float *sa, const float *sb);
void fp8mix_gemm_pack_a_krows_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst);
void fp8mix_gemm_pack_a_kcols_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst);
void fp8mix_gemm_pack_b_krows_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst);
void fp8mix_gemm_pack_b_kcols_amx_ref(const uint8_t *src, int64_t ld, int nv, int w, int64_t kc, fp8mix_format fmt,
                                      int bf16, void *dst);
void fp8mix_gemm_pack_amx_pad(int w, int64_t kc, void *dst);

/* The microkernel (and its packing) the active ISA uses, never NULL; chosen
 * in dispatch.c.  The bf16 kernel is used only after a one-time probe showed
 * it bit-identical to the float32 one, and a timing showed it faster. */
const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_active(void);
/* Every microkernel this build and CPU can run (whatever the ISA limit),
 * scalar first: up to max into out; returns the count.  For tests.  All of them
 * sum in the canonical order; the AMX kernels are not among them. */
int fp8mix_gemm_ukernels(const fp8mix_gemm_ukernel **out, int max);
/* The kernel of the NATIVE order (fp8mix_gemm_order): the AMX one where the active
 * ISA is FP8MIX_ISA_AMX, the AVX512_BF16 one where that ISA is active and the
 * kernel is faster than the float32 one (probe or not), else the active kernel. */
const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_native(void);
/* The AMX kernel on the tile emulation (any CPU), and on the hardware (NULL where
 * this CPU, OS or build has no AMX).  For tests. */
const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_amx_emulated(void);
const fp8mix_gemm_ukernel *fp8mix_gemm_ukernel_amx_hardware(void);

/* ---- shared by the drivers (gemm_epilogue.c, gemm_check.c) -------------- */

/* Byte of A at (row i, k = p) in either layout. */
static inline uint8_t fp8mix_gemm_a_at(const fp8mix_gemm_args *g, int64_t i, int64_t p)
{
    return g->a_layout == FP8MIX_A_MK ? g->a[i * g->lda + p] : g->a[p * g->lda + i];
}

/* Byte of B at (k = p, column j) in either layout. */
static inline uint8_t fp8mix_gemm_b_at(const fp8mix_gemm_args *g, int64_t p, int64_t j)
{
    return g->b_layout == FP8MIX_B_KN ? g->b[p * g->ldb + j] : g->b[j * g->ldb + p];
}

/* BLOCK scales: the float32 factor of K block kb for element (i, j). */
float fp8mix_gemm_block_scale(const fp8mix_gemm_args *g, int64_t i, int64_t kb, int64_t j);

/* Epilogue of rows i0 .. i0+rows-1, n outputs each from column j0: vals
 * (row stride ldv) are the float32 sums (TENSOR / OUTER) or block
 * accumulators (BLOCK); they may be overwritten, and may be the float32
 * output itself (in place). */
void fp8mix_gemm_epilogue(const fp8mix_gemm_args *g, int64_t i0, int64_t rows, int64_t j0, int64_t n, float *vals,
                          int64_t ldv);
/* The same, with `simple` (a microkernel's scale_rows) doing the common case
 * (fp8mix_gemm_epilogue_simple(g)); fp8mix_gemm_epilogue uses the scalar one. */
void fp8mix_gemm_epilogue_rows(const fp8mix_gemm_args *g, fp8mix_gemm_scale_rows_fn simple, int64_t i0, int64_t rows,
                               int64_t j0, int64_t n, float *vals, int64_t ldv);
/* Whether g's epilogue is the common case fp8mix_gemm_scale_rows_fn computes. */
int fp8mix_gemm_epilogue_simple(const fp8mix_gemm_args *g);

/* The argument checks of fp8mix_gemm and fp8mix_gemm_ref (gemm_check.c):
 * everything but the work.  FP8MIX_OK means "compute" unless the output is
 * empty (the caller checks m * n == 0). */
fp8mix_status fp8mix_gemm_check_args(const fp8mix_gemm_args *g);

/* The drivers, called by fp8mix_gemm after the argument checks (m, n > 0);
 * fp8mix_gemm_blocked_with runs a given microkernel (tests). */
fp8mix_status fp8mix_gemm_blocked(const fp8mix_gemm_args *g);
fp8mix_status fp8mix_gemm_blocked_with(const fp8mix_gemm_args *g, const fp8mix_gemm_ukernel *uk);
fp8mix_status fp8mix_gemm_fp22(const fp8mix_gemm_args *g);
/* The MX reference (gemm_mx.c), called by fp8mix_gemm_ref: a plain loop over rows
 * in the rule's order (see fp8mix.h), the oracle of the blocked driver's MX path. */
fp8mix_status fp8mix_gemm_mx(const fp8mix_gemm_args *g);

/* The scalar reference (gemm_ref.c): a plain loop over (i, j, k) implementing
 * the exact rules of fp8mix_gemm (see gemm.c).  Same checks and status codes.
 * The oracle every blocked / SIMD / threaded path is tested against. */
fp8mix_status fp8mix_gemm_ref(const fp8mix_gemm_args *args);

#endif /* FP8MIX_GEMM_INTERNAL_H */
