// torch_ops.cpp — the one C++ file: the fp8mix::* operator schemas, their CPU
// implementations (tensor checks, then a call into the C API), and the empty
// fp8mix._C module.  Fake (meta) implementations and the typed Python wrappers
// live in fp8mix/ops.py; policy (which op, which scale) lives in Python and C.
//
// Tensors are viewed as 2-D (numel / last_dim, last_dim) with inner stride 1;
// anything else is made contiguous first.  C status codes become Python
// exceptions: ValueError for bad values, TypeError for bad dtypes.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <string>

#include "fp8mix.h"

#ifdef FP8MIX_WITH_CUDA
#include <c10/cuda/CUDAStream.h> // c10::cuda::getCurrentCUDAStream (= at::cuda::); avoids CUDAContext.h, which needs the cuSPARSE/cuSOLVER headers
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>

#include "fp8mix_cuda.h"
#endif

// The C core's parallel loops run on PyTorch's intra-op threads: two pools on the same
// cores would compete (torch's OpenMP threads spin after each of torch's loops). With an
// OpenMP torch, at::parallel_for is a pragma compiled here: only a file built with
// OpenMP (setup.py's -fopenmp) runs it in parallel; otherwise the C core keeps its pool.
#if AT_PARALLEL_NATIVE || (AT_PARALLEL_OPENMP && defined(_OPENMP))
#define FP8MIX_TORCH_THREADS 1
namespace {
void run_on_torch_threads(int workers, fp8mix_worker_body body, void *job)
{
    at::parallel_for(0, workers, 1, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; w++) body(job, static_cast<int>(w));
    });
}
} // namespace
#endif

namespace {
void add_direct_calls(PyObject *module); // below: fp8mix.nn's eager entry points
}

extern "C" PyObject *PyInit__C(void)
{
#ifdef FP8MIX_TORCH_THREADS
    fp8mix_set_thread_pool(run_on_torch_threads);
    const long torch_threads = 1;
#else
    const long torch_threads = 0;
#endif
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "fp8mix native ops (registered as torch.ops.fp8mix)", -1,
                              nullptr};
    PyObject *m = PyModule_Create(&def);
    // whether the C core's loops run on torch's threads (tests/test_threads.py)
    if (m && PyModule_AddIntConstant(m, "torch_threads", torch_threads) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    try {
        if (m) add_direct_calls(m);
    } catch (const std::exception &e) {
        Py_DECREF(m);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ImportError, e.what());
        return nullptr;
    }
    return m;
}

namespace {

// ---- checks shared by every device ------------------------------------------------

void check_status(fp8mix_status st, const char *op, const char *what = nullptr)
{
    if (st == FP8MIX_OK) return;
    std::string msg = std::string("fp8mix.") + op + ": " + fp8mix_status_string(st);
    if (what && st == FP8MIX_ERR_BAD_SCALE) msg += std::string(" (") + what + ")";
    if (st == FP8MIX_ERR_BAD_ENUM || st == FP8MIX_ERR_BAD_SCALE || st == FP8MIX_ERR_BAD_ARG ||
        st == FP8MIX_ERR_BAD_SHAPE)
        TORCH_CHECK_VALUE(false, msg);
    TORCH_CHECK(false, msg);
}

void sync_threads() { fp8mix_set_num_threads(at::get_num_threads()); }

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
fp8mix_dtype hp_dtype(const at::Tensor &t, const char *op, const char *name) { return hp_dtype(t.scalar_type(), op, name); }
fp8mix_dtype hp_dtype(at::ScalarType s, const char *op) { return hp_dtype(s, op, "output dtype"); }

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

// The CPU kernels also take MX blocks (4: 1x32, E8M0 scales; csrc/core/mx.c).
fp8mix_granularity granularity_cpu(int64_t g, const char *op)
{
    if (g == FP8MIX_GRAN_MX) return FP8MIX_GRAN_MX;
    TORCH_CHECK_VALUE(g >= 0 && g <= 3, "fp8mix.", op, ": granularity must be 0 (tensor), 1 (row), ",
                      "2 (1x128 block), 3 (128x128 block) or 4 (MX 1x32 block), got ", g);
    return (fp8mix_granularity)g;
}

// Every tensor of one call on the data's device (else the dispatcher would have
// picked one kernel for all of them).
void check_on(const at::Tensor &t, const at::Device &dev, const char *op, const char *name)
{
    TORCH_CHECK_VALUE(t.device() == dev, "fp8mix.", op, ": ", name, " is on ", t.device(), " but the data is on ",
                      dev, dev.is_cpu() ? " (this kernel runs on the CPU; was the CUDA build not installed?)"
                                        : " (all tensors of one call must be on the same device)");
}

void check_margin_eps(const char *op, int64_t margin, double eps)
{
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 126, "fp8mix.", op, ": margin must be in [0, 126], got ", margin);
    TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "fp8mix.", op, ": amax_epsilon must be finite and >= 0");
}

// A new uninitialised tensor; on the CPU without the dispatcher's round trip (at::empty
// costs ~2.5K instructions there, and a small layer's step allocates about 25 tensors).
at::Tensor new_tensor(at::IntArrayRef sizes, const at::TensorOptions &opt)
{
    if (opt.device().is_cpu()) return at::detail::empty_cpu(sizes, opt);
    return at::empty(sizes, opt);
}

struct View2D {
    at::Tensor t; // keeps a contiguous copy alive when one was needed
    int64_t rows, cols, ld;
};

// A row-major 2-D view of t with inner stride 1 (copying only when needed).
View2D view2d(const at::Tensor &t)
{
    View2D v;
    v.cols = t.dim() == 0 ? 1 : t.size(-1);
    v.rows = 1;  // the product of the leading dims, also when the last one is 0
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

// Leading dimension of a dense row of n elements (>= 1 even for empty rows).
inline int64_t ld_of(int64_t n) { return n > 0 ? n : 1; }

int64_t scale_count(fp8mix_granularity g, int64_t rows, int64_t cols) { return fp8mix_scale_count(g, rows, cols); }

// The shape a per-granularity scale/amax tensor of x takes.
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
                           bool inf_to_nan = false)
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

// A stochastic-rounding stream kept in a tensor: int64 [key, offset] on the CPU
// (fp8mix's layers keep it in their fp8_rng buffer, so no Python int is traced).
// The cast uses words from offset + skip on.
void apply_rng(fp8mix_cast_opts &o, const c10::optional<at::Tensor> &rng, int64_t skip, const char *op)
{
    if (!rng.has_value() || !rng->defined()) return;
    const at::Tensor &r = *rng;
    TORCH_CHECK_TYPE(r.scalar_type() == at::kLong, "fp8mix.", op, ": rng must be int64 [key, offset], got ",
                     r.scalar_type());
    TORCH_CHECK_VALUE(r.numel() == 2 && r.is_contiguous(), "fp8mix.", op, ": rng must hold 2 int64 values "
                      "[key, offset], got shape ", r.sizes());
    TORCH_CHECK_VALUE(r.device().is_cpu(), "fp8mix.", op, ": rng is on ", r.device(), "; this build reads "
                      "stochastic-rounding streams from CPU tensors");
    TORCH_CHECK_VALUE(skip >= 0, "fp8mix.", op, ": rng_skip must be >= 0");
    const int64_t *p = r.data_ptr<int64_t>();
    o.rounding = FP8MIX_ROUND_STOCHASTIC;
    o.seed = (uint64_t)p[0];
    o.offset = (uint64_t)p[1] + (uint64_t)skip;
}

// What every cast op does before its kernel, on any device (device checks are the
// caller's): decode and check the arguments, view x as 2-D, allocate the FP8 outputs.
struct CastPrep {
    View2D v;
    fp8mix_dtype xt;
    fp8mix_granularity g;
    fp8mix_cast_opts o;
    at::Tensor q, qt;
    uint8_t *q_ptr() const { return q.numel() ? (uint8_t *)q.data_ptr() : nullptr; }
    uint8_t *qt_ptr() const { return qt.numel() ? (uint8_t *)qt.data_ptr() : nullptr; }
};

CastPrep prepare_cast(const char *op, const at::Tensor &x, at::ScalarType fp8_dtype, int64_t gran, bool saturate,
                      bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose,
                      bool inf_to_nan = false)
{
    CastPrep c;
    c.xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(fp8_dtype, op);
    c.g = x.is_cpu() ? granularity_cpu(gran, op) : granularity(gran, op);
    TORCH_CHECK_VALUE(want_q || transpose, "fp8mix.", op, ": nothing to produce (want_q and transpose both false)");
    c.v = view2d(x);
    c.q = new_tensor(want_q ? x.sizes() : at::IntArrayRef{0}, x.options().dtype(fp8_dtype));
    c.qt = new_tensor(transpose ? std::vector<int64_t>{c.v.cols, c.v.rows} : std::vector<int64_t>{0},
                     x.options().dtype(fp8_dtype));
    c.o = make_opts(fmt, saturate, stochastic, seed, offset, inf_to_nan);
    return c;
}

// ---- CPU: casts, amax, scales ------------------------------------------------------

const at::Device kCPU(at::kCPU);

std::tuple<at::Tensor, at::Tensor, at::Tensor> cast_cpu(const at::Tensor &x, const at::Tensor &scale,
                                                        at::ScalarType fp8_dtype, int64_t gran, bool saturate,
                                                        bool stochastic, int64_t seed, int64_t offset,
                                                        bool want_q, bool transpose, bool inf_to_nan,
                                                        const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "cast";
    check_on(x, kCPU, op, "x");
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    at::Tensor s = scale_arg(scale, scale_count(c.g, v.rows, v.cols), kCPU, op, "scale");
    at::Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_cast(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, s.data_ptr<float>(), c.q_ptr(),
                             ld_of(v.cols), c.qt_ptr(), ld_of(v.rows), amax.data_ptr<float>(), &c.o),
                 op, "scale must be finite and > 0");
    return {c.q, c.qt, amax};
}

// x is the transpose of a row-major 2-D tensor (x = y.t(), y with unit inner stride).
bool is_transposed_2d(const at::Tensor &x)
{
    return x.dim() == 2 && x.size(0) > 1 && x.size(1) > 1 && x.stride(0) == 1 && x.stride(1) >= x.size(0);
}

// quantize_current of x = y.t() in 1x128 blocks, read from y (no contiguous copy of x).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
quantize_current_t_cpu(const at::Tensor &x, at::ScalarType fp8_dtype, int64_t margin, bool pow2, double eps,
                       bool saturate, bool stochastic, int64_t seed, int64_t offset, bool inf_to_nan,
                       const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "quantize";
    const fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_cast_opts o = make_opts(fp8_format(fp8_dtype, op), saturate, stochastic, seed, offset, inf_to_nan);
    apply_rng(o, rng, rng_skip, op);
    const int64_t rows = x.size(0), cols = x.size(1); // x's; y is cols x rows with row stride x.stride(1)
    at::Tensor q = new_tensor({rows, cols}, x.options().dtype(fp8_dtype));
    auto sshape = scale_shape(x, FP8MIX_GRAN_BLOCK, rows, cols);
    at::Tensor sinv = new_tensor(sshape, x.options().dtype(at::kFloat));
    at::Tensor amax = new_tensor(sshape, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_quantize_current_t(x.data_ptr(), xt, cols, rows, x.stride(1), FP8MIX_GRAN_BLOCK, (int)margin,
                                           pow2 ? 1 : 0, (float)eps, static_cast<uint8_t *>(q.data_ptr()), cols,
                                           sinv.data_ptr<float>(), amax.data_ptr<float>(), &o),
                 op);
    return {q, new_tensor({0}, x.options().dtype(fp8_dtype)), sinv, amax};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
quantize_current_cpu(const at::Tensor &x, at::ScalarType fp8_dtype, int64_t gran, int64_t margin, bool pow2,
                     double eps, bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q,
                     bool transpose, bool inf_to_nan, const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "quantize";
    check_on(x, kCPU, op, "x");
    check_margin_eps(op, margin, eps);
    if (gran == FP8MIX_GRAN_BLOCK && want_q && !transpose && is_transposed_2d(x))
        return quantize_current_t_cpu(x, fp8_dtype, margin, pow2, eps, saturate, stochastic, seed, offset,
                                      inf_to_nan, rng, rng_skip);
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    auto sshape = scale_shape(x, c.g, v.rows, v.cols);
    at::Tensor sinv = at::ones(sshape, x.options().dtype(at::kFloat));
    at::Tensor amax = at::zeros(sshape, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_quantize_current(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, (int)margin, pow2 ? 1 : 0,
                                         (float)eps, c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows),
                                         sinv.data_ptr<float>(), amax.data_ptr<float>(), &c.o),
                 op);
    return {c.q, c.qt, sinv, amax};
}

at::Tensor amax_cpu(const at::Tensor &x, int64_t gran)
{
    const char *op = "amax";
    check_on(x, kCPU, op, "x");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_granularity g = granularity_cpu(gran, op);
    View2D v = view2d(x);
    at::Tensor out = at::zeros(scale_shape(x, g, v.rows, v.cols), x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_amax(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, g, out.data_ptr<float>()), op);
    return out;
}

std::tuple<at::Tensor, at::Tensor> compute_scale_cpu(const at::Tensor &amax, at::ScalarType fp8_dtype,
                                                     int64_t margin, bool pow2, double eps)
{
    const char *op = "compute_scale";
    check_on(amax, kCPU, op, "amax");
    TORCH_CHECK_TYPE(amax.scalar_type() == at::kFloat, "fp8mix.compute_scale: amax must be float32");
    check_margin_eps(op, margin, eps);
    at::Tensor a = amax.contiguous();
    at::Tensor s = at::empty_like(a), si = at::empty_like(a);
    check_status(fp8mix_compute_scale(a.data_ptr<float>(), a.numel(), fp8_format(fp8_dtype, op), (int)margin,
                                      pow2 ? 1 : 0, (float)eps, s.data_ptr<float>(), si.data_ptr<float>()),
                 op);
    return {s, si};
}

// Statistics of a cast (fp8mix_quant_stats): a float64 tensor of FP8MIX_STATS_N entries.
// bad_scale_as_one: count a scale_inv that is not finite and > 0 and measure its tile with 1 (else an error).
at::Tensor quant_stats_cpu(const at::Tensor &x, const at::Tensor &q, const at::Tensor &scale_inv, int64_t gran,
                           bool bad_scale_as_one)
{
    const char *op = "quant_stats";
    check_on(x, kCPU, op, "x");
    check_on(q, kCPU, op, "q");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_granularity g = granularity_cpu(gran, op);
    TORCH_CHECK_VALUE(x.sizes() == q.sizes(), "fp8mix.", op, ": x has shape ", x.sizes(), " but q has shape ",
                      q.sizes());
    View2D vx = view2d(x), vq = view2d(q);
    at::Tensor s = scale_arg(scale_inv, scale_count(g, vx.rows, vx.cols), kCPU, op, "scale_inv");
    at::Tensor out = new_tensor({FP8MIX_STATS_N}, x.options().dtype(at::kDouble));
    fp8mix_stats_opts opts = {bad_scale_as_one ? 1 : 0};
    sync_threads();
    check_status(fp8mix_quant_stats(vx.t.data_ptr(), xt, vx.rows, vx.cols, vx.ld, (const uint8_t *)vq.t.data_ptr(),
                                    vq.ld, fmt, g, s.data_ptr<float>(), &opts, out.data_ptr<double>()),
                 op, "scale_inv must be finite and > 0");
    return out;
}

at::Tensor dequantize_cpu(const at::Tensor &q, const at::Tensor &scale_inv, int64_t gran, at::ScalarType out_dtype)
{
    const char *op = "dequantize";
    check_on(q, kCPU, op, "q");
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_dtype ot = hp_dtype(out_dtype, op);
    fp8mix_granularity g = granularity_cpu(gran, op);
    View2D v = view2d(q);
    at::Tensor s = scale_arg(scale_inv, scale_count(g, v.rows, v.cols), kCPU, op, "scale_inv");
    at::Tensor out = new_tensor(q.sizes(), q.options().dtype(out_dtype));
    sync_threads();
    check_status(fp8mix_dequantize((const uint8_t *)v.t.data_ptr(), fmt, v.rows, v.cols, v.ld, g,
                                   s.data_ptr<float>(), out.data_ptr(), ot, ld_of(v.cols)),
                 op, "scale_inv must be finite and > 0");
    return out;
}

// MX quantisation (fp8mix_quantize_mx): rule 0 rceil, 1 floor; with transpose, the second
// quantisation of x's transpose (its own 1x32 blocks and scales).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
quantize_mx_cpu(const at::Tensor &x, at::ScalarType fp8_dtype, int64_t rule, int64_t margin, double eps,
                bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q, bool transpose,
                bool inf_to_nan, const c10::optional<at::Tensor> &rng, int64_t rng_skip)
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
    at::Tensor sinv = want_q ? at::ones(scale_shape(x, FP8MIX_GRAN_MX, v.rows, v.cols), opts) : new_tensor({0}, opts);
    at::Tensor amax = want_q ? at::zeros(scale_shape(x, FP8MIX_GRAN_MX, v.rows, v.cols), opts) : new_tensor({0}, opts);
    at::Tensor sinv_t = transpose ? at::ones({v.cols, (v.rows + 31) / 32}, opts) : new_tensor({0}, opts);
    sync_threads();
    check_status(fp8mix_quantize_mx(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, (fp8mix_mx_rule)rule, (int)margin,
                                    (float)eps, c.q_ptr(), ld_of(v.cols), want_q ? sinv.data_ptr<float>() : nullptr,
                                    c.qt_ptr(), ld_of(v.rows), transpose ? sinv_t.data_ptr<float>() : nullptr,
                                    want_q ? amax.data_ptr<float>() : nullptr, &c.o),
                 op);
    return {c.q, sinv, c.qt, sinv_t, amax};
}

// ---- CPU: the per-tensor recipes' state and casts (csrc/core/recipe.c) -------------

// A module's delayed-scaling buffers: history (capacity, R) float32, scale (R)
// float32, steps (R) int64, all contiguous on the CPU (they are fp8mix's own
// buffers, updated in place).
struct Delayed {
    fp8mix_delayed_state st;
    fp8mix_delayed_recipe r;
};

void check_state_tensor(const at::Tensor &t, at::ScalarType dt, int64_t dim, const char *op, const char *name)
{
    TORCH_CHECK_TYPE(t.scalar_type() == dt, "fp8mix.", op, ": ", name, " must be ", dt, ", got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == dim && t.is_contiguous(), "fp8mix.", op, ": ", name, " must be a contiguous ",
                      dim, "-D tensor, got shape ", t.sizes());
    check_on(t, kCPU, op, name);
}

fp8mix_amax_algo amax_algo(c10::string_view algo, const char *op)
{
    TORCH_CHECK_VALUE(algo == "max" || algo == "most_recent", "fp8mix.", op,
                      ": amax_compute_algo must be 'max' or 'most_recent', got '", std::string(algo), "'");
    return algo == "max" ? FP8MIX_AMAX_MAX : FP8MIX_AMAX_MOST_RECENT;
}

Delayed delayed_args(const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, int64_t history_len,
                     int64_t margin, bool pow2, c10::string_view algo, int64_t interval, const char *op)
{
    check_state_tensor(hist, at::kFloat, 2, op, "amax_history");
    check_state_tensor(scale, at::kFloat, 1, op, "scale");
    check_state_tensor(steps, at::kLong, 1, op, "steps");
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

void check_role(int64_t role, const Delayed &d, const char *op)
{
    TORCH_CHECK_VALUE(role >= 0 && role < d.st.roles, "fp8mix.", op, ": role ", role, " outside [0, ", d.st.roles,
                      ")");
}

const float *scalar_f32(const c10::optional<at::Tensor> &t, const char *op, const char *name, int64_t n = 1)
{
    if (!t.has_value() || !t->defined()) return nullptr;
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, "fp8mix.", op, ": ", name, " must be float32");
    TORCH_CHECK_VALUE(t->numel() == n && t->is_contiguous(), "fp8mix.", op, ": ", name, " must hold ", n,
                      " contiguous value(s), got shape ", t->sizes());
    check_on(*t, kCPU, op, name);
    return t->data_ptr<float>();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
delayed_cast_cpu(const at::Tensor &x, const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps,
                 int64_t role, int64_t history_len, at::ScalarType fp8_dtype, int64_t margin, bool pow2,
                 c10::string_view algo, int64_t interval, bool record, bool transpose, bool inf_to_nan,
                 const c10::optional<at::Tensor> &fresh_amax, const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "delayed_cast";
    check_on(x, kCPU, op, "x");
    Delayed d = delayed_args(hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    const float *fa = scalar_f32(fresh_amax, op, "fresh_amax");
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    at::Tensor scales = new_tensor({2}, x.options().dtype(at::kFloat));
    at::Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    sync_threads();
    const View2D &v = c.v;
    check_status(fp8mix_cast_delayed(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols), c.qt_ptr(),
                                     ld_of(v.rows), &d.st, role, &d.r, fa, record ? 1 : 0, &c.o,
                                     scales.data_ptr<float>(), amax.data_ptr<float>()),
                 op);
    return {c.q, c.qt, scales, amax};
}

void delayed_record_cpu(const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, int64_t role,
                        int64_t history_len, const at::Tensor &amax, at::ScalarType fp8_dtype, int64_t margin,
                        bool pow2, c10::string_view algo, int64_t interval, bool rescale_only)
{
    const char *op = "delayed_record";
    Delayed d = delayed_args(hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    const fp8mix_format fmt = fp8_format(fp8_dtype, op);
    if (rescale_only) {
        check_status(fp8mix_delayed_rescale(&d.st, role, fmt, &d.r), op);
        return;
    }
    const float *a = scalar_f32(amax, op, "amax");
    check_status(fp8mix_delayed_record(&d.st, role, fmt, &d.r, *a), op);
}

std::tuple<at::Tensor, at::Tensor>
delayed_flush_cpu(const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, const at::Tensor &pending,
                  const at::Tensor &next_slot, int64_t role, int64_t history_len, at::ScalarType fp8_dtype,
                  int64_t margin, bool pow2, c10::string_view algo, int64_t interval, bool record, bool reserve)
{
    const char *op = "delayed_flush";
    Delayed d = delayed_args(hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    check_state_tensor(pending, at::kFloat, 1, op, "pending");
    check_state_tensor(next_slot, at::kLong, 0, op, "next_slot");
    TORCH_CHECK_VALUE(pending.numel() >= 1, "fp8mix.", op, ": pending needs at least one slot");
    TORCH_CHECK_VALUE(record || !reserve, "fp8mix.", op, ": reserve needs record");
    at::Tensor plan = new_tensor({2}, hist.options());
    at::Tensor slot = new_tensor({}, steps.options());
    *slot.data_ptr<int64_t>() = 0; // (written only when reserving)
    check_status(fp8mix_delayed_flush(&d.st, role, fp8_format(fp8_dtype, op), &d.r, pending.data_ptr<float>(),
                                      pending.numel(), next_slot.data_ptr<int64_t>(), record ? 1 : 0,
                                      reserve ? 1 : 0, plan.data_ptr<float>(), slot.data_ptr<int64_t>()),
                 op);
    return {plan, slot};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
grad_cast_cpu(const at::Tensor &dy, at::ScalarType fp8_dtype, const c10::optional<at::Tensor> &plan,
              const c10::optional<at::Tensor> &pending, const c10::optional<at::Tensor> &slot, int64_t margin,
              bool pow2, double eps, bool transpose, bool colsum, bool inf_to_nan,
              const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "grad_cast";
    check_on(dy, kCPU, op, "dy");
    check_margin_eps(op, margin, eps);
    const float *pl = scalar_f32(plan, op, "plan", 2);
    float *pend_slot = nullptr;
    const bool has_pending = pending.has_value() && pending->defined();
    TORCH_CHECK_VALUE(has_pending == (slot.has_value() && slot->defined()), "fp8mix.", op,
                      ": pending and slot go together");
    if (has_pending) {
        check_state_tensor(*pending, at::kFloat, 1, op, "pending");
        TORCH_CHECK_TYPE(slot->scalar_type() == at::kLong && slot->numel() == 1, "fp8mix.", op,
                         ": slot must be one int64");
        check_on(*slot, kCPU, op, "slot");
        const int64_t k = *slot->data_ptr<int64_t>(); // (a CPU int64 of one element: no .item() dispatch)
        TORCH_CHECK_VALUE(k >= 0 && k < pending->numel(), "fp8mix.", op, ": slot ", k, " outside [0, ",
                          pending->numel(), ")");
        pend_slot = pending->data_ptr<float>() + k;
    }
    CastPrep c = prepare_cast(op, dy, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    apply_rng(c.o, rng, rng_skip, op);
    const View2D &v = c.v;
    at::Tensor sinv = new_tensor({}, dy.options().dtype(at::kFloat));
    at::Tensor amax = new_tensor({}, dy.options().dtype(at::kFloat));
    at::Tensor cs = new_tensor({colsum ? v.cols : 0}, dy.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_cast_grad(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols), c.qt_ptr(),
                                  ld_of(v.rows), pl, (int)margin, pow2 ? 1 : 0, (float)eps, pend_slot, &c.o,
                                  sinv.data_ptr<float>(), amax.data_ptr<float>(),
                                  colsum ? cs.data_ptr<float>() : nullptr),
                 op, "the plan's scale must be finite and > 0");
    return {c.q, c.qt, sinv, amax, cs};
}

// ---- CPU: the scaled GEMM ------------------------------------------------------------

// b's layout for the C GEMM: column-major (K, N) is the transposed row-major
// weight torch._scaled_mm wants; row-major (K, N) is accepted too.
struct BView {
    at::Tensor t;
    fp8mix_b_layout layout;
    int64_t ld;
};

BView b_view(const at::Tensor &b)
{
    const int64_t K = b.size(0), N = b.size(1);
    if (b.stride(0) == 1 && (N <= 1 || b.stride(1) >= K) && K > 0)
        return {b, FP8MIX_B_NK, N > 1 ? b.stride(1) : K};
    if (b.stride(1) == 1 && (K <= 1 || b.stride(0) >= N) && N > 0)
        return {b, FP8MIX_B_KN, K > 1 ? b.stride(0) : N};
    return {b.contiguous(), FP8MIX_B_KN, N > 0 ? N : 1};
}

// The scale layout of one GEMM operand: given explicitly (kind >= 0, fp8mix_mm_scale)
// by fp8mix's Python layer, which knows it; inferred from the shape otherwise.
fp8mix_mm_scale mm_scale_kind(const at::Tensor &s, int64_t kind, int64_t outer, int64_t blocks_k,
                              int64_t blocks_outer, bool is_a, bool block_mode, const at::Device &dev)
{
    const char *name = is_a ? "scale_a" : "scale_b";
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "fp8mix.scaled_mm: ", name, " must be float32, got ",
                     s.scalar_type());
    check_on(s, dev, "scaled_mm", name);
    const int64_t want_outer = outer;
    const bool tensor = s.numel() == 1 && s.dim() <= 2;
    const bool outer_ok = s.dim() == 2 && (is_a ? (s.size(0) == want_outer && s.size(1) == 1)
                                                : (s.size(0) == 1 && s.size(1) == want_outer));
    if (kind == FP8MIX_MM_SCALE_MX) { // (outer, ceil(K/32)) on either side: the caller checks K blocks
        TORCH_CHECK_VALUE(dev.is_cpu(), "fp8mix.scaled_mm: MX scales (scale_kind 3) run on the CPU only in this build");
        TORCH_CHECK_VALUE(s.dim() == 2 && s.size(0) == outer, "fp8mix.scaled_mm: ", name, " has shape ", s.sizes(),
                          ", which is not the layout of MX scales (", outer, ", ceil(K/32))");
        return FP8MIX_MM_SCALE_MX;
    }
    if (kind >= 0) {
        TORCH_CHECK_VALUE(kind <= 2, "fp8mix.scaled_mm: scale_kind must be 0 (tensor), 1 (row/column), 2 (block) "
                          "or 3 (MX)");
        const bool ok = kind == FP8MIX_MM_SCALE_TENSOR ? tensor : kind == FP8MIX_MM_SCALE_OUTER ? outer_ok : block_mode;
        TORCH_CHECK_VALUE(ok, "fp8mix.scaled_mm: ", name, " has shape ", s.sizes(), ", which is not the layout of ",
                          kind == 0 ? "a per-tensor scale" : kind == 1 ? "per-row/column scales" : "block scales");
        return (fp8mix_mm_scale)kind;
    }
    if (block_mode) return FP8MIX_MM_SCALE_BLOCK;
    if (tensor) return FP8MIX_MM_SCALE_TENSOR;
    if (outer_ok) return FP8MIX_MM_SCALE_OUTER;
    TORCH_CHECK_VALUE(false, "fp8mix.scaled_mm: ", name, " has shape ", s.sizes(), "; expected a single value, ",
                      is_a ? "(M, 1) per row, or (M, ceil(K/128)) per 1x128 block"
                           : "(1, N) per column, or (ceil(K/128), ceil(N/128)) per 128x128 block",
                      " (here ", is_a ? "M = " : "N = ", outer, ", ceil(K/128) = ", blocks_k, ", ceil(",
                      is_a ? "M" : "N", "/128) = ", blocks_outer, ")");
    return FP8MIX_MM_SCALE_TENSOR;
}

bool is_block_mode(const at::Tensor &sa, const at::Tensor &sb, int64_t M, int64_t kb, int64_t nb, int64_t kind)
{
    if (kind >= 0) return kind == FP8MIX_MM_SCALE_BLOCK && sa.dim() == 2 && sb.dim() == 2 && sa.size(0) == M &&
                          sa.size(1) == kb && sb.size(0) == kb && sb.size(1) == nb;
    return sa.dim() == 2 && sb.dim() == 2 && sa.size(0) == M && sa.size(1) == kb && sb.size(0) == kb &&
           sb.size(1) == nb && !(sa.numel() == 1 && sb.numel() == 1);
}

at::Tensor scaled_mm_cpu(const at::Tensor &a, const at::Tensor &b, const at::Tensor &scale_a,
                         const at::Tensor &scale_b, const c10::optional<at::Tensor> &bias,
                         c10::optional<at::ScalarType> out_dtype, c10::string_view accumulate,
                         int64_t promote_interval, int64_t scale_kind_a, int64_t scale_kind_b)
{
    const char *op = "scaled_mm";
    check_on(a, kCPU, op, "a");
    check_on(b, kCPU, op, "b");
    TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, "fp8mix.scaled_mm: a and b must be 2-D, got ", a.dim(),
                      "-D and ", b.dim(), "-D");
    fp8mix_format fa = fp8_format(a.scalar_type(), op), fb = fp8_format(b.scalar_type(), op);
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    TORCH_CHECK_VALUE(b.size(0) == K, "fp8mix.scaled_mm: inner dimensions differ: a is ", a.sizes(), ", b is ",
                      b.sizes());
    at::ScalarType odt = out_dtype.value_or(at::kFloat);
    fp8mix_dtype ot = hp_dtype(odt, op);
    TORCH_CHECK_VALUE(accumulate == "fp32" || accumulate == "fp22",
                      "fp8mix.scaled_mm: accumulate must be 'fp32' or 'fp22', got '", std::string(accumulate), "'");
    TORCH_CHECK_VALUE(promote_interval >= 0, "fp8mix.scaled_mm: promote_interval must be >= 0");
    TORCH_CHECK_VALUE((scale_kind_a < 0) == (scale_kind_b < 0), "fp8mix.scaled_mm: give both scale kinds or none");
    // A row-major (M, K), or column-major (a transposed view, wgrad's dy^T): read in place
    at::Tensor ac;
    fp8mix_a_layout al = FP8MIX_A_MK;
    int64_t lda;
    if (a.stride(1) == 1 && (M <= 1 || a.stride(0) >= K)) {
        ac = a;
        lda = (M > 1 && K > 0) ? a.stride(0) : (K > 0 ? K : 1);
    } else if (M > 1 && K > 1 && a.stride(0) == 1 && a.stride(1) >= M) {
        ac = a;
        al = FP8MIX_A_KM;
        lda = a.stride(1);
    } else {
        ac = a.contiguous();
        lda = K > 0 ? K : 1;
    }
    BView bv = b_view(b);
    const int64_t kb = (K + 127) / 128, mb = (M + 127) / 128, nb = (N + 127) / 128;
    const bool block_mode = is_block_mode(scale_a, scale_b, M, kb, nb, scale_kind_a);
    fp8mix_mm_scale ka = mm_scale_kind(scale_a, scale_kind_a, M, kb, mb, true, block_mode, kCPU);
    fp8mix_mm_scale kb_ = mm_scale_kind(scale_b, scale_kind_b, N, kb, nb, false, block_mode, kCPU);
    if (ka == FP8MIX_MM_SCALE_MX || kb_ == FP8MIX_MM_SCALE_MX) {
        const int64_t k32 = (K + 31) / 32;
        TORCH_CHECK_VALUE(ka == kb_ && scale_a.size(1) == k32 && scale_b.size(1) == k32, "fp8mix.scaled_mm: MX "
                          "scales need both operands MX with ceil(K/32) = ", k32, " blocks, got scale_a ",
                          scale_a.sizes(), " and scale_b ", scale_b.sizes());
    }
    at::Tensor sa = scale_a.contiguous(), sb = scale_b.contiguous();
    at::Tensor bias_t;
    fp8mix_dtype bt = FP8MIX_F32;
    if (bias.has_value() && bias->defined()) {
        bias_t = bias->contiguous();
        check_on(bias_t, kCPU, op, "bias");
        bt = hp_dtype(bias_t, op, "bias");
        TORCH_CHECK_VALUE(bias_t.dim() == 1 && bias_t.size(0) == N, "fp8mix.scaled_mm: bias must have shape (",
                          N, "), got ", bias_t.sizes());
    }
    at::Tensor out = new_tensor({M, N}, a.options().dtype(odt));
    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = (const uint8_t *)ac.data_ptr(); g.fmt_a = fa; g.lda = lda; g.a_layout = al;
    g.b = (const uint8_t *)bv.t.data_ptr(); g.fmt_b = fb; g.ldb = bv.ld; g.b_layout = bv.layout;
    g.scale_a = sa.data_ptr<float>(); g.scale_a_kind = ka;
    g.scale_b = sb.data_ptr<float>(); g.scale_b_kind = kb_;
    g.bias = bias_t.defined() ? bias_t.data_ptr() : nullptr; g.bias_t = bt;
    g.out = out.data_ptr(); g.out_t = ot; g.ldo = N > 0 ? N : 1;
    g.accum = accumulate == "fp22" ? FP8MIX_ACCUM_FP22 : FP8MIX_ACCUM_FP32;
    g.promote_interval = promote_interval;
    sync_threads();
    check_status(fp8mix_gemm(&g), op, "scales must be finite and > 0");
    return out;
}

std::string cpu_isa() { return fp8mix_isa_name(fp8mix_active_isa()); }

void set_max_isa(std::string name)
{
    static const char *names[] = {"scalar", "avx2", "avx512", "avx512bf16"};
    for (int i = 0; i < 4; i++)
        if (name == names[i]) {
            fp8mix_set_max_isa((fp8mix_isa)i);
            return;
        }
    TORCH_CHECK_VALUE(false, "fp8mix.set_max_isa: unknown ISA '", name,
                      "' (expected scalar, avx2, avx512 or avx512bf16)");
}

// ---- CPU: fused producer casts (csrc/core/norm.c, act.c) ----------------------------
//
// A norm or an activation that writes its GEMM's FP8 input itself: the cast half
// (granularity, given scales or current scaling, the outputs) is the same for both
// producers and lives in FusedPrep; the delayed variants take a module's state
// tensors like delayed_cast.  Produced tensors have x's leading dimensions.

struct FusedPrep {
    fp8mix_fused_out out;
    fp8mix_cast_opts o;
    at::Tensor q, qt, scale_inv, amax, hp, scale;
};

// sizes: the produced tensor's (rows x cols as 2-D); `like`: the input, whose
// leading dimensions the per-granularity outputs take.
FusedPrep prepare_fused(const char *op, const at::Tensor &like, std::vector<int64_t> sizes, int64_t rows,
                        int64_t cols, at::ScalarType fp8_dtype, int64_t gran, const c10::optional<at::Tensor> &scale,
                        int64_t margin, bool pow2, double eps, bool want_q, bool transpose, bool inf_to_nan,
                        const c10::optional<at::Tensor> &rng, int64_t rng_skip,
                        c10::optional<at::ScalarType> hp_out)
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
at::Tensor stats_arg(const at::Tensor &t, int64_t n, const char *op, const char *name)
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
    at::Tensor gamma, beta, mean, rstd;
    bool given = false;
};

NormArgs norm_args(const char *op, const View2D &v, const at::Tensor &x, const c10::optional<at::Tensor> &gamma,
                   const c10::optional<at::Tensor> &beta, int64_t kind, double eps, bool zero_centered_gamma,
                   const c10::optional<at::Tensor> &mean, const c10::optional<at::Tensor> &rstd)
{
    NormArgs a;
    std::memset(&a.np, 0, sizeof a.np);
    TORCH_CHECK_VALUE(kind == 0 || kind == 1, "fp8mix.", op, ": kind must be 0 (LayerNorm) or 1 (RMSNorm), got ",
                      kind);
    TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "fp8mix.", op, ": eps must be finite and >= 0, got ", eps);
    a.np.kind = (fp8mix_norm_kind)kind;
    a.np.eps = (float)eps;
    a.np.zero_centered_gamma = zero_centered_gamma ? 1 : 0;
    at::ScalarType wdt = at::kFloat;
    for (int k = 0; k < 2; k++) {
        const c10::optional<at::Tensor> &w = k ? beta : gamma;
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
std::tuple<at::Tensor, at::Tensor> stats_out(const NormArgs &a, const at::Tensor &x)
{
    auto none = [&] { return new_tensor({0}, x.options().dtype(at::kFloat)); }; // distinct tensors: outputs never alias
    if (a.given) return {none(), none()};
    return {a.mean.defined() ? a.mean : none(), a.rstd};
}

float *ptr_or_null(const at::Tensor &t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
norm_cast_cpu(const at::Tensor &x, const c10::optional<at::Tensor> &gamma, const c10::optional<at::Tensor> &beta,
              int64_t kind, double eps, bool zero_centered_gamma, at::ScalarType fp8_dtype, int64_t gran,
              const c10::optional<at::Tensor> &scale, int64_t margin, bool pow2, double amax_eps, bool want_q,
              bool transpose, bool inf_to_nan, const c10::optional<at::Tensor> &rng, int64_t rng_skip,
              const c10::optional<at::Tensor> &mean, const c10::optional<at::Tensor> &rstd,
              c10::optional<at::ScalarType> hp_out)
{
    const char *op = "norm_cast";
    check_on(x, kCPU, op, "x");
    const fp8mix_dtype xt = hp_dtype(x, op, "x");
    View2D v = view2d(x);
    NormArgs a = norm_args(op, v, x, gamma, beta, kind, eps, zero_centered_gamma, mean, rstd);
    FusedPrep f = prepare_fused(op, x, x.sizes().vec(), v.rows, v.cols, fp8_dtype, gran, scale, margin, pow2, amax_eps,
                                want_q, transpose, inf_to_nan, rng, rng_skip, hp_out);
    sync_threads();
    check_status(fp8mix_norm_cast(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, &a.np, ptr_or_null(a.mean),
                                  ptr_or_null(a.rstd), a.given ? 1 : 0, &f.out, &f.o),
                 op, "scale must be finite and > 0");
    auto st = stats_out(a, x);
    return {f.q, f.qt, f.scale_inv, f.amax, std::get<0>(st), std::get<1>(st), f.hp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
norm_delayed_cast_cpu(const at::Tensor &x, const c10::optional<at::Tensor> &gamma,
                      const c10::optional<at::Tensor> &beta, int64_t kind, double eps, bool zero_centered_gamma,
                      const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, int64_t role,
                      int64_t history_len, at::ScalarType fp8_dtype, int64_t margin, bool pow2, c10::string_view algo,
                      int64_t interval, bool record, bool transpose, bool inf_to_nan,
                      const c10::optional<at::Tensor> &fresh_amax, const c10::optional<at::Tensor> &rng,
                      int64_t rng_skip, const c10::optional<at::Tensor> &mean, const c10::optional<at::Tensor> &rstd,
                      c10::optional<at::ScalarType> hp_out)
{
    const char *op = "norm_delayed_cast";
    check_on(x, kCPU, op, "x");
    const fp8mix_dtype xt = hp_dtype(x, op, "x");
    Delayed d = delayed_args(hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    const float *fa = scalar_f32(fresh_amax, op, "fresh_amax");
    View2D v = view2d(x);
    NormArgs a = norm_args(op, v, x, gamma, beta, kind, eps, zero_centered_gamma, mean, rstd);
    FusedPrep f = prepare_fused(op, x, x.sizes().vec(), v.rows, v.cols, fp8_dtype, FP8MIX_GRAN_TENSOR, c10::nullopt,
                                margin, pow2, 0.0, true, transpose, inf_to_nan, rng, rng_skip, hp_out);
    at::Tensor scales = new_tensor({2}, x.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_norm_cast_delayed(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, &a.np, ptr_or_null(a.mean),
                                          ptr_or_null(a.rstd), a.given ? 1 : 0, &f.out, &d.st, role, &d.r, fa,
                                          record ? 1 : 0, &f.o, scales.data_ptr<float>()),
                 op, "the state's scale must be finite and > 0");
    auto st = stats_out(a, x);
    return {f.q, f.qt, scales, f.amax, std::get<0>(st), std::get<1>(st), f.hp};
}

// An activation's input: its kind, and the produced sizes (half the last dim when gated).
std::vector<int64_t> act_sizes(const char *op, const at::Tensor &h, const View2D &v, int64_t act, int64_t *cols)
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
act_cast_cpu(const at::Tensor &h, int64_t act, at::ScalarType fp8_dtype, int64_t gran,
             const c10::optional<at::Tensor> &scale, int64_t margin, bool pow2, double amax_eps, bool want_q,
             bool transpose, bool inf_to_nan, const c10::optional<at::Tensor> &rng, int64_t rng_skip,
             c10::optional<at::ScalarType> hp_out)
{
    const char *op = "act_cast";
    check_on(h, kCPU, op, "h");
    const fp8mix_dtype ht = hp_dtype(h, op, "h");
    View2D v = view2d(h);
    int64_t cols;
    auto sizes = act_sizes(op, h, v, act, &cols);
    FusedPrep f = prepare_fused(op, h, sizes, v.rows, cols, fp8_dtype, gran, scale, margin, pow2, amax_eps, want_q,
                                transpose, inf_to_nan, rng, rng_skip, hp_out);
    sync_threads();
    check_status(fp8mix_act_cast(v.t.data_ptr(), ht, v.rows, v.cols, v.ld, (fp8mix_act_kind)act, &f.out, &f.o), op,
                 "scale must be finite and > 0");
    return {f.q, f.qt, f.scale_inv, f.amax, f.hp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
act_delayed_cast_cpu(const at::Tensor &h, int64_t act, const at::Tensor &hist, const at::Tensor &scale,
                     const at::Tensor &steps, int64_t role, int64_t history_len, at::ScalarType fp8_dtype,
                     int64_t margin, bool pow2, c10::string_view algo, int64_t interval, bool record, bool transpose,
                     bool inf_to_nan, const c10::optional<at::Tensor> &fresh_amax,
                     const c10::optional<at::Tensor> &rng, int64_t rng_skip, c10::optional<at::ScalarType> hp_out)
{
    const char *op = "act_delayed_cast";
    check_on(h, kCPU, op, "h");
    const fp8mix_dtype ht = hp_dtype(h, op, "h");
    Delayed d = delayed_args(hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    const float *fa = scalar_f32(fresh_amax, op, "fresh_amax");
    View2D v = view2d(h);
    int64_t cols;
    auto sizes = act_sizes(op, h, v, act, &cols);
    FusedPrep f = prepare_fused(op, h, sizes, v.rows, cols, fp8_dtype, FP8MIX_GRAN_TENSOR, c10::nullopt, margin, pow2,
                                0.0, true, transpose, inf_to_nan, rng, rng_skip, hp_out);
    at::Tensor scales = new_tensor({2}, h.options().dtype(at::kFloat));
    sync_threads();
    check_status(fp8mix_act_cast_delayed(v.t.data_ptr(), ht, v.rows, v.cols, v.ld, (fp8mix_act_kind)act, &f.out,
                                         &d.st, role, &d.r, fa, record ? 1 : 0, &f.o, scales.data_ptr<float>()),
                 op, "the state's scale must be finite and > 0");
    return {f.q, f.qt, scales, f.amax, f.hp};
}

} // namespace

#ifdef FP8MIX_WITH_CUDA
// ---- CUDA implementations ---------------------------------------------------
// The same ops on CUDA tensors: every tensor must be on x's device; work is
// enqueued on the current stream (c10::cuda::getCurrentCUDAStream) and nothing
// syncs with the host, except the optional scale check (env
// FP8MIX_CUDA_CHECK_SCALES=1, read once: reads a device status flag, one sync per
// call).  The kernels (csrc/cuda) are bit-identical to the CPU ones; scaled_mm
// runs on cuBLASLt, whose layout rules live in fp8mix_mm_layout_plan (this file
// only checks tensors, allocates what the plan asks for and calls), and agrees
// with the CPU up to summation order.  A GEMM cuBLASLt refuses (device, shape,
// library version) raises NotImplementedError starting with kRefused, so that
// Python can fall back to torch._scaled_mm (fp8mix/cuda/fallback.py).
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

void require_cuda(const at::Tensor &t, const char *op, const char *name)
{
    TORCH_CHECK_VALUE(t.is_cuda(), "fp8mix.", op, ": ", name, " is on ", t.device(),
                      " but the other tensors are on CUDA (move them to one device)");
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
    at::Tensor t;
    explicit DeviceFlag(const at::Tensor &like)
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

// A tensor-held stochastic-rounding stream on the data's device (the layers' fp8_rng
// buffer, int64 [key, offset]): the kernels read it on the device, so no host sync and
// a CUDA graph replays with the stream's state at replay time.  NULL when not given.
const int64_t *cuda_rng(const c10::optional<at::Tensor> &rng, int64_t skip, const at::Device &dev, const char *op)
{
    if (!rng.has_value() || !rng->defined()) return nullptr;
    const at::Tensor &r = *rng;
    TORCH_CHECK_TYPE(r.scalar_type() == at::kLong, "fp8mix.", op, ": rng must be int64 [key, offset], got ",
                     r.scalar_type());
    TORCH_CHECK_VALUE(r.numel() == 2 && r.is_contiguous(), "fp8mix.", op, ": rng must hold 2 int64 values "
                      "[key, offset], got shape ", r.sizes());
    check_on(r, dev, op, "rng");
    TORCH_CHECK_VALUE(skip >= 0, "fp8mix.", op, ": rng_skip must be >= 0");
    return r.data_ptr<int64_t>();
}

// Scratch of one recipe cast (fp8mix_cuda_recipe_work_bytes), from torch's caching allocator.
at::Tensor recipe_work(const at::Tensor &like)
{
    return new_tensor({(int64_t)fp8mix_cuda_recipe_work_bytes()}, like.options().dtype(at::kByte));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cast_cuda(const at::Tensor &x, const at::Tensor &scale,
                                                         at::ScalarType fp8_dtype, int64_t gran, bool saturate,
                                                         bool stochastic, int64_t seed, int64_t offset,
                                                         bool want_q, bool transpose, bool inf_to_nan,
                                                         const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "cast";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    const int64_t *rp = cuda_rng(rng, rng_skip, x.device(), op);
    const View2D &v = c.v;
    at::Tensor s = scale_arg(scale, scale_count(c.g, v.rows, v.cols), x.device(), op, "scale");
    at::Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    DeviceFlag flag(x);
    check_cuda_status(fp8mix_cuda_cast(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, s.data_ptr<float>(),
                                       c.q_ptr(), ld_of(v.cols), c.qt_ptr(), ld_of(v.rows), amax.data_ptr<float>(),
                                       flag.ptr(), &c.o, rp, (uint64_t)rng_skip, cur_stream()),
                      op);
    flag.check(op, "scale must be finite and > 0");
    return {c.q, c.qt, amax};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
quantize_current_cuda(const at::Tensor &x, at::ScalarType fp8_dtype, int64_t gran, int64_t margin, bool pow2,
                      double eps, bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q,
                      bool transpose, bool inf_to_nan, const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "quantize";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    check_margin_eps(op, margin, eps);
    CastPrep c = prepare_cast(op, x, fp8_dtype, gran, saturate, stochastic, seed, offset, want_q, transpose,
                              inf_to_nan);
    const int64_t *rp = cuda_rng(rng, rng_skip, x.device(), op);
    const View2D &v = c.v;
    auto sshape = scale_shape(x, c.g, v.rows, v.cols);
    // Every entry is written by the kernels (n > 0), so no fill is needed.
    at::Tensor sinv = new_tensor(sshape, x.options().dtype(at::kFloat));
    at::Tensor amax = new_tensor(sshape, x.options().dtype(at::kFloat));
    if (scale_count(c.g, v.rows, v.cols) == 0) return {c.q, c.qt, sinv, amax};
    at::Tensor work = c.g == FP8MIX_GRAN_TENSOR ? recipe_work(x) : at::Tensor();
    check_cuda_status(fp8mix_cuda_quantize_current(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.g, (int)margin,
                                                   pow2 ? 1 : 0, (float)eps, c.q_ptr(), ld_of(v.cols), c.qt_ptr(),
                                                   ld_of(v.rows), sinv.data_ptr<float>(), amax.data_ptr<float>(),
                                                   &c.o, rp, (uint64_t)rng_skip,
                                                   work.defined() ? work.data_ptr() : nullptr, cur_stream()),
                      op);
    return {c.q, c.qt, sinv, amax};
}

at::Tensor amax_cuda(const at::Tensor &x, int64_t gran)
{
    const char *op = "amax";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_granularity g = granularity(gran, op);
    View2D v = view2d(x);
    at::Tensor out = new_tensor(scale_shape(x, g, v.rows, v.cols), x.options().dtype(at::kFloat));
    if (out.numel() == 0) return out;
    check_cuda_status(fp8mix_cuda_amax(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, g, out.data_ptr<float>(),
                                       cur_stream()),
                      op);
    return out;
}

std::tuple<at::Tensor, at::Tensor> compute_scale_cuda(const at::Tensor &amax, at::ScalarType fp8_dtype,
                                                      int64_t margin, bool pow2, double eps)
{
    const char *op = "compute_scale";
    require_cuda(amax, op, "amax");
    c10::cuda::CUDAGuard guard(amax.device());
    TORCH_CHECK_TYPE(amax.scalar_type() == at::kFloat, "fp8mix.compute_scale: amax must be float32");
    check_margin_eps(op, margin, eps);
    at::Tensor a = amax.contiguous();
    at::Tensor s = at::empty_like(a), si = at::empty_like(a);
    check_cuda_status(fp8mix_cuda_compute_scale(a.data_ptr<float>(), a.numel(), fp8_format(fp8_dtype, op),
                                                (int)margin, pow2 ? 1 : 0, (float)eps, s.data_ptr<float>(),
                                                si.data_ptr<float>(), cur_stream()),
                      op);
    return {s, si};
}

at::Tensor dequantize_cuda(const at::Tensor &q, const at::Tensor &scale_inv, int64_t gran, at::ScalarType out_dtype)
{
    const char *op = "dequantize";
    require_cuda(q, op, "q");
    c10::cuda::CUDAGuard guard(q.device());
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_dtype ot = hp_dtype(out_dtype, op);
    fp8mix_granularity g = granularity(gran, op);
    View2D v = view2d(q);
    at::Tensor s = scale_arg(scale_inv, scale_count(g, v.rows, v.cols), q.device(), op, "scale_inv");
    at::Tensor out = new_tensor(q.sizes(), q.options().dtype(out_dtype));
    DeviceFlag flag(q);
    check_cuda_status(fp8mix_cuda_dequantize((const uint8_t *)v.t.data_ptr(), fmt, v.rows, v.cols, v.ld, g,
                                             s.data_ptr<float>(), out.data_ptr(), ot, ld_of(v.cols), flag.ptr(),
                                             cur_stream()),
                      op);
    flag.check(op, "scale_inv must be finite and > 0");
    return out;
}

// ---- scaled_mm --------------------------------------------------------------

[[noreturn]] void refuse(const std::string &why)
{
    TORCH_CHECK_NOT_IMPLEMENTED(false, kRefused, why,
                                " (fp8mix.cuda.fallback.scaled_mm_fallback runs it on torch._scaled_mm)");
}

// The planning problem of one call (addresses only for their alignment).
fp8mix_mm_problem mm_problem(const at::Tensor &a, const at::Tensor &b, fp8mix_mm_scale ka, fp8mix_mm_scale kb,
                             const at::Tensor &sa, const at::Tensor &sb, const at::Tensor &bias, fp8mix_dtype bt,
                             const at::Tensor &out, fp8mix_dtype ot, bool fast_accum)
{
    fp8mix_mm_problem p;
    std::memset(&p, 0, sizeof p);
    p.m = a.size(0); p.k = a.size(1); p.n = b.size(1);
    p.fmt_a = fp8_format(a.scalar_type(), "scaled_mm"); p.fmt_b = fp8_format(b.scalar_type(), "scaled_mm");
    p.a_stride0 = a.stride(0); p.a_stride1 = a.stride(1);
    p.b_stride0 = b.stride(0); p.b_stride1 = b.stride(1);
    p.a_addr = (uint64_t)(uintptr_t)a.data_ptr(); p.b_addr = (uint64_t)(uintptr_t)b.data_ptr();
    p.scale_a_kind = ka; p.scale_b_kind = kb;
    p.sa_addr = (uint64_t)(uintptr_t)sa.data_ptr(); p.sb_addr = (uint64_t)(uintptr_t)sb.data_ptr();
    p.has_bias = bias.defined();
    p.bias_t = bt;
    p.bias_addr = bias.defined() ? (uint64_t)(uintptr_t)bias.data_ptr() : 0;
    p.out_t = ot;
    p.out_addr = (uint64_t)(uintptr_t)out.data_ptr();
    p.fast_accum = fast_accum;
    return p;
}

// Plan, allocate the plan's scratch, run; refusals become NotImplementedError(kRefused...).
void scaled_mm_cuda_run(fp8mix_mm_problem &pr, const at::Tensor &a, const at::Tensor &b, const at::Tensor &sa,
                        const at::Tensor &sb, const at::Tensor &bias, at::Tensor &out)
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
    at::Tensor scratch = new_tensor({(int64_t)pl.scratch_bytes}, a.options().dtype(at::kByte));
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

at::Tensor scaled_mm_cuda(const at::Tensor &a, const at::Tensor &b, const at::Tensor &scale_a,
                          const at::Tensor &scale_b, const c10::optional<at::Tensor> &bias,
                          c10::optional<at::ScalarType> out_dtype, c10::string_view accumulate,
                          int64_t promote_interval, int64_t scale_kind_a, int64_t scale_kind_b)
{
    const char *op = "scaled_mm";
    require_cuda(a, op, "a");
    c10::cuda::CUDAGuard guard(a.device());
    const at::Device dev = a.device();
    check_on(b, dev, op, "b");
    TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, "fp8mix.scaled_mm: a and b must be 2-D, got ", a.dim(),
                      "-D and ", b.dim(), "-D");
    fp8mix_format fa = fp8_format(a.scalar_type(), op), fb = fp8_format(b.scalar_type(), op);
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    TORCH_CHECK_VALUE(b.size(0) == K, "fp8mix.scaled_mm: inner dimensions differ: a is ", a.sizes(), ", b is ",
                      b.sizes());
    TORCH_CHECK_VALUE(!(fa == FP8MIX_E5M2 && fb == FP8MIX_E5M2),
                      "fp8mix.scaled_mm: E5M2 x E5M2 is not supported by FP8 tensor cores (CUDA); "
                      "use E4M3 for one operand (it runs on CPU)");
    const at::ScalarType odt = out_dtype.value_or(at::kFloat);
    const fp8mix_dtype ot = hp_dtype(odt, op);
    TORCH_CHECK_VALUE(accumulate == "fp32" || accumulate == "fp22",
                      "fp8mix.scaled_mm: accumulate must be 'fp32' or 'fp22', got '", std::string(accumulate), "'");
    TORCH_CHECK_VALUE(promote_interval >= 0, "fp8mix.scaled_mm: promote_interval must be >= 0");
    TORCH_CHECK_VALUE((scale_kind_a < 0) == (scale_kind_b < 0), "fp8mix.scaled_mm: give both scale kinds or none");
    const int64_t kb = (K + 127) / 128, mb = (M + 127) / 128, nb = (N + 127) / 128;
    const bool block_mode = is_block_mode(scale_a, scale_b, M, kb, nb, scale_kind_a);
    const fp8mix_mm_scale ka = mm_scale_kind(scale_a, scale_kind_a, M, kb, mb, true, block_mode, dev);
    const fp8mix_mm_scale kbk = mm_scale_kind(scale_b, scale_kind_b, N, kb, nb, false, block_mode, dev);
    at::Tensor bias_t;
    fp8mix_dtype bt = FP8MIX_F32;
    if (bias.has_value() && bias->defined()) {
        bias_t = bias->contiguous();
        check_on(bias_t, dev, op, "bias");
        bt = hp_dtype(bias_t, op, "bias");
        TORCH_CHECK_VALUE(bias_t.dim() == 1 && bias_t.size(0) == N, "fp8mix.scaled_mm: bias must have shape (", N,
                          "), got ", bias_t.sizes());
    }
    at::Tensor out = new_tensor({M, N}, a.options().dtype(odt));
    if (M == 0 || N == 0) return out;
    if (K == 0) { // no products: bias (or +0), rounded once
        out.zero_();
        if (bias_t.defined()) out.copy_(bias_t.to(at::kFloat).unsqueeze(0).expand({M, N}));
        return out;
    }
    const at::Tensor sa = scale_a.contiguous(), sb = scale_b.contiguous();
    // accumulate="fp22" is cuBLASLt's fast accumulation; promote_interval has no CUDA counterpart
    fp8mix_mm_problem pr = mm_problem(a, b, ka, kbk, sa, sb, bias_t, bt, out, ot, accumulate == "fp22");
    scaled_mm_cuda_run(pr, a, b, sa, sb, bias_t, out);
    return out;
}

// Delayed scaling of many tensors in one kernel (see fp8mix_cuda_delayed_update).
void delayed_scale_update_cuda(at::TensorList amax_history, at::TensorList amax, at::TensorList scale,
                               at::TensorList scale_inv, at::TensorList steps, at::ArrayRef<double> fp8_max,
                               int64_t margin, bool pow2, c10::string_view algo, int64_t interval)
{
    const char *op = "delayed_scale_update";
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
    if (n == 0) return;
    require_cuda(amax_history[0], op, "amax_history");
    c10::cuda::CUDAGuard guard(amax_history[0].device());
    const at::Device dev = amax_history[0].device();
    std::vector<fp8mix_cuda_delayed_entry> e(n);
    for (size_t i = 0; i < n; i++) {
        const at::Tensor &h = amax_history[i];
        auto f32 = [&](const at::Tensor &t, const char *name, int64_t numel) {
            TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat, "fp8mix.delayed_scale_update: ", name,
                             " must be float32");
            check_on(t, dev, op, name);
            TORCH_CHECK_VALUE(numel < 0 || t.numel() == numel, "fp8mix.delayed_scale_update: ", name, " must have ",
                              numel, " element(s), got ", t.numel());
        };
        f32(h, "amax_history", -1);
        TORCH_CHECK_VALUE(h.dim() == 1 && h.numel() >= 1, "fp8mix.delayed_scale_update: amax_history[", i,
                          "] must be 1-D and non-empty (a column of an (L, k) buffer is fine)");
        f32(amax[i], "amax", 1);
        f32(scale[i], "scale", 1);
        e[i].history = h.data_ptr<float>();
        e[i].history_len = h.size(0);
        e[i].history_stride = h.size(0) > 1 ? h.stride(0) : 1;
        TORCH_CHECK_VALUE(e[i].history_stride >= 1, "fp8mix.delayed_scale_update: bad amax_history stride");
        e[i].amax = amax[i].data_ptr<float>();
        e[i].scale = scale[i].data_ptr<float>();
        e[i].scale_inv = nullptr;
        if (!scale_inv.empty()) {
            f32(scale_inv[i], "scale_inv", 1);
            e[i].scale_inv = scale_inv[i].data_ptr<float>();
        }
        e[i].steps = nullptr;
        if (!steps.empty()) {
            TORCH_CHECK_TYPE(steps[i].scalar_type() == at::kLong && steps[i].numel() == 1,
                             "fp8mix.delayed_scale_update: steps must be single int64 values");
            check_on(steps[i], dev, op, "steps");
            e[i].steps = steps[i].data_ptr<int64_t>();
        }
        e[i].fp8_max = (float)fp8_max[i];
    }
    check_cuda_status(fp8mix_cuda_delayed_update(e.data(), (int64_t)n, (int)margin, pow2 ? 1 : 0,
                                                 algo == "max" ? FP8MIX_AMAX_MAX : FP8MIX_AMAX_MOST_RECENT, interval,
                                                 cur_stream()),
                      op);
}

// ---- the per-tensor recipes' state and casts (csrc/cuda/recipe.cu) ---------------------
// The CPU ops' contracts with the state on the device: checks of what the host sees,
// then one call; every state value is read by the kernels (no host sync).

void state_tensor_on(const at::Tensor &t, at::ScalarType dt, int64_t dim, const at::Device &dev, const char *op,
                     const char *name)
{
    TORCH_CHECK_TYPE(t.scalar_type() == dt, "fp8mix.", op, ": ", name, " must be ", dt, ", got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == dim && t.is_contiguous(), "fp8mix.", op, ": ", name, " must be a contiguous ",
                      dim, "-D tensor, got shape ", t.sizes());
    check_on(t, dev, op, name);
}

Delayed delayed_args_on(const at::Device &dev, const at::Tensor &hist, const at::Tensor &scale,
                        const at::Tensor &steps, int64_t history_len, int64_t margin, bool pow2, c10::string_view algo,
                        int64_t interval, const char *op)
{
    state_tensor_on(hist, at::kFloat, 2, dev, op, "amax_history");
    state_tensor_on(scale, at::kFloat, 1, dev, op, "scale");
    state_tensor_on(steps, at::kLong, 1, dev, op, "steps");
    const int64_t R = hist.size(1);
    TORCH_CHECK_VALUE(scale.size(0) == R && steps.size(0) == R, "fp8mix.", op, ": amax_history has ", R,
                      " roles but scale has ", scale.size(0), " and steps ", steps.size(0));
    TORCH_CHECK_VALUE(history_len >= 1 && history_len <= hist.size(0), "fp8mix.", op, ": history_len ", history_len,
                      " must be in [1, ", hist.size(0), "] (the history buffer's rows)");
    TORCH_CHECK_VALUE(interval >= 1, "fp8mix.", op, ": interval must be >= 1, got ", interval);
    check_margin_eps(op, margin, 0.0);
    Delayed d;
    d.st = {hist.data_ptr<float>(), hist.size(0), R, scale.data_ptr<float>(), steps.data_ptr<int64_t>()};
    d.r = {history_len, amax_algo(algo, op), (int)margin, pow2 ? 1 : 0, interval};
    return d;
}

const float *scalar_on(const c10::optional<at::Tensor> &t, const at::Device &dev, const char *op, const char *name,
                       int64_t n = 1)
{
    if (!t.has_value() || !t->defined()) return nullptr;
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, "fp8mix.", op, ": ", name, " must be float32");
    TORCH_CHECK_VALUE(t->numel() == n && t->is_contiguous(), "fp8mix.", op, ": ", name, " must hold ", n,
                      " contiguous value(s), got shape ", t->sizes());
    check_on(*t, dev, op, name);
    return t->data_ptr<float>();
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
delayed_cast_cuda(const at::Tensor &x, const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps,
                  int64_t role, int64_t history_len, at::ScalarType fp8_dtype, int64_t margin, bool pow2,
                  c10::string_view algo, int64_t interval, bool record, bool transpose, bool inf_to_nan,
                  const c10::optional<at::Tensor> &fresh_amax, const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "delayed_cast";
    require_cuda(x, op, "x");
    c10::cuda::CUDAGuard guard(x.device());
    const at::Device dev = x.device();
    Delayed d = delayed_args_on(dev, hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    const float *fa = scalar_on(fresh_amax, dev, op, "fresh_amax");
    CastPrep c = prepare_cast(op, x, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const int64_t *rp = cuda_rng(rng, rng_skip, dev, op);
    at::Tensor scales = new_tensor({2}, x.options().dtype(at::kFloat));
    at::Tensor amax = new_tensor({}, x.options().dtype(at::kFloat));
    at::Tensor work = recipe_work(x);
    DeviceFlag flag(x);
    const View2D &v = c.v;
    check_cuda_status(fp8mix_cuda_cast_delayed(v.t.data_ptr(), c.xt, v.rows, v.cols, v.ld, c.q_ptr(), ld_of(v.cols),
                                               c.qt_ptr(), ld_of(v.rows), &d.st, role, &d.r, fa, record ? 1 : 0,
                                               &c.o, rp, (uint64_t)rng_skip, scales.data_ptr<float>(),
                                               amax.data_ptr<float>(), work.data_ptr(), flag.ptr(), cur_stream()),
                      op);
    flag.check(op, "the role's scale must be finite and > 0");
    return {c.q, c.qt, scales, amax};
}

void delayed_record_cuda(const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, int64_t role,
                         int64_t history_len, const at::Tensor &amax, at::ScalarType fp8_dtype, int64_t margin,
                         bool pow2, c10::string_view algo, int64_t interval, bool rescale_only)
{
    const char *op = "delayed_record";
    require_cuda(hist, op, "amax_history");
    c10::cuda::CUDAGuard guard(hist.device());
    Delayed d = delayed_args_on(hist.device(), hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    const fp8mix_format fmt = fp8_format(fp8_dtype, op);
    const float *a = rescale_only ? nullptr : scalar_on(amax, hist.device(), op, "amax");
    check_cuda_status(fp8mix_cuda_delayed_record(&d.st, role, fmt, &d.r, a, rescale_only ? 1 : 0, cur_stream()), op);
}

std::tuple<at::Tensor, at::Tensor>
delayed_flush_cuda(const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, const at::Tensor &pending,
                   const at::Tensor &next_slot, int64_t role, int64_t history_len, at::ScalarType fp8_dtype,
                   int64_t margin, bool pow2, c10::string_view algo, int64_t interval, bool record, bool reserve)
{
    const char *op = "delayed_flush";
    require_cuda(hist, op, "amax_history");
    c10::cuda::CUDAGuard guard(hist.device());
    const at::Device dev = hist.device();
    Delayed d = delayed_args_on(dev, hist, scale, steps, history_len, margin, pow2, algo, interval, op);
    check_role(role, d, op);
    state_tensor_on(pending, at::kFloat, 1, dev, op, "pending");
    state_tensor_on(next_slot, at::kLong, 0, dev, op, "next_slot");
    TORCH_CHECK_VALUE(pending.numel() >= 1, "fp8mix.", op, ": pending needs at least one slot");
    TORCH_CHECK_VALUE(record || !reserve, "fp8mix.", op, ": reserve needs record");
    at::Tensor plan = new_tensor({2}, hist.options());
    at::Tensor slot = new_tensor({}, steps.options()); // written by the kernel (0 when not reserving)
    check_cuda_status(fp8mix_cuda_delayed_flush(&d.st, role, fp8_format(fp8_dtype, op), &d.r,
                                                pending.data_ptr<float>(), pending.numel(),
                                                next_slot.data_ptr<int64_t>(), record ? 1 : 0, reserve ? 1 : 0,
                                                plan.data_ptr<float>(), slot.data_ptr<int64_t>(), cur_stream()),
                      op);
    return {plan, slot};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
grad_cast_cuda(const at::Tensor &dy, at::ScalarType fp8_dtype, const c10::optional<at::Tensor> &plan,
               const c10::optional<at::Tensor> &pending, const c10::optional<at::Tensor> &slot, int64_t margin,
               bool pow2, double eps, bool transpose, bool colsum, bool inf_to_nan,
               const c10::optional<at::Tensor> &rng, int64_t rng_skip)
{
    const char *op = "grad_cast";
    require_cuda(dy, op, "dy");
    c10::cuda::CUDAGuard guard(dy.device());
    const at::Device dev = dy.device();
    check_margin_eps(op, margin, eps);
    const float *pl = scalar_on(plan, dev, op, "plan", 2);
    const bool has_pending = pending.has_value() && pending->defined();
    TORCH_CHECK_VALUE(has_pending == (slot.has_value() && slot->defined()), "fp8mix.", op,
                      ": pending and slot go together");
    float *pend = nullptr;
    const int64_t *slot_p = nullptr;
    if (has_pending) {
        state_tensor_on(*pending, at::kFloat, 1, dev, op, "pending");
        TORCH_CHECK_TYPE(slot->scalar_type() == at::kLong && slot->numel() == 1, "fp8mix.", op,
                         ": slot must be one int64");
        check_on(*slot, dev, op, "slot");
        pend = pending->data_ptr<float>();
        slot_p = slot->data_ptr<int64_t>(); // its value is read by the kernel
    }
    CastPrep c = prepare_cast(op, dy, fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, transpose, inf_to_nan);
    const int64_t *rp = cuda_rng(rng, rng_skip, dev, op);
    const View2D &v = c.v;
    at::Tensor sinv = new_tensor({}, dy.options().dtype(at::kFloat));
    at::Tensor amax = new_tensor({}, dy.options().dtype(at::kFloat));
    at::Tensor cs = new_tensor({colsum ? v.cols : 0}, dy.options().dtype(at::kFloat));
    at::Tensor work = recipe_work(dy);
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

// fp8mix_quant_stats on the device: the 84 entries with the CPU's bits (csrc/cuda/stats.cu).
at::Tensor quant_stats_cuda(const at::Tensor &x, const at::Tensor &q, const at::Tensor &scale_inv, int64_t gran,
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
    at::Tensor s = scale_arg(scale_inv, scale_count(g, vx.rows, vx.cols), x.device(), op, "scale_inv");
    at::Tensor out = new_tensor({FP8MIX_STATS_N}, x.options().dtype(at::kDouble));
    at::Tensor work = new_tensor({(int64_t)fp8mix_cuda_quant_stats_work_bytes()}, x.options().dtype(at::kByte));
    DeviceFlag flag(x);
    check_cuda_status(fp8mix_cuda_quant_stats(vx.t.data_ptr(), xt, vx.rows, vx.cols, vx.ld,
                                              (const uint8_t *)vq.t.data_ptr(), vq.ld, fmt, g, s.data_ptr<float>(),
                                              bad_scale_as_one ? 1 : 0, out.data_ptr<double>(), work.data_ptr(),
                                              bad_scale_as_one ? nullptr : flag.ptr(), cur_stream()),
                      op);
    flag.check(op, "scale_inv must be finite and > 0");
    return out;
}

void cuda_set_hw_convert(bool on) { fp8mix_cuda_set_hw_convert(on ? 1 : 0); }
bool cuda_get_hw_convert() { return fp8mix_cuda_get_hw_convert() != 0; }
void cuda_set_check_scales(bool on) { scale_checks_flag().store(on ? 1 : 0); }
bool cuda_get_check_scales() { return scale_checks_enabled(); }

} // namespace
#endif // FP8MIX_WITH_CUDA

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
    // scale_kind_a/b: fp8mix_mm_scale (0 tensor, 1 row/column, 2 block), or -1 to infer from the shapes.
    m.def("scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
          "ScalarType? out_dtype=None, str accumulate='fp32', int promote_interval=128, int scale_kind_a=-1, "
          "int scale_kind_b=-1) -> Tensor");
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
    m.def("cpu_isa() -> str", &cpu_isa);
    m.def("set_max_isa(str name) -> ()", &set_max_isa);
}

TORCH_LIBRARY_IMPL(fp8mix, CPU, m)
{
    m.impl("cast", &cast_cpu);
    m.impl("quantize_current", &quantize_current_cpu);
    m.impl("quantize_mx", &quantize_mx_cpu);
    m.impl("amax", &amax_cpu);
    m.impl("compute_scale", &compute_scale_cpu);
    m.impl("dequantize", &dequantize_cpu);
    m.impl("quant_stats", &quant_stats_cpu);
    m.impl("scaled_mm", &scaled_mm_cpu);
    m.impl("delayed_cast", &delayed_cast_cpu);
    m.impl("delayed_record", &delayed_record_cpu);
    m.impl("delayed_flush", &delayed_flush_cpu);
    m.impl("grad_cast", &grad_cast_cpu);
    m.impl("norm_cast", &norm_cast_cpu);
    m.impl("norm_delayed_cast", &norm_delayed_cast_cpu);
    m.impl("act_cast", &act_cast_cpu);
    m.impl("act_delayed_cast", &act_delayed_cast_cpu);
}

#ifdef FP8MIX_WITH_CUDA
// Ops that exist only in CUDA builds.
TORCH_LIBRARY_FRAGMENT(fp8mix, m)
{
    m.def("delayed_scale_update(Tensor(a!)[] amax_history, Tensor[] amax, Tensor(b!)[] scale, "
          "Tensor(c!)[] scale_inv, Tensor(d!)[] steps, float[] fp8_max, int margin=0, bool power_2_scale=False, "
          "str amax_compute_algo='max', int interval=1) -> ()");
    m.def("cuda_set_hw_convert(bool on) -> ()", &cuda_set_hw_convert);
    m.def("cuda_get_hw_convert() -> bool", &cuda_get_hw_convert);
    m.def("cuda_set_check_scales(bool on) -> ()", &cuda_set_check_scales);
    m.def("cuda_get_check_scales() -> bool", &cuda_get_check_scales);
}

TORCH_LIBRARY_IMPL(fp8mix, CUDA, m)
{
    m.impl("cast", &cast_cuda);
    m.impl("quantize_current", &quantize_current_cuda);
    m.impl("amax", &amax_cuda);
    m.impl("compute_scale", &compute_scale_cuda);
    m.impl("dequantize", &dequantize_cuda);
    m.impl("scaled_mm", &scaled_mm_cuda);
    m.impl("quant_stats", &quant_stats_cuda);
    m.impl("delayed_cast", &delayed_cast_cuda);
    m.impl("delayed_record", &delayed_record_cuda);
    m.impl("delayed_flush", &delayed_flush_cuda);
    m.impl("grad_cast", &grad_cast_cuda);
    m.impl("delayed_scale_update", &delayed_scale_update_cuda);
}
#endif // FP8MIX_WITH_CUDA

// ---- CPU: a linear layer's forward casts, and its backward, in one call each -----------
//
// What fp8mix.nn's eager step of a per-tensor recipe runs before its forward GEMM, and in
// its backward, as one op each: the same functions, in the same order and with the same
// arguments as the separate ops (delayed_flush, then delayed_cast of x and of W; or
// quantize_current of x and of W; grad_cast, then the dgrad and wgrad scaled_mm_cpu), so
// the results are those ops' bit for bit. One op instead of two or three saves the
// Python-to-dispatcher cost of the others (about 10 us each), most of a layer's time at
// small shapes. No policy here: the Python layer decides when they apply
// (fp8mix/nn/_casts.py, _function.py). scale_inv outputs are their own 0-d tensors (a copy
// of scales[1]), not views of another output.
namespace {

at::Tensor scalar_copy(const at::Tensor &scales)
{
    at::Tensor s = new_tensor({}, scales.options());
    *s.data_ptr<float>() = scales.data_ptr<float>()[1];
    return s;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
           at::Tensor>
linear_delayed_casts_cpu(const at::Tensor &x, const at::Tensor &w, const at::Tensor &hist, const at::Tensor &scale,
                         const at::Tensor &steps, const at::Tensor &pending, const at::Tensor &next_slot, int64_t gemm,
                         int64_t history_len, at::ScalarType x_dtype, at::ScalarType w_dtype,
                         at::ScalarType grad_dtype, int64_t margin, bool pow2, c10::string_view algo, int64_t interval,
                         bool record, bool reserve, bool transpose, bool inf_to_nan)
{
    TORCH_CHECK_VALUE(gemm >= 0, "fp8mix.linear_delayed_casts: gemm must be >= 0, got ", gemm);
    const c10::optional<at::Tensor> none;
    auto g = delayed_flush_cpu(hist, scale, steps, pending, next_slot, 3 * gemm + 2, history_len, grad_dtype, margin,
                               pow2, algo, interval, record, reserve);
    auto xc = delayed_cast_cpu(x, hist, scale, steps, 3 * gemm, history_len, x_dtype, margin, pow2, algo, interval,
                               record, transpose, inf_to_nan, none, none, 0);
    auto wc = delayed_cast_cpu(w, hist, scale, steps, 3 * gemm + 1, history_len, w_dtype, margin, pow2, algo, interval,
                               record, transpose, inf_to_nan, none, none, 0);
    const at::Tensor &xs = std::get<2>(xc), &ws = std::get<2>(wc);
    return {std::get<0>(xc), std::get<1>(xc), xs, scalar_copy(xs), std::get<0>(wc), std::get<1>(wc), ws,
            scalar_copy(ws), std::get<0>(g), std::get<1>(g)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
linear_current_casts_cpu(const at::Tensor &x, const at::Tensor &w, at::ScalarType x_dtype, at::ScalarType w_dtype,
                         int64_t margin, bool pow2, double eps, bool transpose, bool inf_to_nan)
{
    const c10::optional<at::Tensor> none;
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
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
linear_backward_cpu(const at::Tensor &dy, const at::Tensor &w, const at::Tensor &w_sinv, const at::Tensor &xq,
                    const at::Tensor &x_sinv, at::ScalarType fp8_dtype, const c10::optional<at::Tensor> &plan,
                    const c10::optional<at::Tensor> &pending, const c10::optional<at::Tensor> &slot, int64_t margin,
                    bool pow2, double eps, bool colsum, bool want_dx, bool want_dw, at::ScalarType dx_dtype,
                    at::ScalarType dw_dtype, const c10::optional<at::Tensor> &w_scale,
                    const c10::optional<at::Tensor> &w_amax, c10::optional<at::ScalarType> w_fp8_dtype)
{
    const char *op = "linear_backward";
    const c10::optional<at::Tensor> none;
    TORCH_CHECK_VALUE(!(w_scale && w_amax), "fp8mix.", op, ": pass w_scale or w_amax, not both");
    const bool recast = w_scale.has_value() || w_amax.has_value();
    TORCH_CHECK_VALUE(!recast || w_fp8_dtype.has_value(), "fp8mix.", op,
                      ": w_fp8_dtype is required with w_scale / w_amax (the weight's FP8 format)");
    auto gc = grad_cast_cpu(dy, fp8_dtype, plan, pending, slot, margin, pow2, eps, false, colsum, true, none, 0);
    const at::Tensor &gq = std::get<0>(gc), &g_sinv = std::get<2>(gc);
    const int64_t t = FP8MIX_MM_SCALE_TENSOR;
    at::Tensor dx = new_tensor({0}, dy.options().dtype(dx_dtype));
    if (want_dx) {
        at::Tensor wq = w;
        if (recast) {
            at::Tensor s = w_scale ? *w_scale : std::get<0>(compute_scale_cpu(w_amax->reshape({1}), *w_fp8_dtype,
                                                                             margin, pow2, eps));
            wq = std::get<0>(cast_cpu(w, s, *w_fp8_dtype, FP8MIX_GRAN_TENSOR, true, false, 0, 0, true, false, true,
                                      none, 0));
        }
        dx = scaled_mm_cpu(gq, wq, g_sinv, w_sinv, none, dx_dtype, "fp32", 128, t, t);
    } // the re-cast W is freed here, before dW exists
    at::Tensor dw = want_dw ? scaled_mm_cpu(gq.t(), xq, g_sinv, x_sinv, none, dw_dtype, "fp32", 128, t, t)
                            : new_tensor({0}, dy.options().dtype(dw_dtype));
    return {dx, dw, std::get<4>(gc), gq, g_sinv};
}

} // namespace

TORCH_LIBRARY_FRAGMENT(fp8mix, m)
{
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
}

TORCH_LIBRARY_IMPL(fp8mix, CPU, m)
{
    m.impl("linear_delayed_casts", &linear_delayed_casts_cpu);
    m.impl("linear_current_casts", &linear_current_casts_cpu);
    m.impl("linear_backward", &linear_backward_cpu);
}

// ---- direct calls: fp8mix.nn's eager CPU step without torch.ops' per-call cost ------
//
// A call through torch.ops converts every argument against the schema, boxes the stack and
// passes the autograd fallback: about 80K instructions (20-25 us here) before the kernel
// runs, most of a 64x64 layer's step, which makes three such calls. fp8mix.nn calls these
// module functions instead where nothing needs to see the op (eager mode, no dispatch mode,
// no functorch transform: fp8mix/nn/_forward.py decides). They run the same *_cpu
// functions, so the results are the ops' bit for bit; the profiler records them under the
// op's name; the GIL is released around the kernel, as torch.ops does; and, like the ops
// (custom ops' autograd fallback), they leave version counters alone.
namespace {

// Wrapper tensors (a Python subclass, functorch's) have no storage of their own to read.
void check_plain(const at::Tensor &t, const char *op)
{
    static const c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                              c10::DispatchKey::FuncTorchBatched,
                                              c10::DispatchKey::FuncTorchGradWrapper,
                                              c10::DispatchKey::Functionalize});
    TORCH_CHECK_TYPE(!t.defined() || (t.is_cpu() && !t.key_set().has_any(wrapped)), "fp8mix._C.", op,
                     ": takes plain CPU tensors (a tensor subclass or a functorch wrapper must go through "
                     "torch.ops.fp8mix.", op, ")");
}

void check_plain(const c10::optional<at::Tensor> &t, const char *op)
{
    if (t) check_plain(*t, op);
}

template <typename F> auto direct(const char *name, F &&body)
{
    RECORD_FUNCTION(name, std::vector<c10::IValue>());
    pybind11::gil_scoped_release no_gil;
    return body();
}

// A Linear's forward GEMM after its one-op casts: y = (xq x_sinv) (wq w_sinv)^T + bias, W (N, K)
// read through its transposed view, per-tensor scales (scaled_mm_cpu, as the separate op).
at::Tensor linear_forward_gemm(const at::Tensor &xq, const at::Tensor &wq, const at::Tensor &x_sinv,
                               const at::Tensor &w_sinv, const c10::optional<at::Tensor> &bias,
                               at::ScalarType out_dtype)
{
    const int64_t t = FP8MIX_MM_SCALE_TENSOR;
    return scaled_mm_cpu(xq, wq.t(), x_sinv, w_sinv, bias, out_dtype, "fp32", 128, t, t);
}

void add_direct_calls(PyObject *module)
{
    auto m = pybind11::reinterpret_borrow<pybind11::module_>(module);
    m.def(
        "linear_delayed_forward",
        [](const at::Tensor &x, const at::Tensor &w, const c10::optional<at::Tensor> &bias, at::ScalarType out_dtype,
           const at::Tensor &hist, const at::Tensor &scale, const at::Tensor &steps, const at::Tensor &pending,
           const at::Tensor &next_slot, int64_t gemm, int64_t history_len, at::ScalarType x_dtype,
           at::ScalarType w_dtype, at::ScalarType grad_dtype, int64_t margin, bool pow2, const std::string &algo,
           int64_t interval, bool record, bool reserve) {
            HANDLE_TH_ERRORS
            const char *op = "linear_delayed_forward";
            for (const at::Tensor *t : {&x, &w, &hist, &scale, &steps, &pending, &next_slot}) check_plain(*t, op);
            check_plain(bias, op);
            return direct("fp8mix::linear_delayed_forward", [&] {
                auto c = linear_delayed_casts_cpu(x, w, hist, scale, steps, pending, next_slot, gemm, history_len,
                                                  x_dtype, w_dtype, grad_dtype, margin, pow2, algo, interval, record,
                                                  reserve, false, true);
                at::Tensor y = linear_forward_gemm(std::get<0>(c), std::get<4>(c), std::get<3>(c), std::get<7>(c),
                                                   bias, out_dtype);
                at::Tensor w_scale = new_tensor({1}, std::get<6>(c).options());
                *w_scale.data_ptr<float>() = std::get<6>(c).data_ptr<float>()[0];
                return std::make_tuple(y, std::get<0>(c), std::get<2>(c), std::get<3>(c), std::get<4>(c),
                                       std::get<6>(c), std::get<7>(c), std::get<8>(c), std::get<9>(c), w_scale);
            });
            END_HANDLE_TH_ERRORS_PYBIND
        },
        "linear_delayed_casts (transpose False, inf_to_nan True), then the forward GEMM with bias, in one call: "
        "(y, xq, x_scales, x_scale_inv, wq, w_scales, w_scale_inv, grad_plan, grad_slot, w_scale)");
    m.def(
        "linear_current_forward",
        [](const at::Tensor &x, const at::Tensor &w, const c10::optional<at::Tensor> &bias, at::ScalarType out_dtype,
           at::ScalarType x_dtype, at::ScalarType w_dtype, int64_t margin, bool pow2, double eps) {
            HANDLE_TH_ERRORS
            const char *op = "linear_current_forward";
            check_plain(x, op);
            check_plain(w, op);
            check_plain(bias, op);
            return direct("fp8mix::linear_current_forward", [&] {
                auto c = linear_current_casts_cpu(x, w, x_dtype, w_dtype, margin, pow2, eps, false, true);
                at::Tensor y = linear_forward_gemm(std::get<0>(c), std::get<4>(c), std::get<2>(c), std::get<6>(c),
                                                   bias, out_dtype);
                return std::make_tuple(y, std::get<0>(c), std::get<2>(c), std::get<4>(c), std::get<6>(c),
                                       std::get<7>(c));
            });
            END_HANDLE_TH_ERRORS_PYBIND
        },
        "linear_current_casts (transpose False, inf_to_nan True), then the forward GEMM with bias, in one call: "
        "(y, xq, x_scale_inv, wq, w_scale_inv, w_amax)");
    m.def(
        "linear_delayed_casts",
        [](const at::Tensor &x, const at::Tensor &w, const at::Tensor &hist, const at::Tensor &scale,
           const at::Tensor &steps, const at::Tensor &pending, const at::Tensor &next_slot, int64_t gemm,
           int64_t history_len, at::ScalarType x_dtype, at::ScalarType w_dtype, at::ScalarType grad_dtype,
           int64_t margin, bool pow2, const std::string &algo, int64_t interval, bool record, bool reserve,
           bool transpose, bool inf_to_nan) {
            HANDLE_TH_ERRORS
            const char *op = "linear_delayed_casts";
            for (const at::Tensor *t : {&x, &w, &hist, &scale, &steps, &pending, &next_slot}) check_plain(*t, op);
            return direct("fp8mix::linear_delayed_casts", [&] {
                return linear_delayed_casts_cpu(x, w, hist, scale, steps, pending, next_slot, gemm, history_len,
                                                x_dtype, w_dtype, grad_dtype, margin, pow2, algo, interval, record,
                                                reserve, transpose, inf_to_nan);
            });
            END_HANDLE_TH_ERRORS_PYBIND
        },
        "torch.ops.fp8mix.linear_delayed_casts, called directly (positional arguments in the schema's order)");
    m.def(
        "linear_current_casts",
        [](const at::Tensor &x, const at::Tensor &w, at::ScalarType x_dtype, at::ScalarType w_dtype, int64_t margin,
           bool pow2, double eps, bool transpose, bool inf_to_nan) {
            HANDLE_TH_ERRORS
            check_plain(x, "linear_current_casts");
            check_plain(w, "linear_current_casts");
            return direct("fp8mix::linear_current_casts", [&] {
                return linear_current_casts_cpu(x, w, x_dtype, w_dtype, margin, pow2, eps, transpose, inf_to_nan);
            });
            END_HANDLE_TH_ERRORS_PYBIND
        },
        "torch.ops.fp8mix.linear_current_casts, called directly (positional arguments in the schema's order)");
    m.def(
        "scaled_mm",
        [](const at::Tensor &a, const at::Tensor &b, const at::Tensor &scale_a, const at::Tensor &scale_b,
           const c10::optional<at::Tensor> &bias, c10::optional<at::ScalarType> out_dtype,
           const std::string &accumulate, int64_t promote_interval, int64_t kind_a, int64_t kind_b) {
            HANDLE_TH_ERRORS
            const char *op = "scaled_mm";
            for (const at::Tensor *t : {&a, &b, &scale_a, &scale_b}) check_plain(*t, op);
            check_plain(bias, op);
            return direct("fp8mix::scaled_mm", [&] {
                return scaled_mm_cpu(a, b, scale_a, scale_b, bias, out_dtype, accumulate, promote_interval, kind_a,
                                     kind_b);
            });
            END_HANDLE_TH_ERRORS_PYBIND
        },
        "torch.ops.fp8mix.scaled_mm on the CPU, called directly (positional arguments in the schema's order)");
    m.def(
        "linear_backward",
        [](const at::Tensor &dy, const at::Tensor &w, const at::Tensor &w_sinv, const at::Tensor &xq,
           const at::Tensor &x_sinv, at::ScalarType fp8_dtype, const c10::optional<at::Tensor> &plan,
           const c10::optional<at::Tensor> &pending, const c10::optional<at::Tensor> &slot, int64_t margin, bool pow2,
           double eps, bool colsum, bool want_dx, bool want_dw, at::ScalarType dx_dtype, at::ScalarType dw_dtype,
           const c10::optional<at::Tensor> &w_scale, const c10::optional<at::Tensor> &w_amax,
           c10::optional<at::ScalarType> w_fp8_dtype) {
            HANDLE_TH_ERRORS
            const char *op = "linear_backward";
            for (const at::Tensor *t : {&dy, &w, &w_sinv, &xq, &x_sinv}) check_plain(*t, op);
            for (const c10::optional<at::Tensor> *t : {&plan, &pending, &slot, &w_scale, &w_amax}) check_plain(*t, op);
            return direct("fp8mix::linear_backward", [&] {
                return linear_backward_cpu(dy, w, w_sinv, xq, x_sinv, fp8_dtype, plan, pending, slot, margin, pow2,
                                           eps, colsum, want_dx, want_dw, dx_dtype, dw_dtype, w_scale, w_amax,
                                           w_fp8_dtype);
            });
            END_HANDLE_TH_ERRORS_PYBIND
        },
        "torch.ops.fp8mix.linear_backward, called directly (positional arguments in the schema's order)");
}

} // namespace
