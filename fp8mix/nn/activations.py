"""The activations of fp8mix.LayerNormMLP, with Transformer Engine's names and definitions
(TE's tests/pytorch reference: gelu and geglu use the tanh approximation; gated forms
split a row into halves a | b and give act(a) * b):

    gelu   0.5 a (1 + tanh(sqrt(2/pi) (a + 0.044715 a^3)))    geglu   gelu(a) * b
    relu   max(a, 0)                                          reglu   relu(a) * b
    silu   a * sigmoid(a)                                     swiglu  silu(a) * b
    qgelu  a * sigmoid(1.702 a)                               qgeglu  qgelu(a) * b
    srelu  max(a, 0)^2                                        sreglu  srelu(a) * b

act_hp is the high-precision forward in torch's ops (what LayerNormMLP computes outside
fp8_autocast); act_backward is the backward of the fused FP8 forward, from its saved
input h, written into one tensor (a gated input's two halves are not split into copies).
The fused forward itself is the C kernel (csrc/core/act.c).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops import Act

__all__ = ["ACTIVATIONS", "activation_of", "act_hp", "act_backward"]

ACTIVATIONS = {a.name.lower(): a for a in Act}


def activation_of(owner: str, name) -> Act:
    """TE's activation name as an Act."""
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"fp8mix.{owner}: activation must be one of {sorted(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def _base(act: Act, a: torch.Tensor) -> torch.Tensor:
    if act in (Act.GELU, Act.GEGLU):
        return F.gelu(a, approximate="tanh")
    if act in (Act.RELU, Act.REGLU):
        return F.relu(a)
    if act in (Act.SILU, Act.SWIGLU):
        return F.silu(a)
    if act in (Act.QGELU, Act.QGEGLU):
        return a * torch.sigmoid(1.702 * a)
    return torch.square(F.relu(a))


def _base_backward(act: Act, g: torch.Tensor, a: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = g * act'(a) (out: the gradient of a, possibly a view into the gradient of h)."""
    aten = torch.ops.aten
    if act in (Act.GELU, Act.GEGLU):
        return aten.gelu_backward.grad_input(g, a, approximate="tanh", grad_input=out)
    if act in (Act.RELU, Act.REGLU):
        return aten.threshold_backward.grad_input(g, a, 0, grad_input=out)
    if act in (Act.SILU, Act.SWIGLU):
        return aten.silu_backward.grad_input(g, a, grad_input=out)
    if act in (Act.QGELU, Act.QGEGLU):
        s = torch.sigmoid(1.702 * a)
        return torch.mul(g, s * (1 + 1.702 * a * (1 - s)), out=out)
    return torch.mul(g, 2 * F.relu(a), out=out)


def act_hp(act: Act, h: torch.Tensor) -> torch.Tensor:
    """The activation with torch's ops (gated: of the two halves of h's last dimension)."""
    if not act.gated:
        return _base(act, h)
    a, b = h.chunk(2, dim=-1)
    return _base(act, a) * b


def act_backward(act: Act, dy: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """dh for the activation of h (2-D) given dy, the gradient of its output."""
    dy = dy.to(h.dtype)
    if not act.gated:
        return _base_backward(act, dy, h, torch.empty_like(h))
    f = h.shape[-1] // 2
    a, b = h[:, :f], h[:, f:]
    dh = torch.empty_like(h)  # both halves written in place: no concatenation
    torch.mul(dy, _base(act, a), out=dh[:, f:])          # d/db = act(a)
    _base_backward(act, dy * b, a, out=dh[:, :f])        # d/da = b act'(a)
    return dh
