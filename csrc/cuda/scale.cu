/*
 * scale.cu — scale arithmetic on the device: compute_scale (elementwise, the
 * rules of fp8mix_compute_scale), the delayed-scaling update of many tensors in
 * one kernel, and the bias add used when cuBLASLt's epilogue cannot take the
 * bias.  Not here: casts (cast.cu), the GEMM (gemm_cublaslt.cu).
 */
#include <cstring>

#include "encode.cuh"

namespace fp8mix_cuda {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) compute_scale_kernel(const float *amax, int64_t n, float fmax, int margin,
                                                                 int pow2, float eps, float *scale, float *scale_inv)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float s = compute_scale_one(amax[i], fmax, margin, pow2, eps);
        if (scale) scale[i] = s;
        if (scale_inv) scale_inv[i] = __frcp_rn(s);
    }
}

/* The entry table travels in the kernel parameters (CUDA >= 12.1 allows 32 KB
 * of parameters on sm_70+; this is ~8 KB). */
struct DelayedBatch {
    fp8mix_cuda_delayed_entry e[FP8MIX_CUDA_DELAYED_PER_LAUNCH];
    int64_t interval;
    int margin, pow2, algo;
};

/* NaN-propagating max (torch.amax semantics). */
__device__ __forceinline__ float nan_max(float m, float v) { return (m != m) ? m : ((v != v || v > m) ? v : m); }

/* One block per entry. */
__global__ void __launch_bounds__(kThreads) delayed_kernel(const DelayedBatch B)
{
    __shared__ float part[kThreads];
    const fp8mix_cuda_delayed_entry &E = B.e[blockIdx.x];
    const int64_t L = E.history_len, st = E.history_stride;
    const float anew = *E.amax;
    /* roll: history[k] = history[k-1], chunks from the top down so that no value
     * is overwritten before it has been read */
    for (int64_t base = ((L - 1) / kThreads) * kThreads; base >= 0; base -= kThreads) {
        const int64_t k = base + threadIdx.x;
        const bool mine = k >= 1 && k < L;
        float v = 0.0f;
        if (mine) v = E.history[(k - 1) * st];
        __syncthreads();
        if (mine) E.history[k * st] = v;
        __syncthreads();
    }
    if (threadIdx.x == 0) E.history[0] = anew;
    __syncthreads();
    float a;
    if (B.algo == FP8MIX_AMAX_MOST_RECENT) {
        a = anew;
    } else {
        float m = -__int_as_float(0x7F800000); /* -inf */
        for (int64_t k = threadIdx.x; k < L; k += kThreads) m = nan_max(m, E.history[k * st]);
        part[threadIdx.x] = m;
        __syncthreads();
        a = part[0];
        for (int k = 1; k < kThreads; k++) a = nan_max(a, part[k]);
    }
    if (threadIdx.x != 0) return;
    const float s = compute_scale_one(a, E.fp8_max, B.margin, B.pow2, 0.0f);
    bool ok = a > 0.0f && (__float_as_uint(a) & 0x7FFFFFFFu) < 0x7F800000u; /* finite and > 0 */
    if (E.steps) {
        const int64_t steps = *E.steps + 1;
        *E.steps = steps;
        if (B.interval > 1) ok = ok && steps % B.interval == 0;
    }
    const float cur = ok ? s : *E.scale;
    *E.scale = cur;
    if (E.scale_inv) *E.scale_inv = __frcp_rn(cur);
}

template <int BT, int OT>
__global__ void __launch_bounds__(kThreads) bias_add_kernel(const float *acc, int64_t rows, int64_t cols,
                                                            int64_t ld_acc, const void *bias, void *out,
                                                            int64_t ld_out)
{
    const int64_t ne = rows * cols, stride = (int64_t)gridDim.x * blockDim.x;
    const size_t osz = OT == FP8MIX_F32 ? 4 : 2;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < ne; e += stride) {
        const int64_t i = e / cols, j = e - i * cols;
        const float b = load_hp(bias, (fp8mix_dtype)BT, j);
        const float y = __fadd_rn(acc[i * ld_acc + j], b);
        store_hp((uint8_t *)out + (size_t)(i * ld_out) * osz, (fp8mix_dtype)OT, j, y);
    }
}

} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" fp8mix_status fp8mix_cuda_compute_scale(const float *amax, int64_t n, fp8mix_format fmt, int margin,
                                                   int pow2, float amax_epsilon, float *scale, float *scale_inv,
                                                   cudaStream_t stream)
{
    begin_call();
    if (n < 0) return FP8MIX_ERR_BAD_SHAPE;
    if (fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) return FP8MIX_ERR_BAD_ENUM;
    if (margin < 0 || margin > 126 || !(amax_epsilon >= 0.0f) || amax_epsilon > 3.40282346638528859812e+38f)
        return FP8MIX_ERR_BAD_ARG;
    if (n == 0 || (!scale && !scale_inv)) return FP8MIX_OK;
    if (!amax) return FP8MIX_ERR_NULL_POINTER;
    compute_scale_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(amax, n, format_max(fmt), margin,
                                                                           pow2 ? 1 : 0, amax_epsilon, scale,
                                                                           scale_inv);
    return check_launch("fp8mix_cuda_compute_scale");
}

extern "C" fp8mix_status fp8mix_cuda_delayed_update(const fp8mix_cuda_delayed_entry *entries, int64_t n, int margin,
                                                    int pow2, fp8mix_amax_algo algo, int64_t interval,
                                                    cudaStream_t stream)
{
    begin_call();
    if (n < 0) return FP8MIX_ERR_BAD_SHAPE;
    if (n == 0) return FP8MIX_OK;
    if (!entries) return FP8MIX_ERR_NULL_POINTER;
    if (algo != FP8MIX_AMAX_MAX && algo != FP8MIX_AMAX_MOST_RECENT) return FP8MIX_ERR_BAD_ENUM;
    if (margin < 0 || margin > 126 || interval < 1) return FP8MIX_ERR_BAD_ARG;
    for (int64_t i = 0; i < n; i++) {
        const fp8mix_cuda_delayed_entry &e = entries[i];
        if (!e.history || !e.amax || !e.scale) return FP8MIX_ERR_NULL_POINTER;
        if (e.history_len < 1 || e.history_stride < 1 || !(e.fp8_max > 0.0f)) return FP8MIX_ERR_BAD_ARG;
    }
    DelayedBatch B;
    memset(&B, 0, sizeof B);
    B.interval = interval;
    B.margin = margin;
    B.pow2 = pow2 ? 1 : 0;
    B.algo = (int)algo;
    for (int64_t i0 = 0; i0 < n; i0 += FP8MIX_CUDA_DELAYED_PER_LAUNCH) {
        const int64_t cnt = n - i0 < FP8MIX_CUDA_DELAYED_PER_LAUNCH ? n - i0 : FP8MIX_CUDA_DELAYED_PER_LAUNCH;
        memcpy(B.e, entries + i0, (size_t)cnt * sizeof *entries);
        delayed_kernel<<<(unsigned)cnt, kThreads, 0, stream>>>(B);
        fp8mix_status st = check_launch("fp8mix_cuda_delayed_update");
        if (st) return st;
    }
    return FP8MIX_OK;
}

extern "C" fp8mix_status fp8mix_cuda_bias_add(const float *acc, int64_t rows, int64_t cols, int64_t ld_acc,
                                              const void *bias, fp8mix_dtype bias_t, void *out, fp8mix_dtype out_t,
                                              int64_t ld_out, cudaStream_t stream)
{
    begin_call();
    auto ok_t = [](fp8mix_dtype t) { return t == FP8MIX_F32 || t == FP8MIX_BF16 || t == FP8MIX_F16; };
    if (!ok_t(bias_t) || !ok_t(out_t)) return FP8MIX_ERR_BAD_ENUM;
    if (rows < 0 || cols < 0 || ld_acc < cols || ld_out < cols) return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!acc || !bias || !out) return FP8MIX_ERR_NULL_POINTER;
    const unsigned grid = grid_for(rows * cols, kThreads);
#define FP8MIX_BA(BT, OT) bias_add_kernel<BT, OT><<<grid, kThreads, 0, stream>>>(acc, rows, cols, ld_acc, bias, out, ld_out)
#define FP8MIX_BA_O(BT)                                                                                             \
    switch (out_t) {                                                                                                \
    case FP8MIX_F32: FP8MIX_BA(BT, FP8MIX_F32); break;                                                              \
    case FP8MIX_BF16: FP8MIX_BA(BT, FP8MIX_BF16); break;                                                            \
    default: FP8MIX_BA(BT, FP8MIX_F16); break;                                                                      \
    }
    switch (bias_t) {
    case FP8MIX_F32: FP8MIX_BA_O(FP8MIX_F32) break;
    case FP8MIX_BF16: FP8MIX_BA_O(FP8MIX_BF16) break;
    default: FP8MIX_BA_O(FP8MIX_F16) break;
    }
#undef FP8MIX_BA_O
#undef FP8MIX_BA
    return check_launch("fp8mix_cuda_bias_add");
}
