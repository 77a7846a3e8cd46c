"""fp8mix.LayerNorm and fp8mix.RMSNorm (Transformer Engine's signatures), and the norm
arithmetic the fused modules share: the high-precision forward (torch's own ops, so that
outside fp8_autocast a fused module is exactly LayerNorm -> Linear) and the backward of
the fused FP8 forward, from the statistics the C kernel kept.

    LayerNorm: y = (x - E[x]) / sqrt(Var[x] + eps) * g + b
    RMSNorm:   y = x / sqrt(E[x^2] + eps) * g
    g = gamma, or 1 + gamma with zero_centered_gamma (gamma then starts at 0)

A standalone norm has no GEMM, so it computes in high precision inside fp8_autocast
too (exactly torch.nn.LayerNorm / the RMSNorm formula, as F.rms_norm computes it); the
norm fused with its GEMM's FP8 cast is fp8mix.LayerNormLinear / LayerNormMLP.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..ops import NormKind
from .te_options import TECheckpointMixin, params_dtype_of, te_options

__all__ = ["LayerNorm", "RMSNorm", "NormSpec", "norm_spec", "norm_hp", "norm_backward"]

_NORMALIZATIONS = {"LayerNorm": NormKind.LAYER, "RMSNorm": NormKind.RMS}


@dataclasses.dataclass(frozen=True)
class NormSpec:
    """Which norm a module applies."""

    kind: NormKind
    eps: float
    zero_centered_gamma: bool = False


def norm_spec(owner: str, normalization: str, eps, zero_centered_gamma) -> NormSpec:
    """Check TE's normalization / eps / zero_centered_gamma arguments."""
    if normalization not in _NORMALIZATIONS:
        raise ValueError(f"fp8mix.{owner}: normalization must be 'LayerNorm' or 'RMSNorm', got {normalization!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= float(eps) < float("inf"):
        raise ValueError(f"fp8mix.{owner}: eps must be a finite number >= 0, got {eps!r}")
    if not isinstance(zero_centered_gamma, bool):
        raise TypeError(f"fp8mix.{owner}: zero_centered_gamma must be True or False, got {zero_centered_gamma!r}")
    return NormSpec(_NORMALIZATIONS[normalization], float(eps), zero_centered_gamma)


def _gamma(spec: NormSpec, weight: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    if weight is None or not spec.zero_centered_gamma:
        return weight
    return 1 + weight


def norm_hp(spec: NormSpec, x: torch.Tensor, weight: Optional[torch.Tensor],
            bias: Optional[torch.Tensor]) -> torch.Tensor:
    """The norm with torch's ops (F.layer_norm / F.rms_norm): the high-precision path."""
    shape = (x.shape[-1],)
    if spec.kind == NormKind.LAYER:
        return F.layer_norm(x, shape, _gamma(spec, weight), bias, spec.eps)
    y = F.rms_norm(x, shape, _gamma(spec, weight), spec.eps)
    return y if bias is None else y + bias


def norm_backward(spec: NormSpec, dy: torch.Tensor, x2: torch.Tensor, weight, bias, mean, rstd, needs):
    """(dx, dweight, dbias) of the norm of the 2-D x2 given its float32 statistics (one
    per row) and the gradient of its output; entries not in `needs` are None.
    LayerNorm: aten's native_layer_norm_backward (float32 parameters, so every input
    dtype takes its mixed-precision path); RMSNorm: the formula in float32."""
    need_x, need_w, need_b = needs
    w = _gamma(spec, weight)
    if spec.kind == NormKind.LAYER:
        mask = [need_x, need_w and weight is not None, need_b and bias is not None]
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            dy.to(x2.dtype), x2, [x2.shape[-1]], mean.view(-1, 1), rstd.view(-1, 1),
            None if w is None else w.float(), None if bias is None else bias.float(), mask)
    else:
        r = rstd.view(-1, 1)
        xhat = x2.float() * r
        g = dy.float() if w is None else dy.float() * w.float()
        dx = (r * (g - xhat * (g * xhat).mean(-1, keepdim=True))).to(x2.dtype) if need_x else None
        dw = (dy.float() * xhat).sum(0) if need_w and weight is not None else None
        db = dy.float().sum(0) if need_b and bias is not None else None
    dw = None if dw is None or weight is None else dw.to(weight.dtype)
    db = None if db is None or bias is None else db.to(bias.dtype)
    return (dx if need_x else None), dw, db


class LayerNorm(TECheckpointMixin, nn.LayerNorm):
    """Transformer Engine's LayerNorm: ``LayerNorm(hidden_size, eps=1e-5,
    sequence_parallel=None, params_dtype=None, zero_centered_gamma=False, device=None)``.

    Parameters ``weight`` and ``bias`` (TE's and torch's names). Without
    zero_centered_gamma it is torch.nn.LayerNorm, bit for bit, inside fp8_autocast too;
    with it, gamma starts at 0 and the output is ``x_hat * (1 + gamma) + beta``."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False, device=None, *,
                 dtype: Optional[torch.dtype] = None, **te_kwargs):
        te_options("LayerNorm", {"sequence_parallel": sequence_parallel, **te_kwargs})
        spec = norm_spec("LayerNorm", "LayerNorm", eps, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps, elementwise_affine=True, device=device,
                         dtype=params_dtype_of("LayerNorm", params_dtype, dtype))
        self._spec = spec
        self.zero_centered_gamma = zero_centered_gamma
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if getattr(self, "zero_centered_gamma", False):
            nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_hp(self._spec, x, self.weight, self.bias)


class RMSNorm(TECheckpointMixin, nn.RMSNorm):
    """Transformer Engine's RMSNorm: ``RMSNorm(hidden_size, eps=1e-5,
    sequence_parallel=None, params_dtype=None, zero_centered_gamma=False, device=None)``:
    ``y = x / sqrt(mean(x^2) + eps) * gamma`` (torch's F.rms_norm; gamma is 1 + weight
    with zero_centered_gamma). Parameter ``weight``; no bias, as TE's."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, sequence_parallel: Optional[bool] = None,
                 params_dtype: Optional[torch.dtype] = None, zero_centered_gamma: bool = False, device=None, *,
                 dtype: Optional[torch.dtype] = None, **te_kwargs):
        te_options("RMSNorm", {"sequence_parallel": sequence_parallel, **te_kwargs})
        spec = norm_spec("RMSNorm", "RMSNorm", eps, zero_centered_gamma)
        super().__init__(hidden_size, eps=float(eps), elementwise_affine=True, device=device,
                         dtype=params_dtype_of("RMSNorm", params_dtype, dtype))
        self._spec = spec
        self.zero_centered_gamma = zero_centered_gamma
        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if getattr(self, "zero_centered_gamma", False):
            nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return norm_hp(self._spec, x, self.weight, None)
