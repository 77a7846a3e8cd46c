// ops.h — the op functions of fp8mix._C, declared for the files that register or compose
// them: the CPU kernels (ops_cpu.cpp, fused_cpu.cpp), the linear-layer compositions
// (linear_cpu.cpp), the schema-registered catch-all functions and the direct calls'
// module hook. Each function is documented where it is defined; the arguments are the
// schemas' (schema.cpp), in their order. Not here: the CUDA kernels, which only their own
// file's TORCH_LIBRARY_IMPL block names.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <tuple>

struct _object; // CPython's PyObject, without including Python.h here
typedef _object PyObject;

namespace fp8mix_torch {

using at::Tensor;
using OptTensor = c10::optional<at::Tensor>;
// the ops' results, in the schemas' order
using Tensors2 = std::tuple<Tensor, Tensor>;
using Tensors3 = std::tuple<Tensor, Tensor, Tensor>;
using Tensors4 = std::tuple<Tensor, Tensor, Tensor, Tensor>;
using Tensors5 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using Tensors6 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using Tensors7 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using Tensors8 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using Tensors10 = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;
using Dtype = at::ScalarType;
using OptDtype = c10::optional<at::ScalarType>;
using Str = c10::string_view;

// The ops with a kernel on every device, <name>_cpu and <name>_cuda: the list both
// TORCH_LIBRARY_IMPL blocks register (ops_cpu.cpp, ops_cuda.cpp), so neither misses one.
// Inside a TORCH_LIBRARY_IMPL block (library m), FP8MIX_OPS_ON_EVERY_DEVICE(FP8MIX_IMPL_OP, cpu)
// registers the CPU kernels of them all.
#define FP8MIX_OPS_ON_EVERY_DEVICE(X, dev)                                                                       \
    X(cast, dev) X(quantize_current, dev) X(amax, dev) X(compute_scale, dev) X(dequantize, dev)                  \
    X(quant_stats, dev) X(scaled_mm, dev) X(delayed_cast, dev) X(delayed_record, dev) X(delayed_flush, dev)      \
    X(grad_cast, dev)
#define FP8MIX_IMPL_OP(name, dev) m.impl(#name, &fp8mix_torch::name##_##dev);

// ---- ops_cpu.cpp: casts, amax, scales, the per-tensor recipes, the scaled GEMM ----------
Tensors3 cast_cpu(const Tensor &x, const Tensor &scale, Dtype fp8_dtype, int64_t gran, bool saturate,
                  bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose, bool inf_to_nan,
                  const OptTensor &rng, int64_t rng_skip);
Tensors4 quantize_current_cpu(const Tensor &x, Dtype fp8_dtype, int64_t gran, int64_t margin, bool pow2,
                              double eps, bool saturate, bool stochastic, int64_t seed, int64_t offset,
                              bool want_q, bool transpose, bool inf_to_nan, const OptTensor &rng, int64_t rng_skip);
Tensors5 quantize_mx_cpu(const Tensor &x, Dtype fp8_dtype, int64_t rule, int64_t margin, double eps,
                         bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q,
                         bool transpose, bool inf_to_nan, const OptTensor &rng, int64_t rng_skip);
Tensor amax_cpu(const Tensor &x, int64_t gran);
Tensors2 compute_scale_cpu(const Tensor &amax, Dtype fp8_dtype, int64_t margin, bool pow2, double eps);
Tensor quant_stats_cpu(const Tensor &x, const Tensor &q, const Tensor &scale_inv, int64_t gran,
                       bool bad_scale_as_one);
Tensor dequantize_cpu(const Tensor &q, const Tensor &scale_inv, int64_t gran, Dtype out_dtype);
Tensors4 delayed_cast_cpu(const Tensor &x, const Tensor &hist, const Tensor &scale, const Tensor &steps,
                          int64_t role, int64_t history_len, Dtype fp8_dtype, int64_t margin, bool pow2, Str algo,
                          int64_t interval, bool record, bool transpose, bool inf_to_nan,
                          const OptTensor &fresh_amax, const OptTensor &rng, int64_t rng_skip);
void delayed_record_cpu(const Tensor &hist, const Tensor &scale, const Tensor &steps, int64_t role,
                        int64_t history_len, const Tensor &amax, Dtype fp8_dtype, int64_t margin, bool pow2,
                        Str algo, int64_t interval, bool rescale_only);
Tensors2 delayed_flush_cpu(const Tensor &hist, const Tensor &scale, const Tensor &steps, const Tensor &pending,
                           const Tensor &next_slot, int64_t role, int64_t history_len, Dtype fp8_dtype,
                           int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool reserve);
Tensors5 grad_cast_cpu(const Tensor &dy, Dtype fp8_dtype, const OptTensor &plan, const OptTensor &pending,
                       const OptTensor &slot, int64_t margin, bool pow2, double eps, bool transpose, bool colsum,
                       bool inf_to_nan, const OptTensor &rng, int64_t rng_skip);
Tensor scaled_mm_cpu(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                     const OptTensor &bias, OptDtype out_dtype, Str accumulate, int64_t promote_interval,
                     int64_t scale_kind_a, int64_t scale_kind_b);
std::string cpu_isa();
void set_max_isa(std::string name);
void set_gemm_order(int64_t order);
int64_t get_gemm_order();
std::string gemm_kernel(int64_t order);

// ---- fused_cpu.cpp: a norm or an activation written as FP8 ---------------------------
Tensors7 norm_cast_cpu(const Tensor &x, const OptTensor &gamma, const OptTensor &beta, int64_t kind, double eps,
                       bool zero_centered_gamma, Dtype fp8_dtype, int64_t gran, const OptTensor &scale,
                       int64_t margin, bool pow2, double amax_eps, bool want_q, bool transpose, bool inf_to_nan,
                       const OptTensor &rng, int64_t rng_skip, const OptTensor &mean, const OptTensor &rstd,
                       OptDtype hp_out);
Tensors7 norm_delayed_cast_cpu(const Tensor &x, const OptTensor &gamma, const OptTensor &beta, int64_t kind,
                               double eps, bool zero_centered_gamma, const Tensor &hist, const Tensor &scale,
                               const Tensor &steps, int64_t role, int64_t history_len, Dtype fp8_dtype,
                               int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool transpose,
                               bool inf_to_nan, const OptTensor &fresh_amax, const OptTensor &rng, int64_t rng_skip,
                               const OptTensor &mean, const OptTensor &rstd, OptDtype hp_out);
Tensors5 act_cast_cpu(const Tensor &h, int64_t act, Dtype fp8_dtype, int64_t gran, const OptTensor &scale,
                      int64_t margin, bool pow2, double amax_eps, bool want_q, bool transpose, bool inf_to_nan,
                      const OptTensor &rng, int64_t rng_skip, OptDtype hp_out);
Tensors5 act_delayed_cast_cpu(const Tensor &h, int64_t act, const Tensor &hist, const Tensor &scale,
                              const Tensor &steps, int64_t role, int64_t history_len, Dtype fp8_dtype,
                              int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool transpose,
                              bool inf_to_nan, const OptTensor &fresh_amax, const OptTensor &rng, int64_t rng_skip,
                              OptDtype hp_out);

// ---- linear_cpu.cpp: a linear layer's casts, forward and backward in one call each ----
Tensors10 linear_delayed_casts_cpu(const Tensor &x, const Tensor &w, const Tensor &hist, const Tensor &scale,
                                   const Tensor &steps, const Tensor &pending, const Tensor &next_slot,
                                   int64_t gemm, int64_t history_len, Dtype x_dtype, Dtype w_dtype,
                                   Dtype grad_dtype, int64_t margin, bool pow2, Str algo, int64_t interval,
                                   bool record, bool reserve, bool transpose, bool inf_to_nan);
Tensors8 linear_current_casts_cpu(const Tensor &x, const Tensor &w, Dtype x_dtype, Dtype w_dtype, int64_t margin,
                                  bool pow2, double eps, bool transpose, bool inf_to_nan);
Tensors5 linear_backward_cpu(const Tensor &dy, const Tensor &w, const Tensor &w_sinv, const Tensor &xq,
                             const Tensor &x_sinv, Dtype fp8_dtype, const OptTensor &plan, const OptTensor &pending,
                             const OptTensor &slot, int64_t margin, bool pow2, double eps, bool colsum,
                             bool want_dx, bool want_dw, Dtype dx_dtype, Dtype dw_dtype, const OptTensor &w_scale,
                             const OptTensor &w_amax, OptDtype w_fp8_dtype);
Tensors10 linear_delayed_forward_cpu(const Tensor &x, const Tensor &w, const OptTensor &bias, Dtype out_dtype,
                                     const Tensor &hist, const Tensor &scale, const Tensor &steps,
                                     const Tensor &pending, const Tensor &next_slot, int64_t gemm,
                                     int64_t history_len, Dtype x_dtype, Dtype w_dtype, Dtype grad_dtype,
                                     int64_t margin, bool pow2, Str algo, int64_t interval, bool record,
                                     bool reserve);
Tensors6 linear_current_forward_cpu(const Tensor &x, const Tensor &w, const OptTensor &bias, Dtype out_dtype,
                                    Dtype x_dtype, Dtype w_dtype, int64_t margin, bool pow2, double eps);

#ifdef FP8MIX_WITH_CUDA
// ---- ops_cuda.cpp: the CUDA build's switches (catch-all functions) ----------------------
void cuda_set_hw_convert(bool on);
bool cuda_get_hw_convert();
void cuda_set_check_scales(bool on);
bool cuda_get_check_scales();
#endif

// ---- direct.cpp: fp8mix.nn's eager entry points, added to the module by PyInit__C -------
void add_direct_calls(PyObject *module);

Tensor scaled_grouped_mm_cpu(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                             const Tensor &offs, int64_t scale_kind, const OptTensor &bias, OptDtype out_dtype);

// ---- grouped_cpu.cpp: grouped linear layers (mixture-of-experts experts) ---------------
Tensors4 grouped_quantize_cpu(const Tensor &x, const Tensor &offs, Dtype fp8_dtype, int64_t margin, bool pow2,
                              double eps, bool transpose, bool inf_to_nan);
Tensors4 grouped_delayed_cast_cpu(const Tensor &x, const Tensor &offs, const Tensor &hist, const Tensor &scale,
                                  const Tensor &steps, int64_t role0, int64_t role_step, int64_t history_len,
                                  Dtype fp8_dtype, int64_t margin, bool pow2, Str algo, int64_t interval, bool record,
                                  bool transpose, bool inf_to_nan);
Tensors2 grouped_delayed_flush_cpu(const Tensor &hist, const Tensor &scale, const Tensor &steps,
                                   const Tensor &pending, const Tensor &next_slot, int64_t role0, int64_t role_step,
                                   int64_t history_len, Dtype fp8_dtype, int64_t margin, bool pow2, Str algo,
                                   int64_t interval, bool record, bool reserve);
Tensors5 grouped_grad_cast_cpu(const Tensor &dy, const Tensor &offs, Dtype fp8_dtype, const OptTensor &plans,
                               const OptTensor &pending, const OptTensor &slots, int64_t margin, bool pow2,
                               double eps, bool transpose, bool colsum, bool inf_to_nan);
Tensor scaled_grouped_mm_k_cpu(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                               const Tensor &offs, int64_t scale_kind, const OptTensor &bias, OptDtype out_dtype);

// ---- nvfp4_cpu.cpp: NVFP4 quantisation, decoding, GEMM, Hadamard transform ------------
Tensors3 quantize_nvfp4_cpu(const Tensor &x, const Tensor &global_amax, bool tile_2d, bool stochastic, int64_t seed,
                            int64_t offset, const OptTensor &rng, int64_t rng_skip);
Tensor dequantize_nvfp4_cpu(const Tensor &q, const Tensor &block_scale, const Tensor &scale_inv, Dtype out_dtype);
Tensor nvfp4_mm_cpu(const Tensor &a, const Tensor &a_block_scale, const Tensor &a_scale_inv, const Tensor &b,
                    const Tensor &b_block_scale, const Tensor &b_scale_inv);
Tensor rht16_cpu(const Tensor &x, int64_t signs);

} // namespace fp8mix_torch
