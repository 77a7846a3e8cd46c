// linear_cpu.cpp — a linear layer's forward casts, forward (casts + GEMM) and backward, in
// one call each, on the CPU: what fp8mix.nn's eager step of a per-tensor recipe runs. They
// are compositions of the CPU ops (ops_cpu.cpp) with the same functions, in the same order
// and with the same arguments as the separate ops (delayed_flush, then delayed_cast of x
// and of W; or quantize_current of x and of W; grad_cast, then the dgrad and wgrad
// scaled_mm), so the results are those ops' bit for bit. One call instead of two or three
// saves the Python-to-dispatcher cost of the others (about 10 us each), most of a layer's
// time at small shapes. No policy here: the Python layer decides when they apply
// (fp8mix/nn/_casts.py, _function.py). Not here: their registration (ops_cpu.cpp's IMPL
// block, direct.cpp's table) and any kernel of its own.
#include "common.h"
#include "ops.h"

namespace fp8mix_torch {
namespace {

// scale_inv outputs are their own 0-d tensors (a copy of scales[1]), not views of another output.
Tensor scalar_copy(const Tensor &scales)
{
    Tensor s = new_tensor({}, scales.options());
    *s.data_ptr<float>() = scales.data_ptr<float>()[1];
    return s;
}

// A Linear's forward GEMM after its one-op casts: y = (xq x_sinv) (wq w_sinv)^T + bias, W (N, K)
// read through its transposed view, per-tensor scales (scaled_mm_cpu, as the separate op).
Tensor linear_forward_gemm(const Tensor &xq, const Tensor &wq, const Tensor &x_sinv, const Tensor &w_sinv,
                           const OptTensor &bias, Dtype out_dtype)
{
    const int64_t t = FP8MIX_MM_SCALE_TENSOR;
    return scaled_mm_cpu(xq, wq.t(), x_sinv, w_sinv, bias, out_dtype, "fp32", 128, t, t);
}

} // namespace

Tensors10 linear_delayed_casts_cpu(const Tensor &x, const Tensor &w, const Tensor &hist, const Tensor &scale,
                                   const Tensor &steps, const Tensor &pending, const Tensor &next_slot,
                                   int64_t gemm, int64_t history_len, Dtype x_dtype, Dtype w_dtype,
                                   Dtype grad_dtype, int64_t margin, bool pow2, Str algo, int64_t interval,
                                   bool record, bool reserve, bool transpose, bool inf_to_nan)
{
    TORCH_CHECK_VALUE(gemm >= 0, "fp8mix.linear_delayed_casts: gemm must be >= 0, got ", gemm);
    const OptTensor none;
    auto g = delayed_flush_cpu(hist, scale, steps, pending, next_slot, 3 * gemm + 2, history_len, grad_dtype, margin,
                               pow2, algo, interval, record, reserve);
    auto xc = delayed_cast_cpu(x, hist, scale, steps, 3 * gemm, history_len, x_dtype, margin, pow2, algo, interval,
                               record, transpose, inf_to_nan, none, none, 0);
    auto wc = delayed_cast_cpu(w, hist, scale, steps, 3 * gemm + 1, history_len, w_dtype, margin, pow2, algo, interval,
                               record, transpose, inf_to_nan, none, none, 0);
    const Tensor &xs = std::get<2>(xc), &ws = std::get<2>(wc);
    return {std::get<0>(xc), std::get<1>(xc), xs, scalar_copy(xs), std::get<0>(wc), std::get<1>(wc), ws,
            scalar_copy(ws), std::get<0>(g), std::get<1>(g)};
}

Tensors8 linear_current_casts_cpu(const Tensor &x, const Tensor &w, Dtype x_dtype, Dtype w_dtype, int64_t margin,
                                  bool pow2, double eps, bool transpose, bool inf_to_nan)
{
    const OptTensor none;
    auto xc = quantize_current_cpu(x, x_dtype, FP8MIX_GRAN_TENSOR, margin, pow2, eps, true, false, 0, 0, true,
                                   transpose, inf_to_nan, none, 0);
    auto wc = quantize_current_cpu(w, w_dtype, FP8MIX_GRAN_TENSOR, margin, pow2, eps, true, false, 0, 0, true,
                                   transpose, inf_to_nan, none, 0);
    return {std::get<0>(xc), std::get<1>(xc), std::get<2>(xc), std::get<3>(xc),
            std::get<0>(wc), std::get<1>(wc), std::get<2>(wc), std::get<3>(wc)};
}

// A linear layer's backward (W as (N, K), x kept as (M, K), per-tensor scales): grad_cast
// of dy, then dgrad dx = dy W and wgrad dW = dy^T x with scaled_mm_cpu, as one op (the
// same calls as the separate ops; dy^T is the cast's transposed view). With w_scale or
// w_amax, `w` is the high-precision weight and is cast here first, as the forward cast it
// (cast_cpu with w_scale; delayed scaling), or with compute_scale_cpu's scale of w_amax
// (current scaling; margin, pow2, eps are the recipe's, shared by all roles). That FP8
// copy is dropped before wgrad allocates dW, so it never coexists with dW.
// dx / dW are empty when not wanted. Returns (dx, dW, colsum of dy, dy's FP8, scale_inv).
Tensors5 linear_backward_cpu(const Tensor &dy, const Tensor &w, const Tensor &w_sinv, const Tensor &xq,
                             const Tensor &x_sinv, Dtype fp8_dtype, const OptTensor &plan, const OptTensor &pending,
                             const OptTensor &slot, int64_t margin, bool pow2, double eps, bool colsum,
                             bool want_dx, bool want_dw, Dtype dx_dtype, Dtype dw_dtype, const OptTensor &w_scale,
                             const OptTensor &w_amax, OptDtype w_fp8_dtype)
{
    const char *op = "linear_backward";
    const OptTensor none;
    TORCH_CHECK_VALUE(!(w_scale && w_amax), "fp8mix.", op, ": pass w_scale or w_amax, not both");
    const bool recast = w_scale.has_value() || w_amax.has_value();
    TORCH_CHECK_VALUE(!recast || w_fp8_dtype.has_value(), "fp8mix.", op,
                      ": w_fp8_dtype is required with w_scale / w_amax (the weight's FP8 format)");
    auto gc = grad_cast_cpu(dy, fp8_dtype, plan, pending, slot, margin, pow2, eps, false, colsum, true, none, 0);
    const Tensor &gq = std::get<0>(gc), &g_sinv = std::get<2>(gc);
    const int64_t t = FP8MIX_MM_SCALE_TENSOR;
    Tensor dx = new_tensor({0}, dy.options().dtype(dx_dtype));
    if (want_dx) {
        Tensor wq = w;
        if (recast) {
            Tensor s = w_scale ? *w_scale
                               : std::get<0>(compute_scale_cpu(w_amax->reshape({1}), *w_fp8_dtype, margin, pow2, eps));
            wq = std::get<0>(cast_cpu(w, s, *w_fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, false, true,
                                      none, 0));
        }
        dx = scaled_mm_cpu(gq, wq, g_sinv, w_sinv, none, dx_dtype, "fp32", 128, t, t);
    } // the re-cast W is freed here, before dW exists
    Tensor dw = want_dw ? scaled_mm_cpu(gq.t(), xq, g_sinv, x_sinv, none, dw_dtype, "fp32", 128, t, t)
                        : new_tensor({0}, dy.options().dtype(dw_dtype));
    return {dx, dw, std::get<4>(gc), gq, g_sinv};
}

// linear_delayed_casts (transpose False, inf_to_nan True), then the forward GEMM with bias:
// (y, xq, x_scales, x_scale_inv, wq, w_scales, w_scale_inv, grad_plan, grad_slot, w_scale),
// w_scale a 1-element copy of w_scales[0].
Tensors10 linear_delayed_forward_cpu(const Tensor &x, const Tensor &w, const OptTensor &bias, Dtype out_dtype,
                                     const Tensor &hist, const Tensor &scale, const Tensor &steps,
                                     const Tensor &pending, const Tensor &next_slot, int64_t gemm,
                                     int64_t history_len, Dtype x_dtype, Dtype w_dtype, Dtype grad_dtype,
                                     int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool reserve)
{
    auto c = linear_delayed_casts_cpu(x, w, hist, scale, steps, pending, next_slot, gemm, history_len, x_dtype,
                                      w_dtype, grad_dtype, margin, pow2, algo, interval, record, reserve, false, true);
    Tensor y = linear_forward_gemm(std::get<0>(c), std::get<4>(c), std::get<3>(c), std::get<7>(c), bias, out_dtype);
    Tensor w_scale = new_tensor({1}, std::get<6>(c).options());
    *w_scale.data_ptr<float>() = std::get<6>(c).data_ptr<float>()[0];
    return {y, std::get<0>(c), std::get<2>(c), std::get<3>(c), std::get<4>(c), std::get<6>(c), std::get<7>(c),
            std::get<8>(c), std::get<9>(c), w_scale};
}

// linear_current_casts (transpose False, inf_to_nan True), then the forward GEMM with bias:
// (y, xq, x_scale_inv, wq, w_scale_inv, w_amax).
Tensors6 linear_current_forward_cpu(const Tensor &x, const Tensor &w, const OptTensor &bias, Dtype out_dtype,
                                    Dtype x_dtype, Dtype w_dtype, int64_t margin, bool pow2, double eps)
{
    auto c = linear_current_casts_cpu(x, w, x_dtype, w_dtype, margin, pow2, eps, false, true);
    Tensor y = linear_forward_gemm(std::get<0>(c), std::get<4>(c), std::get<2>(c), std::get<6>(c), bias, out_dtype);
    return {y, std::get<0>(c), std::get<2>(c), std::get<4>(c), std::get<6>(c), std::get<7>(c)};
}

} // namespace fp8mix_torch
