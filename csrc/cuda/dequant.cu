/*
 * dequant.cu — FP8 -> float32 / bfloat16 / float16 (fp8mix_cuda_dequantize):
 * out = decode(q) * scale_inv[tile], rounded once to the output type, the C core's
 * bits (csrc/core/cast.c), NaN sign kept (see scale_value in encode.cuh).
 *
 * Kernel (grid-stride, 256 threads per block): the vector path takes one 16-byte
 * output store per thread step (4 float32 or 8 16-bit values, read as 4 or 8 bytes
 * of q), so loads and stores of a warp are contiguous; otherwise one element.
 * Not here: casts (cast.cu, quantize.cu).
 */
#include "cast_kernels.cuh"

namespace fp8mix_cuda {

struct DqArgs {
    const uint8_t *q;
    int64_t rows, cols, ld_q, ld_out;
    fp8mix_granularity gran;
    int64_t nbc;
    const float *scale_inv;
    uint8_t *out;
    fp8mix_format fmt;
    int *scale_status;
};

__device__ __forceinline__ float dq_scale(const DqArgs &D, int64_t i, int64_t j)
{
    float s = D.scale_inv[scale_tile(D.gran, i, j, D.nbc)];
    if (!scale_ok(s) && D.scale_status) *D.scale_status = FP8MIX_ERR_BAD_SCALE;
    return s;
}

/* One 16-byte output unit: U = 4 float32 or 8 half-width values at (i, j). */
template <int OT>
__device__ __forceinline__ void dequant_unit(const DqArgs &D, int64_t i, int64_t j)
{
    constexpr int U = OT == FP8MIX_F32 ? 4 : 8;
    constexpr size_t osz = OT == FP8MIX_F32 ? 4 : 2;
    const float s = dq_scale(D, i, j);
    uint32_t w[U / 4];
    if constexpr (U == 4) {
        w[0] = __ldg((const unsigned int *)(D.q + i * D.ld_q + j));
    } else {
        uint2 in = __ldg((const uint2 *)(D.q + i * D.ld_q + j));
        w[0] = in.x;
        w[1] = in.y;
    }
    float y[U];
#pragma unroll
    for (int u = 0; u < U; u++) y[u] = scale_value(fp8_decode((uint8_t)(w[u >> 2] >> (8 * (u & 3))), D.fmt), s);
    uint8_t *orow = D.out + (size_t)(i * D.ld_out) * osz;
    if constexpr (OT == FP8MIX_F32) {
        *(float4 *)((float *)orow + j) = make_float4(y[0], y[1], y[2], y[3]);
    } else {
        uint32_t h[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint32_t lo = OT == FP8MIX_BF16 ? f32_to_bf16(y[2 * k]) : f32_to_f16(y[2 * k]);
            uint32_t hi = OT == FP8MIX_BF16 ? f32_to_bf16(y[2 * k + 1]) : f32_to_f16(y[2 * k + 1]);
            h[k] = lo | (hi << 16);
        }
        *(uint4 *)((uint16_t *)orow + j) = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

template <int OT>
__global__ void __launch_bounds__(kThreads) dequant_kernel(DqArgs D, int vec)
{
    constexpr int U = OT == FP8MIX_F32 ? 4 : 8;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const size_t osz = OT == FP8MIX_F32 ? 4 : 2;
    if (vec) {
        const int64_t upr = D.cols / U, nu = D.rows * upr;
        for (int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; u < nu; u += stride) {
            const int64_t i = u / upr, j = (u - i * upr) * U;
            dequant_unit<OT>(D, i, j);
        }
    } else {
        const int64_t ne = D.rows * D.cols;
        for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < ne; e += stride) {
            const int64_t i = e / D.cols, j = e - i * D.cols;
            float y = scale_value(fp8_decode(D.q[i * D.ld_q + j], D.fmt), dq_scale(D, i, j));
            store_hp(D.out + (size_t)(i * D.ld_out) * osz, (fp8mix_dtype)OT, j, y);
        }
    }
}

} // namespace fp8mix_cuda

using namespace fp8mix_cuda;

extern "C" fp8mix_status fp8mix_cuda_dequantize(const uint8_t *q, fp8mix_format fmt, int64_t rows, int64_t cols,
                                                int64_t ld_q, fp8mix_granularity gran, const float *scale_inv,
                                                void *out, fp8mix_dtype out_t, int64_t ld_out, int *scale_status,
                                                cudaStream_t stream)
{
    begin_call();
    if ((fmt != FP8MIX_E4M3 && fmt != FP8MIX_E5M2) || !valid_dtype(out_t) || !valid_gran(gran))
        return FP8MIX_ERR_BAD_ENUM;
    if (bad_2d(rows, cols, ld_q) || bad_2d(rows, cols, ld_out)) return FP8MIX_ERR_BAD_SHAPE;
    if (rows == 0 || cols == 0) return FP8MIX_OK;
    if (!q || !out || !scale_inv) return FP8MIX_ERR_NULL_POINTER;
    DqArgs D = {q, rows, cols, ld_q, ld_out, gran, cdiv(cols, FP8MIX_BLOCK), scale_inv, (uint8_t *)out, fmt,
                scale_status};
    const int vec = aligned16(q) && aligned16(out) && cols % kVec == 0 && ld_q % 16 == 0 &&
                    ((size_t)ld_out * dsize(out_t)) % 16 == 0;
    const int64_t units = rows * (cols / (out_t == FP8MIX_F32 ? 4 : 8));
    const unsigned grid = grid_for(vec ? units : rows * cols, kThreads);
    switch (out_t) {
    case FP8MIX_F32: dequant_kernel<FP8MIX_F32><<<grid, kThreads, 0, stream>>>(D, vec); break;
    case FP8MIX_BF16: dequant_kernel<FP8MIX_BF16><<<grid, kThreads, 0, stream>>>(D, vec); break;
    default: dequant_kernel<FP8MIX_F16><<<grid, kThreads, 0, stream>>>(D, vec); break;
    }
    return check_launch("fp8mix_cuda_dequantize");
}
