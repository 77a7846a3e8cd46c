"""The only module that calls torch.ops.fp8mix.*: loads the native library and gives every
op a typed wrapper (keyword arguments, enums); importing it registers the ops' fake (meta)
implementations too (fp8mix._ops_fake), which let them trace under torch.compile.

The numerics are C (csrc/core, csrc/cuda); the wrappers only name arguments and the
fakes only state output shapes. Callers inside fp8mix use these wrappers, never
torch.ops.fp8mix directly.
"""
from __future__ import annotations

from typing import Optional, Protocol

import torch

# (loading _C registers torch.ops.fp8mix; _ops_fake registers the ops' fakes for torch.compile / FakeTensor)
from . import _C, _ops_fake  # type: ignore[attr-defined]  # noqa: F401
from ._op_types import QUANT_STATS_N, Act, DelayedSpec, NormKind, mm_scale_code, scale_shape
from .formats import Granularity

_ops = torch.ops.fp8mix


def _code(g) -> int:
    """The C code of a granularity given as a Granularity, its name or its code."""
    return _GCODE[g] if type(g) is Granularity else Granularity.of(g).code


_GCODE = {g: g.code for g in Granularity}

__all__ = ["cast", "quantize_current", "quantize_mx", "amax", "compute_scale", "dequantize", "scaled_mm", "quant_stats",
           "delayed_cast", "delayed_record", "delayed_rescale", "delayed_flush", "grad_cast", "DelayedSpec",
           "mm_scale_code", "cpu_isa", "set_max_isa", "gemm_kernel", "set_gemm_order", "get_gemm_order", "scale_shape",
           "has_kernels", "NormKind", "Act", "norm_cast",
           "norm_delayed_cast", "act_cast", "act_delayed_cast", "linear_delayed_casts", "linear_current_casts",
           "linear_backward", "CudaHooks", "set_cuda_hooks", "QUANT_STATS_N",
           "delayed_scale_update", "cuda_hw_convert", "cuda_check_scales", "quantize_nvfp4", "dequantize_nvfp4",
           "nvfp4_mm", "rht16", "scaled_grouped_mm", "grouped_scale_kind", "scaled_grouped_mm_k", "grouped_quantize",
           "grouped_delayed_cast", "grouped_delayed_flush", "grouped_grad_cast"]


class CudaHooks(Protocol):
    """What fp8mix.cuda gives the op layer (``set_cuda_hooks``; fp8mix/__init__ imports
    fp8mix.cuda, which registers itself): the op layer calls the CUDA package only through
    these, so fp8mix.cuda can build on the typed wrappers here without an import circle."""

    def first_use(self, device: torch.device) -> None:
        """Compare the device's kernels with the C core (once per device); raise on a mismatch."""

    def scaled_mm_refused(self, error: NotImplementedError, a: torch.Tensor, b: torch.Tensor,
                          scale_a: torch.Tensor, scale_b: torch.Tensor, bias: Optional[torch.Tensor],
                          out_dtype: torch.dtype) -> torch.Tensor:
        """The product for a GEMM fp8mix's CUDA op raised `error` for: a fallback's result,
        or `error` re-raised when it is not a cuBLASLt refusal."""


_cuda_hooks: Optional[CudaHooks] = None
_checked_devices: set = set()


def set_cuda_hooks(hooks: Optional[CudaHooks]) -> None:
    """Install (or, with None, remove) the CUDA package's hooks (see :class:`CudaHooks`)."""
    global _cuda_hooks
    _cuda_hooks = hooks


def _first_cuda_use(t: torch.Tensor) -> None:
    """The first time a process runs fp8mix's CUDA kernels on a device, the hooks' self-check
    compares them with the C core (fp8mix.cuda.run_selfcheck: about 0.2 s, most of it the CPU
    half; FP8MIX_CUDA_SELFCHECK=0 skips it). A mismatch raises one error naming the kernel
    and the first differing element."""
    if t.device.type != "cuda" or t.device in _checked_devices or torch.compiler.is_compiling():
        return
    _checked_devices.add(t.device)  # once, also when it raises: the error says everything
    if _cuda_hooks is not None:
        _cuda_hooks.first_use(t.device)


def has_kernels(op: str, device: torch.device) -> bool:
    """Whether this build registers op (e.g. "cast") for device (meta: the fake kernels)."""
    key = torch._C._dispatch_key_for_device(device.type)
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"fp8mix::{op}", key)


# ---- casts ---------------------------------------------------------------------------

def cast(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: torch.dtype, *, granularity=Granularity.TENSOR,
         saturate: bool = True, stochastic: bool = False, seed: int = 0, offset: int = 0, want_q: bool = True,
         transpose: bool = False, inf_to_nan: bool = False, rng: Optional[torch.Tensor] = None,
         rng_skip: int = 0):
    """Scale + cast + amax in one pass: (q, qt, amax). qt is the transpose of the 2-D view
    when `transpose` (else empty); `rng` (int64 [key, offset]) selects stochastic rounding
    with words from offset + rng_skip on, in place of stochastic/seed/offset."""
    _first_cuda_use(x)
    return _ops.cast(x, scale, fp8_dtype, _code(granularity), saturate, stochastic, seed, offset, want_q, transpose,
                     inf_to_nan, rng, rng_skip)


def quantize_current(x: torch.Tensor, fp8_dtype: torch.dtype, *, granularity=Granularity.TENSOR, margin: int = 0,
                     power_2_scale: bool = False, amax_epsilon: float = 0.0, saturate: bool = True,
                     stochastic: bool = False, seed: int = 0, offset: int = 0, want_q: bool = True,
                     transpose: bool = False, inf_to_nan: bool = False, rng: Optional[torch.Tensor] = None,
                     rng_skip: int = 0):
    """Current scaling: amax per tile, scale, cast: (q, qt, scale_inv, amax)."""
    _first_cuda_use(x)
    return _ops.quantize_current(x, fp8_dtype, _code(granularity), margin, power_2_scale, amax_epsilon, saturate,
                                 stochastic, seed, offset, want_q, transpose, inf_to_nan, rng, rng_skip)


def quantize_mx(x: torch.Tensor, fp8_dtype: torch.dtype, *, rule: int = 0, margin: int = 0,
                amax_epsilon: float = 0.0, saturate: bool = True, stochastic: bool = False, seed: int = 0,
                offset: int = 0, want_q: bool = True, transpose: bool = False, inf_to_nan: bool = False,
                rng: Optional[torch.Tensor] = None, rng_skip: int = 0):
    """MX (1x32 blocks, power-of-two scales) current quantisation: (q, scale_inv, qt,
    scale_inv_t, amax); rule 0 rceil, 1 floor (fp8mix.formats.MX_RULES). With `transpose`,
    qt is the second quantisation of x's 2-D transpose (its blocks along x's columns)."""
    return _ops.quantize_mx(x, fp8_dtype, rule, margin, amax_epsilon, saturate, stochastic, seed, offset, want_q,
                            transpose, inf_to_nan, rng, rng_skip)


def quantize_nvfp4(x: torch.Tensor, global_amax: torch.Tensor, *, tile_2d: bool = False, stochastic: bool = False,
                   seed: int = 0, offset: int = 0, rng: Optional[torch.Tensor] = None, rng_skip: int = 0):
    """NVFP4 quantisation of x (..., K), K a multiple of 16 (CPU): (q (rows, K/2) uint8, two
    E2M1 codes per byte, block_scale (rows, K/16) float8_e4m3fn, scale_inv () float32), the
    tensor scale from `global_amax` (a one-element tensor); tile_2d: 16x16 blocks."""
    return _ops.quantize_nvfp4(x, global_amax, tile_2d, stochastic, seed, offset, rng, rng_skip)


def dequantize_nvfp4(q: torch.Tensor, block_scale: torch.Tensor, scale_inv: torch.Tensor, *,
                     out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values of an NVFP4 tensor (rows, K) as out_dtype."""
    return _ops.dequantize_nvfp4(q, block_scale, scale_inv, out_dtype)


def nvfp4_mm(a: torch.Tensor, a_block_scale: torch.Tensor, a_scale_inv: torch.Tensor, b: torch.Tensor,
             b_block_scale: torch.Tensor, b_scale_inv: torch.Tensor) -> torch.Tensor:
    """A @ B^T in float32 of two NVFP4 tensors A (M, K) and B (N, K) (scalar C GEMM, CPU)."""
    return _ops.nvfp4_mm(a, a_block_scale, a_scale_inv, b, b_block_scale, b_scale_inv)


def rht16(x: torch.Tensor, *, signs: int) -> torch.Tensor:
    """The 16-point random Hadamard transform along x's last dimension (float32, a multiple
    of 16), signs a 16-bit mask (fp8mix.h fp8mix_rht16)."""
    return _ops.rht16(x, signs)


def amax(x: torch.Tensor, *, granularity=Granularity.TENSOR) -> torch.Tensor:
    return _ops.amax(x, _code(granularity))


def compute_scale(amax: torch.Tensor, fp8_dtype: torch.dtype, *, margin: int = 0, power_2_scale: bool = False,
                  amax_epsilon: float = 0.0):
    """(scale, scale_inv) from amax by fp8mix_compute_scale's rule."""
    return _ops.compute_scale(amax, fp8_dtype, margin, power_2_scale, amax_epsilon)


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor, *, granularity=Granularity.TENSOR,
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return _ops.dequantize(q, scale_inv, _code(granularity), out_dtype)


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
              bias: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.float32, accumulate: str = "fp32",
              promote_interval: int = 128, scale_granularity: Optional[tuple] = None) -> torch.Tensor:
    """(a * scale_a) @ (b * scale_b) + bias. scale_granularity: the Granularity of each
    operand's scales (a: TENSOR, ROW, BLOCK 1x128 along K or MX; b: TENSOR, ROW (one per
    column), BLOCK2D 128x128 or MX) when the caller knows them (fp8mix's modules always do);
    None infers them from the shapes."""
    if scale_granularity is None:
        ka = kb = -1
    else:
        ka, kb = mm_scale_code(scale_granularity[0]), mm_scale_code(scale_granularity[1])
    if not a.is_cuda or torch.compiler.is_compiling():
        return _ops.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, accumulate, promote_interval, ka, kb)
    _first_cuda_use(a)
    try:
        return _ops.scaled_mm(a, b, scale_a, scale_b, bias, out_dtype, accumulate, promote_interval, ka, kb)
    except NotImplementedError as e:  # fp8mix's cuBLASLt call refused (arch, shape): torch._scaled_mm
        if _cuda_hooks is None:
            raise
        return _cuda_hooks.scaled_mm_refused(e, a, b, scale_a, scale_b, bias, out_dtype)


def grouped_scale_kind(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor) -> int:
    """The fp8mix_mm_scale code of a grouped GEMM's scales from their shapes (a (M, K), b
    (G, K, N)): per group (G) and (G); per row of a (M) and per group and column (G, N);
    1x128 / 128x128 blocks (M, ceil(K/128)) and (G, ceil(K/128), ceil(N/128)); MX (M,
    ceil(K/32)) and (G, N, ceil(K/32))."""
    M, K = a.shape[0], a.shape[-1]
    G, N = b.shape[0], b.shape[-1]
    kb, kb32, nb = -(-K // 128), -(-K // 32), -(-N // 128)
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)

    def vector(shape: tuple, n: int) -> bool:  # (n,) or (n, 1)
        return shape in ((n,), (n, 1))
    fits = (vector(sa, G) and vector(sb, G), vector(sa, M) and sb == (G, N), sa == (M, kb) and sb == (G, kb, nb),
            sa == (M, kb32) and sb == (G, N, kb32))
    found = [code for code, ok in enumerate(fits) if ok]
    if len(found) == 1:
        return found[0]
    why = "ambiguous: pass scale_kind" if found else "no scale layout matches"
    raise ValueError(f"fp8mix.scaled_grouped_mm: scales {sa} and {sb} for a {tuple(a.shape)} and b "
                     f"{tuple(b.shape)}: {why} (per group: ({G},) and ({G},); rowwise: ({M},) and ({G}, {N}); "
                     f"block: ({M}, {kb}) and ({G}, {kb}, {nb}); MX: ({M}, {kb32}) and ({G}, {N}, {kb32}))")


def scaled_grouped_mm(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
                      offs: torch.Tensor, bias: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.float32,
                      scale_kind: Optional[int] = None) -> torch.Tensor:
    """Grouped scaled GEMM (torch._scaled_grouped_mm's 2-D x 3-D case, CPU): rows
    [offs[g-1], offs[g]) of a (M, K) times b[g] (K, N), each group with its own scales
    (see grouped_scale_kind), bias (G, N); groups may be empty or of any size. One C call."""
    kind = grouped_scale_kind(a, b, scale_a, scale_b) if scale_kind is None else scale_kind
    return _ops.scaled_grouped_mm(a, b, scale_a, scale_b, offs, kind, bias, out_dtype)


def scaled_grouped_mm_k(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
                        offs: torch.Tensor, bias: Optional[torch.Tensor] = None, out_dtype: torch.dtype = torch.float32,
                        scale_kind: int = 0) -> torch.Tensor:
    """Grouped GEMM with the groups along K (torch._scaled_grouped_mm's 2-D x 2-D case, CPU;
    a grouped linear layer's weight gradients): out (G, M, N), out[g] = a[:, k range g] @
    b[k range g, :] with group g's scales (scale_kind 0: (G,) and (G,); 1: (G, M) and (G, N));
    offs (G) the ranges' cumulative ends; bias (G, N); a, b row-major or transposed views."""
    return _ops.scaled_grouped_mm_k(a, b, scale_a, scale_b, offs, scale_kind, bias, out_dtype)


# ---- grouped per-tensor casts (csrc/core/cast_grouped.c: mixture-of-experts experts) ------

def grouped_quantize(x: torch.Tensor, offs: torch.Tensor, fp8_dtype: torch.dtype, *, margin: int = 0,
                     power_2_scale: bool = False, amax_epsilon: float = 0.0, transpose: bool = False,
                     inf_to_nan: bool = False):
    """Current per-tensor scaling per row group (group g: rows [offs[g-1], offs[g])), each group
    cast as quantize_current would cast it alone: (q, qt, scale_inv (G,), amax (G,))."""
    return _ops.grouped_quantize(x, offs, fp8_dtype, margin, power_2_scale, amax_epsilon, transpose, inf_to_nan)


def grouped_delayed_cast(x: torch.Tensor, offs: torch.Tensor, history: torch.Tensor, scale: torch.Tensor,
                         steps: torch.Tensor, *, role0: int, role_step: int, fp8_dtype: torch.dtype, spec: DelayedSpec,
                         record: bool, transpose: bool = False, inf_to_nan: bool = False):
    """delayed_cast per row group, group g with state role role0 + g * role_step: (q, qt,
    scales (G, 2) [scale, scale_inv], amax (G,)). An empty group records nothing."""
    return _ops.grouped_delayed_cast(x, offs, history, scale, steps, role0, role_step, spec.history_len, fp8_dtype,
                                     spec.margin, spec.power_2_scale, spec.algo, spec.interval, record, transpose,
                                     inf_to_nan)


def grouped_delayed_flush(history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, pending: torch.Tensor,
                          next_slot: torch.Tensor, *, role0: int, role_step: int, fp8_dtype: torch.dtype,
                          spec: DelayedSpec, record: bool, reserve: bool):
    """delayed_flush for G gradient roles (role0 + g * role_step), pending (G, slots) and
    next_slot (G,) in place: (plans (G, 2), slots (G,))."""
    return _ops.grouped_delayed_flush(history, scale, steps, pending, next_slot, role0, role_step, spec.history_len,
                                      fp8_dtype, spec.margin, spec.power_2_scale, spec.algo, spec.interval, record,
                                      reserve)


def grouped_grad_cast(dy: torch.Tensor, offs: torch.Tensor, fp8_dtype: torch.dtype, *,
                      plans: Optional[torch.Tensor] = None, pending: Optional[torch.Tensor] = None,
                      slots: Optional[torch.Tensor] = None, margin: int = 0, power_2_scale: bool = False,
                      amax_epsilon: float = 0.0, transpose: bool = False, colsum: bool = False,
                      inf_to_nan: bool = True):
    """grad_cast per row group: plans (G, 2) from grouped_delayed_flush (None: current
    scaling), each group's amax kept in pending[g, slots[g]]: (q, qt, scale_inv (G,), amax
    (G,), colsum (G, N): the groups' bias gradients)."""
    return _ops.grouped_grad_cast(dy, offs, fp8_dtype, plans, pending, slots, margin, power_2_scale, amax_epsilon,
                                  transpose, colsum, inf_to_nan)


# ---- the per-tensor recipes' state (csrc/core/recipe.c) -------------------------------

def delayed_cast(x: torch.Tensor, history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, *, role: int,
                 fp8_dtype: torch.dtype, spec: DelayedSpec, record: bool, transpose: bool = False,
                 inf_to_nan: bool = False, fresh_amax: Optional[torch.Tensor] = None,
                 rng: Optional[torch.Tensor] = None, rng_skip: int = 0):
    """Delayed-scaling cast of a forward tensor with role's scale (its own amax on the
    role's first use): (q, qt, scales [scale, scale_inv], amax); with `record` the amax
    goes into the role's history and the scale is updated in place."""
    return _ops.delayed_cast(x, history, scale, steps, role, spec.history_len, fp8_dtype, spec.margin,
                             spec.power_2_scale, spec.algo, spec.interval, record, transpose, inf_to_nan, fresh_amax,
                             rng, rng_skip)


def delayed_record(history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, amax: torch.Tensor, *, role: int,
                   fp8_dtype: torch.dtype, spec: DelayedSpec) -> None:
    """Record one amax for role (in place)."""
    _ops.delayed_record(history, scale, steps, role, spec.history_len, amax, fp8_dtype, spec.margin,
                        spec.power_2_scale, spec.algo, spec.interval, False)


def delayed_rescale(history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, *, role: int,
                    fp8_dtype: torch.dtype, spec: DelayedSpec) -> None:
    """Recompute role's scale from its history for fp8_dtype's range (in place)."""
    _ops.delayed_record(history, scale, steps, role, spec.history_len, scale[role], fp8_dtype, spec.margin,
                        spec.power_2_scale, spec.algo, spec.interval, True)


def delayed_flush(history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, pending: torch.Tensor,
                  next_slot: torch.Tensor, *, role: int, fp8_dtype: torch.dtype, spec: DelayedSpec, record: bool,
                  reserve: bool):
    """Before a forward: record the gradient amaxes earlier backwards left (record), and
    return (plan [scale, fresh], slot reserved for this forward's backward)."""
    return _ops.delayed_flush(history, scale, steps, pending, next_slot, role, spec.history_len, fp8_dtype,
                              spec.margin, spec.power_2_scale, spec.algo, spec.interval, record, reserve)


def grad_cast(dy: torch.Tensor, fp8_dtype: torch.dtype, *, plan: Optional[torch.Tensor] = None,
              pending: Optional[torch.Tensor] = None, slot: Optional[torch.Tensor] = None, margin: int = 0,
              power_2_scale: bool = False, amax_epsilon: float = 0.0, transpose: bool = False, colsum: bool = False,
              inf_to_nan: bool = True, rng: Optional[torch.Tensor] = None, rng_skip: int = 0):
    """A gradient's per-tensor cast: (q, qt, scale_inv, amax, colsum). Delayed (the plan's
    scale) or current scaling (plan None or fresh); its amax is kept in pending[slot]
    (max over backwards); colsum is the bias gradient (column sums in float32)."""
    return _ops.grad_cast(dy, fp8_dtype, plan, pending, slot, margin, power_2_scale, amax_epsilon, transpose,
                          colsum, inf_to_nan, rng, rng_skip)


# ---- a linear layer's casts, and its backward, in one op each (CPU) --------------------
# (fp8mix.nn._direct calls the same C++ functions without torch.ops: fp8mix._C's entry points)

def linear_delayed_casts(x: torch.Tensor, w: torch.Tensor, history: torch.Tensor, scale: torch.Tensor,
                         steps: torch.Tensor, pending: torch.Tensor, next_slot: torch.Tensor, *, gemm: int,
                         x_dtype: torch.dtype, w_dtype: torch.dtype, grad_dtype: torch.dtype, spec: DelayedSpec,
                         record: bool, reserve: bool, transpose: bool = False, inf_to_nan: bool = True):
    """delayed_flush of GEMM `gemm`'s grad_output role, then delayed_cast of x (role 3 gemm)
    and of w (3 gemm + 1), as one op with the same results: (xq, xqt, x_scales, x_scale_inv,
    wq, wqt, w_scales, w_scale_inv, grad_plan, grad_slot). Round to nearest."""
    return _ops.linear_delayed_casts(x, w, history, scale, steps, pending, next_slot, gemm, spec.history_len,
                                     x_dtype, w_dtype, grad_dtype, spec.margin, spec.power_2_scale, spec.algo,
                                     spec.interval, record, reserve, transpose, inf_to_nan)


def linear_current_casts(x: torch.Tensor, w: torch.Tensor, *, x_dtype: torch.dtype, w_dtype: torch.dtype,
                         margin: int = 0, power_2_scale: bool = False, amax_epsilon: float = 0.0,
                         transpose: bool = False, inf_to_nan: bool = True):
    """quantize_current of x and of w (per tensor), as one op with the same results:
    (xq, xqt, x_scale_inv, x_amax, wq, wqt, w_scale_inv, w_amax). Round to nearest."""
    return _ops.linear_current_casts(x, w, x_dtype, w_dtype, margin, power_2_scale, amax_epsilon, transpose,
                                     inf_to_nan)


def linear_backward(dy: torch.Tensor, wq: torch.Tensor, w_scale_inv: torch.Tensor, xq: torch.Tensor,
                    x_scale_inv: torch.Tensor, *, fp8_dtype: torch.dtype, plan: Optional[torch.Tensor] = None,
                    pending: Optional[torch.Tensor] = None, slot: Optional[torch.Tensor] = None, margin: int = 0,
                    power_2_scale: bool = False, amax_epsilon: float = 0.0, colsum: bool = False,
                    want_dx: bool = True, want_dw: bool = True, dx_dtype: torch.dtype = torch.float32,
                    dw_dtype: torch.dtype = torch.float32, w_scale: Optional[torch.Tensor] = None,
                    w_amax: Optional[torch.Tensor] = None, w_fp8_dtype: Optional[torch.dtype] = None):
    """A Linear's backward with per-tensor scales as one op: grad_cast of dy (plan, pending,
    slot as grad_cast takes them), dx = dy W and dW = dy^T x (scaled_mm, W (N, K) and x (M, K)
    in FP8): (dx, dW, colsum, dy's FP8, its scale_inv); dx / dW empty when not wanted.

    With ``w_scale`` (delayed scaling) or ``w_amax`` (current scaling: the scale
    compute_scale derives from it with margin / power_2_scale / amax_epsilon), ``wq`` is the
    high-precision weight, cast here to ``w_fp8_dtype`` as the forward cast it (round to
    nearest, saturating, inf to NaN) and freed after dgrad, before dW is allocated."""
    return _ops.linear_backward(dy, wq, w_scale_inv, xq, x_scale_inv, fp8_dtype, plan, pending, slot, margin,
                                power_2_scale, amax_epsilon, colsum, want_dx, want_dw, dx_dtype, dw_dtype, w_scale,
                                w_amax, w_fp8_dtype)


# ---- fused producer casts: a norm / an activation written as FP8 (csrc/core/norm.c, act.c) ----

def norm_cast(x: torch.Tensor, gamma: Optional[torch.Tensor], beta: Optional[torch.Tensor], *, kind: NormKind,
              eps: float, zero_centered_gamma: bool, fp8_dtype: torch.dtype, granularity=Granularity.TENSOR,
              scale: Optional[torch.Tensor] = None, margin: int = 0, power_2_scale: bool = False,
              amax_epsilon: float = 0.0, want_q: bool = True, transpose: bool = False, inf_to_nan: bool = False,
              rng: Optional[torch.Tensor] = None, rng_skip: int = 0, mean: Optional[torch.Tensor] = None,
              rstd: Optional[torch.Tensor] = None, hp_dtype: Optional[torch.dtype] = None):
    """LayerNorm / RMSNorm of x written as FP8 in one pass: (q, qt, scale_inv, amax, mean, rstd, hp).
    scale None is current scaling at `granularity`; mean/rstd (float32, one per row) are
    computed and returned, or given (a second cast of the same x) and returned empty; hp
    holds the normalized values in hp_dtype when asked for (else empty)."""
    return _ops.norm_cast(x, gamma, beta, int(kind), float(eps), zero_centered_gamma, fp8_dtype, _code(granularity),
                          scale, margin, power_2_scale, amax_epsilon, want_q, transpose, inf_to_nan, rng, rng_skip,
                          mean, rstd, hp_dtype)


def norm_delayed_cast(x: torch.Tensor, gamma: Optional[torch.Tensor], beta: Optional[torch.Tensor],
                      history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, *, kind: NormKind, eps: float,
                      zero_centered_gamma: bool, role: int, fp8_dtype: torch.dtype, spec: DelayedSpec, record: bool,
                      transpose: bool = False, inf_to_nan: bool = False, fresh_amax: Optional[torch.Tensor] = None,
                      rng: Optional[torch.Tensor] = None, rng_skip: int = 0, mean: Optional[torch.Tensor] = None,
                      rstd: Optional[torch.Tensor] = None, hp_dtype: Optional[torch.dtype] = None):
    """norm_cast under delayed scaling (delayed_cast's rules for the normalized values):
    (q, qt, scales [scale, scale_inv], amax, mean, rstd, hp)."""
    return _ops.norm_delayed_cast(x, gamma, beta, int(kind), float(eps), zero_centered_gamma, history, scale, steps,
                                  role, spec.history_len, fp8_dtype, spec.margin, spec.power_2_scale, spec.algo,
                                  spec.interval, record, transpose, inf_to_nan, fresh_amax, rng, rng_skip, mean, rstd,
                                  hp_dtype)


def act_cast(h: torch.Tensor, *, act: Act, fp8_dtype: torch.dtype, granularity=Granularity.TENSOR,
             scale: Optional[torch.Tensor] = None, margin: int = 0, power_2_scale: bool = False,
             amax_epsilon: float = 0.0, want_q: bool = True, transpose: bool = False, inf_to_nan: bool = False,
             rng: Optional[torch.Tensor] = None, rng_skip: int = 0, hp_dtype: Optional[torch.dtype] = None):
    """An activation of h written as FP8 in one pass (gated: of the two halves of each row,
    read in place): (q, qt, scale_inv, amax, hp)."""
    return _ops.act_cast(h, int(act), fp8_dtype, _code(granularity), scale, margin, power_2_scale, amax_epsilon, want_q,
                         transpose, inf_to_nan, rng, rng_skip, hp_dtype)


def act_delayed_cast(h: torch.Tensor, history: torch.Tensor, scale: torch.Tensor, steps: torch.Tensor, *, act: Act,
                     role: int, fp8_dtype: torch.dtype, spec: DelayedSpec, record: bool, transpose: bool = False,
                     inf_to_nan: bool = False, fresh_amax: Optional[torch.Tensor] = None,
                     rng: Optional[torch.Tensor] = None, rng_skip: int = 0, hp_dtype: Optional[torch.dtype] = None):
    """act_cast under delayed scaling: (q, qt, scales [scale, scale_inv], amax, hp)."""
    return _ops.act_delayed_cast(h, int(act), history, scale, steps, role, spec.history_len, fp8_dtype, spec.margin,
                                 spec.power_2_scale, spec.algo, spec.interval, record, transpose, inf_to_nan,
                                 fresh_amax, rng, rng_skip, hp_dtype)


# ---- statistics -------------------------------------------------------------------------

def quant_stats(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, granularity, *,
                bad_scale_as_one: bool = False) -> torch.Tensor:
    """fp8mix_quant_stats: a float64 vector of QUANT_STATS_N entries (see fp8mix.numerics);
    granularity: a Granularity (or its name or code). On x's device when this build has the kernel
    there (CPU; CUDA: the same bits, and no copy or host sync, so a backward can feed the
    gradient scaler); tensors on other devices are copied to the CPU. bad_scale_as_one:
    count a scale_inv that is not finite and > 0 and measure its tile as if it were 1,
    instead of raising."""
    if x.device.type != "cpu" and not (x.device.type == "cuda" and has_kernels("quant_stats", x.device)):
        x, q, scale_inv = x.cpu(), q.cpu(), scale_inv.cpu()
    return _ops.quant_stats(x, q, scale_inv, _code(granularity), bad_scale_as_one=bad_scale_as_one)


def cpu_isa() -> str:
    """The instruction set the CPU kernels use now ('scalar', 'avx2', 'avx512', 'avx512bf16', 'amx')."""
    return _ops.cpu_isa()


def set_max_isa(name: str) -> None:
    """Cap the CPU kernels' instruction set (e.g. 'scalar' to run the portable path); process-wide."""
    _ops.set_max_isa(name)


def gemm_kernel(code: int) -> str:
    """The CPU GEMM microkernel's name for summation order `code` (0 canonical, 1 native) on
    this CPU under the current ISA cap (fp8mix.gemm_order.gemm_kernel documents the names)."""
    return _ops.gemm_kernel(code)


def set_gemm_order(code: int) -> None:
    """The summation order every CPU GEMM passes to the C core from now on (0 canonical,
    1 native; fp8mix.gemm_order owns the choice); process-wide."""
    _ops.set_gemm_order(code)


def get_gemm_order() -> int:
    """The order code in force (see set_gemm_order)."""
    return int(_ops.get_gemm_order())


# ---- CUDA builds only -------------------------------------------------------------------

def delayed_scale_update(amax_history: list, amax: list, scale: list, *, fp8_max: list, scale_inv=None, steps=None,
                         margin: int = 0, power_2_scale: bool = False, algo: str = "max", interval: int = 1) -> None:
    """Delayed scaling of many tensors in one CUDA kernel (fp8mix_cuda_delayed_update): per
    tensor i, record amax[i] in amax_history[i] (1-D, a column of an (L, k) buffer is fine)
    and recompute scale[i] (and scale_inv[i], steps[i] when given) in place."""
    _ops.delayed_scale_update(amax_history, amax, scale, [] if scale_inv is None else scale_inv,
                              [] if steps is None else steps, fp8_max, margin, power_2_scale, algo, interval)


def cuda_hw_convert(on: Optional[bool] = None) -> bool:
    """Whether the CUDA casts use the hardware FP8 conversion instructions (sm_89+) where
    they give the same bytes; with `on`, set it first. Returns the setting in force."""
    if on is not None:
        _ops.cuda_set_hw_convert(bool(on))
    return bool(_ops.cuda_get_hw_convert())


def cuda_check_scales(on: Optional[bool] = None) -> bool:
    """Whether the CUDA ops check their scales on the device (one host sync per call;
    FP8MIX_CUDA_CHECK_SCALES=1 at start); with `on`, set it first. Returns the setting."""
    if on is not None:
        _ops.cuda_set_check_scales(bool(on))
    return bool(_ops.cuda_get_check_scales())

