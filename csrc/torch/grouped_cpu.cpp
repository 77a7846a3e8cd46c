// grouped_cpu.cpp — the CPU kernels of the grouped linear layers' ops (mixture-of-experts
// experts, fp8mix.GroupedLinear): per-group per-tensor casts (current, delayed, gradient),
// the grouped delayed flush and the grouped-K GEMM (weight gradients). Each checks its
// tensors and calls the C core's grouped entry point (csrc/core/cast_grouped.c,
// gemm_grouped.c); registered in ops_cpu.cpp's TORCH_LIBRARY_IMPL block.
#include <torch/library.h>

#include <cstring>

#include "common.h"
#include "ops.h"

namespace fp8mix_torch {

namespace {

// offs: G cumulative group ends (int32 or int64, 1-D, CPU) as contiguous int64.
Tensor offs_arg(const Tensor &offs, const char *op)
{
    check_on(offs, kCPU, op, "offs");
    TORCH_CHECK_TYPE(offs.scalar_type() == at::kInt || offs.scalar_type() == at::kLong, "fp8mix.", op,
                     ": offs must be int32 or int64, got ", offs.scalar_type());
    TORCH_CHECK_VALUE(offs.dim() == 1, "fp8mix.", op, ": offs must be 1-D (one entry per group), got shape ",
                      offs.sizes());
    return offs.to(at::kLong).contiguous();
}

const char *offs_why = "offs must be non-decreasing and end at the number of rows";

} // namespace

Tensors4 grouped_quantize_cpu(const Tensor &x, const Tensor &offs, Dtype fp8_dtype, int64_t margin, bool pow2,
                              double eps, bool transpose, bool inf_to_nan)
{
    const char *op = "grouped_quantize";
    check_on(x, kCPU, op, "x");
    check_margin_eps(op, margin, eps);
    const Tensor off = offs_arg(offs, op);
    const int64_t G = off.numel();
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const View2D &v = c.v;
    auto f32 = x.options().dtype(at::kFloat);
    Tensor sinv = new_tensor({G}, f32), amax = new_tensor({G}, f32);
    sync_threads();
    check_status(fp8mix_quantize_current_grouped(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, G,
                                                 off.data_ptr<int64_t>(), (int)margin, pow2 ? 1 : 0, (float)eps,
                                                 c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows),
                                                 sinv.data_ptr<float>(), amax.data_ptr<float>(), &c.o),
                 op, offs_why);
    return {c.q, c.qt, sinv, amax};
}

Tensors4 grouped_delayed_cast_cpu(const Tensor &x, const Tensor &offs, const Tensor &hist, const Tensor &scale,
                                  const Tensor &steps, int64_t role0, int64_t role_step, int64_t history_len,
                                  Dtype fp8_dtype, int64_t margin, bool pow2, Str algo, int64_t interval, bool record,
                                  bool transpose, bool inf_to_nan)
{
    const char *op = "grouped_delayed_cast";
    check_on(x, kCPU, op, "x");
    DelayedRole dr = delayed_role(kCPU, hist, scale, steps, role0, history_len, margin, pow2, algo, interval,
                                  c10::nullopt, op);
    const Tensor off = offs_arg(offs, op);
    const int64_t G = off.numel();
    TORCH_CHECK_VALUE(role_step >= 0 && (G == 0 || role0 + (G - 1) * role_step < dr.d.st.roles), "fp8mix.", op,
                      ": roles ", role0, " + g * ", role_step, " for ", G, " groups go past the state's ",
                      dr.d.st.roles, " roles");
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const View2D &v = c.v;
    auto f32 = x.options().dtype(at::kFloat);
    Tensor scales = new_tensor({G, 2}, f32), amax = new_tensor({G}, f32);
    sync_threads();
    check_status(fp8mix_cast_delayed_grouped(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, G, off.data_ptr<int64_t>(),
                                             c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows), &dr.d.st, role0,
                                             role_step, &dr.d.r, record ? 1 : 0, &c.o, scales.data_ptr<float>(),
                                             amax.data_ptr<float>()),
                 op, offs_why);
    return {c.q, c.qt, scales, amax};
}

Tensors2 grouped_delayed_flush_cpu(const Tensor &hist, const Tensor &scale, const Tensor &steps,
                                   const Tensor &pending, const Tensor &next_slot, int64_t role0, int64_t role_step,
                                   int64_t history_len, Dtype fp8_dtype, int64_t margin, bool pow2, Str algo,
                                   int64_t interval, bool record, bool reserve)
{
    const char *op = "grouped_delayed_flush";
    Delayed d = delayed_role(kCPU, hist, scale, steps, role0, history_len, margin, pow2, algo, interval,
                             c10::nullopt, op).d;
    check_state_tensor(pending, at::kFloat, 2, kCPU, op, "pending");
    check_state_tensor(next_slot, at::kLong, 1, kCPU, op, "next_slot");
    const int64_t G = pending.size(0);
    TORCH_CHECK_VALUE(next_slot.numel() == G && pending.size(1) >= 1, "fp8mix.", op,
                      ": pending (groups, slots) and next_slot (groups) disagree: ", pending.sizes(), " and ",
                      next_slot.sizes());
    TORCH_CHECK_VALUE(record || !reserve, "fp8mix.", op, ": reserve needs record");
    TORCH_CHECK_VALUE(role_step >= 0 && (G == 0 || role0 + (G - 1) * role_step < d.st.roles), "fp8mix.", op,
                      ": roles go past the state's ", d.st.roles);
    Tensor plans = new_tensor({G, 2}, hist.options());
    Tensor slots = at::zeros({G}, steps.options());
    check_status(fp8mix_delayed_flush_grouped(&d.st, role0, role_step, G, fp8_format(fp8_dtype, op), &d.r,
                                              pending.data_ptr<float>(), pending.size(1),
                                              next_slot.data_ptr<int64_t>(), record ? 1 : 0, reserve ? 1 : 0,
                                              plans.data_ptr<float>(), slots.data_ptr<int64_t>()),
                 op);
    return {plans, slots};
}

Tensors5 grouped_grad_cast_cpu(const Tensor &dy, const Tensor &offs, Dtype fp8_dtype, const OptTensor &plans,
                               const OptTensor &pending, const OptTensor &slots, int64_t margin, bool pow2,
                               double eps, bool transpose, bool colsum, bool inf_to_nan)
{
    const char *op = "grouped_grad_cast";
    check_on(dy, kCPU, op, "dy");
    check_margin_eps(op, margin, eps);
    const Tensor off = offs_arg(offs, op);
    const int64_t G = off.numel();
    const float *pl = scalar_f32(plans, kCPU, op, "plans", 2 * G);
    const bool has_p = pending.has_value() && pending->defined(), has_s = slots.has_value() && slots->defined();
    TORCH_CHECK_VALUE(has_p == has_s, "fp8mix.", op, ": pending and slots go together");
    Tensor sl;
    if (has_p) {
        check_state_tensor(*pending, at::kFloat, 2, kCPU, op, "pending");
        TORCH_CHECK_VALUE(pending->size(0) == G, "fp8mix.", op, ": pending must have one row per group (", G,
                          "), got ", pending->sizes());
        check_on(*slots, kCPU, op, "slots");
        TORCH_CHECK_VALUE(slots->scalar_type() == at::kLong && slots->numel() == G, "fp8mix.", op,
                          ": slots must be ", G, " int64 values");
        sl = slots->contiguous();
    }
    CastPrep c = prepare_cast(op, dy, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const View2D &v = c.v;
    auto f32 = dy.options().dtype(at::kFloat);
    Tensor sinv = new_tensor({G}, f32), amax = new_tensor({G}, f32);
    Tensor cs = new_tensor({colsum ? G : 0, colsum ? v.cols : 0}, f32);
    sync_threads();
    check_status(fp8mix_cast_grad_grouped(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, G, off.data_ptr<int64_t>(),
                                          c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows), pl, (int)margin,
                                          pow2 ? 1 : 0, (float)eps, has_p ? pending->data_ptr<float>() : nullptr,
                                          has_p ? pending->size(1) : 0, has_p ? sl.data_ptr<int64_t>() : nullptr,
                                          &c.o, sinv.data_ptr<float>(), amax.data_ptr<float>(),
                                          colsum ? cs.data_ptr<float>() : nullptr),
                 op, "offs must end at the rows, plans' scales finite and > 0, slots inside pending");
    return {c.q, c.qt, sinv, amax, cs};
}

// a (M, K) and b (K, N) FP8, the K dimension cut into groups by offs: out (G, M, N), group g
// the product of a[:, range g] and b[range g, :] with group g's scales (kind 0: (G) and (G);
// 1: (G, M) and (G, N)). a may be row-major or a transposed view (column-major), b likewise.
Tensor scaled_grouped_mm_k_cpu(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                               const Tensor &offs, int64_t scale_kind, const OptTensor &bias, OptDtype out_dtype)
{
    const char *op = "scaled_grouped_mm_k";
    check_on(a, kCPU, op, "a");
    check_on(b, kCPU, op, "b");
    TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, "fp8mix.", op, ": a and b must be 2-D (M, K) and (K, N), got ",
                      a.sizes(), " and ", b.sizes());
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    TORCH_CHECK_VALUE(b.size(0) == K, "fp8mix.", op, ": a is ", a.sizes(), " but b is ", b.sizes());
    const fp8mix_format fa = fp8_format(a.scalar_type(), op), fb = fp8_format(b.scalar_type(), op);
    TORCH_CHECK_VALUE(scale_kind == 0 || scale_kind == 1, "fp8mix.", op,
                      ": scale_kind must be 0 (per group) or 1 (per group and row / column), got ", scale_kind);
    const Tensor off = offs_arg(offs, op);
    const int64_t G = off.numel();
    Tensor ac = a, bc = b;
    fp8mix_a_layout al;
    fp8mix_b_layout bl;
    int64_t lda, ldb;
    if (a.stride(1) == 1 && a.stride(0) >= K) { al = FP8MIX_A_MK; lda = a.stride(0); }
    else if (a.stride(0) == 1 && a.stride(1) >= M) { al = FP8MIX_A_KM; lda = a.stride(1); }
    else { ac = a.contiguous(); al = FP8MIX_A_MK; lda = K; }
    if (b.stride(1) == 1 && b.stride(0) >= N) { bl = FP8MIX_B_KN; ldb = b.stride(0); }
    else if (b.stride(0) == 1 && b.stride(1) >= K) { bl = FP8MIX_B_NK; ldb = b.stride(1); }
    else { bc = b.contiguous(); bl = FP8MIX_B_KN; ldb = N; }
    const Tensor sa = scale_a.to(at::kFloat).contiguous(), sb = scale_b.to(at::kFloat).contiguous();
    const int64_t want_a = scale_kind ? G * M : G, want_b = scale_kind ? G * N : G;
    TORCH_CHECK_VALUE(sa.numel() == want_a && sb.numel() == want_b, "fp8mix.", op, ": scale kind ", scale_kind,
                      " needs ", want_a, " scale_a and ", want_b, " scale_b values, got ", sa.numel(), " and ",
                      sb.numel());
    Tensor bias_c;
    fp8mix_dtype bias_t = FP8MIX_F32;
    if (bias.has_value() && bias->defined()) {
        check_on(*bias, kCPU, op, "bias");
        TORCH_CHECK_VALUE(bias->numel() == G * N, "fp8mix.", op, ": bias must be (groups, N) = (", G, ", ", N,
                          "), got ", bias->sizes());
        bias_t = hp_dtype(*bias, op, "bias");
        bias_c = bias->contiguous();
    }
    const at::ScalarType odt = out_dtype.value_or(at::kFloat);
    Tensor out = new_tensor({G, M, N}, a.options().dtype(odt));
    fp8mix_gemm_args g;
    std::memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = (const uint8_t *)ac.data_ptr(); g.fmt_a = fa; g.lda = ld_of(lda); g.a_layout = al;
    g.b = (const uint8_t *)bc.data_ptr(); g.fmt_b = fb; g.ldb = ld_of(ldb); g.b_layout = bl;
    g.scale_a = sa.data_ptr<float>(); g.scale_a_kind = (fp8mix_mm_scale)scale_kind;
    g.scale_b = sb.data_ptr<float>(); g.scale_b_kind = (fp8mix_mm_scale)scale_kind;
    g.bias = bias_c.defined() ? bias_c.data_ptr() : nullptr; g.bias_t = bias_t;
    g.out = out.data_ptr(); g.out_t = hp_dtype(odt, op); g.ldo = ld_of(N);
    g.accum = FP8MIX_ACCUM_FP32;
    g.order = (fp8mix_gemm_order)get_gemm_order();
    sync_threads();
    check_status(fp8mix_gemm_grouped_k(&g, G, off.data_ptr<int64_t>(), M * N), op,
                 "offs must end at K; scales finite and > 0");
    return out;
}

} // namespace fp8mix_torch
