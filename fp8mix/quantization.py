"""User-facing casts: quantize, amax, cast_transpose, dequantize.

Policy only (argument checks, defaults, seeds); the numerics are the C kernels
behind fp8mix.ops.  Rules (see csrc/include/fp8mix.h): y = fp32(x * scale) is
rounded to float32 first, then to FP8 with round-to-nearest-even (or stochastic
rounding); saturating mode turns overflow and +-inf into +-max, non-saturating
mode follows OCP (NaN for E4M3, +-inf for E5M2); E4M3's 464 is a tie that rounds
to 448, anything above overflows.
"""
from __future__ import annotations

import math

import torch

from . import ops
from .formats import GRANULARITIES, MX_RULES, Format, Granularity, _single, fp8_dtype
from .tensor import Float8Tensor

__all__ = ["quantize", "amax", "cast_transpose", "dequantize"]

_ROUNDING = ("nearest", "stochastic")
_HP = (torch.float32, torch.bfloat16, torch.float16)


def _check_input(x, op: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fp8mix.{op}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _HP:
        raise TypeError(f"fp8mix.{op}: x must be float32, bfloat16 or float16, got {x.dtype}"
                        + ("; convert with x.float()" if x.dtype == torch.float64 else ""))
    if x.device.type != "cpu" and not has_device_kernels(x.device):
        raise NotImplementedError(f"fp8mix.{op}: no fp8mix kernels for device {x.device} in this build")


def has_device_kernels(device: torch.device) -> bool:
    """Whether this build registers fp8mix kernels (or fake kernels, for 'meta') for `device`."""
    return ops.has_kernels("cast", device)


def same_device(op: str, ref: torch.Tensor, **tensors) -> None:
    """Every tensor argument on ref's device (else the dispatcher would pick one kernel
    for all of them, e.g. a fake kernel for a meta scale beside CPU data)."""
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != ref.device:
            raise ValueError(f"fp8mix.{op}: {name} is on {t.device} but the data is on {ref.device}")


def _granularity(g, op: str) -> Granularity:
    """A Granularity or its name (not the C code: that is the op layer's business)."""
    if not isinstance(g, str) or g not in GRANULARITIES:
        raise ValueError(f"fp8mix.{op}: granularity must be one of {list(GRANULARITIES)}, got {g!r}")
    return Granularity(g)


def _seed(seed):
    if seed is None:  # drawn from torch's generator, so torch.manual_seed makes runs repeatable
        return int(torch.randint(0, 2**62, (), dtype=torch.int64))
    if not isinstance(seed, int) or seed < 0 or seed >= 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    return seed - 2**64 if seed >= 2**63 else seed  # the op takes int64; C reads uint64


def _scale_tensor(scale, x: torch.Tensor, g: Granularity, op: str) -> torch.Tensor:
    if isinstance(scale, (int, float)):
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"fp8mix.{op}: scale must be finite and > 0, got {scale}")
        return torch.tensor(float(scale), dtype=torch.float32, device=x.device)
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"fp8mix.{op}: scale must be None, a float or a float32 tensor")
    same_device(op, x, scale=scale)
    return scale.detach()


def _inverse(scale: torch.Tensor, x: torch.Tensor, g: Granularity) -> torch.Tensor:
    """1/scale in the granularity's canonical shape (the op has checked the count)."""
    return torch.reciprocal(scale.detach().to(torch.float32)).reshape(ops.scale_shape(x, g))


def quantize(x: torch.Tensor, fmt=Format.E4M3, scale=None, *,
             granularity: "Granularity | str" = Granularity.TENSOR,
             rounding: str = "nearest", saturate: bool = True, seed: int | None = None,
             offset: int = 0, margin: int = 0, power_2_scale: bool = False,
             amax_epsilon: float = 0.0, mx_rule: str = "rceil") -> Float8Tensor:
    """Cast `x` (float32/bfloat16/float16) to FP8.

    Args:
        fmt: ``Format.E4M3`` (default) or ``Format.E5M2``.
        scale: multiplier applied before the cast. ``None`` means current scaling:
            ``scale = fp8_max / amax / 2**margin`` per tile (power of two if
            `power_2_scale`), and scale 1 where amax is 0 or not finite. A float or a
            float32 tensor with one value per tile of `granularity` is used as given
            (each must be finite and > 0).
        granularity: ``"tensor"``, ``"row"`` (one scale per row of the last dim),
            ``"block"`` (1x128 tiles along the last dim), ``"block2d"`` (128x128
            blocks of the 2-D view ``(numel/last_dim, last_dim)``) or ``"mx"`` (OCP MX:
            1x32 blocks along the last dim, each scaled by a power of two 2^e, e in
            [-127, 127], E8M0's range; CPU; ``scale_inv`` holds 2^e as float32, shape
            ``(*lead, ceil(last_dim/32))``; power_2_scale is implied).
        mx_rule: the MX exponent: ``"rceil"`` (default; NVIDIA's: the smallest 2^e with
            amax / 2^e <= fp8_max) or ``"floor"`` (OCP v1.0: floor(log2(amax)) - emax of
            the element format, which lets the block maximum saturate); then + margin.
        rounding: ``"nearest"`` (ties to even) or ``"stochastic"`` (unbiased; random
            words from Philox4x32-10 keyed by `seed`, indexed by element + `offset`).
        saturate: clamp overflow and +-inf to +-max (default) instead of OCP's NaN/inf.
        seed: stochastic-rounding key; ``None`` draws one from torch's generator.

    Returns:
        A :class:`Float8Tensor` with ``scale_inv = 1/scale`` and the input's amax.
    """
    _check_input(x, "quantize")
    x = x.detach()  # a cast to FP8 has no gradient
    f = _single(fmt)
    g = _granularity(granularity, "quantize")
    if rounding not in _ROUNDING:
        raise ValueError(f"fp8mix.quantize: rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    sr = rounding == "stochastic"
    s = _seed(seed) if sr else 0
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"fp8mix.quantize: offset must be a non-negative int, got {offset!r}")
    if granularity == "mx":
        return _quantize_mx(x, f, scale, mx_rule, margin=margin, amax_epsilon=amax_epsilon, saturate=saturate,
                            stochastic=sr, seed=s, offset=offset)
    if scale is None:
        q, _, sinv, am = ops.quantize_current(x, fp8_dtype(f), granularity=g, margin=margin,
                                              power_2_scale=power_2_scale, amax_epsilon=amax_epsilon,
                                              saturate=saturate, stochastic=sr, seed=s, offset=offset)
        return Float8Tensor(q, sinv, am, g)
    st = _scale_tensor(scale, x, g, "quantize")
    q, _, am = ops.cast(x, st, fp8_dtype(f), granularity=g, saturate=saturate, stochastic=sr, seed=s, offset=offset)
    return Float8Tensor(q, _inverse(st, x, g), am, g)


def _quantize_mx(x: torch.Tensor, f: Format, scale, mx_rule: str, **kw) -> Float8Tensor:
    """quantize(granularity="mx"): current MX scales only (a given scale has no MX meaning)."""
    if scale is not None:
        raise ValueError("fp8mix.quantize: granularity='mx' computes its power-of-two block scales itself; "
                         "pass scale=None")
    if mx_rule not in MX_RULES:
        raise ValueError(f"fp8mix.quantize: mx_rule must be one of {list(MX_RULES)}, got {mx_rule!r}")
    if x.device.type != "cpu":
        raise NotImplementedError(f"fp8mix.quantize: granularity='mx' runs on the CPU only in this build, "
                                  f"got {x.device}")
    q, sinv, _, _, am = ops.quantize_mx(x, fp8_dtype(f), rule=MX_RULES[mx_rule], **kw)
    return Float8Tensor(q, sinv, am, Granularity.MX)


def cast_transpose(x: torch.Tensor, fmt=Format.E4M3, scale=None, *,
                   granularity: "Granularity | str" = Granularity.TENSOR, rounding: str = "nearest",
                   saturate: bool = True, seed: int | None = None, offset: int = 0, margin: int = 0,
                   power_2_scale: bool = False):
    """One read of `x` gives its FP8 copy and the FP8 transpose (of the 2-D view
    ``(numel/last_dim, last_dim)``), plus amax.

    The transpose holds the same bytes as ``quantize(...).data`` transposed, so only
    granularities whose tiles stay tiles when transposed are accepted: ``"tensor"``
    and ``"block2d"``. Returns ``(q, qt)``, two :class:`Float8Tensor`.
    """
    _check_input(x, "cast_transpose")
    x = x.detach()
    if granularity not in ("tensor", "block2d"):
        raise ValueError("fp8mix.cast_transpose: granularity must be 'tensor' or 'block2d' (a row or 1x128 "
                         f"scale does not describe the transpose), got {granularity!r}")
    f = _single(fmt)
    g = Granularity(granularity)
    if rounding not in _ROUNDING:
        raise ValueError(f"fp8mix.cast_transpose: rounding must be 'nearest' or 'stochastic', got {rounding!r}")
    sr = rounding == "stochastic"
    s = _seed(seed) if sr else 0
    if scale is None:
        q, qt, sinv, am = ops.quantize_current(x, fp8_dtype(f), granularity=g, margin=margin,
                                               power_2_scale=power_2_scale, saturate=saturate, stochastic=sr,
                                               seed=s, offset=offset, transpose=True)
    else:
        st = _scale_tensor(scale, x, g, "cast_transpose")
        q, qt, am = ops.cast(x, st, fp8_dtype(f), granularity=g, saturate=saturate, stochastic=sr, seed=s,
                             offset=offset, transpose=True)
        sinv = _inverse(st, x, g)
    sinv_t = sinv.t().contiguous() if g == Granularity.BLOCK2D else sinv
    return Float8Tensor(q, sinv, am, g), Float8Tensor(qt, sinv_t, am, g)


def amax(x: torch.Tensor, granularity: "Granularity | str" = Granularity.TENSOR) -> torch.Tensor:
    """max |x| per tile of `granularity` (float32). A NaN anywhere in a tile gives NaN,
    else an infinity gives +inf; an empty tensor gives 0."""
    _check_input(x, "amax")
    return ops.amax(x.detach(), granularity=_granularity(granularity, "amax"))


def dequantize(t: Float8Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``t.data * t.scale_inv`` (per tile), rounded once to `dtype`."""
    if not isinstance(t, Float8Tensor):
        raise TypeError(f"fp8mix.dequantize expects a Float8Tensor, got {type(t).__name__}")
    return t.dequantize(dtype)
