/*
 * stats.cu — what a cast lost, and what the tensor looked like, on the device
 * (fp8mix_cuda_quant_stats): fp8mix_quant_stats' 84 entries with its definitions and
 * its fixed summation order, so that the float64 sums are bit-identical to the
 * CPU's, not only the counts.  The per-element rules and the lane tree are
 * stats_rules.cuh's (host+device, checked against the C core on the CPU).
 *
 * The order (fp8mix.h): rows in tasks of stats_rows_per_task(rows) consecutive rows;
 * in a task, element (i, j) adds to lane partial j mod 16, row by row, left to right;
 * a task's sums are the fixed tree over its 16 partials; the task sums are added in
 * task order.  On the device one thread is one (task, lane): it visits exactly that
 * lane's elements in that order, so each partial is the CPU's, bit for bit.
 *
 * Kernels (256 threads per block):
 *   stats_pivot_kernel  one block: zeroes the accumulators, finds the first finite x
 *                       in row-major order (the pivot of the power sums)
 *   stats_task_kernel   16 tasks per block; counts, histogram and min / max bits are
 *                       integers (atomics, any order); each task's 6 sums go to the
 *                       work buffer; the last block to finish adds them in task order,
 *                       summarises scale_inv and writes the 84 entries
 * Not here: the casts whose result is measured (cast.cu, quantize.cu).
 */
#include <cstring>

#include "encode.cuh"
#include "stats_rules.cuh"

namespace fp8mix_cuda {
namespace {

constexpr int kThreads = kRecipeThreads;
constexpr float kFltMax = 3.40282346638528859812e+38f;

struct StatsArgs {
    const uint8_t *x;
    fp8mix_dtype xt;
    int64_t rows, cols, ld_x;
    const uint8_t *q;
    int64_t ld_q;
    fp8mix_format fmt;
    fp8mix_granularity gran;
    int64_t nbc;
    const float *scale_inv;
    int64_t nscale;
    int bad_as_one;
    int *scale_status;
    int64_t ntasks, per;
    StatsWork *work;
    double *out;
};

__device__ __forceinline__ float x_at(const StatsArgs &S, int64_t i, int64_t j)
{
    return load_hp(S.x + (size_t)(i * S.ld_x) * (S.xt == FP8MIX_F32 ? 4 : 2), S.xt, j);
}

__device__ __forceinline__ bool finite_f(float v) { return (f32_bits(v) & 0x7FFFFFFFu) < 0x7F800000u; }

__global__ void __launch_bounds__(kThreads) stats_pivot_kernel(StatsArgs S)
{
    __shared__ unsigned long long best;
    StatsWork *W = S.work;
    for (int k = threadIdx.x; k < kStatsCounts; k += blockDim.x) W->count[k] = 0ull;
    for (int k = threadIdx.x; k < FP8MIX_STATS_HIST_BINS; k += blockDim.x) W->hist[k] = 0ull;
    if (threadIdx.x == 0) {
        W->min_bits = 0x7F800000u;
        W->max_bits = 0u;
        W->done = 0u;
        best = ~0ull;
    }
    __syncthreads();
    const int64_t ne = S.rows * S.cols;
    for (int64_t base = 0; base < ne; base += blockDim.x) { /* normally ends at once: x[0] is finite */
        const int64_t e = base + threadIdx.x;
        const bool fin = e < ne && finite_f(x_at(S, e / S.cols, e % S.cols));
        if (fin) atomicMin(&best, (unsigned long long)e);
        if (__syncthreads_or(fin)) break;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        W->pivot = best == ~0ull ? 0.0f : x_at(S, (int64_t)(best / S.cols), (int64_t)(best % S.cols));
}

/* The scale_inv entries' summary: bad count, min and max of the good ones (block). */
__device__ void scale_summary(const StatsArgs &S, double *bad_out, float *lo_out, float *hi_out)
{
    __shared__ unsigned long long bad;
    __shared__ float lo[kThreads], hi[kThreads];
    if (threadIdx.x == 0) bad = 0ull;
    __syncthreads();
    unsigned long long b = 0;
    float l = __int_as_float(0x7F800000), h = 0.0f;
    for (int64_t k = threadIdx.x; k < S.nscale; k += blockDim.x) {
        const float v = S.scale_inv[k];
        if (!(v > 0.0f && v <= kFltMax)) {
            b++;
            continue;
        }
        l = v < l ? v : l;
        h = v > h ? v : h;
    }
    if (b) atomicAdd(&bad, b);
    lo[threadIdx.x] = l;
    hi[threadIdx.x] = h;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w) {
            lo[threadIdx.x] = lo[threadIdx.x + w] < lo[threadIdx.x] ? lo[threadIdx.x + w] : lo[threadIdx.x];
            hi[threadIdx.x] = hi[threadIdx.x + w] > hi[threadIdx.x] ? hi[threadIdx.x + w] : hi[threadIdx.x];
        }
        __syncthreads();
    }
    *bad_out = (double)bad;
    *lo_out = lo[0];
    *hi_out = hi[0];
}

/* The last block: task sums in task order, then every entry of the output. */
__device__ void stats_final(const StatsArgs &S)
{
    __shared__ double sums[kStatsSums];
    const StatsWork *W = S.work;
    if (threadIdx.x < kStatsSums) {
        double r = 0.0;
        for (int64_t t = 0; t < S.ntasks; t++) r = d_add(r, __ldcg(&W->task[t][threadIdx.x]));
        sums[threadIdx.x] = r;
    }
    double bad;
    float lo, hi;
    scale_summary(S, &bad, &lo, &hi); /* synchronises the block */
    if (!S.bad_as_one && bad > 0.0 && S.scale_status && threadIdx.x == 0) *S.scale_status = FP8MIX_ERR_BAD_SCALE;
    double *out = S.out;
    for (int k = threadIdx.x; k < FP8MIX_STATS_N; k += blockDim.x) out[k] = 0.0;
    __syncthreads();
    if (threadIdx.x < FP8MIX_STATS_HIST_BINS)
        out[FP8MIX_STATS_HIST + threadIdx.x] = (double)__ldcg(&W->hist[threadIdx.x]);
    if (threadIdx.x == 0) {
        out[FP8MIX_STATS_NUMEL] = (double)(S.rows * S.cols);
        for (int k = 0; k < kStatsCounts; k++) out[stats_count_entry(k)] = (double)__ldcg(&W->count[k]);
        for (int k = 0; k < kStatsSums; k++) out[stats_sum_entry(k)] = sums[k];
        out[FP8MIX_STATS_MIN_NONZERO] = (double)bits_f32(__ldcg(&W->min_bits));
        out[FP8MIX_STATS_MAX_FINITE] = (double)bits_f32(__ldcg(&W->max_bits));
        out[FP8MIX_STATS_PIVOT] = (double)__ldcg(&W->pivot);
        out[FP8MIX_STATS_BAD_SCALES] = bad;
        out[FP8MIX_STATS_SCALE_INV_MIN] = (double)lo;
        out[FP8MIX_STATS_SCALE_INV_MAX] = (double)hi;
    }
}

/* One (task, lane): its elements in the documented order. */
__device__ void lane_pass(const StatsArgs &S, int64_t task, int lane, StatsLane &a,
                          unsigned long long (&hist)[FP8MIX_STATS_HIST_BINS])
{
    const float pivot = __ldcg(&S.work->pivot);
    const int64_t r0 = task * S.per, r1 = r0 + S.per < S.rows ? r0 + S.per : S.rows;
    StatsSeg seg;
    stats_seg(seg, S.fmt, 1.0f, pivot);
    float seg_si = __int_as_float(0x7FC00000); /* NaN: no segment yet */
    for (int64_t i = r0; i < r1; i++)
        for (int64_t j = lane; j < S.cols; j += kStatsLanes) {
            float si = S.scale_inv[scale_tile(S.gran, i, j, S.nbc)];
            if (S.bad_as_one && !(si > 0.0f && si <= kFltMax)) si = 1.0f;
            if (!(si == seg_si)) {
                stats_seg(seg, S.fmt, si, pivot);
                seg_si = si;
            }
            const int bin = stats_elem(a, x_at(S, i, j), fp8_decode(S.q[i * S.ld_q + j], S.fmt), seg);
            if (bin >= 0) atomicAdd(&hist[bin], 1ull);
        }
}

__global__ void __launch_bounds__(kThreads) stats_task_kernel(StatsArgs S)
{
    __shared__ unsigned long long hist[FP8MIX_STATS_HIST_BINS], cnt[kStatsCounts];
    __shared__ uint32_t smin, smax;
    __shared__ double part[kStatsSums][kThreads];
    __shared__ int last;
    for (int k = threadIdx.x; k < FP8MIX_STATS_HIST_BINS; k += blockDim.x) hist[k] = 0ull;
    if (threadIdx.x < kStatsCounts) cnt[threadIdx.x] = 0ull;
    if (threadIdx.x == 0) {
        smin = 0x7F800000u;
        smax = 0u;
    }
    __syncthreads();
    const int64_t task = (int64_t)blockIdx.x * kStatsTasksPerBlock + threadIdx.x / kStatsLanes;
    const int lane = threadIdx.x % kStatsLanes;
    StatsLane a;
    stats_lane_init(a);
    if (task < S.ntasks) lane_pass(S, task, lane, a, hist);
    for (int k = 0; k < kStatsSums; k++) part[k][threadIdx.x] = a.sum[k];
    for (int k = 0; k < kStatsCounts; k++)
        if (a.count[k]) atomicAdd(&cnt[k], a.count[k]);
    atomicMin(&smin, a.min_bits);
    atomicMax(&smax, a.max_bits);
    __syncthreads();
    StatsWork *W = S.work;
    if (task < S.ntasks && lane == 0)
        for (int k = 0; k < kStatsSums; k++) W->task[task][k] = stats_tree(&part[k][threadIdx.x], 1);
    if (threadIdx.x < FP8MIX_STATS_HIST_BINS && hist[threadIdx.x]) atomicAdd(&W->hist[threadIdx.x], hist[threadIdx.x]);
    if (threadIdx.x < kStatsCounts && cnt[threadIdx.x]) atomicAdd(&W->count[threadIdx.x], cnt[threadIdx.x]);
    if (threadIdx.x == 0) {
        atomicMin(&W->min_bits, smin);
        atomicMax(&W->max_bits, smax);
    }
    __threadfence(); /* this block's task sums and atomics before its ticket */
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&W->done, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    stats_final(S);
}

bool bad_2d(int64_t rows, int64_t cols, int64_t ld)
{
    return rows < 0 || cols < 0 || ld < cols || (rows > 0 && ld < 1) ||
           (cols > 0 && rows > INT64_MAX / (ld > 0 ? ld : 1));
}

int64_t scale_entries(fp8mix_granularity g, int64_t rows, int64_t cols)
{
    const int64_t nbc = (cols + FP8MIX_BLOCK - 1) / FP8MIX_BLOCK;
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return 1;
    case FP8MIX_GRAN_ROW: return rows;
    case FP8MIX_GRAN_BLOCK: return rows * nbc;
    default: return ((rows + FP8MIX_BLOCK - 1) / FP8MIX_BLOCK) * nbc;
    }
}

} // namespace
} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" size_t fp8mix_cuda_quant_stats_work_bytes(void) { return sizeof(StatsWork); }

extern "C" fp8mix_status fp8mix_cuda_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                                 int64_t ld_x, const uint8_t *q, int64_t ld_q, fp8mix_format fmt,
                                                 fp8mix_granularity gran, const float *scale_inv, int bad_scale_as_one,
                                                 double *out, void *work, int *scale_status, cudaStream_t stream)
{
    begin_call();
    if (!out || !work) return FP8MIX_ERR_NULL_POINTER;
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || (xt != FP8MIX_F32 && xt != FP8MIX_BF16 && xt != FP8MIX_F16) ||
        gran < FP8MIX_GRAN_TENSOR || gran > FP8MIX_GRAN_BLOCK2D)
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x) || bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    const bool empty = rows == 0 || cols == 0;
    if (!empty && (!x || !q || !scale_inv)) return FP8MIX_ERR_NULL_POINTER;
    if (((uintptr_t)work & 7u) != 0) return FP8MIX_ERR_BAD_ARG;
    StatsArgs S;
    memset(&S, 0, sizeof S);
    S.x = (const uint8_t *)x; S.xt = xt; S.rows = rows; S.cols = cols; S.ld_x = ld_x;
    S.q = q; S.ld_q = ld_q; S.fmt = fmt; S.gran = gran; S.nbc = (cols + FP8MIX_BLOCK - 1) / FP8MIX_BLOCK;
    S.scale_inv = scale_inv;
    S.nscale = empty ? 0 : scale_entries(gran, rows, cols);
    S.bad_as_one = bad_scale_as_one ? 1 : 0;
    S.scale_status = scale_status;
    S.per = stats_rows_per_task(rows);
    S.ntasks = stats_tasks(rows, cols);
    S.work = (StatsWork *)work;
    S.out = out;
    stats_pivot_kernel<<<1, kThreads, 0, stream>>>(S);
    fp8mix_status st = check_launch("fp8mix_cuda_quant_stats (pivot)");
    if (st) return st;
    const unsigned grid = (unsigned)(S.ntasks > 0 ? ceil_div64(S.ntasks, kStatsTasksPerBlock) : 1);
    stats_task_kernel<<<grid, kThreads, 0, stream>>>(S);
    return check_launch("fp8mix_cuda_quant_stats (tasks)");
}
