// fused_cpu.cpp — the CPU kernels of the fused producer casts (csrc/core/norm.c, act.c): a
// LayerNorm / RMSNorm or an activation that writes its GEMM's FP8 input itself. The cast
// half (granularity, given scales or current scaling, the outputs) is the same for both
// producers and lives in FusedPrep; the delayed variants take a module's state tensors like
// delayed_cast. Produced tensors have x's leading dimensions. Registered by ops_cpu.cpp's
// TORCH_LIBRARY_IMPL block. Not here: the plain casts (ops_cpu.cpp); no CUDA kernels exist.
#include <cmath>
#include <cstring>

#include "common.h"
#include "ops.h"

namespace fp8mix_torch {
namespace {

struct FusedPrep {
    fp8mix_fused_out out;
    fp8mix_cast_opts o;
    Tensor q, qt, scale_inv, amax, hp, scale;
};

// sizes: the produced tensor's (rows x cols as 2-D); `like`: the input, whose
// leading dimensions the per-granularity outputs take.
FusedPrep prepare_fused(const char *op, const Tensor &like, std::vector<int64_t> sizes, int64_t rows, int64_t cols,
                        Dtype fp8_dtype, int64_t gran, const OptTensor &scale, int64_t margin, bool pow2, double eps,
                        bool want_q, bool transpose, bool inf_to_nan, const OptTensor &rng, int64_t rng_skip,
                        OptDtype hp_out)
{
    FusedPrep f;
    std::memset(&f.out, 0, sizeof f.out);
    const fp8mix_format fmt = fp8_format(fp8_dtype, op);
    const fp8mix_granularity g = granularity(gran, op);
    check_margin_eps(op, margin, eps);
    TORCH_CHECK_VALUE(want_q || !transpose, "fp8mix.", op, ": transpose needs want_q (the transpose is made from q)");
    const at::TensorOptions opt = like.options();
    f.q = new_tensor(want_q ? at::IntArrayRef(sizes) : at::IntArrayRef{0}, opt.dtype(fp8_dtype));
    f.qt = new_tensor(transpose ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{0}, opt.dtype(fp8_dtype));
    auto sshape = scale_shape(like, g, rows, cols);
    f.scale_inv = at::ones(sshape, opt.dtype(at::kFloat));
    f.amax = at::zeros(sshape, opt.dtype(at::kFloat));
    f.hp = hp_out.has_value() ? new_tensor(sizes, opt.dtype(*hp_out)) : new_tensor({0}, opt.dtype(at::kFloat));
    fp8mix_dtype yt = hp_out.has_value() ? hp_dtype(*hp_out, op) : FP8MIX_F32;
    if (scale.has_value() && scale->defined()) {
        f.scale = scale_arg(*scale, scale_count(g, rows, cols), kCPU, op, "scale");
        f.out.scale = f.scale.data_ptr<float>();
    }
    f.o = make_opts(fmt, true, false, 0, 0, inf_to_nan);
    apply_rng(f.o, rng, rng_skip, op);
    f.out.gran = g;
    f.out.margin = (int)margin;
    f.out.pow2 = pow2 ? 1 : 0;
    f.out.amax_epsilon = (float)eps;
    f.out.q = want_q && f.q.numel() ? (uint8_t *)f.q.data_ptr() : nullptr;
    f.out.ld_q = ld_of(cols);
    f.out.qt = f.qt.numel() ? (uint8_t *)f.qt.data_ptr() : nullptr;
    f.out.ld_qt = ld_of(rows);
    f.out.scale_inv = f.scale_inv.data_ptr<float>();
    f.out.amax = f.amax.data_ptr<float>();
    f.out.y = hp_out.has_value() && f.hp.numel() ? f.hp.data_ptr() : nullptr;
    f.out.yt = yt;
    f.out.ld_y = ld_of(cols);
    return f;
}

// A CPU float32 vector of n entries (a norm's statistics), contiguous.
Tensor stats_arg(const Tensor &t, int64_t n, const char *op, const char *name)
{
    TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "fp8mix.", op, ": ", name, " must be float32, got ",
                     t.scalar_type());
    check_on(t, kCPU, op, name);
    TORCH_CHECK_VALUE(t.numel() == n, "fp8mix.", op, ": ", name, " has ", t.numel(), " entries, expected ", n,
                      " (one per row)");
    return t.contiguous();
}

// The normalization's arguments; stats given (mean / rstd of an earlier call) or
// allocated here and returned.
struct NormArgs {
    fp8mix_norm_params np;
    Tensor gamma, beta, mean, rstd;
    bool given = false;
};

NormArgs norm_args(const char *op, const View2D &v, const Tensor &x, const OptTensor &gamma, const OptTensor &beta,
                   int64_t kind, double eps, bool zero_centered_gamma, const OptTensor &mean, const OptTensor &rstd)
{
    NormArgs a;
    std::memset(&a.np, 0, sizeof a.np);
    TORCH_CHECK_VALUE(kind == 0 || kind == 1, "fp8mix.", op, ": kind must be 0 (LayerNorm) or 1 (RMSNorm), got ",
                      kind);
    TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "fp8mix.", op, ": eps must be finite and >= 0, got ", eps);
    a.np.kind = (fp8mix_norm_kind)kind;
    a.np.eps = (float)eps;
    a.np.zero_centered_gamma = zero_centered_gamma ? 1 : 0;
    Dtype wdt = at::kFloat;
    for (int k = 0; k < 2; k++) {
        const OptTensor &w = k ? beta : gamma;
        if (!w.has_value() || !w->defined()) continue;
        const char *name = k ? "beta" : "gamma";
        hp_dtype(*w, op, name);
        check_on(*w, kCPU, op, name);
        TORCH_CHECK_VALUE(w->numel() == v.cols, "fp8mix.", op, ": ", name, " has ", w->numel(),
                          " entries but x has ", v.cols, " features");
        TORCH_CHECK_TYPE(!(k && a.gamma.defined()) || w->scalar_type() == wdt, "fp8mix.", op,
                         ": gamma and beta must have one dtype, got ", wdt, " and ", w->scalar_type());
        wdt = w->scalar_type();
        (k ? a.beta : a.gamma) = w->contiguous();
    }
    a.np.gamma = a.gamma.defined() ? a.gamma.data_ptr() : nullptr;
    a.np.beta = a.beta.defined() ? a.beta.data_ptr() : nullptr;
    a.np.wt = hp_dtype(wdt, op, "gamma");
    const bool layer = kind == 0;
    a.given = rstd.has_value() && rstd->defined();
    if (a.given) {
        TORCH_CHECK_VALUE(!layer || (mean.has_value() && mean->defined()), "fp8mix.", op,
                          ": LayerNorm statistics need mean with rstd");
        a.rstd = stats_arg(*rstd, v.rows, op, "rstd");
        if (layer) a.mean = stats_arg(*mean, v.rows, op, "mean");
    } else {
        TORCH_CHECK_VALUE(!(mean.has_value() && mean->defined()), "fp8mix.", op, ": mean given without rstd");
        a.rstd = new_tensor({v.rows}, x.options().dtype(at::kFloat));
        if (layer) a.mean = new_tensor({v.rows}, x.options().dtype(at::kFloat));
    }
    return a;
}

// What the op returns for the statistics: the ones it computed, or nothing when given.
Tensors2 stats_out(const NormArgs &a, const Tensor &x)
{
    auto none = [&] { return new_tensor({0}, x.options().dtype(at::kFloat)); }; // distinct tensors: outputs never alias
    if (a.given) return {none(), none()};
    return {a.mean.defined() ? a.mean : none(), a.rstd};
}

// The producer's input (x or h): on the CPU, of a float type, viewed as 2-D.
struct FusedIn {
    fp8mix_dtype t;
    View2D v;
};

FusedIn fused_input(const char *op, const Tensor &x, const char *name)
{
    check_on(x, kCPU, op, name);
    const fp8mix_dtype t = hp_dtype(x, op, name);
    return {t, view2d(x)};
}

float *ptr_or_null(const Tensor &t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

// An activation's input: its kind, and the produced sizes (half the last dim when gated).
std::vector<int64_t> act_sizes(const char *op, const Tensor &h, const View2D &v, int64_t act, int64_t *cols)
{
    const int gated = fp8mix_act_gated((fp8mix_act_kind)act);
    TORCH_CHECK_VALUE(gated >= 0, "fp8mix.", op, ": unknown activation kind ", act, " (0..9, fp8mix_act_kind)");
    TORCH_CHECK_VALUE(!gated || v.cols % 2 == 0, "fp8mix.", op, ": a gated activation needs an even last ",
                      "dimension (two halves), got ", v.cols);
    *cols = gated ? v.cols / 2 : v.cols;
    std::vector<int64_t> sizes = h.dim() ? h.sizes().vec() : std::vector<int64_t>{1};
    sizes.back() = *cols;
    return sizes;
}

} // namespace

Tensors7 norm_cast_cpu(const Tensor &x, const OptTensor &gamma, const OptTensor &beta, int64_t kind, double eps,
                       bool zero_centered_gamma, Dtype fp8_dtype, int64_t gran, const OptTensor &scale,
                       int64_t margin, bool pow2, double amax_eps, bool want_q, bool transpose, bool inf_to_nan,
                       const OptTensor &rng, int64_t rng_skip, const OptTensor &mean, const OptTensor &rstd,
                       OptDtype hp_out)
{
    const char *op = "norm_cast";
    const FusedIn in = fused_input(op, x, "x");
    const View2D &v = in.v;
    NormArgs a = norm_args(op, v, x, gamma, beta, kind, eps, zero_centered_gamma, mean, rstd);
    FusedPrep f = prepare_fused(op, x, x.sizes().vec(), v.rows, v.cols, fp8_dtype, gran, scale, margin, pow2, amax_eps,
                                want_q, transpose, inf_to_nan, rng, rng_skip, hp_out);
    sync_threads();
    check_status(fp8mix_norm_cast(v.t.data_ptr(), in.t, v.rows, v.cols, v.ld, &a.np, ptr_or_null(a.mean),
                                  ptr_or_null(a.rstd), a.given ? 1 : 0, &f.out, &f.o),
                 op, "scale must be finite and > 0");
    auto st = stats_out(a, x);
    return {f.q, f.qt, f.scale_inv, f.amax, std::get<0>(st), std::get<1>(st), f.hp};
}

Tensors7 norm_delayed_cast_cpu(const Tensor &x, const OptTensor &gamma, const OptTensor &beta, int64_t kind,
                               double eps, bool zero_centered_gamma, const Tensor &hist, const Tensor &scale,
                               const Tensor &steps, int64_t role, int64_t history_len, Dtype fp8_dtype,
                               int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool transpose,
                               bool inf_to_nan, const OptTensor &fresh_amax, const OptTensor &rng, int64_t rng_skip,
                               const OptTensor &mean, const OptTensor &rstd, OptDtype hp_out)
{
    const char *op = "norm_delayed_cast";
    const FusedIn in = fused_input(op, x, "x");
    const View2D &v = in.v;
    DelayedRole dr = delayed_role(kCPU, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                                  fresh_amax, op);
    NormArgs a = norm_args(op, v, x, gamma, beta, kind, eps, zero_centered_gamma, mean, rstd);
    FusedPrep f = prepare_fused(op, x, x.sizes().vec(), v.rows, v.cols, fp8_dtype, FP8MIX_GRAN_TENSOR, c10::nullopt,
                                margin, pow2, 0.0, true, transpose, inf_to_nan, rng, rng_skip, hp_out);
    Tensor scales = new_tensor({2}, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_norm_cast_delayed(v.t.data_ptr(), in.t, v.rows, v.cols, v.ld, &a.np, ptr_or_null(a.mean),
                                          ptr_or_null(a.rstd), a.given ? 1 : 0, &f.out, &dr.d.st, role, &dr.d.r,
                                          dr.fresh_amax, record ? 1 : 0, &f.o, scales.data_ptr<float>()),
                 op, "the state's scale must be finite and > 0");
    auto st = stats_out(a, x);
    return {f.q, f.qt, scales, f.amax, std::get<0>(st), std::get<1>(st), f.hp};
}

Tensors5 act_cast_cpu(const Tensor &h, int64_t act, Dtype fp8_dtype, int64_t gran, const OptTensor &scale,
                      int64_t margin, bool pow2, double amax_eps, bool want_q, bool transpose, bool inf_to_nan,
                      const OptTensor &rng, int64_t rng_skip, OptDtype hp_out)
{
    const char *op = "act_cast";
    const FusedIn in = fused_input(op, h, "h");
    const View2D &v = in.v;
    int64_t cols;
    auto sizes = act_sizes(op, h, v, act, &cols);
    FusedPrep f = prepare_fused(op, h, sizes, v.rows, cols, fp8_dtype, gran, scale, margin, pow2, amax_eps, want_q,
                                transpose, inf_to_nan, rng, rng_skip, hp_out);
    sync_threads();
    check_status(fp8mix_act_cast(v.t.data_ptr(), in.t, v.rows, v.cols, v.ld, (fp8mix_act_kind)act, &f.out, &f.o), op,
                 "scale must be finite and > 0");
    return {f.q, f.qt, f.scale_inv, f.amax, f.hp};
}

Tensors5 act_delayed_cast_cpu(const Tensor &h, int64_t act, const Tensor &hist, const Tensor &scale,
                              const Tensor &steps, int64_t role, int64_t history_len, Dtype fp8_dtype,
                              int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool transpose,
                              bool inf_to_nan, const OptTensor &fresh_amax, const OptTensor &rng, int64_t rng_skip,
                              OptDtype hp_out)
{
    const char *op = "act_delayed_cast";
    const FusedIn in = fused_input(op, h, "h");
    const View2D &v = in.v;
    DelayedRole dr = delayed_role(kCPU, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                                  fresh_amax, op);
    int64_t cols;
    auto sizes = act_sizes(op, h, v, act, &cols);
    FusedPrep f = prepare_fused(op, h, sizes, v.rows, cols, fp8_dtype, FP8MIX_GRAN_TENSOR, c10::nullopt, margin, pow2,
                                0.0, true, transpose, inf_to_nan, rng, rng_skip, hp_out);
    Tensor scales = new_tensor({2}, h.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_act_cast_delayed(v.t.data_ptr(), in.t, v.rows, v.cols, v.ld, (fp8mix_act_kind)act, &f.out,
                                         &dr.d.st, role, &dr.d.r, dr.fresh_amax, record ? 1 : 0, &f.o,
                                         scales.data_ptr<float>()),
                 op, "the state's scale must be finite and > 0");
    return {f.q, f.qt, scales, f.amax, f.hp};
}

} // namespace fp8mix_torch
