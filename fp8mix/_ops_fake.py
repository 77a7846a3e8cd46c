"""The fake (meta) implementations of torch.ops.fp8mix: output shapes and dtypes only, so
that the ops trace under torch.compile and run under FakeTensorMode. Registered when
fp8mix.ops is imported (it imports this module); nothing here computes values.
"""
from __future__ import annotations

import torch

from . import _C  # type: ignore[attr-defined]  # noqa: F401  (loading it defines the ops' schemas)
from ._op_types import QUANT_STATS_N, Act, NormKind, scale_shape
from ._op_types import rows_cols as _rows_cols
from .formats import Granularity


@torch.library.register_fake("fp8mix::cast")
def _cast_fake(x, scale, fp8_dtype, granularity, saturate=True, stochastic=False, seed=0, offset=0,
               want_q=True, transpose=False, inf_to_nan=False, rng=None, rng_skip=0):
    rows, cols = _rows_cols(x)
    q = x.new_empty(x.shape if want_q else (0,), dtype=fp8_dtype)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    return q, qt, x.new_empty((), dtype=torch.float32)


@torch.library.register_fake("fp8mix::quantize_current")
def _quantize_current_fake(x, fp8_dtype, granularity, margin=0, power_2_scale=False, amax_epsilon=0.0,
                           saturate=True, stochastic=False, seed=0, offset=0, want_q=True, transpose=False,
                           inf_to_nan=False, rng=None, rng_skip=0):
    rows, cols = _rows_cols(x)
    q = x.new_empty(x.shape if want_q else (0,), dtype=fp8_dtype)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    s = scale_shape(x, granularity)
    return q, qt, x.new_empty(s, dtype=torch.float32), x.new_empty(s, dtype=torch.float32)


@torch.library.register_fake("fp8mix::quantize_mx")
def _quantize_mx_fake(x, fp8_dtype, rule=0, margin=0, amax_epsilon=0.0, saturate=True, stochastic=False, seed=0,
                      offset=0, want_q=True, transpose=False, inf_to_nan=False, rng=None, rng_skip=0):
    rows, cols = _rows_cols(x)
    f32 = torch.float32
    q = x.new_empty(x.shape if want_q else (0,), dtype=fp8_dtype)
    s = x.new_empty(scale_shape(x, Granularity.MX) if want_q else (0,), dtype=f32)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    st = x.new_empty((cols, (rows + 31) // 32) if transpose else (0,), dtype=f32)
    return q, s, qt, st, x.new_empty(s.shape, dtype=f32)


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
def _scaled_mm_fake(a, b, scale_a, scale_b, bias=None, out_dtype=None, accumulate="fp32", promote_interval=128,
                    scale_kind_a=-1, scale_kind_b=-1):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype or torch.float32)


@torch.library.register_fake("fp8mix::delayed_cast")
def _delayed_cast_fake(x, amax_history, scale, steps, role, history_len, fp8_dtype, margin=0, power_2_scale=False,
                       amax_compute_algo="max", interval=1, record=True, transpose=False, inf_to_nan=False,
                       fresh_amax=None, rng=None, rng_skip=0):
    rows, cols = _rows_cols(x)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    return (x.new_empty(x.shape, dtype=fp8_dtype), qt, x.new_empty((2,), dtype=torch.float32),
            x.new_empty((), dtype=torch.float32))


@torch.library.register_fake("fp8mix::delayed_record")
def _delayed_record_fake(*args, **kwargs):
    return None


@torch.library.register_fake("fp8mix::delayed_flush")
def _delayed_flush_fake(amax_history, scale, steps, pending, next_slot, *args, **kwargs):
    return scale.new_empty((2,)), steps.new_empty(())


@torch.library.register_fake("fp8mix::grad_cast")
def _grad_cast_fake(dy, fp8_dtype, plan=None, pending=None, slot=None, margin=0, power_2_scale=False,
                    amax_epsilon=0.0, transpose=False, colsum=False, inf_to_nan=True, rng=None, rng_skip=0):
    rows, cols = _rows_cols(dy)
    qt = dy.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    return (dy.new_empty(dy.shape, dtype=fp8_dtype), qt, dy.new_empty((), dtype=torch.float32),
            dy.new_empty((), dtype=torch.float32), dy.new_empty((cols if colsum else 0,), dtype=torch.float32))


@torch.library.register_fake("fp8mix::linear_delayed_casts")
def _linear_delayed_casts_fake(x, w, amax_history, scale, steps, pending, next_slot, gemm, history_len, x_dtype,
                               w_dtype, grad_dtype, margin=0, power_2_scale=False, amax_compute_algo="max",
                               interval=1, record=True, reserve=True, transpose=False, inf_to_nan=True):
    xq, xqt, xs, _ = _delayed_cast_fake(x, amax_history, scale, steps, 3 * gemm, history_len, x_dtype,
                                        transpose=transpose)
    wq, wqt, ws, _ = _delayed_cast_fake(w, amax_history, scale, steps, 3 * gemm + 1, history_len, w_dtype,
                                        transpose=transpose)
    plan, slot = _delayed_flush_fake(amax_history, scale, steps, pending, next_slot)
    f32 = torch.float32
    return xq, xqt, xs, x.new_empty((), dtype=f32), wq, wqt, ws, w.new_empty((), dtype=f32), plan, slot


@torch.library.register_fake("fp8mix::linear_current_casts")
def _linear_current_casts_fake(x, w, x_dtype, w_dtype, margin=0, power_2_scale=False, amax_epsilon=0.0,
                               transpose=False, inf_to_nan=True):
    return (*_quantize_current_fake(x, x_dtype, 0, transpose=transpose),
            *_quantize_current_fake(w, w_dtype, 0, transpose=transpose))


@torch.library.register_fake("fp8mix::linear_backward")
def _linear_backward_fake(dy, wq, w_scale_inv, xq, x_scale_inv, fp8_dtype, plan=None, pending=None, slot=None,
                          margin=0, power_2_scale=False, amax_epsilon=0.0, colsum=False, want_dx=True, want_dw=True,
                          dx_dtype=torch.float32, dw_dtype=torch.float32, w_scale=None, w_amax=None,
                          w_fp8_dtype=None):
    gq, _, sinv, _, cs = _grad_cast_fake(dy, fp8_dtype, colsum=colsum)
    dx = dy.new_empty((dy.shape[0], wq.shape[1]) if want_dx else (0,), dtype=dx_dtype)
    dw = dy.new_empty((dy.shape[1], xq.shape[1]) if want_dw else (0,), dtype=dw_dtype)
    return dx, dw, cs, gq, sinv


def _fused_fakes(x, sizes, fp8_dtype, granularity, want_q, transpose, hp_dtype, scales_len=None):
    """The outputs every fused producer cast has: q, qt, scale_inv (or scales), amax, hp."""
    rows, cols = _rows_cols(torch.empty(sizes, device="meta"))
    q = x.new_empty(sizes if want_q else (0,), dtype=fp8_dtype)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    shape = scale_shape(torch.empty(sizes, device="meta"), granularity)
    s = x.new_empty(shape if scales_len is None else (scales_len,), dtype=torch.float32)
    hp = x.new_empty(sizes if hp_dtype is not None else (0,), dtype=hp_dtype or torch.float32)
    return q, qt, s, x.new_empty(shape, dtype=torch.float32), hp


def _stats_fakes(x, kind, rstd):
    """mean (LayerNorm) and rstd, one per row; empty when given."""
    rows = _rows_cols(x)[0]
    if rstd is not None:
        return x.new_empty((0,), dtype=torch.float32), x.new_empty((0,), dtype=torch.float32)
    return x.new_empty((rows if kind == NormKind.LAYER else 0,), dtype=torch.float32), \
        x.new_empty((rows,), dtype=torch.float32)


def _act_sizes(h, act):
    sizes = list(h.shape) if h.dim() else [1]
    if act >= Act.GEGLU:
        sizes[-1] //= 2
    return sizes


@torch.library.register_fake("fp8mix::norm_cast")
def _norm_cast_fake(x, gamma, beta, kind, eps, zero_centered_gamma, fp8_dtype, granularity, scale=None, margin=0,
                    power_2_scale=False, amax_epsilon=0.0, want_q=True, transpose=False, inf_to_nan=False, rng=None,
                    rng_skip=0, mean=None, rstd=None, hp_dtype=None):
    q, qt, s, am, hp = _fused_fakes(x, list(x.shape), fp8_dtype, granularity, want_q, transpose, hp_dtype)
    return (q, qt, s, am, *_stats_fakes(x, kind, rstd), hp)


@torch.library.register_fake("fp8mix::norm_delayed_cast")
def _norm_delayed_cast_fake(x, gamma, beta, kind, eps, zero_centered_gamma, amax_history, scale, steps, role,
                            history_len, fp8_dtype, margin=0, power_2_scale=False, amax_compute_algo="max",
                            interval=1, record=True, transpose=False, inf_to_nan=False, fresh_amax=None, rng=None,
                            rng_skip=0, mean=None, rstd=None, hp_dtype=None):
    q, qt, s, am, hp = _fused_fakes(x, list(x.shape), fp8_dtype, Granularity.TENSOR, True, transpose, hp_dtype,
                                    scales_len=2)
    return (q, qt, s, am, *_stats_fakes(x, kind, rstd), hp)


@torch.library.register_fake("fp8mix::act_cast")
def _act_cast_fake(h, act, fp8_dtype, granularity, scale=None, margin=0, power_2_scale=False, amax_epsilon=0.0,
                   want_q=True, transpose=False, inf_to_nan=False, rng=None, rng_skip=0, hp_dtype=None):
    return _fused_fakes(h, _act_sizes(h, act), fp8_dtype, granularity, want_q, transpose, hp_dtype)


@torch.library.register_fake("fp8mix::act_delayed_cast")
def _act_delayed_cast_fake(h, act, amax_history, scale, steps, role, history_len, fp8_dtype, margin=0,
                           power_2_scale=False, amax_compute_algo="max", interval=1, record=True, transpose=False,
                           inf_to_nan=False, fresh_amax=None, rng=None, rng_skip=0, hp_dtype=None):
    return _fused_fakes(h, _act_sizes(h, act), fp8_dtype, Granularity.TENSOR, True, transpose, hp_dtype,
                        scales_len=2)


if torch._C._dispatch_has_kernel_for_dispatch_key("fp8mix::cast", "CUDA"):  # CUDA builds only
    @torch.library.register_fake("fp8mix::delayed_scale_update")
    def _delayed_scale_update_fake(*args, **kwargs):
        return None


@torch.library.register_fake("fp8mix::quantize_nvfp4")
def _quantize_nvfp4_fake(x, global_amax, tile_2d=False, stochastic=False, seed=0, offset=0, rng=None, rng_skip=0):
    rows, cols = _rows_cols(x)
    return (x.new_empty((rows, cols // 2), dtype=torch.uint8),
            x.new_empty((rows, cols // 16), dtype=torch.float8_e4m3fn), x.new_empty((), dtype=torch.float32))


@torch.library.register_fake("fp8mix::dequantize_nvfp4")
def _dequantize_nvfp4_fake(q, block_scale, scale_inv, out_dtype):
    return q.new_empty((q.shape[0], q.shape[1] * 2), dtype=out_dtype)


@torch.library.register_fake("fp8mix::nvfp4_mm")
def _nvfp4_mm_fake(a, a_block_scale, a_scale_inv, b, b_block_scale, b_scale_inv):
    return a.new_empty((a.shape[0], b.shape[0]), dtype=torch.float32)


@torch.library.register_fake("fp8mix::rht16")
def _rht16_fake(x, signs):
    return torch.empty_like(x)


@torch.library.register_fake("fp8mix::scaled_grouped_mm")
def _scaled_grouped_mm_fake(a, b, scale_a, scale_b, offs, scale_kind, bias=None, out_dtype=None):
    return a.new_empty((a.shape[0], b.shape[-1]), dtype=out_dtype or torch.float32)


@torch.library.register_fake("fp8mix::scaled_grouped_mm_k")
def _scaled_grouped_mm_k_fake(a, b, scale_a, scale_b, offs, scale_kind, bias=None, out_dtype=None):
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[1]), dtype=out_dtype or torch.float32)


def _grouped_q(x, offs, fp8_dtype, transpose):
    rows, cols = _rows_cols(x)
    qt = x.new_empty((cols, rows) if transpose else (0,), dtype=fp8_dtype)
    return x.new_empty(x.shape, dtype=fp8_dtype), qt


@torch.library.register_fake("fp8mix::grouped_quantize")
def _grouped_quantize_fake(x, offs, fp8_dtype, margin=0, power_2_scale=False, amax_epsilon=0.0, transpose=False,
                           inf_to_nan=False):
    g = offs.shape[0]
    return (*_grouped_q(x, offs, fp8_dtype, transpose), x.new_empty((g,), dtype=torch.float32),
            x.new_empty((g,), dtype=torch.float32))


@torch.library.register_fake("fp8mix::grouped_delayed_cast")
def _grouped_delayed_cast_fake(x, offs, amax_history, scale, steps, role0, role_step, history_len, fp8_dtype,
                               margin=0, power_2_scale=False, amax_compute_algo="max", interval=1, record=True,
                               transpose=False, inf_to_nan=False):
    g = offs.shape[0]
    return (*_grouped_q(x, offs, fp8_dtype, transpose), x.new_empty((g, 2), dtype=torch.float32),
            x.new_empty((g,), dtype=torch.float32))


@torch.library.register_fake("fp8mix::grouped_delayed_flush")
def _grouped_delayed_flush_fake(amax_history, scale, steps, pending, next_slot, *args, **kwargs):
    return scale.new_empty((pending.shape[0], 2)), steps.new_empty((pending.shape[0],))


@torch.library.register_fake("fp8mix::grouped_grad_cast")
def _grouped_grad_cast_fake(dy, offs, fp8_dtype, plans=None, pending=None, slots=None, margin=0, power_2_scale=False,
                            amax_epsilon=0.0, transpose=False, colsum=False, inf_to_nan=True):
    g, (_, cols) = offs.shape[0], _rows_cols(dy)
    f32 = torch.float32
    return (*_grouped_q(dy, offs, fp8_dtype, transpose), dy.new_empty((g,), dtype=f32), dy.new_empty((g,), dtype=f32),
            dy.new_empty((g, cols) if colsum else (0, 0), dtype=f32))
