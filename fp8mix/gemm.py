"""fp8mix.scaled_mm: the scaled FP8 GEMM with torch._scaled_mm's contract.

out = (a * scale_a) @ (b * scale_b) + bias, with scale_a / scale_b the
dequantisation factors (the operands' scale_inv). The kernel is C (csrc/core/gemm.c).
"""
from __future__ import annotations

import torch

from . import ops
from .formats import Granularity
from .quantization import same_device
from .tensor import Float8Tensor

__all__ = ["scaled_mm"]

_OUT = (torch.float32, torch.bfloat16, torch.float16)


def _operand_scale(t: Float8Tensor, is_a: bool) -> torch.Tensor:
    s = t.scale_inv
    if t.granularity == "tensor":
        return s.reshape(())
    if is_a and t.granularity in ("row", "block"):
        return s.reshape(t.data.shape[0], -1)
    if not is_a and t.granularity == "block2d":
        return s
    raise ValueError(f"fp8mix.scaled_mm: a {'left' if is_a else 'right'} operand with {t.granularity!r} "
                     "scaling has no GEMM scale layout (a: tensor/row/block/mx; b: tensor/block2d/mx)")


def _mx_operands(a: Float8Tensor, b: Float8Tensor):
    """MX Float8Tensors as the op's arguments: b is the (N, K) tensor quantised along K."""
    if a.granularity != "mx" or b.granularity != "mx":
        raise ValueError("fp8mix.scaled_mm: MX scaling needs both operands quantised with granularity='mx'")
    if a.data.dim() != 2 or b.data.dim() != 2 or a.data.shape[1] != b.data.shape[1]:
        raise ValueError("fp8mix.scaled_mm: MX operands are a (M, K) and b (N, K), both quantised along K; got "
                         f"{tuple(a.data.shape)} and {tuple(b.data.shape)}")
    return a.data, b.data.t(), a.scale_inv, b.scale_inv


def scaled_mm(a, b, scale_a=None, scale_b=None, *, bias=None, out_dtype=torch.float32,
              accumulate: str = "fp32", promote_interval: int = 128) -> torch.Tensor:
    """FP8 matrix product with scales, as ``torch._scaled_mm``.

    Args:
        a: FP8 (M, K) tensor (float8_e4m3fn or float8_e5m2), or a :class:`Float8Tensor`.
        b: FP8 (K, N) tensor, column-major (``w.t()`` of a row-major (N, K) weight, as torch
            requires) or row-major; or a :class:`Float8Tensor` (then omit the scales). With
            MX scaling (``granularity="mx"``, CPU) both are Float8Tensors quantised along K:
            ``a`` (M, K) and ``b`` the (N, K) weight itself, and the result is ``a @ b^T``.
        scale_a: float32 dequantisation factors of `a`: one value, (M, 1) per row, or
            (M, ceil(K/128)) per 1x128 tile (DeepSeek-V3 blocks; then `scale_b` must be blocks too).
        scale_b: one value, (1, N) per column, or (ceil(K/128), ceil(N/128)) per 128x128 block.
        bias: optional (N,) tensor, float32 or `out_dtype`, added before the final rounding.
        out_dtype: float32 (default), bfloat16 or float16.
        accumulate: ``"fp32"`` (exact products, float32 sums) or ``"fp22"``: an emulation of
            Hopper tensor cores' ~14-bit accumulator (partials truncated to 13 mantissa bits),
            promoted to float32 every `promote_interval` products (0 = never; DeepSeek-V3 uses 128).

    Every format pair is supported on CPU (E4M3/E5M2 x E4M3/E5M2), and any M, N, K >= 0.
    """
    if isinstance(a, Float8Tensor) or isinstance(b, Float8Tensor):
        if not (isinstance(a, Float8Tensor) and isinstance(b, Float8Tensor)):
            raise TypeError("fp8mix.scaled_mm: pass two Float8Tensors, or two FP8 tensors and their scales")
        if scale_a is not None or scale_b is not None:
            raise ValueError("fp8mix.scaled_mm: Float8Tensor operands carry their own scales")
        if "mx" in (a.granularity, b.granularity):
            a, b, scale_a, scale_b = _mx_operands(a, b)
            same_device("scaled_mm", a, b=b, bias=bias)
            if out_dtype not in _OUT:
                raise TypeError(f"fp8mix.scaled_mm: out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
            if accumulate != "fp32":
                raise ValueError("fp8mix.scaled_mm: MX scaling accumulates in float32 only (accumulate='fp32')")
            return ops.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype,
                                 scale_granularity=(Granularity.MX, Granularity.MX))
        scale_a, scale_b = _operand_scale(a, True), _operand_scale(b, False)
        a, b = a.data, b.data
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fp8mix.scaled_mm: {name} must be a tensor, got {type(t).__name__}")
    same_device("scaled_mm", a, b=b, scale_a=scale_a, scale_b=scale_b, bias=bias)
    if out_dtype not in _OUT:
        raise TypeError(f"fp8mix.scaled_mm: out_dtype must be float32, bfloat16 or float16, got {out_dtype}")
    return ops.scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype, accumulate=accumulate,
                         promote_interval=promote_interval)
