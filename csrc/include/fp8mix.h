/*
 * fp8mix.h — the C API of the fp8mix engine.
 *
 * The engine turns float32 / bfloat16 / float16 tensors into FP8 (OCP OFP8
 * E4M3 "e4m3fn" and E5M2) and back, and multiplies FP8 matrices.  It knows
 * nothing of PyTorch or Python: callers pass pointers, sizes, strides and
 * scales, and every entry point returns an fp8mix_status.  The engine never
 * prints, exits or aborts; on any error it returns before writing output.
 *
 * Conventions
 *   - Counts, sizes and strides are int64_t and measured in ELEMENTS.
 *   - Matrices are 2-D, row-major with a leading dimension (row stride) `ld`:
 *     element (i, j) of x is x[i * ld + j], and ld >= cols.  Inner stride 1.
 *     N-D tensors are passed as (numel / last_dim, last_dim).
 *   - The caller owns every buffer.  Outputs must not overlap inputs.
 *   - Empty tensors (rows == 0 or cols == 0) are valid: nothing is written
 *     except reductions, whose result is defined per entry point.
 *
 * FP8 formats (bytes, bit 7 = sign)
 *   E4M3: bias 7, max 448 (0x7E), min normal 2^-6, min subnormal 2^-9,
 *         no infinities, NaN is S.1111.111 (0x7F / 0xFF).
 *   E5M2: bias 15, max 57344 (0x7B), min normal 2^-14, min subnormal 2^-16,
 *         +-inf is S.11111.00 (0x7C / 0xFC), NaN is S.11111.{01,10,11}.
 *
 * Encoding rule (every cast in this API)
 *   y = fp32(x * scale): x is widened to float32 exactly, multiplied by the
 *   float32 scale and ROUNDED TO FLOAT32 FIRST (IEEE multiply, no FMA).
 *   y is then rounded to FP8:
 *   - FP8MIX_ROUND_NEAREST: round to nearest, ties to even, subnormals kept
 *     (no flush).  Ties are decided on y's exact float32 value.
 *   - FP8MIX_ROUND_STOCHASTIC: see "Stochastic rounding" below.
 *   Overflow, after rounding the magnitude on the format's grid extended past
 *   max with the same exponent (so E4M3 464 = midway 448/480 ties to even
 *   448 and is NOT an overflow, while anything above 464 is):
 *   - saturate != 0: a finite overflow and +-inf give +-max; NaN gives NaN.
 *     Equal to clamping y to [-max, max] and then rounding.
 *   - saturate == 0 (OCP non-saturating): overflow and +-inf give NaN in
 *     E4M3 and +-inf in E5M2.  Byte-identical to ml_dtypes' casts.
 *   NaN inputs give the sign-preserving quiet NaN: 0x7F/0xFF (E4M3),
 *   0x7E/0xFE (E5M2), the bytes ml_dtypes produces.  -0 stays -0.
 *
 * Stochastic rounding
 *   Let |y| = M * 2^(E - 23) with M the 24-bit significand, and let the FP8
 *   grid spacing at |y| be 2^U (U = exponent of |y| minus the mantissa bits,
 *   clamped at the subnormal spacing).  The discarded part is
 *   frac = (M mod 2^d) / 2^d, d = U - (E - 23).  With r the element's 32-bit
 *   random word, the magnitude rounds UP (away from zero) iff
 *       r < T,  T = floor(frac * 2^32)   (T = (M mod 2^d) << (32-d) for d<=32,
 *                                           (M mod 2^d) >> (d-32) otherwise)
 *   so P(up) = T / 2^32 and the result is unbiased to within 2^-32 ulp.  The
 *   result is always one of the two grid neighbours of y; a neighbour beyond
 *   max is an overflow and follows `saturate` as above.
 *
 *   Random words: Philox4x32-10 (Salmon et al., SC'11; the Random123 and
 *   cuRAND constants).  Element number n (its row-major index in the logical
 *   rows x cols tensor, i.e. i * cols + j, independent of ld) uses
 *       c = offset + n                                   (uint64, wraps)
 *       out = philox4x32_10(counter = {lo32(c / 4), hi32(c / 4), 0, 0},
 *                           key     = {lo32(seed), hi32(seed)})
 *       r = out[c % 4]
 *   A given (seed, offset) thus yields the same bytes on every ISA, thread
 *   count and device.  Callers advance offset by (numel rounded up to a
 *   multiple of 4) per use so that no two casts share random words.
 *
 * amax
 *   amax = max |x| over the INPUT (before scaling), as float32.  If any
 *   element is NaN, amax is NaN (0x7FC00000); otherwise, if any is +-inf, amax
 *   is +inf.  Empty input gives 0.  (Computed as an unsigned max over
 *   |x|'s bits, so the result does not depend on order or thread count.)
 *
 * Scales
 *   scale multiplies x before the cast; scale_inv = 1 / scale multiplies the
 *   FP8 values back (dequantisation and GEMM).  Every scale passed in must be
 *   finite and > 0 (else FP8MIX_ERR_BAD_SCALE).  See fp8mix_compute_scale for
 *   how scales are derived from amax.
 *
 * Scale granularities (the shape of the scale array for an R x C tensor)
 *   FP8MIX_GRAN_TENSOR   one scale                       shape (1)
 *   FP8MIX_GRAN_ROW      one per row                     shape (R)
 *   FP8MIX_GRAN_BLOCK    one per 1x128 tile of a row     shape (R, ceil(C/128))
 *   FP8MIX_GRAN_BLOCK2D  one per 128x128 block           shape (ceil(R/128), ceil(C/128))
 *   Scale arrays are dense row-major.  Tiles at the right/bottom edge are
 *   partial.
 *
 * Threads and memory
 *   Large calls split across threads: a pool of POSIX threads, started on
 *   first use, growing to the largest count asked for, idle threads asleep
 *   (after a short spin), rebuilt empty in a forked child; a call made while
 *   another thread's call holds the pool runs on its own thread.
 *   fp8mix_set_num_threads sets the count; results are bit-identical for
 *   every thread count and ISA.  fp8mix_gemm keeps one packing workspace
 *   (at most 24 MiB; about 2.5 MiB for float32 outputs) between calls, so
 *   that repeated calls neither allocate nor page-fault it.
 */
#ifndef FP8MIX_H
#define FP8MIX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------ */

typedef enum fp8mix_status {
    FP8MIX_OK = 0,
    FP8MIX_ERR_NULL_POINTER = 1,  /* a required pointer is NULL            */
    FP8MIX_ERR_BAD_SHAPE = 2,     /* negative size, ld < cols, size overflow */
    FP8MIX_ERR_BAD_ENUM = 3,      /* unknown format / dtype / granularity    */
    FP8MIX_ERR_BAD_SCALE = 4,     /* a scale that is NaN, inf, 0 or negative */
    FP8MIX_ERR_UNSUPPORTED = 5,   /* valid request this build cannot serve   */
    FP8MIX_ERR_NO_MEMORY = 6,     /* an internal allocation failed           */
    FP8MIX_ERR_BAD_ARG = 7        /* any other invalid argument              */
} fp8mix_status;

/* A static, human-readable English string for a status (never NULL). */
const char *fp8mix_status_string(fp8mix_status s);

/* ---- enums ------------------------------------------------------------- */

typedef enum fp8mix_format { FP8MIX_E4M3 = 0, FP8MIX_E5M2 = 1 } fp8mix_format;

/* High-precision element types.  BF16 and F16 are raw uint16_t bit patterns. */
typedef enum fp8mix_dtype {
    FP8MIX_F32 = 0,
    FP8MIX_BF16 = 1,
    FP8MIX_F16 = 2
} fp8mix_dtype;

typedef enum fp8mix_granularity {
    FP8MIX_GRAN_TENSOR = 0,
    FP8MIX_GRAN_ROW = 1,
    FP8MIX_GRAN_BLOCK = 2,   /* 1 x 128 tiles    */
    FP8MIX_GRAN_BLOCK2D = 3  /* 128 x 128 blocks */
} fp8mix_granularity;

#define FP8MIX_BLOCK 128

typedef enum fp8mix_rounding {
    FP8MIX_ROUND_NEAREST = 0,
    FP8MIX_ROUND_STOCHASTIC = 1
} fp8mix_rounding;

/* Options shared by every cast. */
typedef struct fp8mix_cast_opts {
    fp8mix_format fmt;
    int saturate;            /* nonzero: saturating (default for training) */
    fp8mix_rounding rounding;
    uint64_t seed;           /* stochastic rounding only */
    uint64_t offset;         /* stochastic rounding only */
    int inf_to_nan;          /* nonzero: an infinite INPUT x gives the format's
                                NaN (sign kept) whatever `saturate` says, while
                                finite overflow still follows `saturate`.  Lets
                                a saturating cast keep a non-finite tensor
                                non-finite (fp8mix.Linear uses it so that an inf
                                in x, W or dy makes the GEMM's output NaN, as a
                                high-precision layer's would be, with no host
                                check).  Zero-initialised callers keep the plain
                                rules above. */
} fp8mix_cast_opts;

/* ---- format facts and scalar reference --------------------------------- */

/* Largest finite value of fmt (448 or 57344); 0 for an unknown format. */
float fp8mix_format_max(fp8mix_format fmt);

/* Scalar reference encoder: float32 value y (already scaled) to an FP8 byte,
 * by the rules above.  `r` is the random word (ignored for NEAREST).  This is
 * the oracle every SIMD and CUDA variant is tested against.  An unknown
 * format returns 0. */
uint8_t fp8mix_encode_ref(float y, fp8mix_format fmt, int saturate,
                          fp8mix_rounding rounding, uint32_t r);

/* Exact decode of one FP8 byte to float32 (NaN codes give a quiet NaN with
 * the byte's sign). */
float fp8mix_decode_ref(uint8_t q, fp8mix_format fmt);

/* Philox4x32-10: out = philox(counter, key), 4 words. */
void fp8mix_philox4x32_10(const uint32_t counter[4], const uint32_t key[2],
                          uint32_t out[4]);

/* The random word element n gets under (seed, offset); see above. */
uint32_t fp8mix_random_word(uint64_t seed, uint64_t offset, uint64_t n);

/* ---- casts ------------------------------------------------------------- */

/* Scale + cast + amax in one pass.
 *   x      rows x cols, element type xt, row stride ld_x (>= cols)
 *   scale  float32, shape given by gran (see "Scale granularities")
 *   q      rows x cols FP8 bytes, row stride ld_q (>= cols); may be NULL
 *          when only qt is wanted
 *   qt     optional (NULL: none): cols x rows FP8 bytes, row stride ld_qt
 *          (>= rows); qt[j * ld_qt + i] == q[i * ld_q + j] (cast+transpose)
 *   amax   optional (NULL: none): one float32, max |x| over the whole input
 *   q and qt must not both be NULL unless the tensor is empty.
 * Errors: NULL_POINTER, BAD_SHAPE, BAD_ENUM, BAD_SCALE (checked before any
 * byte is written). */
fp8mix_status fp8mix_cast(const void *x, fp8mix_dtype xt, int64_t rows,
                          int64_t cols, int64_t ld_x, fp8mix_granularity gran,
                          const float *scale, uint8_t *q, int64_t ld_q,
                          uint8_t *qt, int64_t ld_qt, float *amax,
                          const fp8mix_cast_opts *opts);

/* amax per granularity: out has the shape of gran's scale array (see above),
 * out[t] = max |x| over tile t with the NaN/inf rules of "amax". */
fp8mix_status fp8mix_amax(const void *x, fp8mix_dtype xt, int64_t rows,
                          int64_t cols, int64_t ld_x, fp8mix_granularity gran,
                          float *out);

/* Scale from amax, elementwise over n entries (float32 throughout):
 *   a = max(amax[i], amax_epsilon)
 *   if a is 0, NaN or inf:            scale = 1
 *   else scale = fmt_max / a  (one correctly rounded float32 division),
 *        then scale = scale / 2^margin (exact power-of-two step, margin an
 *        integer >= 0);
 *        if pow2: scale = 2^floor(log2(scale)), taken from scale's exponent
 *        bits (so it never rounds up past the true value, never becomes inf);
 *        a scale that overflowed to inf becomes FLT_MAX (or 2^127 with pow2);
 *        a scale below FLT_MIN (subnormal or 0) becomes FLT_MIN, so that
 *        1 / scale stays finite.
 *   scale_inv[i] = 1 / scale[i] (correctly rounded; exact when pow2).
 * scale or scale_inv may be NULL when not wanted.  Errors: NULL_POINTER,
 * BAD_ENUM, BAD_ARG (margin < 0, epsilon negative or not finite). */
fp8mix_status fp8mix_compute_scale(const float *amax, int64_t n,
                                   fp8mix_format fmt, int margin, int pow2,
                                   float amax_epsilon, float *scale,
                                   float *scale_inv);

/* Current-scaling quantisation: amax per granularity, scale by
 * fp8mix_compute_scale(margin, pow2, amax_epsilon), cast.  Writes q (and qt
 * if not NULL) exactly as fp8mix_cast would with those scales, the scales'
 * inverses to scale_inv and the per-granularity amax to amax_out (either may
 * be NULL).  BLOCK and ROW granularities read x once (each tile is reduced
 * and cast while in cache); TENSOR reads it twice. */
fp8mix_status fp8mix_quantize_current(const void *x, fp8mix_dtype xt,
                                      int64_t rows, int64_t cols, int64_t ld_x,
                                      fp8mix_granularity gran, int margin,
                                      int pow2, float amax_epsilon,
                                      uint8_t *q, int64_t ld_q, uint8_t *qt,
                                      int64_t ld_qt, float *scale_inv,
                                      float *amax_out,
                                      const fp8mix_cast_opts *opts);

/* Dequantise: out[i, j] = decode(q[i, j]) * scale_inv[tile(i, j)] in float32,
 * then rounded to out_t (round to nearest even; NaN stays NaN).
 * scale_inv must be finite and > 0 (BAD_SCALE otherwise). */
fp8mix_status fp8mix_dequantize(const uint8_t *q, fp8mix_format fmt,
                                int64_t rows, int64_t cols, int64_t ld_q,
                                fp8mix_granularity gran,
                                const float *scale_inv, void *out,
                                fp8mix_dtype out_t, int64_t ld_out);

/* ---- quantisation statistics -------------------------------------------- */

/* Entries of fp8mix_quant_stats' output, in this order. */
enum {
    FP8MIX_STATS_NUMEL = 0,       /* elements                                      */
    FP8MIX_STATS_NONZERO = 1,     /* x != 0 (NaN and inf included)                 */
    FP8MIX_STATS_UNDERFLOW = 2,   /* finite x != 0 whose FP8 value is +-0          */
    FP8MIX_STATS_SATURATED = 3,   /* finite x whose FP8 value is +-max ("|q|=max") */
    FP8MIX_STATS_NONFINITE = 4,   /* x NaN or +-inf                                */
    FP8MIX_STATS_OVERFLOW = 5,    /* finite x beyond the format's range after scaling:
                                     |x| > (max + half a step) * scale_inv, i.e.
                                     above 464 (E4M3) or 59392 (E5M2) in FP8 units,
                                     the values a saturating cast clips            */
    FP8MIX_STATS_SUBNORMAL = 6,   /* FP8 value non-zero and below the min normal   */
    FP8MIX_STATS_SIGNAL = 7,      /* sum of x^2 over finite x (float64)            */
    FP8MIX_STATS_NOISE = 8,       /* sum of (x - q * scale_inv)^2 over finite x with
                                     finite q (float64); SQNR = 10 log10(signal/noise) */
    FP8MIX_STATS_MIN_NONZERO = 9, /* min |x| over finite non-zero x (+inf if none)   */
    FP8MIX_STATS_N = 10
};

/* Statistics of one cast: x (rows x cols of type xt, row stride ld_x) against
 * q, its FP8 bytes in format fmt (row stride ld_q), with the dequantisation
 * factors scale_inv laid out as gran's scale array (finite and > 0, else
 * BAD_SCALE).  Writes out[FP8MIX_STATS_N] (see the enum; counts are exact
 * integers in float64).  Sums are added in a fixed order, so out is the same
 * for every thread count.  Empty input: zeros, MIN_NONZERO = +inf.
 * Errors: NULL_POINTER, BAD_ENUM, BAD_SHAPE, BAD_SCALE, NO_MEMORY. */
fp8mix_status fp8mix_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows,
                                 int64_t cols, int64_t ld_x, const uint8_t *q,
                                 int64_t ld_q, fp8mix_format fmt,
                                 fp8mix_granularity gran,
                                 const float *scale_inv,
                                 double out[FP8MIX_STATS_N]);

/* ---- scaled GEMM -------------------------------------------------------- */

/* Layout of B (logically K x N). */
typedef enum fp8mix_b_layout {
    FP8MIX_B_KN = 0,  /* row-major K x N:    B(p, j) = b[p * ldb + j]        */
    FP8MIX_B_NK = 1   /* column-major K x N, i.e. a row-major N x K weight:
                         B(p, j) = b[j * ldb + p]  (torch: w.t())           */
} fp8mix_b_layout;

/* Layout of A (M x K).  FP8MIX_A_KM reads a row-major K x M matrix as A, so
 * that a product with a transposed operand (wgrad: dy^T x) needs no
 * transposed copy of it. */
typedef enum fp8mix_a_layout {
    FP8MIX_A_MK = 0,  /* row-major M x K:    A(i, p) = a[i * lda + p]        */
    FP8MIX_A_KM = 1   /* column-major M x K, i.e. a row-major K x M matrix:
                         A(i, p) = a[p * lda + i]  (torch: t.t())           */
} fp8mix_a_layout;

/* Scale layouts of the GEMM operands (scales are dequantisation factors,
 * i.e. the operands' scale_inv). */
typedef enum fp8mix_mm_scale {
    FP8MIX_MM_SCALE_TENSOR = 0, /* one float                                   */
    FP8MIX_MM_SCALE_OUTER = 1,  /* A: one per row (M); B: one per column (N)    */
    FP8MIX_MM_SCALE_BLOCK = 2   /* A: (M, ceil(K/128)) 1x128 tiles;
                                   B: (ceil(K/128), ceil(N/128)) 128x128 blocks
                                   (always indexed [k-block][n-block], whatever
                                   B's layout).  A and B must both be BLOCK. */
} fp8mix_mm_scale;

typedef enum fp8mix_accum {
    FP8MIX_ACCUM_FP32 = 0,   /* exact products, float32 accumulation           */
    FP8MIX_ACCUM_FP22 = 1    /* Hopper-like limited accumulator; see below      */
} fp8mix_accum;

typedef struct fp8mix_gemm_args {
    int64_t m, n, k;                 /* all >= 1 (0 allowed: empty output)    */
    const uint8_t *a;                /* M x K in layout a_layout, stride lda   */
    fp8mix_format fmt_a;
    int64_t lda;
    const uint8_t *b;                /* K x N in layout b_layout, stride ldb   */
    fp8mix_format fmt_b;
    int64_t ldb;
    fp8mix_b_layout b_layout;
    const float *scale_a;            /* layout scale_a_kind (see above)        */
    fp8mix_mm_scale scale_a_kind;
    const float *scale_b;
    fp8mix_mm_scale scale_b_kind;
    const void *bias;                /* NULL or N values of bias_t             */
    fp8mix_dtype bias_t;
    void *out;                       /* M x N row-major, row stride ldo        */
    fp8mix_dtype out_t;
    int64_t ldo;
    fp8mix_accum accum;
    int64_t promote_interval;        /* FP22 only: products per promotion to
                                        float32 (e.g. 128); 0 = never promote */
    fp8mix_a_layout a_layout;        /* last, so that zero-filled args keep
                                        the row-major default                 */
} fp8mix_gemm_args;

/* out = (A * scale_a) @ (B * scale_b) + bias.
 * Products of FP8 values are exact in float32.  ACCUM_FP32: each output is a
 * float32 sum of the exact products, added in one fixed order (pairs
 * k = 1,0,3,2,..., the order of vdpbf16ps), the same on every ISA and thread
 * count, so results are bit-identical everywhere and agree with float64 to
 * ~K * 2^-24 relative.  TENSOR/OUTER scales multiply the sum once in the
 * epilogue (out = sa_i * sb_j * sum + bias_j); BLOCK: each 128-deep K block's
 * float32 partial sum is multiplied by (sa[i][kb] * sb[kb][jb]) and added to
 * a float32 accumulator starting at +0.
 * ACCUM_FP22 models Hopper FP8 tensor cores, whose accumulator keeps about
 * 14 significant bits (DeepSeek-V3 report, sec. 3.3.2): inside a K run (all
 * of K, or one 128-deep block with BLOCK scales) products are added in order
 * k = 0,1,2,... and after each addition the partial is truncated toward zero
 * to 13 explicit mantissa bits (low 10 bits of the float32 cleared); every
 * promote_interval products (0 = never) it is added to a float32 accumulator
 * and reset.  The float32 result then goes through the same epilogue.
 * bias_t may be F32, BF16 or F16 (widened exactly), independent of out_t.
 * K == 0 gives bias (or +0).  Output is rounded once to out_t (nearest even).
 * Errors: NULL_POINTER, BAD_SHAPE (ld too small; every ld >= 1), BAD_ENUM,
 * BAD_SCALE (a scale not finite or <= 0), BAD_ARG (BLOCK mixed with another
 * kind, promote_interval < 0). */
fp8mix_status fp8mix_gemm(const fp8mix_gemm_args *args);

/* ---- runtime ----------------------------------------------------------- */

typedef enum fp8mix_isa {
    FP8MIX_ISA_SCALAR = 0,  /* portable C, any CPU                     */
    FP8MIX_ISA_AVX2 = 1,    /* AVX2 + FMA + F16C                       */
    FP8MIX_ISA_AVX512 = 2,  /* AVX-512 F/BW/VL/DQ                      */
    FP8MIX_ISA_AVX512BF16 = 3 /* AVX-512 above + AVX512_BF16            */
} fp8mix_isa;

/* The best ISA this CPU (and build) supports, read once. */
fp8mix_isa fp8mix_cpu_isa(void);
/* The ISA kernels use: min(best, limit).  Set limit with
 * fp8mix_set_max_isa (or env FP8MIX_MAX_ISA=scalar|avx2|avx512|avx512bf16,
 * read once); used by tests to compare every variant with the scalar one. */
fp8mix_isa fp8mix_active_isa(void);
void fp8mix_set_max_isa(fp8mix_isa limit);
const char *fp8mix_isa_name(fp8mix_isa isa);

/* Threads used by large calls; n <= 0 means the number of online CPUs. */
void fp8mix_set_num_threads(int n);
int fp8mix_get_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif /* FP8MIX_H */
