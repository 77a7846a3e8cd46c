/*
 * stats.cu — what a cast lost, on the device (fp8mix_cuda_quant_stats): the
 * counts and error energies of csrc/core/stats.c with the same definitions, so
 * that the gradient scaler's feedback needs no device-to-host copy of the tensors
 * (only of the ten results, when the caller wants them on the host).
 *
 * Two kernels: stats_partial_kernel (a fixed grid of at most kStatsBlocks blocks,
 * each reducing a grid-stride share of the elements to one partial in a fixed
 * tree order) and stats_final_kernel (one thread adds the partials in block
 * order).  Counts are exact integers; the float64 sums differ from the CPU's only
 * by summation order; the grid depends only on the size, so every run gives the
 * same doubles.  Every float64 operation is an explicit _rn intrinsic (nvcc would
 * otherwise contract x*x + s into an FMA).
 * Not here: the casts whose result is measured (cast.cu, quantize.cu).
 */
#include <cstring>

#include "encode.cuh"

namespace fp8mix_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kStatsBlocks = 256;
constexpr int kCounts = 6; /* nonzero, underflow, saturated, nonfinite, overflow, subnormal */

struct Partial {
    unsigned long long c[kCounts];
    double sig, err;
    float mn;
};

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
    int *scale_status;
    float fmax, min_normal;
    double ovf_bound; /* 464 or 59392: max + half a step, in FP8 units */
};

/* Running sums of one thread (the fields of stats.c's stats_acc). */
struct Acc {
    unsigned long long c[kCounts];
    double sig, err;
    float mn;
};

/* One element, exactly stats.c's stats_seg step. */
__device__ __forceinline__ void stats_one(Acc &a, float x, uint8_t qb, const StatsArgs &S, float sif)
{
    const float ax = fabsf(x), d = fp8_decode(qb, S.fmt), ad = fabsf(d);
    const double si = (double)sif;
    a.c[0] += x != 0.0f;
    if (!(ax <= 3.40282346638528859812e+38f)) { /* NaN or inf */
        a.c[3]++;
        return;
    }
    a.c[1] += (x != 0.0f) & (d == 0.0f);
    a.c[2] += ad == S.fmax;
    a.c[5] += (ad != 0.0f) & (ad < S.min_normal);
    a.c[4] += (double)ax > __dmul_rn(S.ovf_bound, si);
    if (x != 0.0f && ax < a.mn) a.mn = ax;
    a.sig = __dadd_rn(a.sig, __dmul_rn((double)x, (double)x));
    if (ad <= 3.40282346638528859812e+38f) {
        const double e = __dsub_rn((double)x, __dmul_rn((double)d, si));
        a.err = __dadd_rn(a.err, __dmul_rn(e, e));
    }
}

__global__ void __launch_bounds__(kThreads) stats_partial_kernel(StatsArgs S, Partial *part)
{
    __shared__ Acc sh[kThreads];
    Acc a;
    for (int k = 0; k < kCounts; k++) a.c[k] = 0;
    a.sig = a.err = 0.0;
    a.mn = __int_as_float(0x7F800000); /* +inf */
    const int64_t ne = S.rows * S.cols, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < ne; e += stride) {
        const int64_t i = e / S.cols, j = e - i * S.cols;
        const float x = load_hp(S.x + (size_t)(i * S.ld_x) * (S.xt == FP8MIX_F32 ? 4 : 2), S.xt, j);
        const float si = S.scale_inv[scale_tile(S.gran, i, j, S.nbc)];
        if (!scale_ok(si) && S.scale_status) *S.scale_status = FP8MIX_ERR_BAD_SCALE;
        stats_one(a, x, S.q[i * S.ld_q + j], S, si);
    }
    sh[threadIdx.x] = a;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w >>= 1) { /* fixed tree order */
        if (threadIdx.x < w) {
            Acc &l = sh[threadIdx.x];
            const Acc &r = sh[threadIdx.x + w];
            for (int k = 0; k < kCounts; k++) l.c[k] += r.c[k];
            l.sig = __dadd_rn(l.sig, r.sig);
            l.err = __dadd_rn(l.err, r.err);
            l.mn = r.mn < l.mn ? r.mn : l.mn;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        Partial &p = part[blockIdx.x];
        for (int k = 0; k < kCounts; k++) p.c[k] = sh[0].c[k];
        p.sig = sh[0].sig;
        p.err = sh[0].err;
        p.mn = sh[0].mn;
    }
}

__global__ void stats_final_kernel(const Partial *part, int nblocks, int64_t numel, double *out)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    unsigned long long c[kCounts] = {0, 0, 0, 0, 0, 0};
    double sig = 0.0, err = 0.0;
    float mn = __int_as_float(0x7F800000);
    for (int b = 0; b < nblocks; b++) {
        for (int k = 0; k < kCounts; k++) c[k] += part[b].c[k];
        sig = __dadd_rn(sig, part[b].sig);
        err = __dadd_rn(err, part[b].err);
        mn = part[b].mn < mn ? part[b].mn : mn;
    }
    out[FP8MIX_STATS_NUMEL] = (double)numel;
    out[FP8MIX_STATS_NONZERO] = (double)c[0];
    out[FP8MIX_STATS_UNDERFLOW] = (double)c[1];
    out[FP8MIX_STATS_SATURATED] = (double)c[2];
    out[FP8MIX_STATS_NONFINITE] = (double)c[3];
    out[FP8MIX_STATS_OVERFLOW] = (double)c[4];
    out[FP8MIX_STATS_SUBNORMAL] = (double)c[5];
    out[FP8MIX_STATS_SIGNAL] = sig;
    out[FP8MIX_STATS_NOISE] = err;
    out[FP8MIX_STATS_MIN_NONZERO] = (double)mn;
}

bool bad_2d(int64_t rows, int64_t cols, int64_t ld)
{
    return rows < 0 || cols < 0 || ld < cols || (rows > 0 && ld < 1) ||
           (cols > 0 && rows > INT64_MAX / (ld > 0 ? ld : 1));
}

} // namespace
} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" size_t fp8mix_cuda_quant_stats_work_bytes(void) { return (size_t)kStatsBlocks * sizeof(Partial); }

extern "C" fp8mix_status fp8mix_cuda_quant_stats(const void *x, fp8mix_dtype xt, int64_t rows, int64_t cols,
                                                 int64_t ld_x, const uint8_t *q, int64_t ld_q, fp8mix_format fmt,
                                                 fp8mix_granularity gran, const float *scale_inv, double *out,
                                                 void *work, int *scale_status, cudaStream_t stream)
{
    begin_call();
    if (!out || !work) return FP8MIX_ERR_NULL_POINTER;
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || (xt != FP8MIX_F32 && xt != FP8MIX_BF16 && xt != FP8MIX_F16) ||
        gran < FP8MIX_GRAN_TENSOR || gran > FP8MIX_GRAN_BLOCK2D)
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_x) || bad_2d(rows, cols, ld_q)) return FP8MIX_ERR_BAD_SHAPE;
    const int64_t ne = rows * cols;
    if (ne > 0 && (!x || !q || !scale_inv)) return FP8MIX_ERR_NULL_POINTER;
    Partial *part = (Partial *)work;
    int nblocks = 0;
    if (ne > 0) {
        StatsArgs S;
        memset(&S, 0, sizeof S);
        S.x = (const uint8_t *)x; S.xt = xt; S.rows = rows; S.cols = cols; S.ld_x = ld_x;
        S.q = q; S.ld_q = ld_q; S.fmt = fmt; S.gran = gran; S.nbc = (cols + FP8MIX_BLOCK - 1) / FP8MIX_BLOCK;
        S.scale_inv = scale_inv; S.scale_status = scale_status;
        S.fmax = format_max(fmt);
        S.min_normal = fmt == FP8MIX_E4M3 ? 0x1p-6f : 0x1p-14f;
        S.ovf_bound = fmt == FP8MIX_E4M3 ? 464.0 : 59392.0;
        nblocks = (int)grid_for(ne, 8192, kStatsBlocks);
        stats_partial_kernel<<<nblocks, kThreads, 0, stream>>>(S, part);
        fp8mix_status st = check_launch("fp8mix_cuda_quant_stats (partials)");
        if (st) return st;
    }
    stats_final_kernel<<<1, 32, 0, stream>>>(part, nblocks, ne, out);
    return check_launch("fp8mix_cuda_quant_stats (sum)");
}
