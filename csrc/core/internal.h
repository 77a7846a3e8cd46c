/*
 * internal.h — what the C core's files share and the public header does not
 * promise: the per-ISA kernel tables, the thread fan-out, small bit helpers.
 * Not installed, not part of the API.
 */
#ifndef FP8MIX_INTERNAL_H
#define FP8MIX_INTERNAL_H

#include <string.h>

#include "fp8mix.h"
/* Bit helpers, fp8_params, fp8_encode, Philox and the scale rule: shared with
 * the CUDA kernels. */
#include "fp8_rules.h"

/* bf16 / f16 bit patterns to float32 (exact). */
static inline float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }
float fp8mix_f16_to_f32_ref(uint16_t h);
/* float32 to bf16 / f16 bits, round to nearest even, NaN kept (quiet). */
uint16_t fp8mix_f32_to_bf16_ref(float f);
uint16_t fp8mix_f32_to_f16_ref(float f);

/* Load element i of a row of type t as float32. */
static inline float load_f32(const void *row, fp8mix_dtype t, int64_t i)
{
    switch (t) {
    case FP8MIX_F32: return ((const float *)row)[i];
    case FP8MIX_BF16: return bf16_to_f32(((const uint16_t *)row)[i]);
    default: return fp8mix_f16_to_f32_ref(((const uint16_t *)row)[i]);
    }
}

static inline size_t dtype_size(fp8mix_dtype t) { return t == FP8MIX_F32 ? 4 : 2; }

/* Decode table: fp8mix_decode_table(fmt)[byte] is the exact float32 value. */
const float *fp8mix_decode_table(fp8mix_format fmt);

/* ---- cast kernels: one row segment under one scale ----------------------
 * Encodes n contiguous elements x[0..n) (type xt) times `scale` into q[0..n),
 * and folds max |x| bits (unsigned compare of bits & 0x7FFFFFFF) into *amax.
 * For stochastic rounding, element t uses random word index rng_index + t
 * (i.e. fp8mix_random_word(seed, offset, rng_index + t)).  q may be NULL
 * (amax only). */
typedef void (*fp8mix_cast_seg_fn)(const void *x, fp8mix_dtype xt, int64_t n,
                                   float scale, uint8_t *q, uint32_t *amax,
                                   const fp8_params *p, uint64_t seed,
                                   uint64_t rng_index);

/* Decodes n bytes to float32 times scale_inv, then stores as out_t. */
typedef void (*fp8mix_dequant_seg_fn)(const uint8_t *q, int64_t n,
                                      const float *table, float scale_inv,
                                      void *out, fp8mix_dtype out_t);

/* Transposed widening read: buf[j * ldb + i] = (float)x[i * ld_x + j] for
 * i < rows, j < cols (x of type xt, row stride ld_x elements).  Exact. */
typedef void (*fp8mix_widen_t_fn)(const void *x, fp8mix_dtype xt, int64_t ld_x,
                                  int64_t rows, int64_t cols, float *buf,
                                  int64_t ldb);

typedef struct fp8mix_kernels {
    fp8mix_cast_seg_fn cast_seg;
    fp8mix_dequant_seg_fn dequant_seg;
    fp8mix_widen_t_fn widen_t;
} fp8mix_kernels;

/* Kernel table for the active ISA (never NULL), chosen in dispatch.c. */
const fp8mix_kernels *fp8mix_kernels_active(void);

/* The portable kernels (cast_ref.c): the scalar ISA's, and the oracle of the
 * x86 variants (x86/cast_*.c, x86/widen_t_avx2.c; AVX-512 reuses the AVX2
 * widen_t). */
void fp8mix_cast_seg_ref(const void *x, fp8mix_dtype xt, int64_t n,
                         float scale, uint8_t *q, uint32_t *amax,
                         const fp8_params *p, uint64_t seed,
                         uint64_t rng_index);
void fp8mix_dequant_seg_ref(const uint8_t *q, int64_t n, const float *table,
                            float scale_inv, void *out, fp8mix_dtype out_t);
void fp8mix_widen_t_ref(const void *x, fp8mix_dtype xt, int64_t ld_x, int64_t rows,
                        int64_t cols, float *buf, int64_t ldb);
#if defined(__x86_64__) || defined(_M_X64)
#define FP8MIX_X86 1
void fp8mix_cast_seg__avx2(const void *x, fp8mix_dtype xt, int64_t n,
                           float scale, uint8_t *q, uint32_t *amax,
                           const fp8_params *p, uint64_t seed,
                           uint64_t rng_index);
void fp8mix_dequant_seg__avx2(const uint8_t *q, int64_t n, const float *table,
                              float scale_inv, void *out, fp8mix_dtype out_t);
void fp8mix_widen_t__avx2(const void *x, fp8mix_dtype xt, int64_t ld_x, int64_t rows,
                          int64_t cols, float *buf, int64_t ldb);
void fp8mix_cast_seg__avx512(const void *x, fp8mix_dtype xt, int64_t n,
                             float scale, uint8_t *q, uint32_t *amax,
                             const fp8_params *p, uint64_t seed,
                             uint64_t rng_index);
void fp8mix_dequant_seg__avx512(const uint8_t *q, int64_t n, const float *table,
                                float scale_inv, void *out, fp8mix_dtype out_t);
#endif

/* Byte transpose: dst[j * ld_dst + i] = src[i * ld_src + j] for i < rows, j < cols. */
void fp8mix_transpose_u8(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                         int64_t cols);
void fp8mix_transpose_u8_ref(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst,
                             int64_t rows, int64_t cols);
#if FP8MIX_X86
void fp8mix_transpose_u8__sse2(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                               int64_t cols);
void fp8mix_transpose_u8_lines__sse2(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                                     int64_t cols, int stream);
#endif
/* The cast+transpose tile: like fp8mix_transpose_u8, writing each destination
 * row's piece whole (streamed past the caches when `stream`). */
void fp8mix_transpose_u8_tile(const uint8_t *src, int64_t ld_src, uint8_t *dst, int64_t ld_dst, int64_t rows,
                              int64_t cols, int stream);

/* Random words rng_index .. rng_index + n - 1 into r[0..n). */
void fp8mix_random_words(uint64_t seed, uint64_t offset_plus_index, int64_t n,
                         uint32_t *r);

/* ---- threads ------------------------------------------------------------
 * Runs fn(ctx, task, worker) for task in [0, ntasks) on up to `workers`
 * threads (on fp8mix's own pool the calling thread is worker 0).  Tasks are handed out in order
 * from an atomic counter; fn must not depend on which worker runs a task
 * except through the worker index it is given (for per-worker scratch or
 * partial results).  Returns the number of workers actually used, or minus
 * that number when fewer threads than asked could be started (all tasks still
 * ran).  Runs on a persistent pool (parallel.c), or on the host's pool when
 * one was given (fp8mix_set_thread_pool). */
typedef void (*fp8mix_task_fn)(void *ctx, int64_t task, int worker);
int fp8mix_parallel_for(int64_t ntasks, int workers, fp8mix_task_fn fn,
                        void *ctx);

/* Fault in the pages of an output buffer of `bytes` at p before it is written
 * (large, not yet resident buffers only; contents unchanged; see prefault.c). */
void fp8mix_prefault(void *p, size_t bytes, int workers);

/* Workers worth using for `work` units of at least `grain` each. */
int fp8mix_workers_for(int64_t work, int64_t grain);

/* Shape checks shared by the entry points. */
static inline int bad_2d(int64_t rows, int64_t cols, int64_t ld)
{
    return rows < 0 || cols < 0 || ld < cols || (rows > 0 && ld < 1) ||
           (cols > 0 && rows > INT64_MAX / (ld > 0 ? ld : 1));
}
/* ceil(a / b) for a >= 0, b > 0, without the overflow of (a + b - 1) / b near INT64_MAX. */
static inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

/* Number of scales for gran over rows x cols. */
int64_t fp8mix_scale_count(fp8mix_granularity gran, int64_t rows, int64_t cols);
/* Index of the scale of element (i, j). */
static inline int64_t scale_index(fp8mix_granularity g, int64_t i, int64_t j,
                                  int64_t cols)
{
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return 0;
    case FP8MIX_GRAN_ROW: return i;
    case FP8MIX_GRAN_BLOCK: return i * ceil_div(cols, FP8MIX_BLOCK) + j / FP8MIX_BLOCK;
    case FP8MIX_GRAN_MX: return i * ceil_div(cols, FP8MIX_MX_BLOCK) + j / FP8MIX_MX_BLOCK;
    default: return (i / FP8MIX_BLOCK) * ceil_div(cols, FP8MIX_BLOCK) + j / FP8MIX_BLOCK;
    }
}
/* MX (scale.c): the scale 2^-e and scale_inv 2^e of one block with amax bits m
 * (cast.c's fused current-scaling path for GRAN_MX, and cast_mx.c). */
void fp8mix_mx_block_scale(uint32_t amax_bits, fp8mix_format fmt, fp8mix_mx_rule rule, int margin, float eps,
                           float *scale, float *scale_inv);

/* Nonzero unless every one of n scales is finite and > 0. */
int fp8mix_scales_bad(const float *s, int64_t n);

#endif /* FP8MIX_INTERNAL_H */
