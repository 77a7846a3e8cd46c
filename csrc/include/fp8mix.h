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
 *   FP8MIX_GRAN_MX       one per 1x32 block of a row     shape (R, ceil(C/32))
 *   Scale arrays are dense row-major.  Tiles at the right/bottom edge are
 *   partial.  MX (OCP Microscaling v1.0, MXFP8) scales are powers of two
 *   whose exponent fits E8M0; see "MX blocks" below.
 *
 * Threads and memory
 *   Large calls split across threads: a pool of POSIX threads, started on
 *   first use, growing to the largest count asked for, idle threads asleep
 *   (after a short spin), rebuilt empty in a forked child; a call made while
 *   another thread's call holds the pool runs on its own thread.  A host
 *   with a pool of its own hands it over with fp8mix_set_thread_pool
 *   (fp8mix's torch extension gives it PyTorch's intra-op threads).
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
    FP8MIX_GRAN_BLOCK2D = 3, /* 128 x 128 blocks */
    FP8MIX_GRAN_MX = 4       /* 1 x 32 blocks, power-of-two (E8M0) scales */
} fp8mix_granularity;

#define FP8MIX_BLOCK 128
#define FP8MIX_MX_BLOCK 32

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
 * With FP8MIX_GRAN_MX, qt is refused (BAD_ARG): a byte transpose of MX blocks
 * is no MX tensor (fp8mix_quantize_mx writes the transposed quantisation).
 * Errors: NULL_POINTER, BAD_SHAPE, BAD_ENUM, BAD_SCALE, BAD_ARG (checked before
 * any byte is written). */
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
 * and cast while in cache); TENSOR reads it twice.  FP8MIX_GRAN_MX takes its
 * exponents by FP8MIX_MX_RCEIL with margin and amax_epsilon (pow2 is implied
 * and ignored); qt is then refused (BAD_ARG; see fp8mix_quantize_mx). */
fp8mix_status fp8mix_quantize_current(const void *x, fp8mix_dtype xt,
                                      int64_t rows, int64_t cols, int64_t ld_x,
                                      fp8mix_granularity gran, int margin,
                                      int pow2, float amax_epsilon,
                                      uint8_t *q, int64_t ld_q, uint8_t *qt,
                                      int64_t ld_qt, float *scale_inv,
                                      float *amax_out,
                                      const fp8mix_cast_opts *opts);

/* Current-scaling quantisation of x^T read from x: with gran FP8MIX_GRAN_BLOCK,
 * what fp8mix_quantize_current writes for a contiguous copy of x^T (cols x rows)
 * -- its q into qt (cols x rows, row stride ld_qt), its scale_inv and amax into
 * scale_inv_t and amax_out_t (cols x ceil(rows / 128); amax_out_t may be NULL),
 * the same random words (element (j, i) of x^T is number j * rows + i) -- without
 * making that copy: block scaling's wgrad operands x^T and dy^T, whose 1x128
 * tiles run down x's columns.  Other granularities: BAD_ARG (a per-tensor scale
 * is the same for x^T: fp8mix_cast writes qt).  Errors as fp8mix_quantize_current. */
fp8mix_status fp8mix_quantize_current_t(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                        fp8mix_granularity gran, int margin, int pow2, float amax_epsilon,
                                        uint8_t *qt, int64_t ld_qt, float *scale_inv_t, float *amax_out_t,
                                        const fp8mix_cast_opts *opts);

/* Dequantise: out[i, j] = decode(q[i, j]) * scale_inv[tile(i, j)] in float32,
 * then rounded to out_t (round to nearest even; NaN stays NaN).
 * scale_inv must be finite and > 0 (BAD_SCALE otherwise). */
fp8mix_status fp8mix_dequantize(const uint8_t *q, fp8mix_format fmt,
                                int64_t rows, int64_t cols, int64_t ld_q,
                                fp8mix_granularity gran,
                                const float *scale_inv, void *out,
                                fp8mix_dtype out_t, int64_t ld_out);

/* ---- MX blocks (OCP Microscaling Formats v1.0, MXFP8) --------------------
 *
 * FP8MIX_GRAN_MX: each row is cut into blocks of 32 consecutive elements (the
 * last one partial); each block has one shared scale X = 2^e, e an integer in
 * [-127, 127] (E8M0: the byte e + 127; the code 255, NaN, is never produced).
 * Elements are stored as FP8 values P = x / X rounded like every cast (the
 * product x * 2^-e rounded to float32 first, then to nearest even, saturating
 * unless opts say otherwise).  scale_inv arrays hold X as float32 (exact; for
 * e = -127 a subnormal); scale arrays passed to fp8mix_cast hold 1 / X.
 *
 * The exponent of a block with amax a = max |x| (fp8mix_mx_exponent):
 *   a = max(a, amax_epsilon);
 *   a NaN or +-inf:     e = 0 (OCP marks such a block with the NaN scale; fp8mix
 *                       keeps scale 1 so that the block's NaN/inf elements
 *                       carry it, as its other granularities do);
 *   a == 0:             e = -127;
 *   FLOOR (OCP v1.0 sec. 6.3): e = floor(log2(a)) - emax_elem, emax_elem = 8
 *                       (E4M3) or 15 (E5M2): the block's largest element may
 *                       exceed the format's max and saturate;
 *   RCEIL (NVIDIA's, the default): the smallest e with a <= fmt_max * 2^e,
 *                       decided exactly from a's bits (no rounded division);
 *   then e = e + margin, clamped to [-127, 127].
 * amax_epsilon must be finite and >= 0; margin in [0, 126]. */
typedef enum fp8mix_mx_rule {
    FP8MIX_MX_RCEIL = 0,
    FP8MIX_MX_FLOOR = 1
} fp8mix_mx_rule;

/* The exponent e of one block's scale 2^e by the rule above (an unknown
 * format or rule returns 0). */
int fp8mix_mx_exponent(float amax, fp8mix_format fmt, fp8mix_mx_rule rule, int margin, float amax_epsilon);

/* MX quantisation of x (rows x cols), current scaling with `rule`:
 *   q          rows x cols, scale_inv rows x ceil(cols/32) (row-major, X)
 *   qt         optional (NULL: none): the cols x rows quantisation of x's
 *              transpose, whose 32-blocks run along x's columns (so it is a
 *              second quantisation, not a byte transpose), with scale_inv_t
 *              cols x ceil(rows/32).  qt and scale_inv_t are byte for byte what
 *              this call gives as q and scale_inv for the contiguous transpose
 *              of x with the same opts (stochastic rounding included: element
 *              (j, i) of qt takes random word j * rows + i).
 *   amax_out   optional: rows x ceil(cols/32) block amaxes of x.
 * q and its scale_inv may be NULL when only qt is wanted (and vice versa).
 * Errors: NULL_POINTER, BAD_SHAPE, BAD_ENUM (format, dtype, rule), BAD_ARG
 * (margin, amax_epsilon). */
fp8mix_status fp8mix_quantize_mx(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                 fp8mix_mx_rule rule, int margin, float amax_epsilon, uint8_t *q,
                                 int64_t ld_q, float *scale_inv, uint8_t *qt, int64_t ld_qt,
                                 float *scale_inv_t, float *amax_out, const fp8mix_cast_opts *opts);

/* ---- quantisation statistics -------------------------------------------- */

/* The log2 histogram of fp8mix_quant_stats: FP8MIX_STATS_HIST_BINS bins of
 * one binade each, in FP8 units (|x| / scale_inv, i.e. after scaling).  Bin b
 * counts the finite non-zero x with
 *     floor(log2(|x| / scale_inv)) == FP8MIX_STATS_HIST_MIN_LOG2 + b,
 * computed exactly from the exponent and mantissa bits of |x| and scale_inv
 * (no rounding of the quotient); bin 0 also holds everything below 2^-46 and
 * the last bin everything at or above 2^16.  Both formats' ranges lie inside:
 * E4M3 [2^-9, 448] is bins 38..55, E5M2 [2^-16, 57344] is bins 31..62. */
#define FP8MIX_STATS_HIST_BINS 64
#define FP8MIX_STATS_HIST_MIN_LOG2 (-47)

/* Entries of fp8mix_quant_stats' output, in this order.  "Finite x" below
 * means x neither NaN nor +-inf; q is the FP8 value of x's byte. */
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
    FP8MIX_STATS_SUBNORMAL = 6,   /* finite x whose FP8 value is non-zero and below
                                     the min normal                                */
    FP8MIX_STATS_SIGNAL = 7,      /* sum of x^2 over finite x (float64)            */
    FP8MIX_STATS_NOISE = 8,       /* sum of (x - q * scale_inv)^2 over finite x with
                                     finite q (float64); SQNR = 10 log10(signal/noise) */
    FP8MIX_STATS_MIN_NONZERO = 9, /* min |x| over finite non-zero x (+inf if none)   */
    FP8MIX_STATS_NAN = 10,        /* x NaN (a part of NONFINITE)                   */
    FP8MIX_STATS_MAX_FINITE = 11, /* max |x| over finite x (0 if none)             */
    FP8MIX_STATS_PIVOT = 12,      /* c: the first finite x in row-major order (0 if
                                     none), the centre of the power sums below     */
    FP8MIX_STATS_SUM1 = 13,       /* sum of (x - c) over finite x (float64)        */
    FP8MIX_STATS_SUM2 = 14,       /* sum of (x - c)^2                              */
    FP8MIX_STATS_SUM3 = 15,       /* sum of (x - c)^3                              */
    FP8MIX_STATS_SUM4 = 16,       /* sum of (x - c)^4: with n = NUMEL - NONFINITE
                                     the mean (c + SUM1/n), variance and kurtosis
                                     of the finite x, well conditioned whatever the
                                     mean, since c is one of the values            */
    FP8MIX_STATS_BAD_SCALES = 17, /* scale_inv entries not finite and > 0 (only
                                     with bad_scale_as_one; else the call fails)   */
    FP8MIX_STATS_SCALE_INV_MIN = 18, /* min of the good scale_inv entries (+inf if none) */
    FP8MIX_STATS_SCALE_INV_MAX = 19, /* max of the good scale_inv entries (0 if none)    */
    FP8MIX_STATS_HIST = 20,       /* first of FP8MIX_STATS_HIST_BINS histogram counts */
    FP8MIX_STATS_N = FP8MIX_STATS_HIST + FP8MIX_STATS_HIST_BINS
};

/* Options of fp8mix_quant_stats (NULL: all zero). */
typedef struct fp8mix_stats_opts {
    int bad_scale_as_one; /* nonzero: a scale_inv entry that is not finite and
                             > 0 is counted in BAD_SCALES and its tile measured
                             as if it were 1, instead of failing with BAD_SCALE
                             (a monitor reports a broken scale, it does not
                             stop on one) */
} fp8mix_stats_opts;

/* Statistics of one cast: x (rows x cols of type xt, row stride ld_x) against
 * q, its FP8 bytes in format fmt (row stride ld_q), with the dequantisation
 * factors scale_inv laid out as gran's scale array (finite and > 0, else
 * BAD_SCALE unless opts->bad_scale_as_one).  Writes out[FP8MIX_STATS_N] (see
 * the enum; counts are exact integers in float64).  Empty input: zeros,
 * MIN_NONZERO and SCALE_INV_MIN = +inf.
 *
 * Summation order of the float64 sums (SIGNAL, NOISE, SUM1..SUM4), the same
 * on every ISA and thread count, so out is bit-identical everywhere:
 *   - the rows are split into tasks of consecutive rows (64, or more when
 *     rows > 262144: the smallest multiple of 64 giving <= 4096 tasks);
 *   - within a task, element (i, j) is added to partial p[j mod 16], visiting
 *     the elements row by row, left to right (p starts at +0; an element that
 *     does not count adds +0);
 *   - a task's sum is ((r[0] + r[1]) with r[k] = t[k] + t[k + 2],
 *     t[k] = u[k] + u[k + 4], u[k] = p[k] + p[k + 8]);
 *   - the task sums are added in task order, starting from +0.
 * Terms, in float64 from the float32 values x, c and decoded q, with
 * t = x - c and e = x - q * scale_inv: x*x (SIGNAL), e*e (NOISE), t, t*t,
 * (t*t)*t, (t*t)*(t*t) (each operation rounded separately: no fused
 * multiply-add).
 * Errors: NULL_POINTER, BAD_ENUM, BAD_SHAPE, BAD_SCALE, NO_MEMORY. */
fp8mix_status fp8mix_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows,
                                 int64_t cols, int64_t ld_x, const uint8_t *q,
                                 int64_t ld_q, fp8mix_format fmt,
                                 fp8mix_granularity gran,
                                 const float *scale_inv,
                                 const fp8mix_stats_opts *opts,
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
    FP8MIX_MM_SCALE_BLOCK = 2,  /* A: (M, ceil(K/128)) 1x128 tiles;
                                   B: (ceil(K/128), ceil(N/128)) 128x128 blocks
                                   (always indexed [k-block][n-block], whatever
                                   B's layout).  A and B must both be BLOCK. */
    FP8MIX_MM_SCALE_MX = 3      /* MX: A (M, ceil(K/32)) per 1x32 block of a row
                                   of A; B (N, ceil(K/32)) per 32 consecutive k
                                   of a column of B, indexed [n][k-block]
                                   whatever B's layout (the layout of an MX
                                   weight (N, K) quantised along K).  A and B
                                   must both be MX; ACCUM_FP32 only. */
} fp8mix_mm_scale;

/* Summation order of the float32 GEMM (ACCUM_FP32; docs/gemm_order.md):
 *   CANONICAL  the order described at fp8mix_gemm below, the same bits on every
 *              CPU, ISA and thread count (and the CUDA path's CPU oracle);
 *   NATIVE     the fastest exact-product kernel of this CPU, each output summed
 *              in that kernel's order: AMX tiles (tdpbf16ps, where CPUID has
 *              AMX-BF16, Linux grants the tile state and FP8MIX_MAX_ISA allows
 *              "amx"): per 32-deep chunk of K the even and the odd k's products
 *              summed apart (each from +0, in k order), added together, then
 *              added to the output's running sum; elsewhere the kernel
 *              CANONICAL uses (today every other kernel sums in the canonical
 *              order).  The same bits run to run and for every thread count on
 *              one machine and build; not across CPUs.  Error bound against
 *              the exact sum of the products: docs/gemm_order.md.
 * The core keeps no order of its own: each call states it (zero = CANONICAL). */
typedef enum fp8mix_gemm_order {
    FP8MIX_GEMM_CANONICAL = 0,
    FP8MIX_GEMM_NATIVE = 1
} fp8mix_gemm_order;

/* The name of the microkernel fp8mix_gemm runs for ACCUM_FP32 in `order` on this CPU
 * under the current ISA cap, e.g. "f32_14x32__avx512" (float32 FMA, 14 x 32 tiles),
 * "bf16_14x32__avx512bf16" (vdpbf16ps), "bf16_32x32__amx" (AMX tiles), "f32_6x16__avx2",
 * "f32_4x16__scalar"; what it sums with decides how fast an FP8 GEMM can be here (a
 * float32 FMA kernel runs at most at float32 GEMM speed).  A static string; an unknown
 * order gives NULL. */
const char *fp8mix_gemm_kernel_name(fp8mix_gemm_order order);

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
    fp8mix_gemm_order order;         /* ACCUM_FP32's summation order (zero:
                                        CANONICAL); ignored by ACCUM_FP22     */
} fp8mix_gemm_args;

/* out = (A * scale_a) @ (B * scale_b) + bias.
 * Products of FP8 values are exact in float32.  ACCUM_FP32: each output is a
 * float32 sum of the exact products, added in one fixed order (pairs
 * k = 1,0,3,2,..., the order of vdpbf16ps), the same on every ISA and thread
 * count, so results are bit-identical everywhere and agree with float64 to
 * ~K * 2^-24 relative.  TENSOR/OUTER scales multiply the sum once in the
 * epilogue (out = sa_i * sb_j * sum + bias_j); BLOCK: each 128-deep K block's
 * float32 partial sum is multiplied by (sa[i][kb] * sb[kb][jb]) and added to
 * a float32 accumulator starting at +0.  MX: the same with 32-deep K blocks,
 * each partial sum multiplied by (sa[i][kb] * sb[j][kb]).
 * ACCUM_FP22 models Hopper FP8 tensor cores, whose accumulator keeps about
 * 14 significant bits (DeepSeek-V3 report, sec. 3.3.2): inside a K run (all
 * of K, or one 128-deep block with BLOCK scales) products are added in order
 * k = 0,1,2,... and after each addition the partial is truncated toward zero
 * to 13 explicit mantissa bits (low 10 bits of the float32 cleared); every
 * promote_interval products (0 = never) it is added to a float32 accumulator
 * and reset.  The float32 result then goes through the same epilogue.
 * bias_t may be F32, BF16 or F16 (widened exactly), independent of out_t.
 * K == 0 gives bias (or +0).  Output is rounded once to out_t (nearest even).
 * order == FP8MIX_GEMM_NATIVE replaces the canonical order of each K run by
 * the native kernel's (fp8mix_gemm_order); scales, bias and rounding as above.
 * Errors: NULL_POINTER, BAD_SHAPE (ld too small; every ld >= 1), BAD_ENUM
 * (order included),
 * BAD_SCALE (a scale not finite or <= 0), BAD_ARG (BLOCK or MX mixed with
 * another kind, promote_interval < 0), UNSUPPORTED (MX with ACCUM_FP22). */
fp8mix_status fp8mix_gemm(const fp8mix_gemm_args *args);

/* Grouped GEMM (mixture-of-experts layers; torch._scaled_grouped_mm's 2-D x 3-D case): the
 * rows of A (args->m in all) are cut into `groups` consecutive groups, group g holding rows
 * [offs[g-1], offs[g]) (offs[-1] = 0; offs non-decreasing, offs[groups-1] = m; a group may
 * be empty), and group g's rows of out are its rows of A times B_g = args->b + g * stride_b
 * (a K x N matrix in args->b_layout, stride ldb; stride_b in elements, at least B's extent),
 * with group g's scales:
 *   scale_a  TENSOR: one per group (groups values); OUTER: one per row of A (m);
 *            BLOCK / MX: the rows' tiles, as fp8mix_gemm's, for all m rows
 *   scale_b  TENSOR: groups values; OUTER: groups x N; BLOCK: groups x ceil(K/128) x
 *            ceil(N/128); MX: groups x N x ceil(K/32)
 *   bias     NULL or groups x N values of bias_t
 * Everything else as fp8mix_gemm.  Each group's rows are bit for bit fp8mix_gemm of that
 * group alone.  Every group is checked before any is computed (an error writes nothing).
 * Errors: those of fp8mix_gemm for any group; BAD_ARG (groups or stride_b negative, offs
 * decreasing or not ending at m); BAD_SHAPE (B_g overlapping B_{g+1}). */
fp8mix_status fp8mix_gemm_grouped(const fp8mix_gemm_args *args, int64_t groups, const int64_t *offs,
                                  int64_t stride_b);

/* Grouped-K GEMM (a grouped linear layer's weight gradients; torch._scaled_grouped_mm's 2-D x
 * 2-D case): the contraction dimension (args->k in all) is cut into `groups` consecutive
 * ranges by offs as fp8mix_gemm_grouped cuts rows (offs non-decreasing, ending at k; a range
 * may be empty), and output g = args->out + g * stride_out (M x N, row stride ldo; stride_out
 * in elements, at least the output's extent) is A[:, range g] times B[range g, :] with
 * group g's scales:
 *   scale_a  TENSOR: groups values; OUTER: groups x M
 *   scale_b  TENSOR: groups values; OUTER: groups x N
 *   bias     NULL or groups x N values of bias_t
 * Everything else as fp8mix_gemm (either A and either B layout), each output bit for bit
 * fp8mix_gemm of that range alone (an empty range gives bias or +0).  Every group is checked
 * before any is computed.  Errors: those of fp8mix_gemm for any group; BAD_ARG (groups or
 * stride_out negative, offs decreasing or not ending at k); BAD_SHAPE (outputs overlapping);
 * UNSUPPORTED (BLOCK or MX scales: their K tiles would straddle the groups). */
fp8mix_status fp8mix_gemm_grouped_k(const fp8mix_gemm_args *args, int64_t groups, const int64_t *offs,
                                    int64_t stride_out);

/* ---- per-tensor recipes: delayed-scaling state and a linear layer's casts ---
 *
 * A module's delayed-scaling state holds R tensor roles ("columns"; a linear
 * layer has three: input, weight, grad_output):
 *   history  capacity x R float32, row-major, history[k * R + r]; row 0 is
 *            the newest amax of role r.  Only the first history_len rows are
 *            in use (history_len <= capacity), so one buffer serves every
 *            recipe length up to its capacity.
 *   scale    R float32: the scale the next cast of each role uses.
 *   steps    R int64: amaxes recorded per role; 0 means the role was never
 *            used, and its first cast scales from the tensor itself.
 * Backward passes do not record: each leaves the amax of its gradient in a
 * slot of a ring of K pending values (float32, -1 = empty; a forward reserves
 * a slot for its backward, several backwards of one forward keep the max), and
 * the next forward records the filled slots, oldest first (fp8mix_delayed_flush).
 * Every entry point below touches role `role`'s column only and is serial
 * (the state is tiny).  Errors: NULL_POINTER, BAD_SHAPE (role outside
 * [0, R), capacity/history_len/slots < 1, history_len > capacity), BAD_ENUM
 * (format, algo), BAD_ARG (margin outside [0, 126], interval < 1), BAD_SCALE. */

typedef enum fp8mix_amax_algo {
    FP8MIX_AMAX_MAX = 0,        /* the max of the history rows in use */
    FP8MIX_AMAX_MOST_RECENT = 1 /* row 0 */
} fp8mix_amax_algo;

typedef struct fp8mix_delayed_state {
    float *history;
    int64_t capacity;  /* rows allocated */
    int64_t roles;     /* R */
    float *scale;      /* R */
    int64_t *steps;    /* R */
} fp8mix_delayed_state;

typedef struct fp8mix_delayed_recipe {
    int64_t history_len;   /* rows in use, 1 <= history_len <= capacity */
    fp8mix_amax_algo algo;
    int margin;            /* scale = fmt_max / amax / 2^margin */
    int pow2;              /* nonzero: power-of-two scales (fp8mix_compute_scale) */
    int64_t interval;      /* recompute the scale every `interval` records */
} fp8mix_delayed_recipe;

/* Record `amax` for role (fmt: the role's encoding, whose max the scale uses):
 *   v = amax if finite, else 0 ("no information": an overflowing step cannot
 *       freeze the scale for the length of the history);
 *   rows [0, history_len) of the column move down one row (the last is
 *   dropped) and row 0 = v; steps += 1;
 *   on the role's first record (steps becomes 1) and v > 0: scale = s(v);
 *   then, if steps % interval == 0 and a > 0: scale = s(a), with a the max of
 *   rows [0, history_len) (FP8MIX_AMAX_MAX) or row 0 (MOST_RECENT) and s the
 *   rule of fp8mix_compute_scale (margin, pow2, epsilon 0).  Otherwise the
 *   scale is kept (an amax of 0 keeps the previous scale). */
fp8mix_status fp8mix_delayed_record(const fp8mix_delayed_state *st, int64_t role,
                                    fp8mix_format fmt,
                                    const fp8mix_delayed_recipe *r, float amax);

/* Recompute role's scale from its history for format fmt (a = as above; kept
 * when a is 0), without recording: used when Format.AUTO switches a role's
 * format, since the history is in units of the tensor. */
fp8mix_status fp8mix_delayed_rescale(const fp8mix_delayed_state *st, int64_t role,
                                     fp8mix_format fmt,
                                     const fp8mix_delayed_recipe *r);

/* What a forward does for the gradient role before it runs:
 *   if record: every slot of pending[0..slots) with a value >= 0 is recorded
 *   (fp8mix_delayed_record), in ring order starting at *next_slot (the
 *   oldest), and set back to -1;
 *   plan[0] = scale[role], plan[1] = 1 if steps[role] == 0 else 0: the scale
 *   this forward's backward casts its gradient with (1: current scaling, the
 *   role's first use);
 *   if reserve (record must be set): *reserved = *next_slot and *next_slot
 *   advances by one modulo slots; the backward keeps its amax there.  With
 *   more forwards in flight than slots, two share a slot and their amaxes
 *   merge (max): none is dropped.
 * reserved may be NULL unless reserve. */
fp8mix_status fp8mix_delayed_flush(const fp8mix_delayed_state *st, int64_t role,
                                   fp8mix_format fmt,
                                   const fp8mix_delayed_recipe *r, float *pending,
                                   int64_t slots, int64_t *next_slot, int record,
                                   int reserve, float plan[2], int64_t *reserved);

/* A forward tensor's delayed-scaling cast (x as in fp8mix_cast, one
 * per-tensor scale):
 *   s = scale[role], or on the role's first use (steps[role] == 0)
 *       s = fp8mix_compute_scale(a0) with a0 = *fresh_amax if given (e.g. an
 *       amax already all-reduced over ranks), else amax(x) (one more read);
 *   q, qt = fp8mix_cast(x, s, opts), whose amax is a;
 *   scales[0] = s, scales[1] = 1 / s;  *amax = a (amax may be NULL);
 *   if record: fp8mix_delayed_record(role, a).
 * opts->fmt is the role's format.  Nothing is written on error. */
fp8mix_status fp8mix_cast_delayed(const void *x, fp8mix_dtype xt, int64_t rows,
                                  int64_t cols, int64_t ld_x, uint8_t *q,
                                  int64_t ld_q, uint8_t *qt, int64_t ld_qt,
                                  const fp8mix_delayed_state *st, int64_t role,
                                  const fp8mix_delayed_recipe *r,
                                  const float *fresh_amax, int record,
                                  const fp8mix_cast_opts *opts, float scales[2],
                                  float *amax);

/* A gradient's cast for a per-tensor recipe (dy rows x cols as in fp8mix_cast):
 *   s = plan[0] if plan is given and plan[1] == 0 (delayed scaling, from
 *       fp8mix_delayed_flush), else current scaling:
 *       fp8mix_compute_scale(amax(dy), margin, pow2, amax_epsilon);
 *   q, qt = fp8mix_cast(dy, s, opts), whose amax is a;  *scale_inv = 1 / s;
 *   *amax = a (may be NULL);
 *   if pending_slot: *pending_slot = max(*pending_slot, v), v as in
 *       fp8mix_delayed_record (so an empty slot, -1, becomes v);
 *   if colsum (cols floats): colsum[j] = sum over rows of dy[i][j] in float32,
 *       rows added in order 0, 1, ... (the bias gradient; the same bits for
 *       every thread count and ISA).
 * Errors as fp8mix_cast, BAD_SCALE for a plan scale that is not finite and
 * > 0, BAD_ARG for margin / epsilon. */
fp8mix_status fp8mix_cast_grad(const void *dy, fp8mix_dtype xt, int64_t rows,
                               int64_t cols, int64_t ld, uint8_t *q, int64_t ld_q,
                               uint8_t *qt, int64_t ld_qt, const float plan[2],
                               int margin, int pow2, float amax_epsilon,
                               float *pending_slot, const fp8mix_cast_opts *opts,
                               float *scale_inv, float *amax, float *colsum);

/* ---- grouped per-tensor casts (mixture-of-experts expert layers) -----------
 *
 * x (rows x cols as in fp8mix_cast) is cut into `groups` consecutive row groups by offs
 * (group g: rows [offs[g-1], offs[g]), offs[-1] = 0; non-decreasing, ending at rows;
 * groups may be empty), and each group is cast with its own per-tensor scale by the
 * single-tensor entry point named below, applied to that group alone: its rows of q, its
 * columns of qt (qt is cols x rows for the whole x, row stride ld_qt), its scale and amax
 * at index g.  With stochastic rounding group g takes the random words from
 * opts->offset + offs[g-1] * cols on (the words a cast of the whole x gives its rows).
 * An empty group is cast by nothing.  Errors: those of the single entry point for any
 * group, BAD_ARG for offs, BAD_SHAPE for a role outside the state; the offsets, shapes
 * and (grad) plans of every group are checked before any byte is written. */

/* fp8mix_quantize_current (TENSOR granularity) per group: scale_inv[g], amax_out[g] (an
 * empty group: 1 and 0). */
fp8mix_status fp8mix_quantize_current_grouped(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                              int64_t ld_x, int64_t groups, const int64_t *offs, int margin,
                                              int pow2, float amax_epsilon, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                              int64_t ld_qt, float *scale_inv, float *amax_out,
                                              const fp8mix_cast_opts *opts);

/* fp8mix_cast_delayed per group, group g with state role role0 + g * role_step (no fresh
 * amax: a role's first use scales from its group): scales[2g], scales[2g+1] the group's
 * scale and inverse, amax[g] (may be NULL).  An empty group records nothing; its scales
 * are the state's scale and its inverse, its amax 0. */
fp8mix_status fp8mix_cast_delayed_grouped(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                          int64_t groups, const int64_t *offs, uint8_t *q, int64_t ld_q,
                                          uint8_t *qt, int64_t ld_qt, const fp8mix_delayed_state *st,
                                          int64_t role0, int64_t role_step, const fp8mix_delayed_recipe *r,
                                          int record, const fp8mix_cast_opts *opts, float *scales, float *amax);

/* fp8mix_cast_grad per group: plans (NULL: current scaling for every group) holds
 * [scale, fresh] per group (2 * groups floats), scale_inv[g], amax[g] (may be NULL), colsum
 * (NULL or groups x cols: group g's column sums); pending (groups x pending_slots floats)
 * and slots (groups indices) both given or both NULL: group g keeps its amax in
 * pending[g * pending_slots + slots[g]].  An empty group writes scale_inv 1, amax 0, column
 * sums +0 and leaves its pending slot alone. */
fp8mix_status fp8mix_cast_grad_grouped(const void *dy, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld,
                                       int64_t groups, const int64_t *offs, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                       int64_t ld_qt, const float *plans, int margin, int pow2, float amax_epsilon,
                                       float *pending, int64_t pending_slots, const int64_t *slots,
                                       const fp8mix_cast_opts *opts, float *scale_inv, float *amax, float *colsum);

/* fp8mix_delayed_flush for roles role0 + g * role_step, g < groups, each with its own ring
 * pending + g * slots and counter next_slot[g]: plans[2g..2g+1], reserved[g]. */
fp8mix_status fp8mix_delayed_flush_grouped(const fp8mix_delayed_state *st, int64_t role0, int64_t role_step,
                                           int64_t groups, fp8mix_format fmt, const fp8mix_delayed_recipe *r,
                                           float *pending, int64_t slots, int64_t *next_slot, int record,
                                           int reserve, float *plans, int64_t *reserved);

/* Entries of the scale array of granularity gran for a rows x cols tensor
 * (see "Scale granularities"); -1 for an unknown granularity. */
int64_t fp8mix_scale_count(fp8mix_granularity gran, int64_t rows, int64_t cols);

/* ---- runtime ----------------------------------------------------------- */

typedef enum fp8mix_isa {
    FP8MIX_ISA_SCALAR = 0,  /* portable C, any CPU                     */
    FP8MIX_ISA_AVX2 = 1,    /* AVX2 + FMA + F16C                       */
    FP8MIX_ISA_AVX512 = 2,  /* AVX-512 F/BW/VL/DQ                      */
    FP8MIX_ISA_AVX512BF16 = 3, /* AVX-512 above + AVX512_BF16           */
    FP8MIX_ISA_AMX = 4      /* the above + AMX-TILE and AMX-BF16, with the
                               tile state granted by the OS (Linux:
                               arch_prctl(ARCH_REQ_XCOMP_PERM)); used only
                               by the NATIVE GEMM order                 */
} fp8mix_isa;

/* The best ISA this CPU (and build) supports, read once. */
fp8mix_isa fp8mix_cpu_isa(void);
/* The ISA kernels use: min(best, limit).  Set limit with
 * fp8mix_set_max_isa (or env FP8MIX_MAX_ISA=scalar|avx2|avx512|avx512bf16|amx,
 * read once); used by tests to compare every variant with the scalar one. */
fp8mix_isa fp8mix_active_isa(void);
void fp8mix_set_max_isa(fp8mix_isa limit);
const char *fp8mix_isa_name(fp8mix_isa isa);

/* Threads used by large calls; n <= 0 means the number of online CPUs. */
void fp8mix_set_num_threads(int n);
int fp8mix_get_num_threads(void);

/* Running the parallel loops on the host's threads instead of fp8mix's own
 * pool.  Two pools in one process compete for the cores: a host pool's idle
 * threads spin for a while after each of its loops (OpenMP's do), and an
 * fp8mix loop started then gets a fraction of the core it counted on (on 2
 * cores, an fp8mix GEMM right after a torch matmul ran at 0.68x its own
 * speed).  run(workers, body, job) must call body(job, w) exactly once for
 * every w in [0, workers) -- concurrently where it can, on any threads, in
 * any order, several of them on one thread if it has fewer -- and return
 * once every call has returned.  body does not fail and does not throw.
 * Results are the same bits whichever pool runs them.  NULL (the default)
 * goes back to fp8mix's own pool.  Set it before the calls it should serve. */
typedef void (*fp8mix_worker_body)(void *job, int worker);
typedef void (*fp8mix_run_workers)(int workers, fp8mix_worker_body body, void *job);
void fp8mix_set_thread_pool(fp8mix_run_workers run);


/* ---- FP8 GEMM layout plan: cuBLASLt's rules as one checked function ----------
 *
 * The CUDA backend multiplies on cuBLASLt's FP8 matmul, which accepts far fewer
 * layouts than fp8mix_gemm.  fp8mix_mm_layout_plan states those rules in one
 * place, in plain C (no CUDA headers: CPU builds compile and test it), and turns
 * a problem into a plan: which operands run in place and which are copied (zero
 * padded, or transposed), the scale arrays cuBLASLt reads, where the bias goes and
 * how much scratch memory the copies need.  The CUDA op asks for a plan, allocates
 * plan.scratch_bytes and runs it (fp8mix_cuda_scaled_mm).  The rules (cuBLAS
 * Developer Guide, "Narrow precision data types usage"; cublasLt.h), with the
 * column-major cuBLAS problem out^T[N,M] = b^T[N,K] a^T[K,M] ("TN"):
 *   R1 both operands K-contiguous: a row-major (M x K), b column-major (K x N,
 *      i.e. a row-major (N x K) weight seen through .t()); otherwise copied.
 *   R2 operand and output pointers and leading dimensions 16-byte aligned.
 *   R3 K and N multiples of 16 (cuBLAS k and m); otherwise zero padded (zeros
 *      along K add nothing; padded output columns are dropped).  M is free.
 *   R4 no E5M2 x E5M2 kernel (FP8MIX_MM_RULE_FORMATS).
 *   R5 compute capability 8.9 or newer (FP8MIX_MM_RULE_ARCH).
 *   R6 TENSOR scales (one float each): every FP8 device.  OUTER (per row of a /
 *      column of b, OUTER_VEC_32F) and BLOCK (1x128 tiles of a, 128x128 blocks of
 *      b: VEC128_32F / BLK128x128_32F): compute capability 9.x only and cuBLASLt
 *      >= 12.9 (FP8MIX_MM_RULE_SCALE_ARCH, _SCALE_VERSION).  A TENSOR scale with
 *      an OUTER partner is expanded; BLOCK pairs only with BLOCK (BAD_ARG).
 *   R7 BLOCK: cuBLAS n (our M) a multiple of 4, so M is zero padded to mp; K is
 *      zero padded to a whole number of 128-deep blocks (every public use of these
 *      modes has K % 128 == 0; the zeros share the last block's scale and add
 *      nothing); scale arrays sa (ceil(K/128), mp): sa[kb][i], sb (ceil(np/128),
 *      roundup(ceil(K/128), 4)): sb[nb][kb]; padding entries 1.
 *   R8 fast accumulation is not available with BLOCK scales (plan.fast_accum 0).
 *   R9 the bias epilogue is used for a bias of out's type with a bfloat16 /
 *      float16 output and TENSOR scales (the combination PyTorch's _scaled_mm
 *      uses); its length must be np and its pointer 16-byte aligned (else copied).
 *      Every other bias: float32 product, then a bias-add kernel.
 */
typedef struct fp8mix_mm_problem {
    int64_t m, n, k;               /* all >= 1 (the op handles empty products)   */
    fp8mix_format fmt_a, fmt_b;
    int64_t a_stride0, a_stride1;  /* element strides of a (M x K)               */
    int64_t b_stride0, b_stride1;  /* element strides of b (K x N)               */
    uint64_t a_addr, b_addr;       /* addresses: only their alignment is used    */
    fp8mix_mm_scale scale_a_kind, scale_b_kind;
    uint64_t sa_addr, sb_addr;     /* scale arrays, dense as for fp8mix_gemm      */
    int has_bias;
    fp8mix_dtype bias_t;
    uint64_t bias_addr;
    fp8mix_dtype out_t;
    uint64_t out_addr;             /* out: M x N, row stride N                    */
    int fast_accum;                /* requested (accumulate="fp22")               */
    int sm;                        /* compute capability, major * 10 + minor      */
    int64_t blas_version;          /* cublasLtGetVersion(), e.g. 130100           */
} fp8mix_mm_problem;

typedef enum fp8mix_mm_rule {
    FP8MIX_MM_RULE_OK = 0,
    FP8MIX_MM_RULE_ARCH = 1,          /* R5 */
    FP8MIX_MM_RULE_FORMATS = 2,       /* R4 */
    FP8MIX_MM_RULE_SCALE_ARCH = 3,    /* R6: OUTER / BLOCK off compute capability 9.x */
    FP8MIX_MM_RULE_SCALE_VERSION = 4, /* R6: OUTER / BLOCK with cuBLASLt < 12.9 */
    FP8MIX_MM_RULE_SCALE_MIX = 5,     /* BLOCK paired with another kind */
    FP8MIX_MM_RULE_SHAPE = 6          /* a size or stride out of range */
} fp8mix_mm_rule;

/* How an operand reaches cuBLASLt. */
typedef enum fp8mix_mm_copy {
    FP8MIX_MM_IN_PLACE = 0,       /* its own memory, as given                       */
    FP8MIX_MM_COPY_PAD = 1,       /* copied, already K-contiguous: padding/alignment */
    FP8MIX_MM_COPY_TRANSPOSE = 2  /* copied across its layout (R1): avoidable by
                                     passing the FP8 transpose                      */
} fp8mix_mm_copy;

/* A scale array cuBLASLt reads: rows x cols float32, row-major, dense.  Entry
 * (r, c) is the given scale array's element r * src_stride_r + c * src_stride_c
 * when r < valid_rows and c < valid_cols, else 1.  repack == 0: the given array
 * is passed as is (then it already has this layout). */
typedef struct fp8mix_mm_scale_map {
    int repack;
    int64_t rows, cols, valid_rows, valid_cols, src_stride_r, src_stride_c;
} fp8mix_mm_scale_map;

typedef struct fp8mix_mm_plan {
    fp8mix_mm_rule rule;           /* which rule refused the problem (else OK)     */
    int64_t mp, np, kp;            /* the GEMM cuBLASLt runs (padded sizes)        */
    fp8mix_mm_copy copy_a, copy_b;
    int64_t lda, ldb;              /* leading dimensions cuBLASLt gets (elements)  */
    fp8mix_mm_scale kind;          /* cuBLASLt's scale mode family, both operands  */
    fp8mix_mm_scale_map sa, sb;
    int bias_epilogue;             /* R9: cuBLASLt adds the bias                   */
    int copy_bias;                 /* the bias is copied to an np-long padded buffer */
    int bias_add;                  /* a separate kernel adds the bias              */
    fp8mix_dtype d_t;              /* the type cuBLASLt writes (out_t or F32)      */
    int d_in_scratch;              /* cuBLASLt writes an mp x np scratch matrix,
                                      which the bias add or a copy moves into out   */
    int fast_accum;
    size_t off_a, off_b, off_sa, off_sb, off_bias, off_d, off_ws; /* into scratch */
    size_t workspace_bytes;        /* cuBLASLt workspace (inside scratch)          */
    size_t scratch_bytes;          /* one buffer for all of the above              */
} fp8mix_mm_plan;

#define FP8MIX_MM_WORKSPACE ((size_t)32 << 20)

/* Fill *plan for problem *p.  OK: cuBLASLt can run it as planned.  UNSUPPORTED:
 * a rule refuses it (plan->rule says which; another library may still do it).
 * BAD_ENUM, BAD_SHAPE, BAD_ARG (BLOCK mixed with another kind): invalid input;
 * NULL_POINTER.  Never reads the addresses, only their alignment. */
fp8mix_status fp8mix_mm_layout_plan(const fp8mix_mm_problem *p, fp8mix_mm_plan *plan);

/* A static English sentence for a rule (never NULL). */
const char *fp8mix_mm_rule_string(fp8mix_mm_rule r);

/* ---- the op layer's GEMM and cast decisions, as plain functions -----------
 *
 * What the torch layer (csrc/torch) decides from sizes and strides before it
 * calls a kernel, stated here so that every decision has one copy, in C, with
 * C tests: how fp8mix_gemm reads two strided operands (in place, or a dense
 * copy first), which scale layout each operand of a scaled GEMM has (stated by
 * the caller or inferred from the scale arrays' shapes), and whether a current-
 * scaling 1x128-block cast reads its input through its transpose.  They read no
 * data and allocate nothing; every one returns a status and writes only *out.
 * The caller turns tensors into these arguments (sizes, strides and dims as
 * torch reports them) and an error code into its own message.
 */

/* A strided 2-D array: element (i, j) is at base + i * stride0 + j * stride1
 * (element strides; torch's t.stride(0), t.stride(1)). */
typedef struct fp8mix_strided2d {
    int64_t rows, cols;        /* >= 0 */
    int64_t stride0, stride1;  /* >= 0 (0: a broadcast dimension) */
} fp8mix_strided2d;

/* How fp8mix_gemm reads a and b (fp8mix_gemm_args' a_layout, lda, b_layout,
 * ldb).  copy_a / copy_b == 1: the operand cannot be read in place; the caller
 * passes a dense row-major copy, for which the layout and leading dimension
 * here are already set. */
typedef struct fp8mix_gemm_operands {
    fp8mix_a_layout a_layout;
    int64_t lda;
    int copy_a;
    fp8mix_b_layout b_layout;
    int64_t ldb;
    int copy_b;
} fp8mix_gemm_operands;

/* The layouts of a (M x K) and b (K x N) for fp8mix_gemm, read in place when
 * their rows (or columns) do not overlap.  Each operand's rules are tried in
 * this order; the first that fits wins:
 *   a row-major, stride1 == 1 and (M <= 1 or stride0 >= K): FP8MIX_A_MK,
 *     lda = stride0 when M > 1 and K > 0, else max(K, 1);
 *   a column-major (a transposed view, wgrad's dy^T), M > 1, K > 1,
 *     stride0 == 1 and stride1 >= M: FP8MIX_A_KM, lda = stride1;
 *   b column-major (w.t() of a row-major (N, K) weight), K > 0, stride0 == 1
 *     and (N <= 1 or stride1 >= K): FP8MIX_B_NK, ldb = stride1 when N > 1,
 *     else K;
 *   b row-major, N > 0, stride1 == 1 and (K <= 1 or stride0 >= N):
 *     FP8MIX_B_KN, ldb = stride0 when K > 1, else N;
 *   anything else: copy (FP8MIX_A_MK, lda = max(K, 1); FP8MIX_B_KN,
 *     ldb = max(N, 1)).
 * Errors: NULL_POINTER; BAD_SHAPE (a negative size or stride, or
 * a->cols != b->rows). */
fp8mix_status fp8mix_gemm_operand_layout(const fp8mix_strided2d *a, const fp8mix_strided2d *b,
                                         fp8mix_gemm_operands *out);

/* The GEMM a scaled_mm call runs on: which scale kinds it takes. */
typedef enum fp8mix_mm_backend {
    FP8MIX_MM_BACKEND_CPU = 0,      /* fp8mix_gemm: every fp8mix_mm_scale        */
    FP8MIX_MM_BACKEND_CUBLASLT = 1  /* fp8mix_cuda_scaled_mm: all but MX         */
} fp8mix_mm_backend;

/* One operand's scale array as given, and the kind its caller states. */
typedef struct fp8mix_mm_scale_given {
    int64_t dim;         /* number of dimensions (>= 0)                        */
    int64_t numel;       /* number of elements (>= 0)                          */
    int64_t rows, cols;  /* its sizes when dim == 2 (not read otherwise)       */
    int64_t kind;        /* an fp8mix_mm_scale, or < 0: infer from the shape   */
} fp8mix_mm_scale_given;

typedef struct fp8mix_mm_scale_query {
    int64_t m, n, k;              /* the GEMM's sizes (>= 0)                   */
    fp8mix_mm_scale_given a, b;   /* scale_a (for A's rows), scale_b (B's columns) */
    fp8mix_mm_backend backend;
} fp8mix_mm_scale_query;

typedef enum fp8mix_mm_scale_error {
    FP8MIX_MM_SCALE_FITS = 0,        /* no error                                    */
    FP8MIX_MM_SCALE_HALF_GIVEN = 1,  /* one kind stated, the other < 0              */
    FP8MIX_MM_SCALE_BAD_KIND = 2,    /* a stated kind above FP8MIX_MM_SCALE_MX      */
    FP8MIX_MM_SCALE_NO_MX = 3,       /* MX stated for a backend without MX          */
    FP8MIX_MM_SCALE_NOT_KIND = 4,    /* the array is not the stated kind's layout   */
    FP8MIX_MM_SCALE_NO_FIT = 5,      /* nothing stated; the shape fits no kind      */
    FP8MIX_MM_SCALE_MX_PAIR = 6      /* MX on one operand only, or either array not
                                        ceil(K/32) blocks along K                  */
} fp8mix_mm_scale_error;

/* The decision.  The errors come in the order a caller reports them (its own
 * per-operand checks, e.g. dtype and device, go before err_a and err_b):
 * pair == HALF_GIVEN first (then nothing else is decided), err_a, err_b, then
 * pair == MX_PAIR (decided only when both operands fit). */
typedef struct fp8mix_mm_scale_choice {
    fp8mix_mm_scale kind_a, kind_b;       /* valid where err_a / err_b is FITS   */
    fp8mix_mm_scale_error err_a, err_b;   /* BAD_KIND, NO_MX, NOT_KIND, NO_FIT   */
    fp8mix_mm_scale_error pair;           /* HALF_GIVEN or MX_PAIR               */
} fp8mix_mm_scale_choice;

/* The scale kinds of a scaled GEMM (kb = ceil(K/128), nb = ceil(N/128)).
 * "Block shapes": scale_a (M, kb) and scale_b (kb, nb), both 2-D.
 * Block mode: with stated kinds, kind_a == BLOCK and block shapes; inferred,
 * block shapes unless both arrays hold one value.
 * Per operand (outer = M for a, N for b):
 *   stated MX: NO_MX on a backend without MX; the array must be 2-D with
 *     outer rows (its K blocks are checked with the pair), else NOT_KIND;
 *   stated 0..2: the array must have the kind's layout: TENSOR one value
 *     (dim <= 2), OUTER a (M, 1) / b (1, N), BLOCK block mode; else NOT_KIND;
 *     a stated kind above MX is BAD_KIND;
 *   inferred: BLOCK in block mode, else TENSOR for one value (dim <= 2), else
 *     OUTER for (M, 1) / (1, N), else NO_FIT.
 * Pair: either kind MX needs both MX with ceil(K/32) columns each (MX_PAIR).
 * A stated BLOCK partnered with another kind is not refused here (the GEMM
 * refuses the mix).  OK when everything fits, BAD_ARG when any error field is
 * set; NULL_POINTER, BAD_ENUM (backend), BAD_SHAPE (a negative size). */
fp8mix_status fp8mix_mm_scale_kinds(const fp8mix_mm_scale_query *q, fp8mix_mm_scale_choice *out);

/* Which outputs a cast writes (flags, or'ed). */
typedef enum fp8mix_cast_outputs {
    FP8MIX_OUT_Q = 1,   /* q, x's shape               */
    FP8MIX_OUT_QT = 2   /* qt, x's transpose as 2-D    */
} fp8mix_cast_outputs;

typedef enum fp8mix_quantize_source {
    FP8MIX_READ_ROWS = 0,       /* fp8mix_quantize_current on x's row-major 2-D view */
    FP8MIX_READ_TRANSPOSED = 1  /* fp8mix_quantize_current_t on y, where x = y^T */
} fp8mix_quantize_source;

typedef struct fp8mix_quantize_read {
    fp8mix_quantize_source source;
    int64_t rows, cols, ld;  /* READ_TRANSPOSED: fp8mix_quantize_current_t's rows,
                                cols and ld_x (y's: x's cols, x's rows, x's
                                stride1); READ_ROWS: 0 */
} fp8mix_quantize_read;

/* How current scaling reads x (ndim dimensions; *x its sizes and strides when
 * ndim == 2, not read otherwise): through its transpose y, with no contiguous
 * copy of x, when gran is FP8MIX_GRAN_BLOCK, outputs is exactly FP8MIX_OUT_Q
 * and x = y^T of a row-major y (ndim 2, both sizes > 1, stride0 == 1 and
 * stride1 >= rows); by rows otherwise.  gran is an fp8mix_granularity value
 * as the caller got it, only compared (the cast itself checks it; any other
 * value reads by rows).  Errors: NULL_POINTER; BAD_SHAPE (ndim 2 with a negative size
 * or stride, or ndim < 0). */
fp8mix_status fp8mix_quantize_current_read(int64_t ndim, const fp8mix_strided2d *x, int64_t gran,
                                           unsigned outputs, fp8mix_quantize_read *out);

/* ---- fused producer casts: a norm or an activation written as FP8 ---------
 *
 * A GEMM's FP8 input made by the op that produces it, in the same pass:
 * the normalized x of a LayerNorm / RMSNorm, or the activation of an MLP's
 * first GEMM output.  Each row is produced in short float32 segments that
 * are cast to FP8 while in cache (the same encoder, SIMD kernels and
 * stochastic-rounding words as fp8mix_cast on those float32 values), so the
 * high-precision result is never stored unless asked for (`y`).  Bytes are
 * identical for every thread count and ISA.
 *
 * Passes over the input: one with given scales, block (1x128) or row current
 * scaling, or delayed scaling once the role has a history; two for
 * per-tensor or 128x128 current scaling and a delayed role's first use (an
 * amax pass, then the cast, producing the values again).
 */

/* Where a fused cast writes; the produced tensor has rows x cols values v. */
typedef struct fp8mix_fused_out {
    fp8mix_granularity gran;  /* TENSOR, ROW, BLOCK (1x128) or BLOCK2D         */
    const float *scale;       /* gran's scale array (finite, > 0), or NULL:
                                 current scaling by fp8mix_compute_scale with
                                 margin, pow2 and amax_epsilon below            */
    int margin, pow2;
    float amax_epsilon;
    uint8_t *q;               /* rows x cols FP8 bytes, row stride ld_q; NULL
                                 together with qt NULL: amax only (no cast)     */
    int64_t ld_q;
    uint8_t *qt;              /* optional cols x rows transpose (needs q)        */
    int64_t ld_qt;
    float *scale_inv;         /* optional, gran's shape: 1 / the scales used      */
    float *amax;              /* optional, gran's shape: max |v| per tile, with
                                 fp8mix_amax's NaN / inf rules                   */
    void *y;                  /* optional rows x cols copy of v, rounded to yt
                                 (round to nearest even), row stride ld_y       */
    fp8mix_dtype yt;
    int64_t ld_y;
} fp8mix_fused_out;

typedef enum fp8mix_norm_kind {
    FP8MIX_NORM_LAYER = 0,  /* v = (x - mean) * rstd * g + b                    */
    FP8MIX_NORM_RMS = 1     /* v = x * rstd * g + b (b normally absent)         */
} fp8mix_norm_kind;

typedef struct fp8mix_norm_params {
    fp8mix_norm_kind kind;
    float eps;                /* finite, >= 0                                    */
    int zero_centered_gamma;  /* nonzero: g = 1 + gamma (rounded to float32)     */
    const void *gamma;        /* cols values of type wt; NULL: gamma = 1 (or 0)  */
    const void *beta;         /* cols values of type wt; NULL: b = 0             */
    fp8mix_dtype wt;
} fp8mix_norm_params;

/* Normalization + cast.  x: rows x cols of type xt, row stride ld_x; the
 * produced tensor is rows x cols.  Per row, in float64 from the float32
 * values of x, summed in 8 lanes (element j into lane j mod 8, lanes added
 * 0+4, 1+5, 2+6, 3+7, then (0+2) + (1+3)):
 *   LayerNorm: mean = sum(x) / cols; var = sum((x - mean)^2) / cols;
 *   RMSNorm:   mean = 0;             var = sum(x^2) / cols;
 *   rstd = 1 / sqrt(var + eps); both rounded to float32 (mean[i], rstd[i]).
 * Then in float32, each operation rounded (no FMA):
 *   v = ((x - mean) * rstd) * g + b   (RMSNorm: (x * rstd) * g + b).
 * mean, rstd: rows floats each, written (stats_given 0; mean may be NULL for
 * RMSNorm) or read (stats_given nonzero: the statistics of an earlier call
 * on the same x, e.g. for a second cast at another granularity).  cols == 0
 * gives mean 0, rstd 1 / sqrt(eps) (inf for eps 0).
 * Errors: NULL_POINTER, BAD_SHAPE, BAD_ENUM, BAD_ARG (eps, margin, epsilon),
 * BAD_SCALE, NO_MEMORY; nothing is written on error. */
fp8mix_status fp8mix_norm_cast(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                               const fp8mix_norm_params *np, float *mean, float *rstd, int stats_given,
                               const fp8mix_fused_out *out, const fp8mix_cast_opts *opts);

/* The delayed-scaling variant (fp8mix_cast_delayed's rules, for v instead of
 * x): out->gran must be TENSOR and out->scale NULL; the scale is role's (on
 * its first use, from *fresh_amax if given, else from an amax pass over v);
 * scales[0] = s, scales[1] = 1 / s; out->amax gets amax(v); with record it
 * is recorded into the role's history. */
fp8mix_status fp8mix_norm_cast_delayed(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                       int64_t ld_x, const fp8mix_norm_params *np, float *mean, float *rstd,
                                       int stats_given, const fp8mix_fused_out *out,
                                       const fp8mix_delayed_state *st, int64_t role,
                                       const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                       const fp8mix_cast_opts *opts, float scales[2]);

/* Activations (Transformer Engine's definitions).  The gated ones read a row
 * of 2F inputs as two halves a = h[0..F), b = h[F..2F) and produce F values
 * act(a) * b; the others produce act(h) elementwise. */
typedef enum fp8mix_act_kind {
    FP8MIX_ACT_GELU = 0,    /* tanh approximation:
                               0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3))) */
    FP8MIX_ACT_RELU = 1,    /* max(a, 0), NaN kept                              */
    FP8MIX_ACT_SILU = 2,    /* a / (1 + exp(-a))                                */
    FP8MIX_ACT_QGELU = 3,   /* a / (1 + exp(-1.702 a)), "quick gelu"            */
    FP8MIX_ACT_SRELU = 4,   /* max(a, 0)^2, "squared relu"                      */
    FP8MIX_ACT_GEGLU = 5,   /* gelu(a) * b                                      */
    FP8MIX_ACT_SWIGLU = 6,  /* silu(a) * b                                      */
    FP8MIX_ACT_REGLU = 7,   /* relu(a) * b                                      */
    FP8MIX_ACT_QGEGLU = 8,  /* qgelu(a) * b                                     */
    FP8MIX_ACT_SREGLU = 9   /* srelu(a) * b                                     */
} fp8mix_act_kind;

/* Nonzero for the gated kinds; -1 for an unknown kind. */
int fp8mix_act_gated(fp8mix_act_kind act);

/* The scalar value of act at (a, b) in float32 (b ignored unless gated),
 * the oracle of the kernels below.  float32 operations only, in the sigmoid
 * forms gelu(a) = a / (1 + exp(-2u)) (= 0.5 a (1 + tanh u)), silu(a) =
 * a / (1 + exp(-a)), qgelu(a) = a / (1 + exp(-1.702 a)), with fp8mix's own
 * exp (Cody-Waite reduction, degree-6 polynomial; +inf above 88.72, 0 below
 * -87.34), so the bits do not depend on the C library.  Within a few ulp of
 * the exact value plus the exponent argument's rounding (relative error
 * ~2^-23 |argument|); results below ~1e-35 in magnitude may be 0. */
float fp8mix_act_ref(fp8mix_act_kind act, float a, float b);

/* Activation + cast.  h: rows x cols_in of type ht, row stride ld_h; the
 * produced tensor is rows x cols with cols = cols_in / 2 for gated kinds
 * (cols_in must be even: BAD_SHAPE otherwise) and cols_in for the others;
 * v(i, j) = fp8mix_act_ref(act, a, b) of the float32 inputs.
 * Errors as fp8mix_norm_cast. */
fp8mix_status fp8mix_act_cast(const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in, int64_t ld_h,
                              fp8mix_act_kind act, const fp8mix_fused_out *out, const fp8mix_cast_opts *opts);

/* The delayed-scaling variant, as fp8mix_norm_cast_delayed. */
fp8mix_status fp8mix_act_cast_delayed(const void *h, fp8mix_dtype ht, int64_t rows, int64_t cols_in,
                                      int64_t ld_h, fp8mix_act_kind act, const fp8mix_fused_out *out,
                                      const fp8mix_delayed_state *st, int64_t role,
                                      const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                      const fp8mix_cast_opts *opts, float scales[2]);

/* ---- NVFP4 (NVIDIA's 4-bit format: E2M1 values, E4M3 block scales) --------
 *
 * Elements are E2M1 (OCP Microscaling v1.0 sec. 5.3.3: 1 sign, 2 exponent
 * bits with bias 1, 1 mantissa bit, no inf or NaN): the magnitudes 0, 0.5, 1,
 * 1.5, 2, 3, 4, 6 for the codes 0..7, bit 3 the sign.  Two codes share a byte,
 * element 2j in the low nibble and 2j+1 in the high one (torch's
 * float4_e2m1fn_x2).  Every row is cut into blocks of FP8MIX_NVFP4_BLOCK = 16
 * consecutive elements (cols must be a multiple of 16); with tile_rows = 16
 * the blocks of 16 consecutive rows (the last group partial) share one scale
 * (the 16x16 2-D weight scaling of the NVFP4 recipe).  Two levels of scale,
 * in Transformer Engine's arithmetic (float32, round to nearest even):
 *   S_enc  = 2688 / global_amax      (2688 = 6 * 448; +inf gives FLT_MAX;
 *            global_amax 0, +inf or NaN gives 1)   fp8mix_nvfp4_tensor_scale
 *   S_dec  = 1 / S_enc                the float32 decode scale, per tensor
 *   block b with amax a_b (max |x| of its elements):
 *     d_b  = E4M3(a_b * (S_enc * (1/6)))   the block's decode scale, an E4M3
 *            byte, saturating at 448, round to nearest even; a block holding
 *            NaN or +-inf gets the NaN byte 0x7F instead (its elements are
 *            then code 0: the whole block decodes to NaN, fp8mix's rule that a
 *            non-finite input stays non-finite)
 *     e_b  = min(1 / (float(d_b) * S_dec), FLT_MAX)     (d_b = 0: FLT_MAX)
 *     code = E2M1(x * e_b), saturating at 6, rounded to nearest even or
 *            stochastically (the FP8 rules above with 1 mantissa bit; element
 *            (i, j) takes random word i * cols + j under (seed, offset))
 * Decoding: x' = (E2M1 value * float(d_b)) * S_dec.  global_amax is the
 * caller's (current scaling: the tensor's amax, all-reduced where sharded);
 * a block whose amax exceeds it saturates. */
#define FP8MIX_NVFP4_BLOCK 16

/* Exact value of the E2M1 code in the low nibble of `code` (the high nibble
 * is ignored). */
float fp8mix_e2m1_decode(uint8_t code);

/* Scalar reference E2M1 encoder of an already scaled value y: a code 0..15,
 * saturating at +-6; NaN gives 0 (E2M1 has no NaN: the quantiser marks
 * non-finite blocks by their scale).  r: the stochastic-rounding word. */
uint8_t fp8mix_e2m1_encode_ref(float y, fp8mix_rounding rounding, uint32_t r);

/* S_enc of the rule above. */
float fp8mix_nvfp4_tensor_scale(float global_amax);

/* NVFP4 quantisation of x (rows x cols, type xt, row stride ld_x):
 *   q            rows x cols/2 bytes, row stride ld_q (>= cols/2) bytes
 *   block_scale  rows x cols/16 E4M3 bytes d_b (row-major; with tile_rows 16
 *                the 16 rows of a tile hold the same byte)
 *   scale_inv    optional (NULL: none): S_dec
 * opts: rounding, seed and offset as for the FP8 casts; fmt must be
 * FP8MIX_E4M3 (the block scales' format); saturate and inf_to_nan are
 * implied by the rule above.  Errors: NULL_POINTER, BAD_SHAPE (cols not a
 * multiple of 16, ld < cols), BAD_ENUM, BAD_ARG (tile_rows not 1 or 16,
 * global_amax negative). */
fp8mix_status fp8mix_quantize_nvfp4(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                    int tile_rows, float global_amax, uint8_t *q, int64_t ld_q,
                                    uint8_t *block_scale, float *scale_inv, const fp8mix_cast_opts *opts);

/* out (rows x cols float32, row stride ld_out) = the decoding above of q and
 * block_scale with S_dec = scale_inv (finite and > 0, else BAD_SCALE). */
fp8mix_status fp8mix_dequantize_nvfp4(const uint8_t *q, int64_t ld_q, const uint8_t *block_scale, int64_t rows,
                                      int64_t cols, float scale_inv, float *out, int64_t ld_out);

/* C (M x N float32, row stride ldc) = A B^T of two NVFP4 tensors with the
 * same K (a multiple of 16): A M x K (codes a, row stride lda bytes, block
 * scales sa M x K/16, decode scale sinv_a), B N x K likewise.  Summation
 * order, the same on every CPU and thread count: for each block of 16, the
 * 16 products of E2M1 values summed in order (exact in float32: each is a
 * multiple of 1/4 below 36), times float(d_a) * float(d_b) (exact); the block
 * results accumulated in float32 from +0 in ascending k; finally times
 * (sinv_a * sinv_b) rounded once.  A NaN block scale gives NaN.  Errors:
 * NULL_POINTER, BAD_SHAPE, BAD_SCALE (sinv not finite or <= 0). */
fp8mix_status fp8mix_gemm_nvfp4(int64_t M, int64_t N, int64_t K, const uint8_t *a, int64_t lda,
                                const uint8_t *sa, float sinv_a, const uint8_t *b, int64_t ldb,
                                const uint8_t *sb, float sinv_b, float *c, int64_t ldc);

/* The random Hadamard transform of the NVFP4 recipe along rows: every group
 * of 16 consecutive elements of a row (cols a multiple of 16) becomes
 *   y[g*16 + r] = (sum over c = 0..15, in order, of H[r][c] * s_c * x[g*16 + c]) / 4
 * with H the 16x16 Sylvester Hadamard matrix (H[r][c] = (-1)^popcount(r & c))
 * and s_c = -1 where bit c of `signs` is set, else +1; float32 additions in
 * the order written, the division by 4 exact but for float32 subnormals.  (H D / 4 is orthogonal: for
 * two tensors transformed alike, A' B'^T = A B^T up to rounding, which is how
 * the recipe applies it to the weight gradient's operands along the tokens.)
 * x and y: float32, rows x cols, row strides ld_x, ld_y; y may equal x.
 * Errors: NULL_POINTER, BAD_SHAPE. */
fp8mix_status fp8mix_rht16(const float *x, int64_t rows, int64_t cols, int64_t ld_x, uint16_t signs, float *y,
                           int64_t ld_y);

#ifdef __cplusplus
}
#endif
#endif /* FP8MIX_H */
