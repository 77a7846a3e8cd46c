// direct.cpp — the direct calls: fp8mix.nn's eager CPU step without torch.ops' per-call
// cost, as functions of the fp8mix._C module, generated from one table (kDirectCalls
// below: name, the C++ function, the docstring).
//
// A call through torch.ops converts every argument against the schema, boxes the stack and
// passes the autograd fallback: about 80K instructions (20-25 us here) before the kernel
// runs, most of a 64x64 layer's step, which makes three such calls. fp8mix.nn calls these
// module functions instead where nothing needs to see the op (eager mode, no dispatch mode,
// no functorch transform: fp8mix/nn/_forward.py decides). They run the same *_cpu
// functions, so the results are the ops' bit for bit; the profiler records them under the
// op's name; the GIL is released around the kernel, as torch.ops does; and, like the ops
// (custom ops' autograd fallback), they leave version counters alone. Every tensor argument
// must be a plain CPU tensor (checked for all of them, so a new entry cannot forget one).
// Not here: the functions themselves (ops_cpu.cpp, linear_cpu.cpp), the module (module.cpp).
#include <Python.h>

#include <ATen/record_function.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <string>
#include <vector>

#include "common.h"
#include "ops.h"

namespace fp8mix_torch {
namespace {

// Wrapper tensors (a Python subclass, functorch's) have no storage of their own to read.
void check_plain(const Tensor &t, const char *op)
{
    static const c10::DispatchKeySet wrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                              c10::DispatchKey::FuncTorchBatched,
                                              c10::DispatchKey::FuncTorchGradWrapper,
                                              c10::DispatchKey::Functionalize});
    TORCH_CHECK_TYPE(!t.defined() || (t.is_cpu() && !t.key_set().has_any(wrapped)), "fp8mix._C.", op,
                     ": takes plain CPU tensors (a tensor subclass or a functorch wrapper must go through "
                     "torch.ops.fp8mix.", op, ")");
}

void check_plain(const OptTensor &t, const char *op)
{
    if (t) check_plain(*t, op);
}

template <typename A> void check_plain(const A &, const char *) {} // not a tensor

// The Python-facing type of a parameter: strings arrive as std::string (pybind11 has no
// caster for c10::string_view); everything else as the function takes it.
template <typename A> struct PyArg {
    using type = A;
};
template <> struct PyArg<Str> {
    using type = const std::string &;
};

// One direct call made from a function pointer: the tensor checks, then the function with
// the GIL released, recorded under "fp8mix::<name>"; errors as torch.ops raises them.
template <auto Fn> struct Direct;
template <typename R, typename... A, R (*Fn)(A...)> struct Direct<Fn> {
    static void def(pybind11::module_ &m, const char *name, const char *record, const char *doc)
    {
        m.def(
            name,
            [name, record](typename PyArg<A>::type... args) -> R {
                HANDLE_TH_ERRORS
                (check_plain(args, name), ...);
                RECORD_FUNCTION(record, std::vector<c10::IValue>());
                pybind11::gil_scoped_release no_gil;
                return Fn(args...);
                END_HANDLE_TH_ERRORS_PYBIND
            },
            doc);
    }
};

// The table: Python name, C++ function, docstring. Positional arguments in the function's
// (the schema's) order; the returns are the function's tuple.
#define FP8MIX_DIRECT_CALLS(X)                                                                                       \
    X(linear_delayed_forward, linear_delayed_forward_cpu,                                                            \
      "linear_delayed_casts (transpose False, inf_to_nan True), then the forward GEMM with bias, in one call: "      \
      "(y, xq, x_scales, x_scale_inv, wq, w_scales, w_scale_inv, grad_plan, grad_slot, w_scale)")                    \
    X(linear_current_forward, linear_current_forward_cpu,                                                            \
      "linear_current_casts (transpose False, inf_to_nan True), then the forward GEMM with bias, in one call: "      \
      "(y, xq, x_scale_inv, wq, w_scale_inv, w_amax)")                                                               \
    X(linear_delayed_casts, linear_delayed_casts_cpu,                                                                \
      "torch.ops.fp8mix.linear_delayed_casts, called directly (positional arguments in the schema's order)")         \
    X(linear_current_casts, linear_current_casts_cpu,                                                                \
      "torch.ops.fp8mix.linear_current_casts, called directly (positional arguments in the schema's order)")         \
    X(scaled_mm, scaled_mm_cpu,                                                                                      \
      "torch.ops.fp8mix.scaled_mm on the CPU, called directly (positional arguments in the schema's order)")         \
    X(linear_backward, linear_backward_cpu,                                                                          \
      "torch.ops.fp8mix.linear_backward, called directly (positional arguments in the schema's order)")

} // namespace

void add_direct_calls(PyObject *module)
{
    auto m = pybind11::reinterpret_borrow<pybind11::module_>(module);
#define FP8MIX_DEF_DIRECT(name, fn, doc) Direct<&fn>::def(m, #name, "fp8mix::" #name, doc);
    FP8MIX_DIRECT_CALLS(FP8MIX_DEF_DIRECT)
#undef FP8MIX_DEF_DIRECT
}

} // namespace fp8mix_torch
