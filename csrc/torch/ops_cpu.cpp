// ops_cpu.cpp — the CPU kernels of the fp8mix::* ops: casts, amax, scales, dequantisation,
// statistics, MX quantisation, the per-tensor recipes' state and casts, the scaled GEMM;
// each checks its tensors (common.h), asks the C core for any layout decision
// (csrc/core/mm_layout.c) and calls the C API. Also the one TORCH_LIBRARY_IMPL(fp8mix, CPU)
// block, which registers these and the kernels of fused_cpu.cpp and linear_cpu.cpp.
// Not here: schemas (schema.cpp), fused norm / activation casts (fused_cpu.cpp), the
// linear-layer compositions (linear_cpu.cpp), CUDA (ops_cuda.cpp).
#include <torch/library.h>

#include <atomic>
#include <cstring>

#include "common.h"
#include "ops.h"

namespace fp8mix_torch {

// ---- casts, amax, scales -------------------------------------------------------------

Tensors3 cast_cpu(const Tensor &x, const Tensor &scale, Dtype fp8_dtype, int64_t gran, bool saturate,
                  bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose, bool inf_to_nan,
                  const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "cast";
    check_on(x, kCPU, op, "x");
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    Tensor s = scale_arg(scale, scale_count(c.g, v.rows, v.cols), kCPU, op, "scale");
    Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_cast(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, s.data_ptr<float>(), c.q_ptr(),
                             ld_of(v.cols), c.qt_ptr(), ld_of(v.rows), amax.data_ptr<float>(), &c.o),
                 op, "scale must be finite and > 0");
    return {c.q, c.qt, amax};
}

namespace {

// quantize_current of x = y.t() in 1x128 blocks, read from y (rd: y's rows, cols and row
// stride, as fp8mix_quantize_current_read gave them), with no contiguous copy of x.
Tensors4 quantize_current_t_cpu(const Tensor &x, const fp8mix_quantize_read &rd, Dtype fp8_dtype, int64_t margin,
                                bool pow2, double eps, bool saturate, bool stochastic, int64_t seed, int64_t offset,
                                bool inf_to_nan, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "quantize";
    const fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_cast_opts o = make_opts(fp8_format(fp8_dtype, op), saturate, stochastic, seed, offset, inf_to_nan);
    apply_rng(o, rng, rng_skip, op);
    const int64_t rows = x.size(0), cols = x.size(1);
    Tensor q = new_tensor({rows, cols}, x.options().dtype(fp8_dtype));
    auto sshape = scale_shape(x, FP8MIX_GRAN_BLOCK, rows, cols);
    Tensor sinv = new_tensor(sshape, x.options().dtype(at::kFloat));
    Tensor amax = new_tensor(sshape, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_quantize_current_t(x.data_ptr(), xt, rd.rows, rd.cols, rd.ld, FP8MIX_GRAN_BLOCK, (int)margin,
                                           pow2 ? 1 : 0, (float)eps, static_cast<uint8_t *>(q.data_ptr()), cols,
                                           sinv.data_ptr<float>(), amax.data_ptr<float>(), &o),
                 op);
    return {q, new_tensor({0}, x.options().dtype(fp8_dtype)), sinv, amax};
}

} // namespace

Tensors4 quantize_current_cpu(const Tensor &x, Dtype fp8_dtype, int64_t gran, int64_t margin, bool pow2, double eps,
                              bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q,
                              bool transpose, bool inf_to_nan, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "quantize";
    check_on(x, kCPU, op, "x");
    check_margin_eps(op, margin, eps);
    fp8mix_strided2d xs = {0, 0, 0, 0};
    if (x.dim() == 2) xs = strided2d(x);
    fp8mix_quantize_read rd;
    check_status(fp8mix_quantize_current_read(x.dim(), &xs, gran,
                                              (want_q ? FP8MIX_OUT_Q : 0u) | (transpose ? FP8MIX_OUT_QT : 0u), &rd),
                 op);
    if (rd.source == FP8MIX_READ_TRANSPOSED)
        return quantize_current_t_cpu(x, rd, fp8_dtype, margin, pow2, eps, saturate, stochastic, seed, offset,
                                      inf_to_nan, rng, rng_skip);
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    auto sshape = scale_shape(x, c.g, v.rows, v.cols);
    Tensor sinv = at::ones(sshape, x.options().dtype(at::kFloat));
    Tensor amax = at::zeros(sshape, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_quantize_current(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, (int)margin, pow2 ? 1 : 0,
                                         (float)eps, c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows),
                                         sinv.data_ptr<float>(), amax.data_ptr<float>(), &c.o),
                 op);
    return {c.q, c.qt, sinv, amax};
}

Tensor amax_cpu(const Tensor &x, int64_t gran)
{
    const char *op = "amax";
    check_on(x, kCPU, op, "x");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_granularity g = granularity_on(gran, kCPU, op);
    View2D v = view2d(x);
    Tensor out = at::zeros(scale_shape(x, g, v.rows, v.cols), x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_amax(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, g, out.data_ptr<float>()), op);
    return out;
}

Tensors2 compute_scale_cpu(const Tensor &amax, Dtype fp8_dtype, int64_t margin, bool pow2, double eps)
{
    const char *op = "compute_scale";
    check_on(amax, kCPU, op, "amax");
    TORCH_CHECK_TYPE(amax.scalar_type() == at::kFloat, "fp8mix.compute_scale: amax must be float32");
    check_margin_eps(op, margin, eps);
    Tensor a = amax.contiguous();
    Tensor s = at::empty_like(a), si = at::empty_like(a);
    check_status(fp8mix_compute_scale(a.data_ptr<float>(), a.numel(), fp8_format(fp8_dtype, op), (int)margin,
                                      pow2 ? 1 : 0, (float)eps, s.data_ptr<float>(), si.data_ptr<float>()),
                 op);
    return {s, si};
}

// Statistics of a cast (fp8mix_quant_stats): a float64 tensor of FP8MIX_STATS_N entries.
// bad_scale_as_one: count a scale_inv that is not finite and > 0 and measure its tile with 1 (else an error).
Tensor quant_stats_cpu(const Tensor &x, const Tensor &q, const Tensor &scale_inv, int64_t gran, bool bad_scale_as_one)
{
    const char *op = "quant_stats";
    check_on(x, kCPU, op, "x");
    check_on(q, kCPU, op, "q");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_granularity g = granularity_on(gran, kCPU, op);
    TORCH_CHECK_VALUE(x.sizes() == q.sizes(), "fp8mix.", op, ": x has shape ", x.sizes(), " but q has shape ",
                      q.sizes());
    View2D vx = view2d(x), vq = view2d(q);
    Tensor s = scale_arg(scale_inv, scale_count(g, vx.rows, vx.cols), kCPU, op, "scale_inv");
    Tensor out = new_tensor({FP8MIX_STATS_N}, x.options().dtype(at::kDouble));
    fp8mix_stats_opts opts = {bad_scale_as_one ? 1 : 0};
    sync_threads();
    check_status(fp8mix_quant_stats(vx.t.data_ptr(), xt, vx.rows, vx.cols, vx.ld, (const uint8_t *)vq.t.data_ptr(),
                                    vq.ld, fmt, g, s.data_ptr<float>(), &opts, out.data_ptr<double>()),
                 op, "scale_inv must be finite and > 0");
    return out;
}

Tensor dequantize_cpu(const Tensor &q, const Tensor &scale_inv, int64_t gran, Dtype out_dtype)
{
    const char *op = "dequantize";
    check_on(q, kCPU, op, "q");
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_dtype ot = hp_dtype(out_dtype, op);
    fp8mix_granularity g = granularity_on(gran, kCPU, op);
    View2D v = view2d(q);
    Tensor s = scale_arg(scale_inv, scale_count(g, v.rows, v.cols), kCPU, op, "scale_inv");
    Tensor out = new_tensor(q.sizes(), q.options().dtype(out_dtype));
    sync_threads();
    check_status(fp8mix_dequantize((const uint8_t *)v.t.data_ptr(), fmt, v.rows, v.cols, v.ld, g,
                                   s.data_ptr<float>(), out.data_ptr(), ot, ld_of(v.cols)),
                 op, "scale_inv must be finite and > 0");
    return out;
}

// MX quantisation (fp8mix_quantize_mx): rule 0 rceil, 1 floor; with transpose, the second
// quantisation of x's transpose (its own 1x32 blocks and scales).
Tensors5 quantize_mx_cpu(const Tensor &x, Dtype fp8_dtype, int64_t rule, int64_t margin, double eps, bool saturate,
                         bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose, bool inf_to_nan,
                         const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "quantize_mx";
    check_on(x, kCPU, op, "x");
    check_margin_eps(op, margin, eps);
    TORCH_CHECK_VALUE(rule == 0 || rule == 1, "fp8mix.", op, ": rule must be 0 (rceil) or 1 (floor), got ", rule);
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_MX, saturate, stochastic, seed, offset, want_q,
                              transpose, inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    auto opts = x.options().dtype(at::kFloat);
    Tensor sinv = want_q ? at::ones(scale_shape(x, FP8MIX_GRAN_MX, v.rows, v.cols), opts) : new_tensor({0}, opts);
    Tensor amax = want_q ? at::zeros(scale_shape(x, FP8MIX_GRAN_MX, v.rows, v.cols), opts) : new_tensor({0}, opts);
    Tensor sinv_t = transpose ? at::ones({v.cols, (v.rows + 31) / 32}, opts) : new_tensor({0}, opts);
    sync_threads();
    check_status(fp8mix_quantize_mx(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, (fp8mix_mx_rule)rule, (int)margin,
                                    (float)eps, c.q_ptr(), ld_of(v.cols), want_q ? sinv.data_ptr<float>() : nullptr,
                                    c.qt_ptr(), ld_of(v.rows), transpose ? sinv_t.data_ptr<float>() : nullptr,
                                    want_q ? amax.data_ptr<float>() : nullptr, &c.o),
                 op);
    return {c.q, sinv, c.qt, sinv_t, amax};
}

// ---- the per-tensor recipes' state and casts (csrc/core/recipe.c) ---------------------

Tensors4 delayed_cast_cpu(const Tensor &x, const Tensor &hist, const Tensor &scale, const Tensor &steps, int64_t role,
                          int64_t history_len, Dtype fp8_dtype, int64_t margin, bool pow2, Str algo, int64_t interval,
                          bool record, bool transpose, bool inf_to_nan, const OptTensor &fresh_amax,
                          const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "delayed_cast";
    check_on(x, kCPU, op, "x");
    DelayedRole dr = delayed_role(kCPU, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                                  fresh_amax, op);
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    Tensor scales = new_tensor({2}, x.options().dtype(at::kFloat));
    Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    sync_threads();
    const View2D &v = c.v;
    check_status(fp8mix_cast_delayed(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols), c.qt_ptr(),
                                     ld_of(v.rows), &dr.d.st, role, &dr.d.r, dr.fresh_amax, record ? 1 : 0, &c.o,
                                     scales.data_ptr<float>(), amax.data_ptr<float>()),
                 op);
    return {c.q, c.qt, scales, amax};
}

Tensors5 grad_cast_cpu(const Tensor &dy, Dtype fp8_dtype, const OptTensor &plan, const OptTensor &pending,
                       const OptTensor &slot, int64_t margin, bool pow2, double eps, bool transpose, bool colsum,
                       bool inf_to_nan, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "grad_cast";
    check_on(dy, kCPU, op, "dy");
    check_margin_eps(op, margin, eps);
    const float *pl = scalar_f32(plan, kCPU, op, "plan", 2);
    float *pend_slot = nullptr;
    if (grad_pending_args(pending, slot, kCPU, op)) {
        const int64_t k = *slot->data_ptr<int64_t>(); // (a CPU int64 of one element: no .item() dispatch)
        TORCH_CHECK_VALUE(k >= 0 && k < pending->numel(), "fp8mix.", op, ": slot ", k, " outside [0, ",
                          pending->numel(), ")");
        pend_slot = pending->data_ptr<float>() + k;
    }
    CastPrep c = prepare_cast(op, dy, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    Tensor sinv = new_tensor({}, dy.options().dtype(at::kFloat));
    Tensor amax = new_tensor({}, dy.options().dtype(at::kFloat));
    Tensor cs = new_tensor({colsum ? v.cols : 0}, dy.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_cast_grad(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols), c.qt_ptr(),
                                  ld_of(v.rows), pl, (int)margin, pow2 ? 1 : 0, (float)eps, pend_slot, &c.o,
                                  sinv.data_ptr<float>(), amax.data_ptr<float>(),
                                  colsum ? cs.data_ptr<float>() : nullptr),
                 op, "the plan's scale must be finite and > 0");
    return {c.q, c.qt, sinv, amax, cs};
}

void delayed_record_cpu(const Tensor &hist, const Tensor &scale, const Tensor &steps, int64_t role,
                        int64_t history_len, const Tensor &amax, Dtype fp8_dtype, int64_t margin, bool pow2, Str algo,
                        int64_t interval, bool rescale_only)
{
    const char *op = "delayed_record";
    Delayed d = delayed_role(kCPU, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                             c10::nullopt, op).d;
    const fp8mix_format fmt = fp8_format(fp8_dtype, op);
    if (rescale_only) {
        check_status(fp8mix_delayed_rescale(&d.st, role, fmt, &d.r), op);
        return;
    }
    const float *a = scalar_f32(amax, kCPU, op, "amax");
    check_status(fp8mix_delayed_record(&d.st, role, fmt, &d.r, *a), op);
}

Tensors2 delayed_flush_cpu(const Tensor &hist, const Tensor &scale, const Tensor &steps, const Tensor &pending,
                           const Tensor &next_slot, int64_t role, int64_t history_len, Dtype fp8_dtype,
                           int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool reserve)
{
    const char *op = "delayed_flush";
    Delayed d = delayed_role(kCPU, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                             c10::nullopt, op).d;
    check_flush_args(pending, next_slot, record, reserve, kCPU, op);
    Tensor plan = new_tensor({2}, hist.options());
    Tensor slot = new_tensor({}, steps.options());
    *slot.data_ptr<int64_t>() = 0; // (written only when reserving)
    check_status(fp8mix_delayed_flush(&d.st, role, fp8_format(fp8_dtype, op), &d.r, pending.data_ptr<float>(),
                                      pending.numel(), next_slot.data_ptr<int64_t>(), record ? 1 : 0,
                                      reserve ? 1 : 0, plan.data_ptr<float>(), slot.data_ptr<int64_t>()),
                 op);
    return {plan, slot};
}

// ---- the scaled GEMM -----------------------------------------------------------------

// The summation order the CPU GEMMs pass to fp8mix_gemm: Python's choice (fp8mix.gemm_order
// sets it through set_gemm_order when fp8mix is imported and whenever it changes), kept here
// only because the linear ops reach scaled_mm_cpu without a Python call in between.
static std::atomic<int> g_gemm_order{FP8MIX_GEMM_CANONICAL};

void set_gemm_order(int64_t order)
{
    TORCH_CHECK_VALUE(order == FP8MIX_GEMM_CANONICAL || order == FP8MIX_GEMM_NATIVE,
                      "fp8mix.set_gemm_order: order must be 0 (canonical) or 1 (native), got ", order);
    g_gemm_order.store((int)order, std::memory_order_relaxed);
}

int64_t get_gemm_order() { return g_gemm_order.load(std::memory_order_relaxed); }

std::string gemm_kernel(int64_t order)
{
    const char *name = order == FP8MIX_GEMM_CANONICAL || order == FP8MIX_GEMM_NATIVE
                           ? fp8mix_gemm_kernel_name((fp8mix_gemm_order)order)
                           : nullptr;
    TORCH_CHECK_VALUE(name, "fp8mix.gemm_kernel: order must be 0 (canonical) or 1 (native), got ", order);
    return name;
}

Tensor scaled_mm_cpu(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                     const OptTensor &bias, OptDtype out_dtype, Str accumulate, int64_t promote_interval,
                     int64_t scale_kind_a, int64_t scale_kind_b)
{
    const char *op = "scaled_mm";
    const MmArgs r = mm_args(a, b, scale_a, scale_b, bias, out_dtype, accumulate, promote_interval, scale_kind_a,
                             scale_kind_b, kCPU);
    // a and b read in place when row- or column-major (a transposed view: wgrad's dy^T, w.t())
    const fp8mix_strided2d as = strided2d(a), bs = strided2d(b);
    fp8mix_gemm_operands lay;
    check_status(fp8mix_gemm_operand_layout(&as, &bs, &lay), op);
    const Tensor ac = lay.copy_a ? a.contiguous() : a, bc = lay.copy_b ? b.contiguous() : b;
    const Tensor sa = scale_a.contiguous(), sb = scale_b.contiguous();
    Tensor out = new_tensor({r.m, r.n}, a.options().dtype(r.out_dtype));
    fp8mix_gemm_args g;
    std::memset(&g, 0, sizeof g);
    g.m = r.m; g.n = r.n; g.k = r.k;
    g.a = (const uint8_t *)ac.data_ptr(); g.fmt_a = r.fmt_a; g.lda = lay.lda; g.a_layout = lay.a_layout;
    g.b = (const uint8_t *)bc.data_ptr(); g.fmt_b = r.fmt_b; g.ldb = lay.ldb; g.b_layout = lay.b_layout;
    g.scale_a = sa.data_ptr<float>(); g.scale_a_kind = r.kind_a;
    g.scale_b = sb.data_ptr<float>(); g.scale_b_kind = r.kind_b;
    g.bias = r.bias.defined() ? r.bias.data_ptr() : nullptr; g.bias_t = r.bias_t;
    g.out = out.data_ptr(); g.out_t = r.out_t; g.ldo = ld_of(r.n);
    g.accum = r.fp22 ? FP8MIX_ACCUM_FP22 : FP8MIX_ACCUM_FP32;
    g.promote_interval = promote_interval;
    g.order = (fp8mix_gemm_order)g_gemm_order.load(std::memory_order_relaxed);
    sync_threads();
    check_status(fp8mix_gemm(&g), op, "scales must be finite and > 0");
    return out;
}

// The grouped GEMM (fp8mix_gemm_grouped): a (M, K) FP8, b (G, K, N) FP8 whose groups are
// row-major K x N or column-major (b = w.transpose(-2, -1) of (G, N, K) weights), offs (G)
// the groups' cumulative row ends, scale_kind the fp8mix_mm_scale of both operands (chosen by
// fp8mix.ops from the scales' shapes), scales float32 as fp8mix.h states per kind, bias (G, N).
Tensor scaled_grouped_mm_cpu(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                             const Tensor &offs, int64_t scale_kind, const OptTensor &bias, OptDtype out_dtype)
{
    const char *op = "scaled_grouped_mm";
    check_on(a, kCPU, op, "a");
    check_on(b, kCPU, op, "b");
    TORCH_CHECK_VALUE(a.dim() == 2, "fp8mix.", op, ": a must be 2-D (M, K), got ", a.sizes());
    TORCH_CHECK_VALUE(b.dim() == 3, "fp8mix.", op, ": b must be 3-D (groups, K, N), got ", b.sizes());
    const int64_t M = a.size(0), K = a.size(1), G = b.size(0), N = b.size(2);
    TORCH_CHECK_VALUE(b.size(1) == K, "fp8mix.", op, ": a is (M, K) = ", a.sizes(), " but b's groups are (K, N) = (",
                      b.size(1), ", ", N, ")");
    const fp8mix_format fa = fp8_format(a.scalar_type(), op), fb = fp8_format(b.scalar_type(), op);
    TORCH_CHECK_VALUE(scale_kind >= 0 && scale_kind <= 3, "fp8mix.", op, ": scale_kind must be 0..3, got ",
                      scale_kind);
    TORCH_CHECK_TYPE(offs.scalar_type() == at::kInt || offs.scalar_type() == at::kLong, "fp8mix.", op,
                     ": offs must be int32 or int64, got ", offs.scalar_type());
    TORCH_CHECK_VALUE(offs.dim() == 1 && offs.size(0) == G, "fp8mix.", op, ": offs must have one entry per group (",
                      G, "), got shape ", offs.sizes());
    check_on(offs, kCPU, op, "offs");
    const Tensor off = offs.to(at::kLong).contiguous();
    const Tensor ac = a.stride(1) == 1 ? a : a.contiguous();
    Tensor bc = b;
    fp8mix_b_layout bl;
    int64_t ldb;
    if (b.stride(2) == 1 && b.stride(1) >= N) { bl = FP8MIX_B_KN; ldb = b.stride(1); }
    else if (b.stride(1) == 1 && b.stride(2) >= K) { bl = FP8MIX_B_NK; ldb = b.stride(2); }
    else { bc = b.contiguous(); bl = FP8MIX_B_KN; ldb = N; }
    const auto kind = (fp8mix_mm_scale)scale_kind;
    const Tensor sa = scale_a.to(at::kFloat).contiguous(), sb = scale_b.to(at::kFloat).contiguous();
    const int64_t kb128 = (K + 127) / 128, kb32 = (K + 31) / 32;
    const int64_t want_a = kind == FP8MIX_MM_SCALE_TENSOR ? G : kind == FP8MIX_MM_SCALE_OUTER ? M
                           : kind == FP8MIX_MM_SCALE_MX ? M * kb32 : M * kb128;
    const int64_t want_b = kind == FP8MIX_MM_SCALE_TENSOR ? G : kind == FP8MIX_MM_SCALE_OUTER ? G * N
                           : kind == FP8MIX_MM_SCALE_MX ? G * N * kb32 : G * kb128 * ((N + 127) / 128);
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
    const fp8mix_dtype ot = hp_dtype(odt, op);
    Tensor out = new_tensor({M, N}, a.options().dtype(odt));
    fp8mix_gemm_args g;
    std::memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = (const uint8_t *)ac.data_ptr(); g.fmt_a = fa; g.lda = ld_of(ac.stride(0)); g.a_layout = FP8MIX_A_MK;
    g.b = (const uint8_t *)bc.data_ptr(); g.fmt_b = fb; g.ldb = ld_of(ldb); g.b_layout = bl;
    g.scale_a = sa.data_ptr<float>(); g.scale_a_kind = kind;
    g.scale_b = sb.data_ptr<float>(); g.scale_b_kind = kind;
    g.bias = bias_c.defined() ? bias_c.data_ptr() : nullptr; g.bias_t = bias_t;
    g.out = out.data_ptr(); g.out_t = ot; g.ldo = ld_of(N);
    g.accum = FP8MIX_ACCUM_FP32;
    g.order = (fp8mix_gemm_order)g_gemm_order.load(std::memory_order_relaxed);
    sync_threads();
    check_status(fp8mix_gemm_grouped(&g, G, off.data_ptr<int64_t>(), G > 1 ? bc.stride(0) : 0), op,
                 "scales must be finite and > 0");
    return out;
}

std::string cpu_isa() { return fp8mix_isa_name(fp8mix_active_isa()); }

void set_max_isa(std::string name)
{
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512bf16", "amx"};
    for (int i = 0; i < 5; i++)
        if (name == names[i]) {
            fp8mix_set_max_isa((fp8mix_isa)i);
            return;
        }
    TORCH_CHECK_VALUE(false, "fp8mix.set_max_isa: unknown ISA '", name,
                      "' (expected scalar, avx2, avx512, avx512bf16 or amx)");
}

} // namespace fp8mix_torch

// Every CPU kernel of the library: this file's, fused_cpu.cpp's, linear_cpu.cpp's, grouped_cpu.cpp's and
// nvfp4_cpu.cpp's.
TORCH_LIBRARY_IMPL(fp8mix, CPU, m)
{
    FP8MIX_OPS_ON_EVERY_DEVICE(FP8MIX_IMPL_OP, cpu)
    // CPU only
    using namespace fp8mix_torch;
    m.impl("quantize_mx", &quantize_mx_cpu);
    m.impl("norm_cast", &norm_cast_cpu);
    m.impl("norm_delayed_cast", &norm_delayed_cast_cpu);
    m.impl("act_cast", &act_cast_cpu);
    m.impl("act_delayed_cast", &act_delayed_cast_cpu);
    m.impl("linear_delayed_casts", &linear_delayed_casts_cpu);
    m.impl("linear_current_casts", &linear_current_casts_cpu);
    m.impl("linear_backward", &linear_backward_cpu);
    m.impl("scaled_grouped_mm", &scaled_grouped_mm_cpu);
    m.impl("scaled_grouped_mm_k", &scaled_grouped_mm_k_cpu);
    m.impl("grouped_quantize", &grouped_quantize_cpu);
    m.impl("grouped_delayed_cast", &grouped_delayed_cast_cpu);
    m.impl("grouped_delayed_flush", &grouped_delayed_flush_cpu);
    m.impl("grouped_grad_cast", &grouped_grad_cast_cpu);
    m.impl("quantize_nvfp4", &quantize_nvfp4_cpu);
    m.impl("dequantize_nvfp4", &dequantize_nvfp4_cpu);
    m.impl("nvfp4_mm", &nvfp4_mm_cpu);
    m.impl("rht16", &rht16_cpu);
}
