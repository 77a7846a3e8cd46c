/*
 * fp8mix_cuda.h — the CUDA entry points of the fp8mix engine.
 *
 * The same operations as fp8mix.h, run on an NVIDIA GPU, with the same numeric
 * rules (read fp8mix.h first: encoding, stochastic rounding and its Philox
 * stream, amax, scale granularities, compute_scale).  For equal inputs the FP8
 * bytes, amaxes and scales are bit-identical to the CPU entry points.
 *
 * Conventions (in addition to fp8mix.h's)
 *   - Every data pointer (inputs, outputs, scales, amax) is a DEVICE pointer of
 *     the current device.  Nothing is read from or copied to the host, and no
 *     launcher synchronises: each enqueues its work on `stream` and returns.
 *   - Every launcher returns an fp8mix_status.  Arguments that the host can see
 *     (enums, shapes, NULL pointers, alignment) are checked before anything is
 *     enqueued.  A CUDA launch or runtime error gives FP8MIX_ERR_UNSUPPORTED
 *     (FP8MIX_ERR_NO_MEMORY for an allocation failure); the detail is in
 *     fp8mix_cuda_last_error().  Errors of kernels that already ran
 *     asynchronously surface, as usual in CUDA, at a later synchronisation.
 *   - Scales live on the device, so their validity (finite and > 0) cannot be
 *     checked before launch without a sync.  Instead, launchers that take scales
 *     accept an optional device int `scale_status` (NULL: none): a kernel that
 *     meets an invalid scale stores FP8MIX_ERR_BAD_SCALE there (it never writes
 *     FP8MIX_OK; the caller zeroes it).  The output is still written, computed
 *     with the invalid scale (NaN/inf scales give NaN / saturated bytes): unlike
 *     the CPU, the bytes are not left untouched.  The torch layer reads the flag
 *     only when asked to (env FP8MIX_CUDA_CHECK_SCALES=1), since reading it costs
 *     a host sync.
 *   - Kernels use 16-byte vector loads and stores when cols is a multiple of 16,
 *     every ld is a multiple of 16 and the base pointers are 16-byte aligned;
 *     otherwise a scalar path (same bytes).  All indexing is 64-bit.
 *   - Host-side state (the cuBLASLt handle per device, heuristic cache) is
 *     created on first use, guarded by a mutex, and never freed before exit.
 *
 * Not covered: the FP22 accumulation model of fp8mix_gemm (on the GPU the
 * tensor cores' own accumulation is used, which agrees with the CPU's FP32 sums
 * only to summation order and accumulator width; see fp8mix_cuda_gemm).
 */
#ifndef FP8MIX_CUDA_H
#define FP8MIX_CUDA_H

#include <cuda_runtime_api.h>

#include "fp8mix.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A static, per-thread English description of the last CUDA / cuBLASLt error a
 * launcher met on this thread ("" when none).  Every entry point empties it first,
 * so after a call it is that call's message or "".  Valid until the next call. */
const char *fp8mix_cuda_last_error(void);
/* Empties this thread's last-error message (the entry points do so themselves). */
void fp8mix_cuda_clear_error(void);

/* Saturating round-to-nearest casts may use the sm_89+ FP8 convert instruction
 * (after a NaN fix-up, the same bytes as the integer encoder; the tests check
 * both).  on != 0 (the default): allowed; 0: always the integer encoder.
 * Process-wide; read at each launch (an atomic, no environment read). */
void fp8mix_cuda_set_hw_convert(int on);
int fp8mix_cuda_get_hw_convert(void);

/* ---- casts (see fp8mix_cast etc. in fp8mix.h for the full contracts) ------- */

/* Tensor-held stochastic-rounding streams: every cast below takes `rng`, NULL or a
 * device int64 [key, offset] (the layers' fp8_rng buffer), read ON THE DEVICE by the
 * kernels: when given, the cast rounds stochastically with seed = key and words from
 * offset + rng_skip on (opts' rounding / seed / offset are then ignored), exactly as the
 * C core's torch ops do with a CPU tensor.  A CUDA graph thus replays with the stream's
 * state at replay time. */

/* Scale + cast (+ transpose) + amax, as fp8mix_cast.
 *   x      rows x cols of xt, row stride ld_x
 *   scale  device float32, the shape of gran's scale array
 *   q      rows x cols bytes (ld_q) or NULL; qt cols x rows bytes (ld_qt) or NULL
 *   amax   device float or NULL: zeroed on `stream` first, then max |x|
 *   scale_status  optional device int, see "Conventions"
 * With qt the kernel reads x once and writes q and qt from a shared-memory tile.
 * Launches: a memset of amax (when given) and one cast kernel. */
fp8mix_status fp8mix_cuda_cast(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                               fp8mix_granularity gran, const float *scale, uint8_t *q, int64_t ld_q,
                               uint8_t *qt, int64_t ld_qt, float *amax, int *scale_status,
                               const fp8mix_cast_opts *opts, const int64_t *rng, uint64_t rng_skip,
                               cudaStream_t stream);

/* amax per granularity into out (device, gran's scale-array shape), as fp8mix_amax. */
fp8mix_status fp8mix_cuda_amax(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                               fp8mix_granularity gran, float *out, cudaStream_t stream);

/* fp8mix_compute_scale elementwise over n device floats; scale / scale_inv may be NULL. */
fp8mix_status fp8mix_cuda_compute_scale(const float *amax, int64_t n, fp8mix_format fmt, int margin, int pow2,
                                        float amax_epsilon, float *scale, float *scale_inv, cudaStream_t stream);

/* Current scaling, as fp8mix_quantize_current.  scale_inv and amax_out are
 * REQUIRED here (device, gran's scale-array shape): amax_out doubles as the
 * scratch the cast reads its amax from.  Launches, all on `stream`, no host sync:
 *   TENSOR: 2 (an amax pre-pass writing per-block partial maxima into `work`, then
 *           the cast, whose blocks reduce the partials to the scale; its last
 *           block writes scale_inv and amax_out); `work`: device scratch of
 *           fp8mix_cuda_recipe_work_bytes() bytes, REQUIRED for TENSOR;
 *   ROW and BLOCK without qt: 1 fused kernel (each tile reduced, scaled and cast by
 *           one thread group, x read once);
 *   otherwise: amax kernel -> compute_scale kernel -> cast kernel (which derives
 *           each tile's scale from amax_out). */
fp8mix_status fp8mix_cuda_quantize_current(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                           int64_t ld_x, fp8mix_granularity gran, int margin, int pow2,
                                           float amax_epsilon, uint8_t *q, int64_t ld_q, uint8_t *qt,
                                           int64_t ld_qt, float *scale_inv, float *amax_out,
                                           const fp8mix_cast_opts *opts, const int64_t *rng, uint64_t rng_skip,
                                           void *work, cudaStream_t stream);

/* Dequantise, as fp8mix_dequantize (scale_status: see "Conventions"). */
fp8mix_status fp8mix_cuda_dequantize(const uint8_t *q, fp8mix_format fmt, int64_t rows, int64_t cols,
                                     int64_t ld_q, fp8mix_granularity gran, const float *scale_inv, void *out,
                                     fp8mix_dtype out_t, int64_t ld_out, int *scale_status, cudaStream_t stream);

/* ---- delayed scaling: one kernel updates many tensors ---------------------- */

/* fp8mix_amax_algo: see fp8mix.h. */

/* One tensor's delayed-scaling state (all pointers device pointers). */
typedef struct fp8mix_cuda_delayed_entry {
    float *history;          /* L entries, newest first: history[k * history_stride] */
    int64_t history_len;     /* L >= 1 */
    int64_t history_stride;  /* >= 1 (e.g. 3 for one column of an (L, 3) buffer) */
    const float *amax;       /* the amax to record (one float) */
    float *scale;            /* in/out: the scale */
    float *scale_inv;        /* optional out (NULL: none): 1 / scale after the update */
    int64_t *steps;          /* optional in/out (NULL: none): records so far, += 1 */
    float fp8_max;           /* 448 or 57344 (the tensor's format max) */
} fp8mix_cuda_delayed_entry;

/* For each entry, in one kernel (one launch per FP8MIX_CUDA_DELAYED_PER_LAUNCH
 * entries; the entry table travels in the kernel parameters, nothing is copied):
 *   roll the history by one (history[k] = history[k-1]), history[0] = *amax;
 *   a = max(history) (NaN if any entry is NaN) or history[0] (MOST_RECENT);
 *   s = fp8mix_compute_scale(a, fp8_max, margin, pow2, epsilon 0)   (inf -> FLT_MAX);
 *   if steps: *steps += 1;
 *   ok = a finite and > 0, and (steps == NULL or *steps % interval == 0);
 *   *scale = ok ? s : *scale;  scale_inv (if any) = 1 / *scale.
 * `entries` is a HOST array.  Errors: NULL_POINTER, BAD_ARG (history_len or
 * stride < 1, margin outside [0,126], interval < 1), BAD_ENUM (algo). */
#define FP8MIX_CUDA_DELAYED_PER_LAUNCH 128
fp8mix_status fp8mix_cuda_delayed_update(const fp8mix_cuda_delayed_entry *entries, int64_t n, int margin,
                                         int pow2, fp8mix_amax_algo algo, int64_t interval, cudaStream_t stream);

/* ---- per-tensor recipes: a linear layer's delayed-scaling state and casts -----
 *
 * The CUDA counterparts of fp8mix.h's "per-tensor recipes" entry points, with the
 * same contracts and the same bits (FP8 bytes, amax, scales, history, steps,
 * pending, slot; the number rules are csrc/core/fp8_rules.h's).  The state
 * (fp8mix_delayed_state: history, scale, steps) and every other tensor argument
 * are DEVICE pointers, and every state value (steps, scale, the slot index, the
 * fresh flag, rng key and offset) is read on the device: nothing syncs, so a
 * training step made of these calls can be captured in a CUDA graph.  The host
 * checks what it can see (NULL pointers, shapes, enums, the recipe's numbers)
 * before enqueueing anything, with the C core's statuses.  What only the device
 * sees is reported in the optional device int `status` (NULL: none; the caller
 * zeroes it; never set to OK): FP8MIX_ERR_BAD_SCALE for a state or plan scale that
 * is not finite and > 0 (the cast still runs with it), FP8MIX_ERR_BAD_ARG for a
 * grad slot outside [0, slots) (the pending update is then skipped).
 *
 * `work` (the casts): device scratch of fp8mix_cuda_recipe_work_bytes() bytes,
 * owned by the caller for the duration of the call (one per call in flight).
 * Launch counts (kernels; no memsets, no copies):
 *   fp8mix_cuda_cast_delayed   2: an amax pre-pass that exits at once unless this
 *                              is the role's first use without fresh_amax (it
 *                              also zeroes the cast's counters), then the cast,
 *                              whose last block writes scales / amax and records
 *   fp8mix_cuda_cast_grad      2: the pre-pass (exits at once for a delayed plan),
 *                              then the cast; with colsum, the column sums run in
 *                              extra blocks of the cast kernel; its last cast
 *                              block writes scale_inv / amax and the pending max
 *   fp8mix_cuda_delayed_record 1 (one thread block)
 *   fp8mix_cuda_delayed_flush  1 (one thread block)
 * so an fp8mix.Linear step under delayed scaling launches 1 (flush) + 2 (x) +
 * 2 (W) + 2 (dy) kernels besides its three GEMMs (and, with a bias, the copy of
 * the float32 column sums to the bias dtype that fp8mix.nn makes): 10, 11 with a
 * bias.  benchmarks/bench_gpu.py measures it (torch.profiler's CUDA activity). */

/* Bytes of `work` for fp8mix_cuda_cast_delayed / _cast_grad / TENSOR quantize_current. */
size_t fp8mix_cuda_recipe_work_bytes(void);

/* fp8mix_cast_delayed on the device.  x, q (ld_q), qt (NULL: none; ld_qt) as in
 * fp8mix_cuda_cast with one per-tensor scale; st / role / r the state and recipe;
 * fresh_amax: device float or NULL; record: nonzero records the cast's amax;
 * scales: device float[2] out ([scale, 1 / scale]); amax: device float out (may be
 * NULL).  The state's scale is checked on the device (status). */
fp8mix_status fp8mix_cuda_cast_delayed(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                       uint8_t *q, int64_t ld_q, uint8_t *qt, int64_t ld_qt,
                                       const fp8mix_delayed_state *st, int64_t role, const fp8mix_delayed_recipe *r,
                                       const float *fresh_amax, int record, const fp8mix_cast_opts *opts,
                                       const int64_t *rng, uint64_t rng_skip, float *scales, float *amax,
                                       void *work, int *status, cudaStream_t stream);

/* fp8mix_cast_grad on the device.  plan: device float[2] or NULL; pending: device
 * float[slots] or NULL, with slot a device int64 (the reserved slot; read on the
 * device): pending[*slot] = max(pending[*slot], v); colsum: device float[cols] or
 * NULL (per-column sequential float32 sums over rows 0..rows-1: the C core's bits);
 * scale_inv (device float, required) and amax (may be NULL) out. */
fp8mix_status fp8mix_cuda_cast_grad(const void *dy, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld,
                                    uint8_t *q, int64_t ld_q, uint8_t *qt, int64_t ld_qt, const float *plan,
                                    int margin, int pow2, float amax_epsilon, float *pending, int64_t slots,
                                    const int64_t *slot, const fp8mix_cast_opts *opts, const int64_t *rng,
                                    uint64_t rng_skip, float *scale_inv, float *amax, float *colsum, void *work,
                                    int *status, cudaStream_t stream);

/* fp8mix_delayed_record (amax: one device float) or, with rescale_only,
 * fp8mix_delayed_rescale (amax unused, may be NULL). */
fp8mix_status fp8mix_cuda_delayed_record(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                         const fp8mix_delayed_recipe *r, const float *amax, int rescale_only,
                                         cudaStream_t stream);

/* fp8mix_delayed_flush: pending (device float[slots]), next_slot (device int64, in
 * out), plan (device float[2] out), reserved (device int64 out, required: written
 * always, 0 when not reserving, so that the caller needs no fill). */
fp8mix_status fp8mix_cuda_delayed_flush(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                        const fp8mix_delayed_recipe *r, float *pending, int64_t slots,
                                        int64_t *next_slot, int record, int reserve, float *plan,
                                        int64_t *reserved, cudaStream_t stream);

/* ---- scaled GEMM through cuBLASLt ------------------------------------------- */

/* out[M,N] = (A * scale_a) @ (B * scale_b) + bias, on FP8 tensor cores (sm_89+),
 * for operands already in cuBLASLt's layout (fp8mix_cuda_scaled_mm below takes
 * any layout and makes it so).  Layout ("TN", both operands contiguous along K):
 *   a    M x K row-major, row stride lda (a multiple of 16, >= K)
 *   b    K x N column-major: B(p, j) = b[j * ldb + p] (torch: w.t() of a row-major
 *        (N, K) weight); ldb a multiple of 16, >= K.  Row-major B is not accepted.
 *   out  M x N row-major, row stride ldo (>= N; ldo * sizeof(out) a multiple of 16)
 * K and N must be multiples of 16, a / b / out 16-byte aligned.  E5M2 x E5M2 is
 * not supported by the hardware (UNSUPPORTED).
 * Scales (dequantisation factors, device float32), both of one kind (BAD_ARG
 * otherwise; expand a TENSOR partner of OUTER first):
 *   TENSOR  one float each (every FP8 device)
 *   OUTER   scale_a: M floats (one per row), scale_b: N floats (one per column)
 *           (cuBLASLt OUTER_VEC_32F: compute capability 9.x only, cuBLASLt >= 12.9;
 *           other devices refuse it with UNSUPPORTED)
 *   BLOCK   GEMM-ready layouts (cuBLASLt VEC128_32F for A, BLK128x128_32F for B;
 *           compute capability 9.x only, cuBLASLt >= 12.9; M % 4 == 0):
 *           scale_a: (ceil(K/128), M) row-major, sa[kb * M + i]
 *           scale_b: (ceil(N/128), roundup(ceil(K/128), 4)) row-major,
 *                    sb[nb * roundup(ceil(K/128),4) + kb]
 *           (fp8mix_mm_layout_plan gives these shapes; fp8mix_cuda_scaled_mm
 *           repacks the C API's (M, ceil(K/128)) / (ceil(K/128), ceil(N/128)) arrays).
 * bias: NULL or N values.  The cuBLASLt epilogue takes it only when
 *   fp8mix_cuda_gemm_bias_in_epilogue says so (rule R9 of fp8mix.h: bias_t ==
 *   out_t, a bfloat16 / float16 output, TENSOR scales); other combinations give
 *   UNSUPPORTED: add it afterwards with fp8mix_cuda_bias_add.
 * fast_accum: 0 (default) keeps cuBLASLt's periodic promotion of the FP8
 *   accumulator to float32; 1 uses the faster, less accurate accumulation
 *   (CUBLASLT_MATMUL_DESC_FAST_ACCUM; not allowed with BLOCK scales).  The torch op
 *   maps accumulate="fp22" to 1; its promote_interval has no CUDA counterpart (the
 *   hardware's accumulator and cuBLASLt's promotion schedule are not configurable).
 * workspace: device memory of workspace_size bytes for cuBLASLt; NULL uses a
 *   per-device workspace cached by the library (32 MiB; then concurrent calls on
 *   different streams of one device must not overlap — pass your own workspace,
 *   e.g. from a stream-ordered allocator, when they can).
 * The handle is cached per device and the heuristic's answer per problem (M, N, K,
 * lds, types, scale kinds, bias, fast_accum, pointer alignment) in a small
 * fixed-size cache, refusals included.  cuBLASLt status -> fp8mix_status:
 * ALLOC_FAILED -> NO_MEMORY, anything else (NOT_SUPPORTED, INVALID_VALUE for a
 * combination it does not take, no heuristic result) -> UNSUPPORTED; details in
 * fp8mix_cuda_last_error. */
typedef struct fp8mix_cuda_gemm_args {
    int64_t m, n, k;
    const uint8_t *a;
    fp8mix_format fmt_a;
    int64_t lda;
    const uint8_t *b;
    fp8mix_format fmt_b;
    int64_t ldb;
    const float *scale_a;
    fp8mix_mm_scale scale_a_kind;
    const float *scale_b;
    fp8mix_mm_scale scale_b_kind;
    const void *bias;
    fp8mix_dtype bias_t;
    void *out;
    fp8mix_dtype out_t;
    int64_t ldo;
    int fast_accum;
    void *workspace;
    size_t workspace_size;
} fp8mix_cuda_gemm_args;

fp8mix_status fp8mix_cuda_gemm(const fp8mix_cuda_gemm_args *args, cudaStream_t stream);

/* Nonzero when fp8mix_cuda_gemm can add a bias of bias_t to an out_t output with
 * these scale kinds in its epilogue (rule R9 of fp8mix_mm_layout_plan). */
int fp8mix_cuda_gemm_bias_in_epilogue(fp8mix_dtype bias_t, fp8mix_dtype out_t, fp8mix_mm_scale scale_kind);

/* cublasLtGetVersion() of the loaded library (e.g. 131000). */
int64_t fp8mix_cuda_blas_version(void);

/* ---- scaled_mm: any layout, planned by fp8mix_mm_layout_plan ----------------- */

/* Fills p->sm and p->blas_version for the current device and library, then
 * fp8mix_mm_layout_plan(p, plan) (same statuses: UNSUPPORTED names the refusing
 * rule in plan->rule). */
fp8mix_status fp8mix_cuda_scaled_mm_plan(fp8mix_mm_problem *p, fp8mix_mm_plan *plan);

/* Everything one planned GEMM reads and writes (device pointers). */
typedef struct fp8mix_cuda_scaled_mm_args {
    const fp8mix_mm_problem *problem;  /* as given to fp8mix_cuda_scaled_mm_plan */
    const fp8mix_mm_plan *plan;        /* its OK plan */
    const uint8_t *a, *b;              /* with the problem's strides */
    const float *scale_a, *scale_b;    /* dense, fp8mix_gemm's layouts per kind */
    const void *bias;                  /* N values of problem->bias_t, or NULL */
    void *out;                         /* M x N of out_t, row stride N */
    void *scratch;                     /* plan->scratch_bytes, 256-byte aligned */
    size_t scratch_bytes;
} fp8mix_cuda_scaled_mm_args;

/* Carries out a plan on `stream`: operand copies and scale repacking (one launch
 * each that the plan asks for), the cuBLASLt GEMM, then the bias add or the copy of
 * a padded product into out.  UNSUPPORTED when cuBLASLt refuses the problem at run
 * time (no algorithm, unsupported combination): the caller may fall back to
 * another library.  BAD_ARG: a plan that is not OK or too small a scratch. */
fp8mix_status fp8mix_cuda_scaled_mm(const fp8mix_cuda_scaled_mm_args *args, cudaStream_t stream);

/* out[i, j] = round_to_out_t(acc[i, j] + bias[j]) in float32 (one rounding).
 * acc float32 rows x cols (ld_acc); bias N values of bias_t (widened exactly);
 * out may alias acc when out_t is F32 and ld_out == ld_acc. */
fp8mix_status fp8mix_cuda_bias_add(const float *acc, int64_t rows, int64_t cols, int64_t ld_acc, const void *bias,
                                   fp8mix_dtype bias_t, void *out, fp8mix_dtype out_t, int64_t ld_out,
                                   cudaStream_t stream);

/* ---- quantisation statistics --------------------------------------------------- */

/* fp8mix_quant_stats on the device: out (device, FP8MIX_STATS_N doubles) gets the
 * same 84 entries with the same bits: counts exact, and the float64 sums added in
 * fp8mix.h's documented order (tasks of rows, 16 lane partials, the fixed tree, tasks
 * in order), one thread per (task, lane).  bad_scale_as_one as fp8mix_stats_opts;
 * without it a scale_inv entry that is not finite and > 0 sets scale_status
 * (see "Conventions") instead of failing.  work: device scratch of
 * fp8mix_cuda_quant_stats_work_bytes() bytes, 8-byte aligned.  Launches: 2 (a
 * one-block kernel finding the pivot and zeroing the accumulators; the task kernel,
 * whose last block adds the task sums in order and writes out). */
size_t fp8mix_cuda_quant_stats_work_bytes(void);
fp8mix_status fp8mix_cuda_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols, int64_t ld_x,
                                      const uint8_t *q, int64_t ld_q, fp8mix_format fmt, fp8mix_granularity gran,
                                      const float *scale_inv, int bad_scale_as_one, double *out, void *work,
                                      int *scale_status, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* FP8MIX_CUDA_H */
