"""Float8Tensor: FP8 bytes with the scales that give them meaning.

A plain holder (not a torch.Tensor subclass): `data` is a torch.float8_e4m3fn or
torch.float8_e5m2 tensor, `scale_inv` the float32 dequantisation factor(s) whose
shape follows the granularity, so that value = data.float() * scale_inv
(broadcast per tile).
"""
from __future__ import annotations

import torch

from . import ops
from .formats import Format, Granularity, format_of_dtype

__all__ = ["Float8Tensor"]


class Float8Tensor:
    """An FP8 tensor and its scale.

    Attributes:
        data: the FP8 bytes, a ``torch.float8_e4m3fn`` or ``torch.float8_e5m2`` tensor.
        scale_inv: float32 dequantisation factors; shape ``()`` for per-tensor scaling,
            ``(*lead, 1)`` per row, ``(*lead, ceil(K/128))`` per 1x128 block,
            ``(ceil(R/128), ceil(K/128))`` per 128x128 block.
        fmt: ``Format.E4M3`` or ``Format.E5M2`` (follows ``data.dtype``).
        amax: max |x| of the source: per tile (shape of ``scale_inv``) when the scales were
            computed (current scaling), the whole tensor's when they were given; or None.
        granularity: a :class:`fp8mix.Granularity` (a str: ``"tensor"``, ``"row"``, ``"block"``,
            ``"block2d"`` or ``"mx"``; the constructor takes either).
    """

    __slots__ = ("data", "scale_inv", "amax", "granularity")

    def __init__(self, data: torch.Tensor, scale_inv: torch.Tensor, amax: torch.Tensor | None = None,
                 granularity: Granularity | str = Granularity.TENSOR):
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"Float8Tensor: data must be a torch.Tensor, got {type(data).__name__}")
        format_of_dtype(data.dtype)  # raises TypeError for non-FP8 data
        granularity = Granularity.of(granularity)
        if not isinstance(scale_inv, torch.Tensor) or scale_inv.dtype != torch.float32:
            raise TypeError("Float8Tensor: scale_inv must be a float32 tensor")
        if scale_inv.device != data.device:
            raise ValueError(f"Float8Tensor: scale_inv is on {scale_inv.device} but data is on {data.device}")
        self.data = data
        self.scale_inv = scale_inv
        self.amax = amax
        self.granularity = granularity

    @property
    def fmt(self) -> Format:
        return format_of_dtype(self.data.dtype)

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    @property
    def device(self) -> torch.device:
        return self.data.device

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The represented values: ``data * scale_inv`` in float32, then rounded to `dtype`."""
        return ops.dequantize(self.data, self.scale_inv, granularity=self.granularity, out_dtype=dtype)

    def t(self) -> "Float8Tensor":
        """The 2-D transpose as a view (for GEMM operands: ``scaled_mm(x8, w8.t())``).
        Defined for per-tensor and 128x128-block scaling, whose tiles stay tiles."""
        if self.data.dim() != 2:
            raise ValueError("Float8Tensor.t() needs a 2-D tensor")
        if self.granularity == "tensor":
            return Float8Tensor(self.data.t(), self.scale_inv, self.amax, Granularity.TENSOR)
        if self.granularity == "block2d":
            am = self.amax.t() if self.amax is not None and self.amax.dim() == 2 else self.amax
            return Float8Tensor(self.data.t(), self.scale_inv.t(), am, Granularity.BLOCK2D)
        raise ValueError(f"Float8Tensor.t(): {self.granularity!r} scales do not describe the transpose")

    def __repr__(self) -> str:
        return (f"Float8Tensor(shape={tuple(self.shape)}, fmt={self.fmt!r}, granularity={self.granularity.value!r}, "
                f"scale_inv={self.scale_inv if self.scale_inv.numel() <= 4 else tuple(self.scale_inv.shape)})")
