"""What the planner reads of an fp8mix layer, whatever its kind: its GEMMs' shapes and
weights, its high-precision output on the same inputs, the input of the GEMM whose channels
the outlier rule measures (the one smoothing acts on), and the outlier fixes it can run.

    fp8mix.Linear, nn.Conv1D   one GEMM on the layer's input x; smoothing: fp8_smooth (Linear)
    LayerNormLinear            one GEMM on norm(x); no smoothing
    LayerNormMLP               fc1 on norm(x), fc2 on a = act(fc1(norm(x))); the outlier rule
                               reads fc2's input a (the SwiGLU output Smooth-SwiGLU smooths),
                               smoothing is its fp8_smooth (smooth_swiglu)

TransformerLayer is no layer of its own: the planner sees its LayerNormLinear, Linear and
LayerNormMLP. The fused modules (LayerNormLinear, LayerNormMLP) write their GEMM inputs
with the fused norm / activation casts, which have per-tensor and 1x128-block layouts
only: of the outlier fixes they run smoothing (LayerNormMLP) and 1x128 blocks, not
rowwise or MX. Not here: running the model (measure.py) and deciding (search.py).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..context import fp8_autocast
from ..nn.activations import act_hp
from ..nn.conv1d import Conv1D
from ..nn.fp8_weight import FP8Weight, gemm_weight_names
from ..nn.layernorm_linear import LayerNormLinear
from ..nn.layernorm_mlp import LayerNormMLP
from ..nn.norms import norm_hp

__all__ = ["gemm_shapes", "gemm_weights", "min_features", "hp_output", "channel_input", "smoothable", "fixes_for",
           "runs_recipe"]

_FUSED = (LayerNormLinear, LayerNormMLP)
_FUSED_LACK = ("row", "mx")  # the fused norm / activation casts' missing layouts


def gemm_shapes(m: Any) -> list:
    """(in, out) features of each GEMM of m, in GEMM order."""
    if isinstance(m, LayerNormMLP):
        return [(m.hidden_size, int(m.fc1_weight.shape[0])), (m.ffn_hidden_size, m.hidden_size)]
    return [(int(m.in_features), int(m.out_features))]


def gemm_weights(m: nn.Module) -> list:
    """m's GEMM weights (Parameters), in GEMM order; [] for a module without the usual names."""
    try:
        return [getattr(m, n) for n in gemm_weight_names(m)]
    except TypeError:
        return []


def min_features(m: nn.Module) -> int:
    """The smallest GEMM dimension of m (what fp8_min_features is compared with)."""
    return min(min(s) for s in gemm_shapes(m))


def hp_output(m: nn.Module, args: tuple, kwargs: dict) -> Optional[torch.Tensor]:
    """m's high-precision output on the same inputs (its first output when it returns
    several): the layer's own _hp_forward where it has one, else its forward with FP8 off
    (nothing is recorded then). The caller keeps its hooks from running again inside."""
    hp = getattr(m, "_hp_forward", None)
    if hp is not None and args:
        return hp(args[0])
    with fp8_autocast(enabled=False):
        out = m(*args, **kwargs)
    if isinstance(out, (tuple, list)):
        out = out[0] if out else None
    return out if isinstance(out, torch.Tensor) else None


def channel_input(m: nn.Module, x: torch.Tensor) -> Optional[tuple]:
    """(x2 [M, K], weight [N, K], fixed) of the GEMM whose input channels the outlier rule
    measures, in high precision (an FP8 primary weight decoded, fixed=True: its bytes are
    what the GEMM uses; Conv1D's (in, out) weight transposed); None where m has none."""
    w: Any
    with torch.no_grad():
        if isinstance(m, LayerNormMLP):
            ln = norm_hp(m._spec, x, m.layer_norm_weight, m.layer_norm_bias)
            x2, w = act_hp(m._act, F.linear(ln, m.fc1_weight, m.fc1_bias)), m.fc2_weight
        elif isinstance(m, LayerNormLinear):
            x2, w = norm_hp(m._spec, x, m.layer_norm_weight, m.layer_norm_bias), m.weight
        else:
            x2, w = x, getattr(m, "weight", None)
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        return None
    fixed = isinstance(w, FP8Weight)
    wv = w.dequantize() if fixed else w
    return x2.reshape(-1, x2.shape[-1]), (wv.t() if isinstance(m, Conv1D) else wv), fixed


def smoothable(m: nn.Module) -> bool:
    """Whether m can smooth its (channel_input's) GEMM input: it has the fp8_smooth policy."""
    return hasattr(type(m), "fp8_smooth")


def fixes_for(m: nn.Module, fixes: tuple) -> tuple:
    """The outlier fixes of `fixes` (fp8mix.plan.outliers.FIX_ORDER) that m can run."""
    fused = isinstance(m, _FUSED)
    return tuple(f for f in fixes if (f != "smooth" or smoothable(m)) and not (fused and f in _FUSED_LACK))


def runs_recipe(m: nn.Module, recipe) -> bool:
    """Whether m can run under `recipe` (the fused modules have no rowwise / MX casts)."""
    return not (isinstance(m, _FUSED) and recipe.along_reduction())
