"""The only module that calls torch.ops.fp8mix.*: loads the native library and
registers fake (meta) implementations so the ops trace under torch.compile.

Everything numeric happens in C (csrc/); this file only states output shapes.
"""
from __future__ import annotations

import torch

from . import _C  # noqa: F401  (loading it registers torch.ops.fp8mix)

_ops = torch.ops.fp8mix

__all__ = ["cast", "quantize_current", "amax", "compute_scale", "dequantize", "scaled_mm", "quant_stats", "cpu_isa", "set_max_isa"]


def _rows_cols(x: torch.Tensor):
    cols = 1 if x.dim() == 0 else x.shape[-1]
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return rows, cols


def scale_shape(x: torch.Tensor, g: int):
    """Shape of the per-granularity scale / amax tensor of x (granularity code g)."""
    rows, cols = _rows_cols(x)
    lead = list(x.shape[:-1]) if x.dim() >= 1 else []
    if g == 0:
        return []
    if g == 1:
        return lead + [1]
    if g == 2:
        return lead + [(cols + 127) // 128]
    return [(rows + 127) // 128, (cols + 127) // 128]


@torch.library.register_fake("fp8mix::cast")
def _cast_fake(x, scale, fp8_dtype, granularity, saturate=True, stochastic=False, seed=0, offset=0,
               want_q=True, transpose=False):
    rows, cols = _rows_cols(x)
    q = x.new_empty(x.shape if want_q else (0,), dtype=fp8_dtype)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    return q, qt, x.new_empty((), dtype=torch.float32)


@torch.library.register_fake("fp8mix::quantize_current")
def _quantize_current_fake(x, fp8_dtype, granularity, margin=0, power_2_scale=False, amax_epsilon=0.0,
                           saturate=True, stochastic=False, seed=0, offset=0, want_q=True, transpose=False):
    rows, cols = _rows_cols(x)
    q = x.new_empty(x.shape if want_q else (0,), dtype=fp8_dtype)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    s = scale_shape(x, granularity)
    return q, qt, x.new_empty(s, dtype=torch.float32), x.new_empty(s, dtype=torch.float32)


@torch.library.register_fake("fp8mix::amax")
def _amax_fake(x, granularity=0):
    return x.new_empty(scale_shape(x, granularity), dtype=torch.float32)


@torch.library.register_fake("fp8mix::compute_scale")
def _compute_scale_fake(amax, fp8_dtype, margin=0, power_2_scale=False, amax_epsilon=0.0):
    return amax.new_empty(amax.shape), amax.new_empty(amax.shape)  # contiguous, as the kernel


@torch.library.register_fake("fp8mix::dequantize")
def _dequantize_fake(q, scale_inv, granularity, out_dtype):
    return q.new_empty(q.shape, dtype=out_dtype)


@torch.library.register_fake("fp8mix::quant_stats")
def _quant_stats_fake(x, q, scale_inv, granularity, *, bad_scale_as_one=False):
    return x.new_empty((QUANT_STATS_N,), dtype=torch.float64)


@torch.library.register_fake("fp8mix::scaled_mm")
def _scaled_mm_fake(a, b, scale_a, scale_b, bias=None, out_dtype=None, accumulate="fp32", promote_interval=128):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.float32)


if torch._C._dispatch_has_kernel_for_dispatch_key("fp8mix::cast", "CUDA"):  # CUDA builds only
    @torch.library.register_fake("fp8mix::delayed_scale_update")
    def _delayed_scale_update_fake(*args, **kwargs):
        return None


cast = _ops.cast
quantize_current = _ops.quantize_current
amax = _ops.amax
compute_scale = _ops.compute_scale
dequantize = _ops.dequantize
scaled_mm = _ops.scaled_mm

# Length of fp8mix_quant_stats' output (FP8MIX_STATS_N in fp8mix.h); fp8mix.numerics.FIELDS and
# HIST_BINS name its entries (the one list; tests/test_numerics.py checks that the two agree).
QUANT_STATS_N = 84


def quant_stats(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, granularity, *,
                bad_scale_as_one: bool = False) -> torch.Tensor:
    """fp8mix_quant_stats: a float64 vector of QUANT_STATS_N entries (see fp8mix.numerics);
    granularity: its code (or a Granularity). On the CPU (tensors elsewhere are copied:
    statistics are sampled). bad_scale_as_one: count a scale_inv that is not finite and > 0
    and measure its tile as if it were 1, instead of raising."""
    if x.device.type != "cpu":
        x, q, scale_inv = x.cpu(), q.cpu(), scale_inv.cpu()
    return _ops.quant_stats(x, q, scale_inv, int(granularity), bad_scale_as_one=bad_scale_as_one)


def cpu_isa() -> str:
    """The instruction set the CPU kernels use now ('scalar', 'avx2', 'avx512', 'avx512bf16')."""
    return _ops.cpu_isa()


def set_max_isa(name: str) -> None:
    """Cap the CPU kernels' instruction set (e.g. 'scalar' to run the portable path); process-wide."""
    _ops.set_max_isa(name)
