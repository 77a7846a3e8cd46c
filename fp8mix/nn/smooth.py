"""Per-channel smoothing of a GEMM's input before its FP8 cast (Smooth-SwiGLU, Fishman et
al. 2024, "Scaling FP8 training to trillion-token LLMs"; the same migration SmoothQuant
uses): y = x W^T = (x diag(s)) (W diag(s)^-1)^T for any per-input-channel s, so the FP8
casts see x * s and W / s instead of x and W.

    s_c = 2^round( (1 - alpha) log2 max|W[:, c]|  -  alpha log2 max|x[:, c]| )

alpha = 1 is the paper's choice for the SwiGLU output (every channel of x * s has amax
about 1, the whole spread moves into W's columns); alpha = 0.5 (SmoothQuant's, the default here)
splits the spread between the two operands, which is what a per-tensor weight cast needs
(a channel 1000x larger gives both operands a ~32x channel, not W a 1000x column). The
scales are powers of two, so x * s and W / s are exact in float32 (no rounding of their
own: the smoothed GEMM differs from the plain one only by what the FP8 casts lose), they
are detached (a function of the batch, as a current scale is) and recomputed every
forward from the batch's per-channel amax (one extra read of x and W).

Not here: which layers to smooth (fp8mix.plan decides; LayerNormMLP(smooth_swiglu=True)
and fp8mix.Linear.fp8_smooth ask for it).
"""
from __future__ import annotations

import torch

__all__ = ["smoothing_scales", "smooth_operands", "DEFAULT_ALPHA", "check_alpha"]

DEFAULT_ALPHA = 0.5
_EXP_LIMIT = 64  # |log2 s| at most: a dead channel (amax 0) gets s = 1, a huge ratio is clamped


def check_alpha(owner: str, alpha) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < float(alpha) <= 1.0:
        raise ValueError(f"{owner}: smoothing alpha must be a number in (0, 1], got {alpha!r}")
    return float(alpha)


def smoothing_scales(x2: torch.Tensor, weight: torch.Tensor, alpha: float = DEFAULT_ALPHA) -> torch.Tensor:
    """Power-of-two float32 scales s[K] for x2 [M, K] and weight [N, K]: s_c = 2^round(e_c),
    e_c = (1 - alpha) log2 max|W[:, c]| - alpha log2 max|x[:, c]| (SmoothQuant's rule in the
    x * s convention); 1 where either amax is 0 or not finite."""
    with torch.no_grad():
        xmax = x2.detach().abs().amax(dim=0).float()
        wmax = weight.detach().abs().amax(dim=0).float()
        ok = (xmax > 0) & (wmax > 0) & torch.isfinite(xmax) & torch.isfinite(wmax)
        e = (1.0 - alpha) * torch.log2(torch.where(ok, wmax, 1.0)) - alpha * torch.log2(torch.where(ok, xmax, 1.0))
        e = torch.round(e).clamp(-_EXP_LIMIT, _EXP_LIMIT)
        return torch.exp2(torch.where(ok, e, 0.0))


def smooth_operands(x: torch.Tensor, weight: torch.Tensor, alpha: float = DEFAULT_ALPHA):
    """(x * s, weight / s, s): the smoothed GEMM operands (gradients flow through both
    products to x and weight; s is detached)."""
    k = x.shape[-1]
    s = smoothing_scales(x.reshape(-1, k), weight, alpha)
    return x * s.to(x.dtype), weight * torch.reciprocal(s).to(weight.dtype), s
