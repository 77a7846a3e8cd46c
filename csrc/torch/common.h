// common.h — what every op file of fp8mix._C shares, one copy each, the device a
// parameter where the rule depends on it: C statuses as Python exceptions (ValueError for
// bad values, TypeError for bad dtypes), dtype / format / granularity decoding, device
// checks, the 2-D view of a tensor, scale and stochastic-rounding arguments, the cast
// preparation, the delayed-scaling state arguments and the scaled_mm argument checks.
// Not here: kernel calls (ops_cpu.cpp, fused_cpu.cpp, ops_cuda.cpp), schemas (schema.cpp),
// and decisions the C core makes from sizes and strides (csrc/core/mm_layout.c).
//
// Tensors are viewed as 2-D (numel / last_dim, last_dim) with inner stride 1; anything
// else is made contiguous first.
#pragma once

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include <string>
#include <tuple>
#include <vector>

#include "fp8mix.h"

namespace fp8mix_torch {

inline const at::Device kCPU(at::kCPU);

// A C status as an exception naming the op: ValueError for bad values, RuntimeError for
// the rest; `what` is appended to a bad-scale error (which scale).
void check_status(fp8mix_status st, const char *op, const char *what = nullptr);

// The C core's thread count follows torch's (set before every parallel kernel).
inline void sync_threads() { fp8mix_set_num_threads(at::get_num_threads()); }

fp8mix_dtype hp_dtype(at::ScalarType s, const char *op, const char *name);
inline fp8mix_dtype hp_dtype(const at::Tensor &t, const char *op, const char *name)
{
    return hp_dtype(t.scalar_type(), op, name);
}
inline fp8mix_dtype hp_dtype(at::ScalarType s, const char *op) { return hp_dtype(s, op, "output dtype"); }

fp8mix_format fp8_format(at::ScalarType s, const char *op);

// Granularities 0..3 (tensor, row, 1x128, 128x128): what the CUDA kernels and the fused
// producer casts take.
fp8mix_granularity granularity(int64_t g, const char *op);
// The granularities of a cast kernel on dev: on the CPU also MX blocks (4: 1x32, E8M0
// scales; csrc/core/mx.c).
fp8mix_granularity granularity_on(int64_t g, const at::Device &dev, const char *op);

// Every tensor of one call on the data's device (else the dispatcher would have picked
// one kernel for all of them).
void check_on(const at::Tensor &t, const at::Device &dev, const char *op, const char *name);
// A CUDA op's first tensor on CUDA (the dispatcher picked the CUDA kernel for another one).
void require_cuda(const at::Tensor &t, const char *op, const char *name);

void check_margin_eps(const char *op, int64_t margin, double eps);

// A new uninitialised tensor; on the CPU without the dispatcher's round trip (at::empty
// costs ~2.5K instructions there, and a small layer's step allocates about 25 tensors).
inline at::Tensor new_tensor(at::IntArrayRef sizes, const at::TensorOptions &opt)
{
    if (opt.device().is_cpu()) return at::detail::empty_cpu(sizes, opt);
    return at::empty(sizes, opt);
}

struct View2D {
    at::Tensor t; // keeps a contiguous copy alive when one was needed
    int64_t rows, cols, ld;
};

// A row-major 2-D view of t with inner stride 1 (copying only when needed).
View2D view2d(const at::Tensor &t);

// Leading dimension of a dense row of n elements (>= 1 even for empty rows).
inline int64_t ld_of(int64_t n) { return n > 0 ? n : 1; }

inline int64_t scale_count(fp8mix_granularity g, int64_t rows, int64_t cols)
{
    return fp8mix_scale_count(g, rows, cols);
}

// The shape a per-granularity scale/amax tensor of x takes.
std::vector<int64_t> scale_shape(const at::Tensor &x, fp8mix_granularity g, int64_t rows, int64_t cols);

// A float32 scale array of `expect` entries on dev, made contiguous.
at::Tensor scale_arg(const at::Tensor &s, int64_t expect, const at::Device &dev, const char *op, const char *name);

// A 2-D tensor's sizes and strides, as the C core's layout decisions take them.
inline fp8mix_strided2d strided2d(const at::Tensor &t)
{
    return fp8mix_strided2d{t.size(0), t.size(1), t.stride(0), t.stride(1)};
}

fp8mix_cast_opts make_opts(fp8mix_format fmt, bool saturate, bool stochastic, int64_t seed, int64_t offset,
                           bool inf_to_nan = false);

// A stochastic-rounding stream kept in a tensor, int64 [key, offset] (fp8mix's layers keep
// it in their fp8_rng buffer, so no Python int is traced): checked, on dev (the CPU build
// reads it on the host; the CUDA kernels read it on the device). NULL when not given.
const int64_t *rng_arg(const c10::optional<at::Tensor> &rng, int64_t skip, const at::Device &dev, const char *op);
// The CPU's use of it: the cast takes the words from offset + skip on.
void apply_rng(fp8mix_cast_opts &o, const c10::optional<at::Tensor> &rng, int64_t skip, const char *op);

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
                      bool inf_to_nan = false);

// ---- the per-tensor recipes' state (csrc/core/recipe.c, csrc/cuda/recipe.cu) ----------

// A module's delayed-scaling buffers: history (capacity, R) float32, scale (R) float32,
// steps (R) int64, all contiguous on the data's device (they are fp8mix's own buffers,
// updated in place).
struct Delayed {
    fp8mix_delayed_state st;
    fp8mix_delayed_recipe r;
};

void check_state_tensor(const at::Tensor &t, at::ScalarType dt, int64_t dim, const at::Device &dev, const char *op,
                        const char *name);
// A delayed-scaling op's state for one role: the module's buffers on dev (checked), the
// role inside them, and the optional fresh amax (n = 1 float32 on dev, else NULL).
struct DelayedRole {
    Delayed d;
    const float *fresh_amax;
};
DelayedRole delayed_role(const at::Device &dev, const at::Tensor &hist, const at::Tensor &scale,
                         const at::Tensor &steps, int64_t role, int64_t history_len, int64_t margin, bool pow2,
                         c10::string_view algo, int64_t interval, const c10::optional<at::Tensor> &fresh_amax,
                         const char *op);
// n contiguous float32 values on dev (a fresh amax, a grad plan), or NULL when not given.
const float *scalar_f32(const c10::optional<at::Tensor> &t, const at::Device &dev, const char *op, const char *name,
                        int64_t n = 1);
// grad_cast's pending ring and slot (both or neither): whether they are given.
bool grad_pending_args(const c10::optional<at::Tensor> &pending, const c10::optional<at::Tensor> &slot,
                       const at::Device &dev, const char *op);
// delayed_flush's pending ring and next-slot counter.
void check_flush_args(const at::Tensor &pending, const at::Tensor &next_slot, bool record, bool reserve,
                      const at::Device &dev, const char *op);
// delayed_scale_update's lists (the op runs on CUDA; its checks are these): lengths and
// scalar arguments, then every entry's dtype, device and shape.
void check_delayed_update_lists(at::TensorList amax_history, at::TensorList amax, at::TensorList scale,
                                at::TensorList scale_inv, at::TensorList steps, at::ArrayRef<double> fp8_max,
                                int64_t margin, c10::string_view algo, int64_t interval);
void check_delayed_update_entries(at::TensorList amax_history, at::TensorList amax, at::TensorList scale,
                                  at::TensorList scale_inv, at::TensorList steps, const at::Device &dev);

// ---- scaled_mm ---------------------------------------------------------------------

// scaled_mm's arguments, checked in one order on every device; the scale kinds decided by
// fp8mix_mm_scale_kinds (stated, or inferred from the shapes).
struct MmArgs {
    int64_t m, n, k;
    fp8mix_format fmt_a, fmt_b;
    at::ScalarType out_dtype;
    fp8mix_dtype out_t;
    bool fp22; // accumulate="fp22"
    fp8mix_mm_scale kind_a, kind_b;
    at::Tensor bias; // contiguous, or undefined
    fp8mix_dtype bias_t;
};

MmArgs mm_args(const at::Tensor &a, const at::Tensor &b, const at::Tensor &scale_a, const at::Tensor &scale_b,
               const c10::optional<at::Tensor> &bias, c10::optional<at::ScalarType> out_dtype,
               c10::string_view accumulate, int64_t promote_interval, int64_t scale_kind_a, int64_t scale_kind_b,
               const at::Device &dev);

} // namespace fp8mix_torch
