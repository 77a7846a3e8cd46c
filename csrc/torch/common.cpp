// common.cpp — the device-generic checks and preparation of fp8mix._C's ops (common.h):
// one copy each, taking the device as a parameter. Not here: kernel calls, schemas, and the
// decisions the C core makes from sizes and strides (fp8mix_mm_scale_kinds, called here,
// lives in csrc/core/mm_layout.c).
#include "common.h"

#include <cmath>
#include <cstring>

namespace fp8mix_torch {

void check_status(fp8mix_status st, const char *op, const char *what)
{
    if (st == FP8MIX_OK) return;
    std::string msg = std::string("fp8mix.") + op + ": " + fp8mix_status_string(st);
    if (what && st == FP8MIX_ERR_BAD_SCALE) msg += std::string(" (") + what + ")";
    if (st == FP8MIX_ERR_BAD_ENUM || st == FP8MIX_ERR_BAD_SCALE || st == FP8MIX_ERR_BAD_ARG ||
        st == FP8MIX_ERR_BAD_SHAPE)
        TORCH_CHECK_VALUE(false, msg);
    TORCH_CHECK(false, msg);
}

fp8mix_dtype hp_dtype(at::ScalarType s, const char *op, const char *name)
{
    switch (s) {
    case at::kFloat: return FP8MIX_F32;
    case at::kBFloat16: return FP8MIX_BF16;
    case at::kHalf: return FP8MIX_F16;
    default:
        TORCH_CHECK_TYPE(false, "fp8mix.", op, ": ", name, " must be float32, bfloat16 or float16, got ", s);
    }
    return FP8MIX_F32;
}

fp8mix_format fp8_format(at::ScalarType s, const char *op)
{
    if (s == at::kFloat8_e4m3fn) return FP8MIX_E4M3;
    if (s == at::kFloat8_e5m2) return FP8MIX_E5M2;
    TORCH_CHECK_TYPE(false, "fp8mix.", op, ": FP8 dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got ", s);
    return FP8MIX_E4M3;
}

fp8mix_granularity granularity(int64_t g, const char *op)
{
    TORCH_CHECK_VALUE(g >= 0 && g <= 3, "fp8mix.", op, ": granularity must be 0 (tensor), 1 (row), ",
                      "2 (1x128 block) or 3 (128x128 block), got ", g);
    return (fp8mix_granularity)g;
}

fp8mix_granularity granularity_on(int64_t g, const at::Device &dev, const char *op)
{
    if (!dev.is_cpu()) return granularity(g, op);
    if (g == FP8MIX_GRAN_MX) return FP8MIX_GRAN_MX;
    TORCH_CHECK_VALUE(g >= 0 && g <= 3, "fp8mix.", op, ": granularity must be 0 (tensor), 1 (row), ",
                      "2 (1x128 block), 3 (128x128 block) or 4 (MX 1x32 block), got ", g);
    return (fp8mix_granularity)g;
}

void check_on(const at::Tensor &t, const at::Device &dev, const char *op, const char *name)
{
    TORCH_CHECK_VALUE(t.device() == dev, "fp8mix.", op, ": ", name, " is on ", t.device(), " but the data is on ",
                      dev, dev.is_cpu() ? " (this kernel runs on the CPU; was the CUDA build not installed?)"
                                        : " (all tensors of one call must be on the same device)");
}

void require_cuda(const at::Tensor &t, const char *op, const char *name)
{
    TORCH_CHECK_VALUE(t.is_cuda(), "fp8mix.", op, ": ", name, " is on ", t.device(),
                      " but the other tensors are on CUDA (move them to one device)");
}

void check_margin_eps(const char *op, int64_t margin, double eps)
{
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 126, "fp8mix.", op, ": margin must be in [0, 126], got ", margin);
    TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "fp8mix.", op, ": amax_epsilon must be finite and >= 0");
}

View2D view2d(const at::Tensor &t)
{
    View2D v;
    v.cols = t.dim() == 0 ? 1 : t.size(-1);
    v.rows = 1; // the product of the leading dims, also when the last one is 0
    for (int64_t d = 0; d + 1 < t.dim(); d++) v.rows *= t.size(d);
    if (t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= v.cols && t.size(0) > 0) {
        v.t = t;
        v.ld = t.size(0) > 1 ? t.stride(0) : v.cols;
    } else {
        v.t = t.is_contiguous() ? t : t.contiguous(); // (contiguous() is a dispatch even when a no-op)
        v.ld = v.cols;
    }
    if (v.ld < 1) v.ld = 1;
    return v;
}

std::vector<int64_t> scale_shape(const at::Tensor &x, fp8mix_granularity g, int64_t rows, int64_t cols)
{
    std::vector<int64_t> lead;
    if (x.dim() >= 1)
        for (int64_t d = 0; d < x.dim() - 1; d++) lead.push_back(x.size(d));
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return {};
    case FP8MIX_GRAN_ROW: lead.push_back(1); return lead;
    case FP8MIX_GRAN_BLOCK: lead.push_back((cols + 127) / 128); return lead;
    case FP8MIX_GRAN_MX: lead.push_back((cols + 31) / 32); return lead;
    default: return {(rows + 127) / 128, (cols + 127) / 128};
    }
}

at::Tensor scale_arg(const at::Tensor &s, int64_t expect, const at::Device &dev, const char *op, const char *name)
{
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "fp8mix.", op, ": ", name, " must be float32, got ",
                     s.scalar_type());
    check_on(s, dev, op, name);
    TORCH_CHECK_VALUE(s.numel() == expect, "fp8mix.", op, ": ", name, " has ", s.numel(),
                      " elements but this granularity needs ", expect, " (shape ", s.sizes(), ")");
    return s.contiguous();
}

fp8mix_cast_opts make_opts(fp8mix_format fmt, bool saturate, bool stochastic, int64_t seed, int64_t offset,
                           bool inf_to_nan)
{
    fp8mix_cast_opts o;
    std::memset(&o, 0, sizeof o);
    o.fmt = fmt;
    o.saturate = saturate ? 1 : 0;
    o.rounding = stochastic ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST;
    o.seed = (uint64_t)seed;
    o.offset = (uint64_t)offset;
    o.inf_to_nan = inf_to_nan ? 1 : 0;
    return o;
}

const int64_t *rng_arg(const c10::optional<at::Tensor> &rng, int64_t skip, const at::Device &dev, const char *op)
{
    if (!rng.has_value() || !rng->defined()) return nullptr;
    const at::Tensor &r = *rng;
    TORCH_CHECK_TYPE(r.scalar_type() == at::kLong, "fp8mix.", op, ": rng must be int64 [key, offset], got ",
                     r.scalar_type());
    TORCH_CHECK_VALUE(r.numel() == 2 && r.is_contiguous(), "fp8mix.", op, ": rng must hold 2 int64 values "
                      "[key, offset], got shape ", r.sizes());
    if (dev.is_cpu()) {
        TORCH_CHECK_VALUE(r.device().is_cpu(), "fp8mix.", op, ": rng is on ", r.device(), "; this build reads "
                          "stochastic-rounding streams from CPU tensors");
    } else {
        check_on(r, dev, op, "rng");
    }
    TORCH_CHECK_VALUE(skip >= 0, "fp8mix.", op, ": rng_skip must be >= 0");
    return r.data_ptr<int64_t>();
}

void apply_rng(fp8mix_cast_opts &o, const c10::optional<at::Tensor> &rng, int64_t skip, const char *op)
{
    const int64_t *p = rng_arg(rng, skip, at::Device(at::kCPU), op);
    if (!p) return;
    o.rounding = FP8MIX_ROUND_STOCHASTIC;
    o.seed = (uint64_t)p[0];
    o.offset = (uint64_t)p[1] + (uint64_t)skip;
}

CastPrep prepare_cast(const char *op, const at::Tensor &x, at::ScalarType fp8_dtype, int64_t gran, bool saturate,
                      bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose, bool inf_to_nan)
{
    CastPrep c;
    c.xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(fp8_dtype, op);
    c.g = granularity_on(gran, x.device(), op);
    TORCH_CHECK_VALUE(want_q || transpose, "fp8mix.", op, ": nothing to produce (want_q and transpose both false)");
    c.v = view2d(x);
    c.q = new_tensor(want_q ? x.sizes() : at::IntArrayRef{0}, x.options().dtype(fp8_dtype));
    c.qt = new_tensor(transpose ? std::vector<int64_t>{c.v.cols, c.v.rows} : std::vector<int64_t>{0},
                      x.options().dtype(fp8_dtype));
    c.o = make_opts(fmt, saturate, stochastic, seed, offset, inf_to_nan);
    return c;
}

// ---- the per-tensor recipes' state ---------------------------------------------------

void check_state_tensor(const at::Tensor &t, at::ScalarType dt, int64_t dim, const at::Device &dev, const char *op,
                        const char *name)
{
    TORCH_CHECK_TYPE(t.scalar_type() == dt, "fp8mix.", op, ": ", name, " must be ", dt, ", got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == dim && t.is_contiguous(), "fp8mix.", op, ": ", name, " must be a contiguous ",
                      dim, "-D tensor, got shape ", t.sizes());
    check_on(t, dev, op, name);
}

namespace {

fp8mix_amax_algo amax_algo(c10::string_view algo, const char *op)
{
    TORCH_CHECK_VALUE(algo == "max" || algo == "most_recent", "fp8mix.", op,
                      ": amax_compute_algo must be 'max' or 'most_recent', got '", std::string(algo), "'");
    return algo == "max" ? FP8MIX_AMAX_MAX : FP8MIX_AMAX_MOST_RECENT;
}

Delayed delayed_args(const at::Device &dev, const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps,
                     int64_t history_len, int64_t margin, bool pow2, c10::string_view algo, int64_t interval,
                     const char *op)
{
    check_state_tensor(hist, at::kFloat, 2, dev, op, "amax_history");
    check_state_tensor(scale, at::kFloat, 1, dev, op, "scale");
    check_state_tensor(steps, at::kLong, 1, dev, op, "steps");
    const int64_t R = hist.size(1);
    TORCH_CHECK_VALUE(scale.size(0) == R && steps.size(0) == R, "fp8mix.", op, ": amax_history has ", R,
                      " roles but scale has ", scale.size(0), " and steps ", steps.size(0));
    TORCH_CHECK_VALUE(history_len >= 1 && history_len <= hist.size(0), "fp8mix.", op, ": history_len ", history_len,
                      " must be in [1, ", hist.size(0), "] (the history buffer's rows)");
    TORCH_CHECK_VALUE(interval >= 1, "fp8mix.", op, ": interval must be >= 1, got ", interval);
    check_margin_eps(op, margin, 0.0);
    Delayed d;
    d.st.history = hist.data_ptr<float>();
    d.st.capacity = hist.size(0);
    d.st.roles = R;
    d.st.scale = scale.data_ptr<float>();
    d.st.steps = steps.data_ptr<int64_t>();
    d.r.history_len = history_len;
    d.r.algo = amax_algo(algo, op);
    d.r.margin = (int)margin;
    d.r.pow2 = pow2 ? 1 : 0;
    d.r.interval = interval;
    return d;
}

} // namespace

DelayedRole delayed_role(const at::Device &dev, const at::Tensor &hist, const at::Tensor &scale,
                         const at::Tensor &steps, int64_t role, int64_t history_len, int64_t margin, bool pow2,
                         c10::string_view algo, int64_t interval, const c10::optional<at::Tensor> &fresh_amax,
                         const char *op)
{
    DelayedRole dr;
    dr.d = delayed_args(dev, hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    TORCH_CHECK_VALUE(role >= 0 && role < dr.d.st.roles, "fp8mix.", op, ": role ", role, " outside [0, ",
                      dr.d.st.roles, ")");
    dr.fresh_amax = scalar_f32(fresh_amax, dev, op, "fresh_amax");
    return dr;
}

const float *scalar_f32(const c10::optional<at::Tensor> &t, const at::Device &dev, const char *op, const char *name,
                        int64_t n)
{
    if (!t.has_value() || !t->defined()) return nullptr;
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, "fp8mix.", op, ": ", name, " must be float32");
    TORCH_CHECK_VALUE(t->numel() == n && t->is_contiguous(), "fp8mix.", op, ": ", name, " must hold ", n,
                      " contiguous value(s), got shape ", t->sizes());
    check_on(*t, dev, op, name);
    return t->data_ptr<float>();
}

bool grad_pending_args(const c10::optional<at::Tensor> &pending, const c10::optional<at::Tensor> &slot,
                       const at::Device &dev, const char *op)
{
    const bool has_pending = pending.has_value() && pending->defined();
    TORCH_CHECK_VALUE(has_pending == (slot.has_value() && slot->defined()), "fp8mix.", op,
                      ": pending and slot go together");
    if (!has_pending) return false;
    check_state_tensor(*pending, at::kFloat, 1, dev, op, "pending");
    TORCH_CHECK_TYPE(slot->scalar_type() == at::kLong && slot->numel() == 1, "fp8mix.", op,
                     ": slot must be one int64");
    check_on(*slot, dev, op, "slot");
    return true;
}

void check_flush_args(const at::Tensor &pending, const at::Tensor &next_slot, bool record, bool reserve,
                      const at::Device &dev, const char *op)
{
    check_state_tensor(pending, at::kFloat, 1, dev, op, "pending");
    check_state_tensor(next_slot, at::kLong, 0, dev, op, "next_slot");
    TORCH_CHECK_VALUE(pending.numel() >= 1, "fp8mix.", op, ": pending needs at least one slot");
    TORCH_CHECK_VALUE(record || !reserve, "fp8mix.", op, ": reserve needs record");
}

void check_delayed_update_lists(at::TensorList amax_history, at::TensorList amax, at::TensorList scale,
                                at::TensorList scale_inv, at::TensorList steps, at::ArrayRef<double> fp8_max,
                                int64_t margin, c10::string_view algo, int64_t interval)
{
    const size_t n = amax_history.size();
    TORCH_CHECK_VALUE(amax.size() == n && scale.size() == n && fp8_max.size() == n,
                      "fp8mix.delayed_scale_update: amax_history, amax, scale and fp8_max must have equal lengths");
    TORCH_CHECK_VALUE(scale_inv.empty() || scale_inv.size() == n, "fp8mix.delayed_scale_update: scale_inv must be "
                      "empty or as long as amax_history");
    TORCH_CHECK_VALUE(steps.empty() || steps.size() == n, "fp8mix.delayed_scale_update: steps must be empty or as "
                      "long as amax_history");
    TORCH_CHECK_VALUE(algo == "max" || algo == "most_recent",
                      "fp8mix.delayed_scale_update: amax_compute_algo must be 'max' or 'most_recent'");
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 126, "fp8mix.delayed_scale_update: margin must be in [0, 126]");
    TORCH_CHECK_VALUE(interval >= 1, "fp8mix.delayed_scale_update: interval must be >= 1");
}

void check_delayed_update_entries(at::TensorList amax_history, at::TensorList amax, at::TensorList scale,
                                  at::TensorList scale_inv, at::TensorList steps, const at::Device &dev)
{
    const char *op = "delayed_scale_update";
    auto f32 = [&](const at::Tensor &t, const char *name, int64_t numel) {
        TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "fp8mix.delayed_scale_update: ", name, " must be float32");
        check_on(t, dev, op, name);
        TORCH_CHECK_VALUE(numel < 0 || t.numel() == numel, "fp8mix.delayed_scale_update: ", name, " must have ",
                          numel, " element(s), got ", t.numel());
    };
    for (size_t i = 0; i < amax_history.size(); i++) {
        const at::Tensor &h = amax_history[i];
        f32(h, "amax_history", -1);
        TORCH_CHECK_VALUE(h.dim() == 1 && h.numel() >= 1, "fp8mix.delayed_scale_update: amax_history[", i,
                          "] must be 1-D and non-empty (a column of an (L, k) buffer is fine)");
        f32(amax[i], "amax", 1);
        f32(scale[i], "scale", 1);
        TORCH_CHECK_VALUE((h.size(0) > 1 ? h.stride(0) : 1) >= 1,
                          "fp8mix.delayed_scale_update: bad amax_history stride");
        if (!scale_inv.empty()) f32(scale_inv[i], "scale_inv", 1);
        if (!steps.empty()) {
            TORCH_CHECK_TYPE(steps[i].scalar_type() == at::kLong && steps[i].numel() == 1,
                             "fp8mix.delayed_scale_update: steps must be single int64 values");
            check_on(steps[i], dev, op, "steps");
        }
    }
}

// ---- scaled_mm -----------------------------------------------------------------------

namespace {

fp8mix_mm_scale_given scale_given(const at::Tensor &s, int64_t kind)
{
    const bool two = s.dim() == 2;
    return fp8mix_mm_scale_given{s.dim(), s.numel(), two ? s.size(0) : 0, two ? s.size(1) : 0, kind};
}

// One operand's scale: its own tensor checks, then the C decision's error as today's message.
void check_mm_scale(const at::Tensor &s, fp8mix_mm_scale_error e, int64_t kind, bool is_a, int64_t outer, int64_t k,
                    const at::Device &dev)
{
    const char *name = is_a ? "scale_a" : "scale_b";
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "fp8mix.scaled_mm: ", name, " must be float32, got ",
                     s.scalar_type());
    check_on(s, dev, "scaled_mm", name);
    if (e == FP8MIX_MM_SCALE_FITS) return;
    TORCH_CHECK_VALUE(e != FP8MIX_MM_SCALE_NO_MX,
                      "fp8mix.scaled_mm: MX scales (scale_kind 3) run on the CPU only in this build");
    TORCH_CHECK_VALUE(e != FP8MIX_MM_SCALE_NOT_KIND || kind != FP8MIX_MM_SCALE_MX, "fp8mix.scaled_mm: ", name,
                      " has shape ", s.sizes(), ", which is not the layout of MX scales (", outer, ", ceil(K/32))");
    TORCH_CHECK_VALUE(e != FP8MIX_MM_SCALE_BAD_KIND, "fp8mix.scaled_mm: scale_kind must be 0 (tensor), 1 "
                      "(row/column), 2 (block) or 3 (MX)");
    TORCH_CHECK_VALUE(e != FP8MIX_MM_SCALE_NOT_KIND, "fp8mix.scaled_mm: ", name, " has shape ", s.sizes(),
                      ", which is not the layout of ",
                      kind == 0 ? "a per-tensor scale" : kind == 1 ? "per-row/column scales" : "block scales");
    TORCH_CHECK_VALUE(e != FP8MIX_MM_SCALE_NO_FIT, "fp8mix.scaled_mm: ", name, " has shape ", s.sizes(),
                      "; expected a single value, ",
                      is_a ? "(M, 1) per row, or (M, ceil(K/128)) per 1x128 block"
                           : "(1, N) per column, or (ceil(K/128), ceil(N/128)) per 128x128 block",
                      " (here ", is_a ? "M = " : "N = ", outer, ", ceil(K/128) = ", (k + 127) / 128, ", ceil(",
                      is_a ? "M" : "N", "/128) = ", (outer + 127) / 128, ")");
    TORCH_CHECK(false, "fp8mix.scaled_mm: ", name, ": unexpected scale decision ", (int)e);
}

} // namespace

MmArgs mm_args(const at::Tensor &a, const at::Tensor &b, const at::Tensor &scale_a, const at::Tensor &scale_b,
               const c10::optional<at::Tensor> &bias, c10::optional<at::ScalarType> out_dtype,
               c10::string_view accumulate, int64_t promote_interval, int64_t scale_kind_a, int64_t scale_kind_b,
               const at::Device &dev)
{
    const char *op = "scaled_mm";
    check_on(a, dev, op, "a");
    check_on(b, dev, op, "b");
    TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, "fp8mix.scaled_mm: a and b must be 2-D, got ", a.dim(),
                      "-D and ", b.dim(), "-D");
    MmArgs r;
    r.fmt_a = fp8_format(a.scalar_type(), op);
    r.fmt_b = fp8_format(b.scalar_type(), op);
    r.m = a.size(0);
    r.k = a.size(1);
    r.n = b.size(1);
    TORCH_CHECK_VALUE(b.size(0) == r.k, "fp8mix.scaled_mm: inner dimensions differ: a is ", a.sizes(), ", b is ",
                      b.sizes());
    TORCH_CHECK_VALUE(!(dev.is_cuda() && r.fmt_a == FP8MIX_E5M2 && r.fmt_b == FP8MIX_E5M2),
                      "fp8mix.scaled_mm: E5M2 x E5M2 is not supported by FP8 tensor cores (CUDA); "
                      "use E4M3 for one operand (it runs on CPU)");
    r.out_dtype = out_dtype.value_or(at::kFloat);
    r.out_t = hp_dtype(r.out_dtype, op);
    TORCH_CHECK_VALUE(accumulate == "fp32" || accumulate == "fp22",
                      "fp8mix.scaled_mm: accumulate must be 'fp32' or 'fp22', got '", std::string(accumulate), "'");
    TORCH_CHECK_VALUE(promote_interval >= 0, "fp8mix.scaled_mm: promote_interval must be >= 0");
    r.fp22 = accumulate == "fp22";
    fp8mix_mm_scale_query q;
    std::memset(&q, 0, sizeof q);
    q.m = r.m;
    q.n = r.n;
    q.k = r.k;
    q.a = scale_given(scale_a, scale_kind_a);
    q.b = scale_given(scale_b, scale_kind_b);
    q.backend = dev.is_cpu() ? FP8MIX_MM_BACKEND_CPU : FP8MIX_MM_BACKEND_CUBLASLT;
    fp8mix_mm_scale_choice c;
    const fp8mix_status st = fp8mix_mm_scale_kinds(&q, &c);
    // reported in the order the C decision lists them, each operand after its own tensor checks
    TORCH_CHECK_VALUE(c.pair != FP8MIX_MM_SCALE_HALF_GIVEN, "fp8mix.scaled_mm: give both scale kinds or none");
    check_mm_scale(scale_a, c.err_a, scale_kind_a, true, r.m, r.k, dev);
    check_mm_scale(scale_b, c.err_b, scale_kind_b, false, r.n, r.k, dev);
    TORCH_CHECK_VALUE(c.pair != FP8MIX_MM_SCALE_MX_PAIR, "fp8mix.scaled_mm: MX scales need both operands MX with "
                      "ceil(K/32) = ", (r.k + 31) / 32, " blocks, got scale_a ", scale_a.sizes(), " and scale_b ",
                      scale_b.sizes());
    check_status(st, op);
    r.kind_a = c.kind_a;
    r.kind_b = c.kind_b;
    r.bias_t = FP8MIX_F32;
    if (bias.has_value() && bias->defined()) {
        r.bias = bias->contiguous();
        check_on(r.bias, dev, op, "bias");
        r.bias_t = hp_dtype(r.bias, op, "bias");
        TORCH_CHECK_VALUE(r.bias.dim() == 1 && r.bias.size(0) == r.n, "fp8mix.scaled_mm: bias must have shape (",
                          r.n, "), got ", r.bias.sizes());
    }
    return r;
}

} // namespace fp8mix_torch
