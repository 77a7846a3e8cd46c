/*
 * recipe.cu — the per-tensor recipes on the device: a linear layer's delayed-scaling
 * state (record, rescale, the pending-gradient flush) and its casts (the delayed
 * forward cast, the gradient cast with the bias gradient's column sums), plus the
 * whole-tensor current-scaling cast of quantize.cu.  Same contracts and bits as
 * csrc/core/recipe.c; the number rules are fp8_rules.h's; the host checks and grid
 * sizes are recipe_plan.h's.  Nothing syncs with the host: every state value is read
 * by the kernels.
 *
 * Kernels (kRecipeThreads = 256 per block):
 *   prepass_kernel     zeroes the cast's accumulators (block 0), then, when this cast
 *                      needs the tensor's own amax before casting (current scaling, a
 *                      role's first use, a fresh gradient plan), writes one partial
 *                      max per block; otherwise it exits at once
 *   state_cast_kernel  blocks [0, ncolsum): column sums, one thread per column, rows
 *                      in order; blocks after: the cast (cast_body.cuh) with the scale
 *                      each block derives from the state / plan / partials, amax by
 *                      atomicMax; the last cast block to finish (a counter) writes the
 *                      scales and amax and updates the state (record / pending max)
 *   record_kernel      one block: fp8mix_delayed_record or _rescale
 *   flush_kernel       one block: fp8mix_delayed_flush (records in ring order)
 * A record (block_record) rolls the role's history down one row with the block's
 * threads (top chunk first, so no value is overwritten before it is read), reduces
 * the max, then thread 0 applies fp8r_delayed_scale.
 * Not here: the given-scale casts (cast.cu), per-tile current scaling (quantize.cu).
 */
#include "cast_body.cuh"
#include "recipe_plan.h"

namespace fp8mix_cuda {
namespace {

static_assert(kRecipeThreads == kThreads, "the cast bodies assume 256-thread blocks");

enum StateMode { MODE_DELAYED = 0, MODE_GRAD = 1, MODE_CURRENT = 2 };
enum CastPath { PATH_VEC = 0, PATH_SCALAR = 1, PATH_TRANSPOSE = 2 };

/* Everything the pre-pass and the state cast read (passed by value). */
struct StateArgs {
    CastArgs c;                  /* the cast: one per-tensor scale */
    int mode;                    /* StateMode */
    /* delayed */
    fp8mix_delayed_state st;     /* device pointers */
    int64_t role;
    fp8mix_delayed_recipe r;
    const float *fresh;          /* device float or NULL */
    int record;
    float *scales_out;           /* [scale, scale_inv] */
    /* gradient */
    const float *plan;           /* [scale, fresh] or NULL */
    float *pending;              /* ring or NULL */
    int64_t slots;
    const int64_t *slot;
    float *colsum;
    /* gradient / current */
    float *scale_inv_out;
    /* every mode */
    float *amax_out;             /* or NULL */
    RecipeWork *work;
    int *status;                 /* device-side errors, or NULL */
    int nprepass, ncolsum, ncast;
    int path;                    /* CastPath */
    int vec_x, vec_q, vec_qt;    /* transpose path's vector flags */
    int prepass_vec;             /* the pre-pass reads 16-byte units */
};

__device__ __forceinline__ void flag(int *status, fp8mix_status s)
{
    if (status) *status = (int)s;
}

/* Whether the cast needs the tensor's own amax first (the same answer in the
 * pre-pass and in every cast block: the values it reads change only in the cast's
 * last block, after all blocks have read them). */
__device__ __forceinline__ bool needs_prepass(const StateArgs &S)
{
    if (S.mode == MODE_CURRENT) return true;
    if (S.mode == MODE_GRAD) return !(S.plan && S.plan[1] == 0.0f);
    return S.st.steps[S.role] == 0 && !S.fresh;
}

/* ---- block reductions (every thread of the block calls; all get the result) ---- */
__device__ __forceinline__ uint32_t block_max_u32(uint32_t m)
{
    __shared__ uint32_t part[kRecipeThreads / 32];
    __shared__ uint32_t res;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    m = warp_max_u32(m);
    if (lane == 0) part[warp] = m;
    __syncthreads();
    if (warp == 0) {
        m = lane < (int)(blockDim.x >> 5) ? part[lane] : 0u;
        m = warp_max_u32(m);
        if (lane == 0) res = m;
    }
    __syncthreads();
    return res;
}

/* max over the block of values a >= +0 that were each reduced with `if (v > a) a = v`
 * from +0 (so NaN never enters): the C core's history max, in any order. */
__device__ __forceinline__ float block_max_nonneg(float a)
{
    __shared__ float part[kRecipeThreads];
    part[threadIdx.x] = a;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w && part[threadIdx.x + w] > part[threadIdx.x]) part[threadIdx.x] = part[threadIdx.x + w];
        __syncthreads();
    }
    const float r = part[0];
    __syncthreads();
    return r;
}

/* ---- the state ------------------------------------------------------------------- */

/* Rows [0, L) of a history column (stride R) move down one row; the last is dropped. */
__device__ void roll_down(float *h, int64_t R, int64_t L)
{
    constexpr int V = 4;
    const int64_t nt = blockDim.x, chunk = nt * V;
    for (int64_t base = ((L - 1) / chunk) * chunk; base >= 0; base -= chunk) {
        float v[V];
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int64_t k = base + u * nt + threadIdx.x;
            v[u] = (k >= 1 && k < L) ? h[(k - 1) * R] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < V; u++) {
            const int64_t k = base + u * nt + threadIdx.x;
            if (k >= 1 && k < L) h[k * R] = v[u];
        }
        __syncthreads();
    }
}

/* max of rows [0, L) (MAX) or row 0 (MOST_RECENT), as recipe.c's history_amax. */
__device__ float history_amax(const float *h, int64_t R, const fp8mix_delayed_recipe &r)
{
    if (r.algo == FP8MIX_AMAX_MOST_RECENT) return h[0];
    float a = 0.0f;
    for (int64_t k = threadIdx.x; k < r.history_len; k += blockDim.x)
        if (h[k * R] > a) a = h[k * R]; /* NaN from a foreign checkpoint: skipped */
    return block_max_nonneg(a);
}

/* fp8mix_delayed_record with the block's threads. */
__device__ void block_record(const fp8mix_delayed_state &st, int64_t role, const fp8mix_delayed_recipe &r,
                             float fmax, float amax)
{
    const float v = fp8r_history_value(amax);
    float *h = st.history + role;
    roll_down(h, st.roles, r.history_len);
    if (threadIdx.x == 0) h[0] = v;
    __syncthreads();
    const float a = history_amax(h, st.roles, r);
    if (threadIdx.x == 0) {
        const int64_t steps = st.steps[role] + 1;
        st.steps[role] = steps;
        st.scale[role] = fp8r_delayed_scale(st.scale[role], steps, v, a, r.interval, fmax, r.margin, r.pow2);
    }
    __syncthreads();
}

/* ---- the pre-pass ---------------------------------------------------------------- */
template <int XT>
__global__ void __launch_bounds__(kRecipeThreads) prepass_kernel(StateArgs S)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        S.work->acc = 0u;
        S.work->done = 0u;
    }
    if (!needs_prepass(S)) return; /* uniform: every thread reads the same state */
    const CastArgs &A = S.c;
    const int64_t first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, stride = (int64_t)gridDim.x * blockDim.x;
    const uint32_t m = block_max_u32(amax_body<XT>(A.x, A.rows, A.cols, A.ld_x, S.prepass_vec, first, stride));
    if (threadIdx.x == 0) S.work->partial[blockIdx.x] = canon_amax_bits(m);
}

/* ---- the state cast ---------------------------------------------------------------- */

/* The cast's scale, the same in every block (block-uniform control flow). */
__device__ float state_scale(const StateArgs &S)
{
    const bool need = needs_prepass(S);
    float a0 = 0.0f;
    if (need) {
        uint32_t m = 0;
        for (int k = threadIdx.x; k < S.nprepass; k += blockDim.x) m = max(m, S.work->partial[k]);
        a0 = bits_f32(block_max_u32(m));
    }
    const CastArgs &A = S.c;
    float s;
    if (S.mode == MODE_DELAYED) {
        if (S.st.steps[S.role] != 0) s = S.st.scale[S.role];
        else s = compute_scale_one(S.fresh ? *S.fresh : a0, A.fmax, S.r.margin, S.r.pow2, 0.0f);
    } else if (S.mode == MODE_GRAD && !need) {
        s = S.plan[0];
    } else {
        s = compute_scale_one(a0, A.fmax, A.margin, A.pow2, A.eps);
    }
    if (!scale_ok(s) && threadIdx.x == 0 && blockIdx.x == (unsigned)S.ncolsum) flag(S.status, FP8MIX_ERR_BAD_SCALE);
    return s;
}

/* colsum[j] = sum of column j over rows 0, 1, ... in float32 (the C core's order),
 * one thread per column; loads run ahead of the additions in batches. */
template <int XT>
__device__ void colsum_body(const StateArgs &S, int64_t blk)
{
    using L = In<XT>;
    constexpr int P = 32;
    const CastArgs &A = S.c;
    const int64_t j = blk * blockDim.x + threadIdx.x;
    if (j >= A.cols) return;
    const uint8_t *p = A.x + (size_t)j * L::size;
    const size_t rs = (size_t)A.ld_x * L::size;
    float s = 0.0f;
    int64_t i = 0;
    for (; i + P <= A.rows; i += P) {
        float v[P];
#pragma unroll
        for (int k = 0; k < P; k++) v[k] = L::one(p + (size_t)(i + k) * rs, 0);
#pragma unroll
        for (int k = 0; k < P; k++) s = __fadd_rn(s, v[k]);
    }
    for (; i < A.rows; i++) s = __fadd_rn(s, L::one(p + (size_t)i * rs, 0));
    S.colsum[j] = s;
}

/* What the last cast block writes: outputs, then the state. */
__device__ void state_epilogue(const StateArgs &S, float s, float a)
{
    if (threadIdx.x == 0) {
        if (S.amax_out) *S.amax_out = a;
        if (S.mode == MODE_DELAYED) {
            S.scales_out[0] = s;
            S.scales_out[1] = __frcp_rn(s);
        } else {
            *S.scale_inv_out = __frcp_rn(s);
        }
        if (S.mode == MODE_GRAD && S.pending) {
            const int64_t k = *S.slot;
            if (k >= 0 && k < S.slots) {
                const float v = fp8r_history_value(a);
                if (!(S.pending[k] >= v)) S.pending[k] = v; /* an empty slot (-1) or a smaller amax */
            } else {
                flag(S.status, FP8MIX_ERR_BAD_ARG);
            }
        }
    }
    if (S.mode == MODE_DELAYED && S.record) block_record(S.st, S.role, S.r, S.c.fmax, a);
}

template <int XT, bool STOCH>
__global__ void __launch_bounds__(kRecipeThreads) state_cast_kernel(StateArgs S)
{
    __shared__ __align__(16) uint8_t tile[kTile * kPitch];
    __shared__ int last;
    if ((int)blockIdx.x < S.ncolsum) { /* uniform per block */
        colsum_body<XT>(S, blockIdx.x);
        return;
    }
    const int64_t b = (int64_t)blockIdx.x - S.ncolsum, nb = S.ncast, nt = blockDim.x;
    const float s = state_scale(S);
    const FixedScale fs{s};
    const CastArgs &A = S.c;
    uint32_t m;
    if (S.path == PATH_VEC) m = rows_vec_body<XT, STOCH>(A, fs, b * nt + threadIdx.x, nb * nt);
    else if (S.path == PATH_SCALAR) m = rows_scalar_body<XT>(A, fs, b * nt + threadIdx.x, nb * nt);
    else m = transpose_body<XT, STOCH>(A, fs, S.vec_x, S.vec_q, S.vec_qt, b, nb, tile);
    block_amax_commit(m, &S.work->acc); /* thread 0 commits last, then takes the ticket */
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&S.work->done, 1u) == (unsigned)(nb - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float a = bits_f32(atomicOr(&S.work->acc, 0u)); /* every block's max is in */
    state_epilogue(S, s, a);
}

/* ---- the one-block state kernels -------------------------------------------------- */
struct RecordArgs {
    fp8mix_delayed_state st;
    int64_t role;
    fp8mix_delayed_recipe r;
    float fmax;
    const float *amax;
    int rescale_only;
    /* flush */
    float *pending;
    int64_t slots;
    int64_t *next_slot;
    int record, reserve;
    float *plan;
    int64_t *reserved;
};

__global__ void __launch_bounds__(kRecipeThreads) record_kernel(RecordArgs R)
{
    if (!R.rescale_only) {
        block_record(R.st, R.role, R.r, R.fmax, *R.amax);
        return;
    }
    const float a = history_amax(R.st.history + R.role, R.st.roles, R.r);
    const uint32_t ab = f32_bits(a) & 0x7FFFFFFFu;
    if (threadIdx.x == 0 && a > 0.0f && ab < 0x7F800000u)
        R.st.scale[R.role] = fp8r_scale_from_amax(a, R.fmax, R.r.margin, R.r.pow2, 0.0f);
}

__global__ void __launch_bounds__(kRecipeThreads) flush_kernel(RecordArgs R)
{
    __shared__ int64_t head_s;
    __shared__ float p_s;
    if (threadIdx.x == 0) {
        const int64_t h = *R.next_slot;
        head_s = (h < 0 || h >= R.slots) ? 0 : h; /* a foreign or corrupted checkpoint: restart the ring */
    }
    __syncthreads();
    const int64_t head = head_s;
    if (R.record)
        for (int64_t t = 0; t < R.slots; t++) {
            const int64_t k = (head + t) % R.slots;
            if (threadIdx.x == 0) p_s = R.pending[k];
            __syncthreads();
            const float p = p_s;
            __syncthreads(); /* p_s is rewritten by the next slot */
            if (p >= 0.0f) { /* filled by a backward (uniform) */
                block_record(R.st, R.role, R.r, R.fmax, p);
                if (threadIdx.x == 0) R.pending[k] = -1.0f;
            }
        }
    if (threadIdx.x == 0) {
        R.plan[0] = R.st.scale[R.role];
        R.plan[1] = R.st.steps[R.role] == 0 ? 1.0f : 0.0f;
        *R.reserved = R.reserve ? head : 0;
        if (R.reserve) *R.next_slot = (head + 1) % R.slots;
    }
}

/* ---- launchers -------------------------------------------------------------------- */

/* Path, grid sizes and vector flags of S's cast (S.c filled). */
void plan_cast(StateArgs &S, fp8mix_dtype xt)
{
    const CastArgs &A = S.c;
    S.prepass_vec = vec_ok_x(A.x, xt, A.cols, A.ld_x);
    S.nprepass = prepass_blocks(S.prepass_vec ? vec_units(A, xt) : A.rows * A.cols);
    if (A.qt) {
        const TransposeVec v = transpose_vec(A, xt);
        S.path = PATH_TRANSPOSE;
        S.vec_x = v.x;
        S.vec_q = v.q;
        S.vec_qt = v.qt;
        S.ncast = cast_blocks(transpose_tiles(A), 1);
    } else if (rows_vec_ok(A, xt)) {
        S.path = PATH_VEC;
        S.ncast = cast_blocks(vec_units(A, xt), kRecipeThreads);
    } else {
        S.path = PATH_SCALAR;
        S.ncast = cast_blocks(A.rows * A.cols, kRecipeThreads);
    }
    S.ncolsum = S.colsum ? colsum_blocks(A.cols) : 0;
}

fp8mix_status launch_state_cast(StateArgs &S, fp8mix_dtype xt, void *work, cudaStream_t st)
{
    S.work = (RecipeWork *)work;
    plan_cast(S, xt);
    const unsigned grid = (unsigned)(S.ncolsum + S.ncast);
    const bool sr = S.c.p.stochastic;
#define FP8MIX_LAUNCH_R(XT)                                                                                         \
    prepass_kernel<XT><<<S.nprepass, kRecipeThreads, 0, st>>>(S);                                                   \
    if (sr) state_cast_kernel<XT, true><<<grid, kRecipeThreads, 0, st>>>(S);                                        \
    else state_cast_kernel<XT, false><<<grid, kRecipeThreads, 0, st>>>(S);
    FP8MIX_DISPATCH_XT(FP8MIX_LAUNCH_R)
#undef FP8MIX_LAUNCH_R
    return check_launch("fp8mix_cuda recipe cast (prepass_kernel, state_cast_kernel)");
}

/* The StateArgs of a cast after cast_prologue's checks. */
StateArgs state_args(const void *x, int64_t rows, int64_t cols, int64_t ld_x, uint8_t *q, int64_t ld_q, uint8_t *qt,
                     int64_t ld_qt, const Fp8Params &p, const fp8mix_cast_opts *opts, const int64_t *rng,
                     uint64_t rng_skip, int mode)
{
    StateArgs S;
    memset(&S, 0, sizeof S);
    S.c = make_args(x, rows, cols, ld_x, FP8MIX_GRAN_TENSOR, p, opts);
    with_rng(S.c, rng, rng_skip);
    S.c.q = q;
    S.c.ld_q = ld_q;
    S.c.qt = qt;
    S.c.ld_qt = ld_qt;
    S.mode = mode;
    return S;
}

} // namespace

/* Whole-tensor current scaling for fp8mix_cuda_quantize_current (A: its checked cast
 * arguments with margin / pow2 / eps; TENSOR granularity). */
fp8mix_status launch_current_tensor(const CastArgs &A, fp8mix_dtype xt, float *scale_inv, float *amax_out, void *work,
                                    cudaStream_t st)
{
    if (!work) return FP8MIX_ERR_NULL_POINTER;
    StateArgs S;
    memset(&S, 0, sizeof S);
    S.c = A;
    S.mode = MODE_CURRENT;
    S.scale_inv_out = scale_inv;
    S.amax_out = amax_out;
    return launch_state_cast(S, xt, work, st);
}

} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

/* ---- entry points ---------------------------------------------------------------------- */

extern "C" size_t fp8mix_cuda_recipe_work_bytes(void) { return sizeof(RecipeWork); }

extern "C" fp8mix_status fp8mix_cuda_cast_delayed(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                                  int64_t ld_x, uint8_t *q, int64_t ld_q, uint8_t *qt, int64_t ld_qt,
                                                  const fp8mix_delayed_state *st, int64_t role,
                                                  const fp8mix_delayed_recipe *r, const float *fresh_amax, int record,
                                                  const fp8mix_cast_opts *opts, const int64_t *rng, uint64_t rng_skip,
                                                  float *scales, float *amax, void *work, int *status,
                                                  cudaStream_t stream)
{
    begin_call();
    if (!opts || !scales || !work) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status s = check_delayed(st, role, opts->fmt, r);
    if (s) return s;
    Fp8Params p;
    if ((s = cast_prologue(x, xt, rows, cols, ld_x, FP8MIX_GRAN_TENSOR, q, ld_q, qt, ld_qt, opts, &p))) return s;
    StateArgs S = state_args(x, rows, cols, ld_x, q, ld_q, qt, ld_qt, p, opts, rng, rng_skip, MODE_DELAYED);
    S.st = *st;
    S.role = role;
    S.r = *r;
    S.fresh = fresh_amax;
    S.record = record ? 1 : 0;
    S.scales_out = scales;
    S.amax_out = amax;
    S.status = status;
    return launch_state_cast(S, xt, work, stream);
}

extern "C" fp8mix_status fp8mix_cuda_cast_grad(const void *dy, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                               int64_t ld, uint8_t *q, int64_t ld_q, uint8_t *qt, int64_t ld_qt,
                                               const float *plan, int margin, int pow2, float amax_epsilon,
                                               float *pending, int64_t slots, const int64_t *slot,
                                               const fp8mix_cast_opts *opts, const int64_t *rng, uint64_t rng_skip,
                                               float *scale_inv, float *amax, float *colsum, void *work, int *status,
                                               cudaStream_t stream)
{
    begin_call();
    if (!opts || !scale_inv || !work) return FP8MIX_ERR_NULL_POINTER;
    fp8mix_status s = check_grad(opts->fmt, margin, amax_epsilon, pending, slots, slot, colsum, rows, cols, dy);
    if (s) return s;
    Fp8Params p;
    if ((s = cast_prologue(dy, xt, rows, cols, ld, FP8MIX_GRAN_TENSOR, q, ld_q, qt, ld_qt, opts, &p))) return s;
    StateArgs S = state_args(dy, rows, cols, ld, q, ld_q, qt, ld_qt, p, opts, rng, rng_skip, MODE_GRAD);
    S.c.margin = margin;
    S.c.pow2 = pow2 ? 1 : 0;
    S.c.eps = amax_epsilon;
    S.plan = plan;
    S.pending = pending;
    S.slots = slots;
    S.slot = slot;
    S.colsum = colsum;
    S.scale_inv_out = scale_inv;
    S.amax_out = amax;
    S.status = status;
    return launch_state_cast(S, xt, work, stream);
}

static RecordArgs record_args(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                              const fp8mix_delayed_recipe *r)
{
    RecordArgs R;
    memset(&R, 0, sizeof R);
    R.st = *st;
    R.role = role;
    R.r = *r;
    R.fmax = format_max(fmt);
    return R;
}

extern "C" fp8mix_status fp8mix_cuda_delayed_record(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                                    const fp8mix_delayed_recipe *r, const float *amax,
                                                    int rescale_only, cudaStream_t stream)
{
    begin_call();
    fp8mix_status s = check_delayed(st, role, fmt, r);
    if (s) return s;
    if (!rescale_only && !amax) return FP8MIX_ERR_NULL_POINTER;
    RecordArgs R = record_args(st, role, fmt, r);
    R.amax = amax;
    R.rescale_only = rescale_only ? 1 : 0;
    record_kernel<<<1, kRecipeThreads, 0, stream>>>(R);
    return check_launch("fp8mix_cuda_delayed_record");
}

extern "C" fp8mix_status fp8mix_cuda_delayed_flush(const fp8mix_delayed_state *st, int64_t role, fp8mix_format fmt,
                                                   const fp8mix_delayed_recipe *r, float *pending, int64_t slots,
                                                   int64_t *next_slot, int record, int reserve, float *plan,
                                                   int64_t *reserved, cudaStream_t stream)
{
    begin_call();
    fp8mix_status s = check_delayed(st, role, fmt, r);
    if (s) return s;
    if (!pending || !next_slot || !plan || !reserved) return FP8MIX_ERR_NULL_POINTER;
    if (slots < 1) return FP8MIX_ERR_BAD_SHAPE;
    if (reserve && !record) return FP8MIX_ERR_BAD_ARG;
    RecordArgs R = record_args(st, role, fmt, r);
    R.pending = pending;
    R.slots = slots;
    R.next_slot = next_slot;
    R.record = record ? 1 : 0;
    R.reserve = reserve ? 1 : 0;
    R.plan = plan;
    R.reserved = reserved;
    flush_kernel<<<1, kRecipeThreads, 0, stream>>>(R);
    return check_launch("fp8mix_cuda_delayed_flush");
}
