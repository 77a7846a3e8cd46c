// ops_cuda.cpp — the CUDA kernels of the fp8mix::* ops (compiled only in CUDA builds) and
// their TORCH_LIBRARY_IMPL(fp8mix, CUDA) block: every tensor on x's device (checks from
// common.h, one copy with the CPU's), then one launch of csrc/cuda's C API on the current
// stream (c10::cuda::getCurrentCUDAStream). Nothing syncs with the host, except the optional
// scale check (env FP8MIX_CUDA_CHECK_SCALES=1, read once: reads a device status flag, one
// sync per call). The kernels are bit-identical to the CPU ones; scaled_mm runs on
// cuBLASLt, whose layout rules live in fp8mix_mm_layout_plan (this file only allocates
// what the plan asks for and calls), and agrees with the CPU up to summation order. A GEMM
// cuBLASLt refuses (device, shape, library version) raises NotImplementedError starting
// with kRefused, so that Python can fall back to torch._scaled_mm (fp8mix/cuda/fallback.py).
// Not here: argument checks (common.cpp), schemas (schema.cpp), the kernels (csrc/cuda).
#ifndef FP8MIX_WITH_CUDA
#error "ops_cuda.cpp is part of CUDA builds only (setup.py compiles it with FP8MIX_WITH_CUDA)"
#endif

// c10::cuda::getCurrentCUDAStream (= at::cuda::): CUDAContext.h would need the cuSPARSE/cuSOLVER headers
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include "fp8mix_cuda.h"
#include "ops.h"

namespace fp8mix_torch {
namespace {

constexpr const char *kRefused = "fp8mix.scaled_mm: refused by cuBLASLt: ";

void check_cuda_status(fp8mix_status st, const char *op, const char *what = nullptr)
{
    if (st == FP8MIX_OK) return;
    std::string detail = fp8mix_cuda_last_error();
    std::string w = what ? what : "";
    if (!detail.empty() && st != FP8MIX_ERR_BAD_ENUM) w += (w.empty() ? "" : "; ") + detail;
    check_status(st, op, w.empty() ? nullptr : w.c_str());
}

// FP8MIX_CUDA_CHECK_SCALES is read once per process (a getenv per op call would
// cost more than some kernels); cuda_set_check_scales changes it at run time.
std::atomic<int> &scale_checks_flag()
{
    static std::atomic<int> on{[] {
        const char *e = std::getenv("FP8MIX_CUDA_CHECK_SCALES");
        return e && *e && std::strcmp(e, "0") != 0 ? 1 : 0;
    }()};
    return on;
}

bool scale_checks_enabled() { return scale_checks_flag().load() != 0; }

// Device flag for what only a kernel sees (an invalid scale, a grad slot outside its
// ring): allocated only when checks are enabled, since reading it is a host sync.
struct DeviceFlag {
    Tensor t;
    explicit DeviceFlag(const Tensor &like)
    {
        if (scale_checks_enabled()) t = at::zeros({1}, like.options().dtype(at::kInt));
    }
    int *ptr() { return t.defined() ? t.data_ptr<int>() : nullptr; }
    void check(const char *op, const char *scale_what, const char *arg_what = "a device-side argument is invalid")
    {
        if (!t.defined()) return;
        const int v = t.item<int>();
        TORCH_CHECK_VALUE(v != FP8MIX_ERR_BAD_ARG, "fp8mix.", op, ": ", arg_what);
        if (v != 0) check_status((fp8mix_status)v, op, scale_what);
    }
};

cudaStream_t cur_stream() { return c10::cuda::getCurrentCUDAStream(); }

// Scratch of one recipe cast (fp8mix_cuda_recipe_work_bytes), from torch's caching allocator.
Tensor recipe_work(const Tensor &like)
{
    return new_tensor({(int64_t)fp8mix_cuda_recipe_work_bytes()}, like.options().dtype(at::kByte));
}

// ---- casts, amax, scales -------------------------------------------------------------
// A tensor-held stochastic-rounding stream (rng) is read by the kernels on the device, so
// no host sync, and a CUDA graph replays with the stream's state at replay time.

Tensors3 cast_cuda(const Tensor &x, const Tensor &scale, Dtype fp8_dtype, int64_t gran, bool saturate,
                   bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose, bool inf_to_nan,
                   const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "cast";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    const int64_t *rp = rng_arg(rng, rng_skip, x.device(), op);
    const View2D &v = c.v;
    Tensor s = scale_arg(scale, scale_count(c.g, v.rows, v.cols), x.device(), op, "scale");
    Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    DeviceFlag flag(x);
    check_cuda_status(fp8mix_cuda_cast(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, s.data_ptr<float>(),
                                       c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows), amax.data_ptr<float>(),
                                       flag.ptr(), &c.o, rp, (uint64_t)rng_skip, cur_stream()),
                      op);
    flag.check(op, "scale must be finite and > 0");
    return {c.q, c.qt, amax};
}

Tensors4 quantize_current_cuda(const Tensor &x, Dtype fp8_dtype, int64_t gran, int64_t margin, bool pow2,
                               double eps, bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q,
                               bool transpose, bool inf_to_nan, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "quantize";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    check_margin_eps(op, margin, eps);
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    const int64_t *rp = rng_arg(rng, rng_skip, x.device(), op);
    const View2D &v = c.v;
    auto sshape = scale_shape(x, c.g, v.rows, v.cols);
    // Every entry is written by the kernels (n > 0), so no fill is needed.
    Tensor sinv = new_tensor(sshape, x.options().dtype(at::kFloat));
    Tensor amax = new_tensor(sshape, x.options().dtype(at::kFloat));
    if (scale_count(c.g, v.rows, v.cols) == 0) return {c.q, c.qt, sinv, amax};
    Tensor work = c.g == FP8MIX_GRAN_TENSOR ? recipe_work(x) : Tensor();
    check_cuda_status(fp8mix_cuda_quantize_current(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, (int)margin,
                                                   pow2 ? 1 : 0, (float)eps, c.q_ptr(), ld_of(v.cols), c.qt_ptr(),
                                                   ld_of(v.rows), sinv.data_ptr<float>(), amax.data_ptr<float>(),
                                                   &c.o, rp, (uint64_t)rng_skip,
                                                   work.defined() ? work.data_ptr() : nullptr, cur_stream()),
                      op);
    return {c.q, c.qt, sinv, amax};
}

Tensor amax_cuda(const Tensor &x, int64_t gran)
{
    const char *op = "amax";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_granularity g = granularity(gran, op);
    View2D v = view2d(x);
    Tensor out = new_tensor(scale_shape(x, g, v.rows, v.cols), x.options().dtype(at::kFloat));
    if (out.numel() == 0) return out;
    check_cuda_status(fp8mix_cuda_amax(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, g, out.data_ptr<float>(),
                                       cur_stream()),
                      op);
    return out;
}

Tensors2 compute_scale_cuda(const Tensor &amax, Dtype fp8_dtype, int64_t margin, bool pow2, double eps)
{
    const char *op = "compute_scale";
    require_cuda(amax, op, "amax");
    c10::cuda::CUDAGuard guard(amax.device());
    TORCH_CHECK_TYPE(amax.scalar_type() == at::kFloat, "fp8mix.compute_scale: amax must be float32");
    check_margin_eps(op, margin, eps);
    Tensor a = amax.contiguous();
    Tensor s = at::empty_like(a), si = at::empty_like(a);
    check_cuda_status(fp8mix_cuda_compute_scale(a.data_ptr<float>(), a.numel(), fp8_format(fp8_dtype, op),
                                                (int)margin, pow2 ? 1 : 0, (float)eps, s.data_ptr<float>(),
                                                si.data_ptr<float>(), cur_stream()),
                      op);
    return {s, si};
}

Tensor dequantize_cuda(const Tensor &q, const Tensor &scale_inv, int64_t gran, Dtype out_dtype)
{
    const char *op = "dequantize";
    require_cuda(q, op, "q");
    c10::cuda::CUDAGuard guard(q.device());
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_dtype ot = hp_dtype(out_dtype, op);
    fp8mix_granularity g = granularity(gran, op);
    View2D v = view2d(q);
    Tensor s = scale_arg(scale_inv, scale_count(g, v.rows, v.cols), q.device(), op, "scale_inv");
    Tensor out = new_tensor(q.sizes(), q.options().dtype(out_dtype));
    DeviceFlag flag(q);
    check_cuda_status(fp8mix_cuda_dequantize((const uint8_t *)v.t.data_ptr(), fmt, v.rows, v.cols, v.ld, g,
                                             s.data_ptr<float>(), out.data_ptr(), ot, ld_of(v.cols), flag.ptr(),
                                             cur_stream()),
                      op);
    flag.check(op, "scale_inv must be finite and > 0");
    return out;
}

// fp8mix_quant_stats on the device: the 84 entries with the CPU's bits (csrc/cuda/stats.cu).
Tensor quant_stats_cuda(const Tensor &x, const Tensor &q, const Tensor &scale_inv, int64_t gran,
                        bool bad_scale_as_one)
{
    const char *op = "quant_stats";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    check_on(q, x.device(), op, "q");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_granularity g = granularity(gran, op);
    TORCH_CHECK_VALUE(x.sizes() == q.sizes(), "fp8mix.", op, ": x has shape ", x.sizes(), " but q has shape ",
                      q.sizes());
    View2D vx = view2d(x), vq = view2d(q);
    Tensor s = scale_arg(scale_inv, scale_count(g, vx.rows, vx.cols), x.device(), op, "scale_inv");
    Tensor out = new_tensor({FP8MIX_STATS_N}, x.options().dtype(at::kDouble));
    Tensor work = new_tensor({(int64_t)fp8mix_cuda_quant_stats_work_bytes()}, x.options().dtype(at::kByte));
    DeviceFlag flag(x);
    check_cuda_status(fp8mix_cuda_quant_stats(vx.t.data_ptr(), xt, vx.rows, vx.cols, vx.ld,
                                              (const uint8_t *)vq.t.data_ptr(), vq.ld, fmt, g, s.data_ptr<float>(),
                                              bad_scale_as_one ? 1 : 0, out.data_ptr<double>(), work.data_ptr(),
                                              bad_scale_as_one ? nullptr : flag.ptr(), cur_stream()),
                      op);
    flag.check(op, "scale_inv must be finite and > 0");
    return out;
}

// ---- scaled_mm -----------------------------------------------------------------------

[[noreturn]] void refuse(const std::string &why)
{
    TORCH_CHECK_NOT_IMPLEMENTED(false, kRefused, why,
                                " (fp8mix.cuda.fallback.scaled_mm_fallback runs it on torch._scaled_mm)");
}

// The planning problem of one call (addresses only for their alignment).
fp8mix_mm_problem mm_problem(const Tensor &a, const Tensor &b, const MmArgs &r, const Tensor &sa, const Tensor &sb,
                             const Tensor &out)
{
    fp8mix_mm_problem p;
    std::memset(&p, 0, sizeof p);
    p.m = r.m; p.k = r.k; p.n = r.n;
    p.fmt_a = r.fmt_a; p.fmt_b = r.fmt_b;
    p.a_stride0 = a.stride(0); p.a_stride1 = a.stride(1);
    p.b_stride0 = b.stride(0); p.b_stride1 = b.stride(1);
    p.a_addr = (uint64_t)(uintptr_t)a.data_ptr(); p.b_addr = (uint64_t)(uintptr_t)b.data_ptr();
    p.scale_a_kind = r.kind_a; p.scale_b_kind = r.kind_b;
    p.sa_addr = (uint64_t)(uintptr_t)sa.data_ptr(); p.sb_addr = (uint64_t)(uintptr_t)sb.data_ptr();
    p.has_bias = r.bias.defined();
    p.bias_t = r.bias_t;
    p.bias_addr = r.bias.defined() ? (uint64_t)(uintptr_t)r.bias.data_ptr() : 0;
    p.out_t = r.out_t;
    p.out_addr = (uint64_t)(uintptr_t)out.data_ptr();
    // accumulate="fp22" is cuBLASLt's fast accumulation; promote_interval has no CUDA counterpart
    p.fast_accum = r.fp22;
    return p;
}

// Plan, allocate the plan's scratch, run; refusals become NotImplementedError(kRefused...).
void scaled_mm_cuda_run(fp8mix_mm_problem &pr, const Tensor &a, const Tensor &b, const Tensor &sa, const Tensor &sb,
                        const Tensor &bias, Tensor &out)
{
    const char *op = "scaled_mm";
    fp8mix_mm_plan pl;
    fp8mix_status st = fp8mix_cuda_scaled_mm_plan(&pr, &pl);
    if (st == FP8MIX_ERR_UNSUPPORTED)
        refuse(std::string(fp8mix_mm_rule_string(pl.rule)) + " (device sm_" + std::to_string(pr.sm) +
               ", cuBLASLt " + std::to_string(pr.blas_version) + ")");
    check_cuda_status(st, op, pl.rule != FP8MIX_MM_RULE_OK ? fp8mix_mm_rule_string(pl.rule) : nullptr);
    if (pl.copy_a == FP8MIX_MM_COPY_TRANSPOSE || pl.copy_b == FP8MIX_MM_COPY_TRANSPOSE)
        TORCH_WARN_ONCE("fp8mix.scaled_mm (CUDA): an operand is not K-contiguous (a must be row-major (M, K), b "
                        "column-major (K, N), e.g. w.t() of a row-major (N, K) weight), so it is transposed with a "
                        "copy for cuBLASLt. Pass the FP8 transpose (cast with transpose=True) to avoid the pass.");
    Tensor scratch = new_tensor({(int64_t)pl.scratch_bytes}, a.options().dtype(at::kByte));
    fp8mix_cuda_scaled_mm_args x;
    std::memset(&x, 0, sizeof x);
    x.problem = &pr;
    x.plan = &pl;
    x.a = (const uint8_t *)a.data_ptr();
    x.b = (const uint8_t *)b.data_ptr();
    x.scale_a = sa.data_ptr<float>();
    x.scale_b = sb.data_ptr<float>();
    x.bias = bias.defined() ? bias.data_ptr() : nullptr;
    x.out = out.data_ptr();
    x.scratch = scratch.data_ptr();
    x.scratch_bytes = pl.scratch_bytes;
    st = fp8mix_cuda_scaled_mm(&x, cur_stream());
    if (st == FP8MIX_ERR_UNSUPPORTED) refuse(fp8mix_cuda_last_error());
    check_cuda_status(st, op);
}

Tensor scaled_mm_cuda(const Tensor &a, const Tensor &b, const Tensor &scale_a, const Tensor &scale_b,
                      const OptTensor &bias, OptDtype out_dtype, Str accumulate, int64_t promote_interval,
                      int64_t scale_kind_a, int64_t scale_kind_b)
{
    require_cuda(a, "scaled_mm", "a");
    c10::cuda::CUDAGuard guard(a.device());
    const MmArgs r = mm_args(a, b, scale_a, scale_b, bias, out_dtype, accumulate, promote_interval, scale_kind_a,
                             scale_kind_b, a.device());
    Tensor out = new_tensor({r.m, r.n}, a.options().dtype(r.out_dtype));
    if (r.m == 0 || r.n == 0) return out;
    if (r.k == 0) { // no products: bias (or +0), rounded once
        out.zero_();
        if (r.bias.defined()) out.copy_(r.bias.to(at::kFloat).unsqueeze(0).expand({r.m, r.n}));
        return out;
    }
    const Tensor sa = scale_a.contiguous(), sb = scale_b.contiguous();
    fp8mix_mm_problem pr = mm_problem(a, b, r, sa, sb, out);
    scaled_mm_cuda_run(pr, a, b, sa, sb, r.bias, out);
    return out;
}

// ---- the per-tensor recipes' state and casts (csrc/cuda/recipe.cu) ---------------------
// The CPU ops' contracts with the state on the device: checks of what the host sees,
// then one call; every state value is read by the kernels (no host sync).

// Delayed scaling of many tensors in one kernel (see fp8mix_cuda_delayed_update).
void delayed_scale_update_cuda(at::TensorList amax_history, at::TensorList amax, at::TensorList scale,
                               at::TensorList scale_inv, at::TensorList steps, at::ArrayRef<double> fp8_max,
                               int64_t margin, bool pow2, Str algo, int64_t interval)
{
    const char *op = "delayed_scale_update";
    check_delayed_update_lists(amax_history, amax, scale, scale_inv, steps, fp8_max, margin, algo, interval);
    const size_t n = amax_history.size();
    if (n == 0) return;
    require_cuda(amax_history[0], op, "amax_history");
    c10::cuda::CUDAGuard guard(amax_history[0].device());
    check_delayed_update_entries(amax_history, amax, scale, scale_inv, steps, amax_history[0].device());
    std::vector<fp8mix_cuda_delayed_entry> e(n);
    for (size_t i = 0; i < n; i++) {
        const Tensor &h = amax_history[i];
        e[i].history = h.data_ptr<float>();
        e[i].history_len = h.size(0);
        e[i].history_stride = h.size(0) > 1 ? h.stride(0) : 1;
        e[i].amax = amax[i].data_ptr<float>();
        e[i].scale = scale[i].data_ptr<float>();
        e[i].scale_inv = scale_inv.empty() ? nullptr : scale_inv[i].data_ptr<float>();
        e[i].steps = steps.empty() ? nullptr : steps[i].data_ptr<int64_t>();
        e[i].fp8_max = (float)fp8_max[i];
    }
    check_cuda_status(fp8mix_cuda_delayed_update(e.data(), (int64_t)n, (int)margin, pow2 ? 1 : 0,
                                                 algo == "max" ? FP8MIX_AMAX_MAX : FP8MIX_AMAX_MOST_RECENT, interval,
                                                 cur_stream()),
                      op);
}

Tensors4 delayed_cast_cuda(const Tensor &x, const Tensor &hist, const Tensor &scale, const Tensor &steps,
                           int64_t role, int64_t history_len, Dtype fp8_dtype, int64_t margin, bool pow2, Str algo,
                           int64_t interval, bool record, bool transpose, bool inf_to_nan,
                           const OptTensor &fresh_amax, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "delayed_cast";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    const at::Device dev = x.device();
    DelayedRole dr = delayed_role(dev, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                                  fresh_amax, op);
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const int64_t *rp = rng_arg(rng, rng_skip, dev, op);
    Tensor scales = new_tensor({2}, x.options().dtype(at::kFloat));
    Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    Tensor work = recipe_work(x);
    DeviceFlag flag(x);
    const View2D &v = c.v;
    check_cuda_status(fp8mix_cuda_cast_delayed(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols),
                                               c.qt_ptr(), ld_of(v.rows), &dr.d.st, role, &dr.d.r, dr.fresh_amax,
                                               record ? 1 : 0, &c.o, rp, (uint64_t)rng_skip, scales.data_ptr<float>(),
                                               amax.data_ptr<float>(), work.data_ptr(), flag.ptr(), cur_stream()),
                      op);
    flag.check(op, "the role's scale must be finite and > 0");
    return {c.q, c.qt, scales, amax};
}

Tensors5 grad_cast_cuda(const Tensor &dy, Dtype fp8_dtype, const OptTensor &plan, const OptTensor &pending,
                        const OptTensor &slot, int64_t margin, bool pow2, double eps, bool transpose, bool colsum,
                        bool inf_to_nan, const OptTensor &rng, int64_t rng_skip)
{
    const char *op = "grad_cast";
    require_cuda(dy, op, "dy");
    c10::cuda::CUDAGuard guard(dy.device());
    const at::Device dev = dy.device();
    check_margin_eps(op, margin, eps);
    const float *pl = scalar_f32(plan, dev, op, "plan", 2);
    const bool has_pending = grad_pending_args(pending, slot, dev, op);
    float *pend = has_pending ? pending->data_ptr<float>() : nullptr;
    const int64_t *slot_p = has_pending ? slot->data_ptr<int64_t>() : nullptr; // its value is read by the kernel
    CastPrep c = prepare_cast(op, dy, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const int64_t *rp = rng_arg(rng, rng_skip, dev, op);
    const View2D &v = c.v;
    Tensor sinv = new_tensor({}, dy.options().dtype(at::kFloat));
    Tensor amax = new_tensor({}, dy.options().dtype(at::kFloat));
    Tensor cs = new_tensor({colsum ? v.cols : 0}, dy.options().dtype(at::kFloat));
    Tensor work = recipe_work(dy);
    DeviceFlag flag(dy);
    check_cuda_status(fp8mix_cuda_cast_grad(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols),
                                            c.qt_ptr(), ld_of(v.rows), pl, (int)margin, pow2 ? 1 : 0, (float)eps,
                                            pend, has_pending ? pending->numel() : 0, slot_p, &c.o, rp,
                                            (uint64_t)rng_skip, sinv.data_ptr<float>(), amax.data_ptr<float>(),
                                            colsum ? cs.data_ptr<float>() : nullptr, work.data_ptr(), flag.ptr(),
                                            cur_stream()),
                      op);
    flag.check(op, "the plan's scale must be finite and > 0", "slot is outside [0, pending slots)");
    return {c.q, c.qt, sinv, amax, cs};
}

void delayed_record_cuda(const Tensor &hist, const Tensor &scale, const Tensor &steps, int64_t role,
                         int64_t history_len, const Tensor &amax, Dtype fp8_dtype, int64_t margin, bool pow2,
                         Str algo, int64_t interval, bool rescale_only)
{
    const char *op = "delayed_record";
    require_cuda(hist, op, "amax_history");
    c10::cuda::CUDAGuard guard(hist.device());
    Delayed d = delayed_role(hist.device(), hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                             c10::nullopt, op).d;
    const fp8mix_format fmt = fp8_format(fp8_dtype, op);
    const float *a = rescale_only ? nullptr : scalar_f32(amax, hist.device(), op, "amax");
    check_cuda_status(fp8mix_cuda_delayed_record(&d.st, role, fmt, &d.r, a, rescale_only ? 1 : 0, cur_stream()), op);
}

Tensors2 delayed_flush_cuda(const Tensor &hist, const Tensor &scale, const Tensor &steps, const Tensor &pending,
                            const Tensor &next_slot, int64_t role, int64_t history_len, Dtype fp8_dtype,
                            int64_t margin, bool pow2, Str algo, int64_t interval, bool record, bool reserve)
{
    const char *op = "delayed_flush";
    require_cuda(hist, op, "amax_history");
    c10::cuda::CUDAGuard guard(hist.device());
    const at::Device dev = hist.device();
    Delayed d = delayed_role(dev, hist, scale, steps, role, history_len, margin, pow2, algo, interval,
                             c10::nullopt, op).d;
    check_flush_args(pending, next_slot, record, reserve, dev, op);
    Tensor plan = new_tensor({2}, hist.options());
    Tensor slot = new_tensor({}, steps.options()); // written by the kernel (0 when not reserving)
    check_cuda_status(fp8mix_cuda_delayed_flush(&d.st, role, fp8_format(fp8_dtype, op), &d.r,
                                                pending.data_ptr<float>(), pending.numel(),
                                                next_slot.data_ptr<int64_t>(), record ? 1 : 0, reserve ? 1 : 0,
                                                plan.data_ptr<float>(), slot.data_ptr<int64_t>(), cur_stream()),
                      op);
    return {plan, slot};
}

} // namespace

void cuda_set_hw_convert(bool on) { fp8mix_cuda_set_hw_convert(on ? 1 : 0); }
bool cuda_get_hw_convert() { return fp8mix_cuda_get_hw_convert() != 0; }
void cuda_set_check_scales(bool on) { scale_checks_flag().store(on ? 1 : 0); }
bool cuda_get_check_scales() { return scale_checks_enabled(); }

} // namespace fp8mix_torch

TORCH_LIBRARY_IMPL(fp8mix, CUDA, m)
{
    FP8MIX_OPS_ON_EVERY_DEVICE(FP8MIX_IMPL_OP, cuda)
    // CUDA only
    m.impl("delayed_scale_update", &fp8mix_torch::delayed_scale_update_cuda);
}
