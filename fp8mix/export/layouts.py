"""The FP8 weight layouts inference engines load, and their exact inverse.

    layout    keys beside <module>.weight (float8_e4m3fn [N, K])   value of element (n, k)
    tensor    weight_scale float32 [1]                              q[n, k] * weight_scale[0]
    channel   weight_scale float32 [N, 1]                           q[n, k] * weight_scale[n, 0]
    block     weight_scale_inv float32 [ceil(N/128), ceil(K/128)]   q[n, k] * weight_scale_inv[n//128, k//128]

"tensor" and "channel" are compressed-tensors' "float-quantized" format (vLLM's FP8 W8A8
checkpoints: strategy "tensor" / "channel"); "block" is DeepSeek-V3's (and transformers'
FineGrainedFP8), whose scale is also a multiplier despite its name. Every scale is the
dequantisation multiplier 1/scale of fp8mix's cast (fp8mix.quantize with current scaling:
scale = 448 / amax of the tensor / row / 128x128 block, round to nearest even, saturating).

A weight that is already an FP8 primary weight (fp8mix.fp8_model_init's FP8Weight, per
tensor E4M3) is written as its own bytes and scale_inv for "tensor" (nothing re-rounded:
the exported model computes what the FP8 model computed); other layouts re-cast its
dequantised value. Not here: which modules are written, config.json (checkpoint.py, config.py).
"""
from __future__ import annotations

import math

import torch

from ..formats import Format, Granularity
from ..nn.fp8_weight import FP8Weight
from ..quantization import quantize

__all__ = ["LAYOUTS", "BLOCK", "quantize_weight", "dequantize_weight", "scale_key"]

LAYOUTS = ("tensor", "channel", "block")
BLOCK = 128
_GRAN = {"tensor": Granularity.TENSOR, "channel": Granularity.ROW, "block": Granularity.BLOCK2D}


def scale_key(layout: str) -> str:
    """The scale's key suffix: DeepSeek's weight_scale_inv, compressed-tensors' weight_scale."""
    return "weight_scale_inv" if layout == "block" else "weight_scale"


def scale_shape(layout: str, n: int, k: int) -> tuple:
    return {"tensor": (1,), "channel": (n, 1), "block": (math.ceil(n / BLOCK), math.ceil(k / BLOCK))}[layout]


def quantize_weight(w: torch.Tensor, layout: str) -> tuple:
    """(q float8_e4m3fn [N, K], scale float32 in the layout's shape) for a 2-D weight."""
    if layout not in LAYOUTS:
        raise ValueError(f"fp8mix.export: layout must be one of {LAYOUTS}, got {layout!r}")
    if w.dim() != 2:
        raise ValueError(f"fp8mix.export: a weight to quantize must be 2-D, got shape {tuple(w.shape)}")
    n, k = w.shape
    if isinstance(w, FP8Weight):
        if layout == "tensor" and w._data.dtype == torch.float8_e4m3fn:
            return w._data.detach().clone().contiguous(), w._scale_inv.detach().float().reshape(1).clone()
        w = w.dequantize(torch.float32)
    hp = w.detach().float().contiguous()
    t = quantize(hp, Format.E4M3, granularity=_GRAN[layout])
    return t.data.contiguous(), t.scale_inv.float().reshape(scale_shape(layout, n, k)).contiguous()


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, layout: str, dtype: torch.dtype = torch.float32):
    """The value of a stored weight (the table above), computed in float32, rounded once to dtype."""
    if q.dim() != 2:
        raise ValueError(f"fp8mix.export: a stored FP8 weight must be 2-D, got shape {tuple(q.shape)}")
    n, k = q.shape
    want = scale_shape(layout, n, k)
    if tuple(scale.shape) != want and not (layout == "tensor" and scale.numel() == 1):
        raise ValueError(f"fp8mix.export: a {layout} weight [{n}, {k}] needs a scale of shape {list(want)}, "
                         f"got {list(scale.shape)}")
    qf, s = q.float(), scale.float()
    if layout == "tensor":
        out = qf * s.reshape(())
    elif layout == "channel":
        out = qf * s.reshape(n, 1)
    else:
        s2 = s.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)[:n, :k]
        out = qf * s2
    return out.to(dtype)
