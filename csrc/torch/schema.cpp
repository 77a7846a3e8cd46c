// schema.cpp — every fp8mix::* operator schema, in the one TORCH_LIBRARY(fp8mix, m) block
// (names, argument names, defaults, returns: what torch.ops.fp8mix and fp8mix/ops.py see).
// The kernels are registered per device elsewhere (ops_cpu.cpp, ops_cuda.cpp); fake (meta)
// implementations and the typed Python wrappers live in fp8mix/_ops_fake.py and
// fp8mix/ops.py. The few functions defined with their schema here are device-independent
// switches (catch-all kernels). Not here: any tensor check or kernel.
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(fp8mix, m)
{
    // Casts.  inf_to_nan: an infinite input gives NaN (fp8mix.h).  rng: a stochastic-rounding
    // stream as an int64 [key, offset] tensor (words from offset + rng_skip on); when given it
    // replaces stochastic/seed/offset.
    m.def("cast(Tensor x, Tensor scale, ScalarType fp8_dtype, int granularity, bool saturate=True, "
          "bool stochastic=False, int seed=0, int offset=0, bool want_q=True, bool transpose=False, "
          "bool inf_to_nan=False, Tensor? rng=None, int rng_skip=0) -> (Tensor q, Tensor qt, Tensor amax)");
    m.def("quantize_current(Tensor x, ScalarType fp8_dtype, int granularity, int margin=0, "
          "bool power_2_scale=False, float amax_epsilon=0.0, bool saturate=True, bool stochastic=False, "
          "int seed=0, int offset=0, bool want_q=True, bool transpose=False, bool inf_to_nan=False, "
          "Tensor? rng=None, int rng_skip=0) -> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax)");
    m.def("quantize_mx(Tensor x, ScalarType fp8_dtype, int rule=0, int margin=0, float amax_epsilon=0.0, "
          "bool saturate=True, bool stochastic=False, int seed=0, int offset=0, bool want_q=True, "
          "bool transpose=False, bool inf_to_nan=False, Tensor? rng=None, int rng_skip=0) "
          "-> (Tensor q, Tensor scale_inv, Tensor qt, Tensor scale_inv_t, Tensor amax)");
    m.def("amax(Tensor x, int granularity=0) -> Tensor");
    m.def("compute_scale(Tensor amax, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, "
          "float amax_epsilon=0.0) -> (Tensor scale, Tensor scale_inv)");
    m.def("dequantize(Tensor q, Tensor scale_inv, int granularity, ScalarType out_dtype) -> Tensor");
    m.def("quant_stats(Tensor x, Tensor q, Tensor scale_inv, int granularity, *, bool bad_scale_as_one=False) "
          "-> Tensor");
    // scale_kind_a/b: fp8mix_mm_scale (0 tensor, 1 row/column, 2 block, 3 MX), or -1 to infer from the
    // shapes (fp8mix_mm_scale_kinds decides).
    m.def("scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
          "ScalarType? out_dtype=None, str accumulate='fp32', int promote_interval=128, int scale_kind_a=-1, "
          "int scale_kind_b=-1) -> Tensor");
    // The grouped GEMM (mixture of experts; torch._scaled_grouped_mm's 2-D x 3-D case): offs the
    // groups' cumulative row ends, scale_kind fp8mix_mm_scale (fp8mix.ops infers it from the shapes).
    m.def("scaled_grouped_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs, int scale_kind, "
          "Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor");
    // Grouped linear layers (fp8mix.GroupedLinear): the K dimension cut into groups (weight
    // gradients; torch._scaled_grouped_mm's 2-D x 2-D case), out (groups, M, N); per-group
    // per-tensor casts of row groups (offs: cumulative row ends), roles role0 + g * role_step.
    m.def("scaled_grouped_mm_k(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor offs, int scale_kind, "
          "Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor");
    m.def("grouped_quantize(Tensor x, Tensor offs, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, "
          "float amax_epsilon=0.0, bool transpose=False, bool inf_to_nan=False) "
          "-> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax)");
    m.def("grouped_delayed_cast(Tensor x, Tensor offs, Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, "
          "int role0, int role_step, int history_len, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, "
          "str amax_compute_algo='max', int interval=1, bool record=True, bool transpose=False, "
          "bool inf_to_nan=False) -> (Tensor q, Tensor qt, Tensor scales, Tensor amax)");
    m.def("grouped_delayed_flush(Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, Tensor(d!) pending, "
          "Tensor(e!) next_slot, int role0, int role_step, int history_len, ScalarType fp8_dtype, int margin=0, "
          "bool power_2_scale=False, str amax_compute_algo='max', int interval=1, bool record=True, "
          "bool reserve=False) -> (Tensor plans, Tensor slots)");
    m.def("grouped_grad_cast(Tensor dy, Tensor offs, ScalarType fp8_dtype, Tensor? plans=None, "
          "Tensor(a!)? pending=None, Tensor? slots=None, int margin=0, bool power_2_scale=False, "
          "float amax_epsilon=0.0, bool transpose=False, bool colsum=False, bool inf_to_nan=True) "
          "-> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax, Tensor colsum)");
    // The per-tensor recipes' state and casts (csrc/core/recipe.c); the state is updated in place.
    m.def("delayed_cast(Tensor x, Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, int role, "
          "int history_len, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, "
          "str amax_compute_algo='max', int interval=1, bool record=True, bool transpose=False, "
          "bool inf_to_nan=False, Tensor? fresh_amax=None, Tensor? rng=None, int rng_skip=0) "
          "-> (Tensor q, Tensor qt, Tensor scales, Tensor amax)");
    m.def("delayed_record(Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, int role, int history_len, "
          "Tensor amax, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, str amax_compute_algo='max', "
          "int interval=1, bool rescale_only=False) -> ()");
    m.def("delayed_flush(Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, Tensor(d!) pending, "
          "Tensor(e!) next_slot, int role, int history_len, ScalarType fp8_dtype, int margin=0, "
          "bool power_2_scale=False, str amax_compute_algo='max', int interval=1, bool record=True, "
          "bool reserve=True) -> (Tensor plan, Tensor slot)");
    m.def("grad_cast(Tensor dy, ScalarType fp8_dtype, Tensor? plan=None, Tensor(a!)? pending=None, "
          "Tensor? slot=None, int margin=0, bool power_2_scale=False, float amax_epsilon=0.0, "
          "bool transpose=False, bool colsum=False, bool inf_to_nan=True, Tensor? rng=None, int rng_skip=0) "
          "-> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax, Tensor colsum)");
    // Fused producer casts (csrc/core/norm.c, act.c): a norm / an activation written as FP8.
    // kind: 0 LayerNorm, 1 RMSNorm; act: fp8mix_act_kind; scale None: current scaling;
    // want_q=False, transpose=False: amaxes only; mean/rstd given: reused (and returned empty);
    // hp_dtype: also return the high-precision values (else an empty hp).
    m.def("norm_cast(Tensor x, Tensor? gamma, Tensor? beta, int kind, float eps, bool zero_centered_gamma, "
          "ScalarType fp8_dtype, int granularity, Tensor? scale=None, int margin=0, bool power_2_scale=False, "
          "float amax_epsilon=0.0, bool want_q=True, bool transpose=False, bool inf_to_nan=False, "
          "Tensor? rng=None, int rng_skip=0, Tensor? mean=None, Tensor? rstd=None, ScalarType? hp_dtype=None) "
          "-> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax, Tensor mean, Tensor rstd, Tensor hp)");
    m.def("norm_delayed_cast(Tensor x, Tensor? gamma, Tensor? beta, int kind, float eps, bool zero_centered_gamma, "
          "Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, int role, int history_len, "
          "ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, str amax_compute_algo='max', "
          "int interval=1, bool record=True, bool transpose=False, bool inf_to_nan=False, Tensor? fresh_amax=None, "
          "Tensor? rng=None, int rng_skip=0, Tensor? mean=None, Tensor? rstd=None, ScalarType? hp_dtype=None) "
          "-> (Tensor q, Tensor qt, Tensor scales, Tensor amax, Tensor mean, Tensor rstd, Tensor hp)");
    m.def("act_cast(Tensor h, int act, ScalarType fp8_dtype, int granularity, Tensor? scale=None, int margin=0, "
          "bool power_2_scale=False, float amax_epsilon=0.0, bool want_q=True, bool transpose=False, "
          "bool inf_to_nan=False, Tensor? rng=None, int rng_skip=0, ScalarType? hp_dtype=None) "
          "-> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax, Tensor hp)");
    m.def("act_delayed_cast(Tensor h, int act, Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, "
          "int role, int history_len, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, "
          "str amax_compute_algo='max', int interval=1, bool record=True, bool transpose=False, "
          "bool inf_to_nan=False, Tensor? fresh_amax=None, Tensor? rng=None, int rng_skip=0, "
          "ScalarType? hp_dtype=None) -> (Tensor q, Tensor qt, Tensor scales, Tensor amax, Tensor hp)");
    // A linear layer's forward casts and backward in one op each (linear_cpu.cpp).
    m.def("linear_backward(Tensor dy, Tensor wq, Tensor w_scale_inv, Tensor xq, Tensor x_scale_inv, "
          "ScalarType fp8_dtype, Tensor? plan=None, Tensor(a!)? pending=None, Tensor? slot=None, int margin=0, "
          "bool power_2_scale=False, float amax_epsilon=0.0, bool colsum=False, bool want_dx=True, "
          "bool want_dw=True, ScalarType dx_dtype=float, ScalarType dw_dtype=float, Tensor? w_scale=None, "
          "Tensor? w_amax=None, ScalarType? w_fp8_dtype=None) "
          "-> (Tensor dx, Tensor dw, Tensor colsum, Tensor gq, Tensor scale_inv)");
    m.def("linear_delayed_casts(Tensor x, Tensor w, Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) steps, "
          "Tensor(d!) pending, Tensor(e!) next_slot, int gemm, int history_len, ScalarType x_dtype, "
          "ScalarType w_dtype, ScalarType grad_dtype, int margin=0, bool power_2_scale=False, "
          "str amax_compute_algo='max', int interval=1, bool record=True, bool reserve=True, bool transpose=False, "
          "bool inf_to_nan=True) -> (Tensor xq, Tensor xqt, Tensor x_scales, Tensor x_scale_inv, Tensor wq, "
          "Tensor wqt, Tensor w_scales, Tensor w_scale_inv, Tensor grad_plan, Tensor grad_slot)");
    m.def("linear_current_casts(Tensor x, Tensor w, ScalarType x_dtype, ScalarType w_dtype, int margin=0, "
          "bool power_2_scale=False, float amax_epsilon=0.0, bool transpose=False, bool inf_to_nan=True) "
          "-> (Tensor xq, Tensor xqt, Tensor x_scale_inv, Tensor x_amax, Tensor wq, Tensor wqt, Tensor w_scale_inv, "
          "Tensor w_amax)");
    // NVFP4 (fp8mix.h "NVFP4", CPU): E2M1 codes two per byte, E4M3 block scales, a float32
    // tensor scale from global_amax; tile_2d: 16x16 blocks (the weights' 2-D scaling).
    m.def("quantize_nvfp4(Tensor x, Tensor global_amax, bool tile_2d=False, bool stochastic=False, int seed=0, "
          "int offset=0, Tensor? rng=None, int rng_skip=0) -> (Tensor q, Tensor block_scale, Tensor scale_inv)");
    m.def("dequantize_nvfp4(Tensor q, Tensor block_scale, Tensor scale_inv, ScalarType out_dtype) -> Tensor");
    m.def("nvfp4_mm(Tensor a, Tensor a_block_scale, Tensor a_scale_inv, Tensor b, Tensor b_block_scale, "
          "Tensor b_scale_inv) -> Tensor");
    m.def("rht16(Tensor x, int signs) -> Tensor");
    // The CPU's SIMD level (csrc/core/dispatch.c).
    m.def("cpu_isa() -> str", &fp8mix_torch::cpu_isa);
    m.def("set_max_isa(str name) -> ()", &fp8mix_torch::set_max_isa);
    // The CPU GEMMs' summation order (0 canonical, 1 native: fp8mix_gemm_order), set by fp8mix.gemm_order.
    m.def("set_gemm_order(int order) -> ()", &fp8mix_torch::set_gemm_order);
    m.def("get_gemm_order() -> int", &fp8mix_torch::get_gemm_order);
    m.def("gemm_kernel(int order) -> str", &fp8mix_torch::gemm_kernel);
#ifdef FP8MIX_WITH_CUDA
    // Ops that exist only in CUDA builds.
    m.def("delayed_scale_update(Tensor(a!)[] amax_history, Tensor[] amax, Tensor(b!)[] scale, "
          "Tensor(c!)[] scale_inv, Tensor(d!)[] steps, float[] fp8_max, int margin=0, bool power_2_scale=False, "
          "str amax_compute_algo='max', int interval=1) -> ()");
    m.def("cuda_set_hw_convert(bool on) -> ()", &fp8mix_torch::cuda_set_hw_convert);
    m.def("cuda_get_hw_convert() -> bool", &fp8mix_torch::cuda_get_hw_convert);
    m.def("cuda_set_check_scales(bool on) -> ()", &fp8mix_torch::cuda_set_check_scales);
    m.def("cuda_get_check_scales() -> bool", &fp8mix_torch::cuda_get_check_scales);
#endif
}
