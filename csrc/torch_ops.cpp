// torch_ops.cpp — the one C++ file: the fp8mix::* operator schemas, their CPU
// implementations (tensor checks, then a call into the C API), and the empty
// fp8mix._C module.  Fake (meta) implementations live in fp8mix/ops.py.
//
// Tensors are viewed as 2-D (numel / last_dim, last_dim) with inner stride 1;
// anything else is made contiguous first.  C status codes become Python
// exceptions: ValueError for bad values, TypeError for bad dtypes.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <string>

#include "fp8mix.h"

extern "C" PyObject *PyInit__C(void)
{
    static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "fp8mix native ops (registered as torch.ops.fp8mix)", -1,
                              nullptr};
    return PyModule_Create(&def);
}

namespace {

void check_status(fp8mix_status st, const char *op, const char *what = nullptr)
{
    if (st == FP8MIX_OK) return;
    std::string msg = std::string("fp8mix.") + op + ": " + fp8mix_status_string(st);
    if (what) msg += std::string(" (") + what + ")";
    if (st == FP8MIX_ERR_BAD_ENUM || st == FP8MIX_ERR_BAD_SCALE || st == FP8MIX_ERR_BAD_ARG ||
        st == FP8MIX_ERR_BAD_SHAPE)
        TORCH_CHECK_VALUE(false, msg);
    TORCH_CHECK(false, msg);
}

void sync_threads() { fp8mix_set_num_threads(at::get_num_threads()); }

fp8mix_dtype hp_dtype(const at::Tensor &t, const char *op, const char *name)
{
    switch (t.scalar_type()) {
    case at::kFloat: return FP8MIX_F32;
    case at::kBFloat16: return FP8MIX_BF16;
    case at::kHalf: return FP8MIX_F16;
    default:
        TORCH_CHECK_TYPE(false, "fp8mix.", op, ": ", name, " must be float32, bfloat16 or float16, got ",
                         t.scalar_type());
    }
    return FP8MIX_F32;
}

fp8mix_dtype hp_dtype(at::ScalarType s, const char *op)
{
    switch (s) {
    case at::kFloat: return FP8MIX_F32;
    case at::kBFloat16: return FP8MIX_BF16;
    case at::kHalf: return FP8MIX_F16;
    default: TORCH_CHECK_TYPE(false, "fp8mix.", op, ": output dtype must be float32, bfloat16 or float16, got ", s);
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

struct View2D {
    at::Tensor t; // keeps a contiguous copy alive when one was needed
    int64_t rows, cols, ld;
};

// A row-major 2-D view of t with inner stride 1 (copying only when needed).
View2D view2d(const at::Tensor &t)
{
    View2D v;
    v.cols = t.dim() == 0 ? 1 : t.size(-1);
    v.rows = v.cols == 0 ? 0 : t.numel() / v.cols;
    if (t.dim() == 2 && t.stride(1) == 1 && t.stride(0) >= v.cols && t.size(0) > 0) {
        v.t = t;
        v.ld = t.size(0) > 1 ? t.stride(0) : v.cols;
    } else {
        v.t = t.contiguous();
        v.ld = v.cols;
    }
    if (v.ld < 1) v.ld = 1;
    return v;
}

void check_cpu(const at::Tensor &t, const char *op, const char *name)
{
    TORCH_CHECK_VALUE(t.device().is_cpu(), "fp8mix.", op, ": ", name, " is on ", t.device(),
                      " but this kernel runs on the CPU (was the CUDA build not installed?)");
}

int64_t scale_count(fp8mix_granularity g, int64_t rows, int64_t cols)
{
    switch (g) {
    case FP8MIX_GRAN_TENSOR: return 1;
    case FP8MIX_GRAN_ROW: return rows;
    case FP8MIX_GRAN_BLOCK: return rows * ((cols + 127) / 128);
    default: return ((rows + 127) / 128) * ((cols + 127) / 128);
    }
}

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
    default: return {(rows + 127) / 128, (cols + 127) / 128};
    }
}

at::Tensor scale_arg(const at::Tensor &s, int64_t expect, const char *op, const char *name)
{
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "fp8mix.", op, ": ", name, " must be float32, got ",
                     s.scalar_type());
    check_cpu(s, op, name);
    TORCH_CHECK_VALUE(s.numel() == expect, "fp8mix.", op, ": ", name, " has ", s.numel(),
                      " elements but this granularity needs ", expect, " (shape ", s.sizes(), ")");
    return s.contiguous();
}

fp8mix_cast_opts make_opts(fp8mix_format fmt, bool saturate, bool stochastic, int64_t seed, int64_t offset)
{
    fp8mix_cast_opts o;
    o.fmt = fmt;
    o.saturate = saturate ? 1 : 0;
    o.rounding = stochastic ? FP8MIX_ROUND_STOCHASTIC : FP8MIX_ROUND_NEAREST;
    o.seed = (uint64_t)seed;
    o.offset = (uint64_t)offset;
    return o;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> cast_cpu(const at::Tensor &x, const at::Tensor &scale,
                                                        at::ScalarType fp8_dtype, int64_t gran, bool saturate,
                                                        bool stochastic, int64_t seed, int64_t offset,
                                                        bool want_q, bool transpose)
{
    const char *op = "cast";
    check_cpu(x, op, "x");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(fp8_dtype, op);
    fp8mix_granularity g = granularity(gran, op);
    TORCH_CHECK_VALUE(want_q || transpose, "fp8mix.cast: nothing to produce (want_q and transpose both false)");
    View2D v = view2d(x);
    at::Tensor s = scale_arg(scale, scale_count(g, v.rows, v.cols), op, "scale");
    at::Tensor q = at::empty(want_q ? x.sizes() : at::IntArrayRef{0}, x.options().dtype(fp8_dtype));
    at::Tensor qt = at::empty(transpose ? std::vector<int64_t>{v.cols, v.rows} : std::vector<int64_t>{0},
                              x.options().dtype(fp8_dtype));
    at::Tensor amax = at::empty({}, x.options().dtype(at::kFloat));
    fp8mix_cast_opts o = make_opts(fmt, saturate, stochastic, seed, offset);
    sync_threads();
    check_status(fp8mix_cast(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, g, s.data_ptr<float>(),
                             want_q ? (uint8_t *)q.data_ptr() : nullptr, v.cols,
                             transpose ? (uint8_t *)qt.data_ptr() : nullptr, v.rows,
                             amax.data_ptr<float>(), &o),
                 op, "scale must be finite and > 0");
    return {q, qt, amax};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>
quantize_current_cpu(const at::Tensor &x, at::ScalarType fp8_dtype, int64_t gran, int64_t margin, bool pow2,
                     double eps, bool saturate, bool stochastic, int64_t seed, int64_t offset, bool want_q,
                     bool transpose)
{
    const char *op = "quantize";
    check_cpu(x, op, "x");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_format fmt = fp8_format(fp8_dtype, op);
    fp8mix_granularity g = granularity(gran, op);
    TORCH_CHECK_VALUE(want_q || transpose, "fp8mix.quantize: nothing to produce");
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 126, "fp8mix.quantize: margin must be in [0, 126], got ", margin);
    TORCH_CHECK_VALUE(eps >= 0.0 && std::isfinite(eps), "fp8mix.quantize: amax_epsilon must be finite and >= 0");
    View2D v = view2d(x);
    auto sshape = scale_shape(x, g, v.rows, v.cols);
    at::Tensor q = at::empty(want_q ? x.sizes() : at::IntArrayRef{0}, x.options().dtype(fp8_dtype));
    at::Tensor qt = at::empty(transpose ? std::vector<int64_t>{v.cols, v.rows} : std::vector<int64_t>{0},
                              x.options().dtype(fp8_dtype));
    at::Tensor sinv = at::ones(sshape, x.options().dtype(at::kFloat));
    at::Tensor amax = at::zeros(sshape, x.options().dtype(at::kFloat));
    fp8mix_cast_opts o = make_opts(fmt, saturate, stochastic, seed, offset);
    sync_threads();
    check_status(fp8mix_quantize_current(v.t.data_ptr(), xt, v.rows, v.cols, v.ld, g, (int)margin, pow2 ? 1 : 0,
                                         (float)eps, want_q ? (uint8_t *)q.data_ptr() : nullptr, v.cols,
                                         transpose ? (uint8_t *)qt.data_ptr() : nullptr, v.rows,
                                         sinv.data_ptr<float>(), amax.data_ptr<float>(), &o),
                 op);
    return {q, qt, sinv, amax};
}

at::Tensor amax_cpu(const at::Tensor &x, int64_t gran)
{
    const char *op = "amax";
    check_cpu(x, op, "x");
    fp8mix_dtype xt = hp_dtype(x, op, "x");
    fp8mix_granularity g = granularity(gran, op);
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
    check_cpu(amax, op, "amax");
    TORCH_CHECK_TYPE(amax.scalar_type() == at::kFloat, "fp8mix.compute_scale: amax must be float32");
    TORCH_CHECK_VALUE(margin >= 0 && margin <= 126, "fp8mix.compute_scale: margin must be in [0, 126], got ",
                      margin);
    at::Tensor a = amax.contiguous();
    at::Tensor s = at::empty_like(a), si = at::empty_like(a);
    check_status(fp8mix_compute_scale(a.data_ptr<float>(), a.numel(), fp8_format(fp8_dtype, op), (int)margin,
                                      pow2 ? 1 : 0, (float)eps, s.data_ptr<float>(), si.data_ptr<float>()),
                 op);
    return {s, si};
}

at::Tensor dequantize_cpu(const at::Tensor &q, const at::Tensor &scale_inv, int64_t gran, at::ScalarType out_dtype)
{
    const char *op = "dequantize";
    check_cpu(q, op, "q");
    fp8mix_format fmt = fp8_format(q.scalar_type(), op);
    fp8mix_dtype ot = hp_dtype(out_dtype, op);
    fp8mix_granularity g = granularity(gran, op);
    View2D v = view2d(q);
    at::Tensor s = scale_arg(scale_inv, scale_count(g, v.rows, v.cols), op, "scale_inv");
    at::Tensor out = at::empty(q.sizes(), q.options().dtype(out_dtype));
    sync_threads();
    check_status(fp8mix_dequantize((const uint8_t *)v.t.data_ptr(), fmt, v.rows, v.cols, v.ld, g,
                                   s.data_ptr<float>(), out.data_ptr(), ot, v.cols),
                 op, "scale_inv must be finite and > 0");
    return out;
}

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

fp8mix_mm_scale mm_scale_kind(const at::Tensor &s, int64_t outer, int64_t blocks_k, int64_t blocks_outer,
                              bool is_a, bool block_mode)
{
    const char *name = is_a ? "scale_a" : "scale_b";
    TORCH_CHECK_TYPE(s.scalar_type() == at::kFloat, "fp8mix.scaled_mm: ", name, " must be float32, got ",
                     s.scalar_type());
    check_cpu(s, "scaled_mm", name);
    if (block_mode) return FP8MIX_MM_SCALE_BLOCK;
    if (s.numel() == 1 && s.dim() <= 2) return FP8MIX_MM_SCALE_TENSOR;
    if (s.dim() == 2 && (is_a ? (s.size(0) == outer && s.size(1) == 1) : (s.size(0) == 1 && s.size(1) == outer)))
        return FP8MIX_MM_SCALE_OUTER;
    TORCH_CHECK_VALUE(false, "fp8mix.scaled_mm: ", name, " has shape ", s.sizes(), "; expected a single value, ",
                      is_a ? "(M, 1) per row, or (M, ceil(K/128)) per 1x128 block"
                           : "(1, N) per column, or (ceil(K/128), ceil(N/128)) per 128x128 block",
                      " (M, N, K, ceil(K/128), ceil(outer/128) = ", outer, ", ", blocks_k, ", ", blocks_outer, ")");
    return FP8MIX_MM_SCALE_TENSOR;
}

at::Tensor scaled_mm_cpu(const at::Tensor &a, const at::Tensor &b, const at::Tensor &scale_a,
                         const at::Tensor &scale_b, const c10::optional<at::Tensor> &bias,
                         c10::optional<at::ScalarType> out_dtype, c10::string_view accumulate,
                         int64_t promote_interval)
{
    const char *op = "scaled_mm";
    check_cpu(a, op, "a");
    check_cpu(b, op, "b");
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
    at::Tensor ac = (a.stride(1) == 1 && (M <= 1 || a.stride(0) >= K)) ? a : a.contiguous();
    const int64_t lda = M > 1 ? ac.stride(0) : (K > 0 ? K : 1);
    BView bv = b_view(b);
    const int64_t kb = (K + 127) / 128, mb = (M + 127) / 128, nb = (N + 127) / 128;
    (void)mb;
    bool block_mode = scale_a.dim() == 2 && scale_b.dim() == 2 && scale_a.size(0) == M &&
                      scale_a.size(1) == kb && scale_b.size(0) == kb && scale_b.size(1) == nb &&
                      !(scale_a.numel() == 1 && scale_b.numel() == 1);
    fp8mix_mm_scale ka = mm_scale_kind(scale_a, M, kb, mb, true, block_mode);
    fp8mix_mm_scale kb_ = mm_scale_kind(scale_b, N, kb, nb, false, block_mode);
    at::Tensor sa = scale_a.contiguous(), sb = scale_b.contiguous();
    at::Tensor bias_t;
    fp8mix_dtype bt = FP8MIX_F32;
    if (bias.has_value() && bias->defined()) {
        bias_t = bias->contiguous();
        check_cpu(bias_t, op, "bias");
        bt = hp_dtype(bias_t, op, "bias");
        TORCH_CHECK_VALUE(bias_t.dim() == 1 && bias_t.size(0) == N, "fp8mix.scaled_mm: bias must have shape (",
                          N, "), got ", bias_t.sizes());
    }
    at::Tensor out = at::empty({M, N}, a.options().dtype(odt));
    fp8mix_gemm_args g;
    memset(&g, 0, sizeof g);
    g.m = M; g.n = N; g.k = K;
    g.a = (const uint8_t *)ac.data_ptr(); g.fmt_a = fa; g.lda = lda;
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

} // namespace

TORCH_LIBRARY(fp8mix, m)
{
    m.def("cast(Tensor x, Tensor scale, ScalarType fp8_dtype, int granularity, bool saturate=True, "
          "bool stochastic=False, int seed=0, int offset=0, bool want_q=True, bool transpose=False) "
          "-> (Tensor q, Tensor qt, Tensor amax)");
    m.def("quantize_current(Tensor x, ScalarType fp8_dtype, int granularity, int margin=0, "
          "bool power_2_scale=False, float amax_epsilon=0.0, bool saturate=True, bool stochastic=False, "
          "int seed=0, int offset=0, bool want_q=True, bool transpose=False) "
          "-> (Tensor q, Tensor qt, Tensor scale_inv, Tensor amax)");
    m.def("amax(Tensor x, int granularity=0) -> Tensor");
    m.def("compute_scale(Tensor amax, ScalarType fp8_dtype, int margin=0, bool power_2_scale=False, "
          "float amax_epsilon=0.0) -> (Tensor scale, Tensor scale_inv)");
    m.def("dequantize(Tensor q, Tensor scale_inv, int granularity, ScalarType out_dtype) -> Tensor");
    m.def("scaled_mm(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b, Tensor? bias=None, "
          "ScalarType? out_dtype=None, str accumulate='fp32', int promote_interval=128) -> Tensor");
    m.def("cpu_isa() -> str", &cpu_isa);
    m.def("set_max_isa(str name) -> ()", &set_max_isa);
}

TORCH_LIBRARY_IMPL(fp8mix, CPU, m)
{
    m.impl("cast", &cast_cpu);
    m.impl("quantize_current", &quantize_current_cpu);
    m.impl("amax", &amax_cpu);
    m.impl("compute_scale", &compute_scale_cpu);
    m.impl("dequantize", &dequantize_cpu);
    m.impl("scaled_mm", &scaled_mm_cpu);
}
