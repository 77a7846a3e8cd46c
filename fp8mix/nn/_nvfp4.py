"""The Linear step under NVFP4BlockScaling (fp8mix.recipe): three NVFP4 GEMMs on the
C core's scalar kernels, no FP8 state. fp8_forward hands a module's GEMM here when the
recipe is NVFP4; everything numeric is fp8mix.nvfp4's (the C core's).

    forward  y    = Q(x, 1x16) Q(W, 16x16)^T
    dgrad    dx   = Q_sr(dy, 1x16) Q(W^T, 16x16)^T            (W^T's tiles hold W's values)
    wgrad    dW   = Q_sr(H dy^T) Q(H x^T)^T                   (H: the 16-point RHT along tokens)

A checkpointed forward leaves its recipe in the module's replay queue (fp8mix.nn.recompute)
so that the recompute, which runs outside fp8_autocast, repeats it. Tokens are padded with zero rows to a multiple of 16 for wgrad (zeros add nothing to the
product). The stochastic words come from the layer's fp8_rng stream [key, offset], read
and advanced in backward: a recompute of the forward (activation checkpointing) draws
nothing, so it changes nothing.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import nvfp4
from ..recipe import NVFP4BlockScaling

_B = nvfp4.BLOCK


def _round4(n: int) -> int:
    return -(-n // 4) * 4


def check_shapes(m, in_features: int, out_features: int) -> None:
    for name, n in (("in_features", in_features), ("out_features", out_features)):
        if n % _B:
            raise ValueError(f"fp8mix.{type(m).__name__}: NVFP4BlockScaling needs {name} to be a multiple of "
                             f"{_B} (NVFP4 blocks), got {name}={n}")


def _rows_to_16(t: torch.Tensor) -> torch.Tensor:
    """t (K, M) with M padded by zero columns to a multiple of 16."""
    pad = -t.shape[1] % _B
    return F.pad(t, (0, pad)) if pad else t


def _along_tokens(t: torch.Tensor, recipe: NVFP4BlockScaling, *, stochastic: bool, rng: torch.Tensor,
                  skip: int) -> nvfp4.NVFP4Tensor:
    """The wgrad operand t^T (features, tokens): RHT along tokens (unless disabled), then 1x16."""
    tt = _rows_to_16(t.t().float().contiguous())
    if not recipe.disable_rht:
        tt = nvfp4.random_hadamard(tt, signs=recipe.rht_signs)
    return nvfp4.quantize(tt, rng=rng if stochastic else None, rng_skip=skip)


class _Replay:
    """What a recompute of an NVFP4 forward repeats: its recipe (a ReplayQueue entry; the
    autograd node holds it, so it lives as long as the forward's graph)."""

    def __init__(self, recipe: NVFP4BlockScaling):
        self.recipe = recipe


class NVFP4LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, recipe, rng, out_dtype, replay):
        tile = not recipe.disable_2d_quantization
        wq = nvfp4.quantize(weight.detach(), tile_2d=tile)
        y = nvfp4.mm(nvfp4.quantize(x2.detach()), wq)
        if bias is not None:
            y = y + bias.detach().float()
        ctx.recipe, ctx.rng, ctx.has_bias, ctx.replay = recipe, rng, bias is not None, replay
        ctx.save_for_backward(x2, weight)
        return y.to(out_dtype)

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        recipe = ctx.recipe
        if ctx.replay is not None:
            ctx.replay.backward_done = True
        sr = not recipe.disable_stochastic_rounding
        dy2 = dy.detach().float().contiguous()
        rows, n_out = dy2.shape
        with torch.no_grad():
            words = ctx.rng.clone()  # this backward's words: [key, offset]; the stream moves past them
            if sr:
                ctx.rng[1:].add_(_round4(rows * n_out) + _round4(n_out * (rows + (-rows % _B))))
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dyq = nvfp4.quantize(dy2, rng=words if sr else None)
            wtq = nvfp4.quantize(weight.detach().t().contiguous(), tile_2d=not recipe.disable_2d_quantization)
            dx = nvfp4.mm(dyq, wtq).to(x2.dtype)
        if ctx.needs_input_grad[1]:
            gq = _along_tokens(dy2, recipe, stochastic=sr, rng=words, skip=_round4(rows * n_out))
            xq = _along_tokens(x2.detach(), recipe, stochastic=False, rng=words, skip=0)
            dw = nvfp4.mm(gq, xq).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0).to(weight.dtype)
        return dx, dw, db, None, None, None, None


def nvfp4_forward(m, x: torch.Tensor, weight: torch.Tensor, bias, *, recipe: NVFP4BlockScaling, layout: str,
                  in_features: int, out_features: int, out_dtype: torch.dtype, fused_input: bool,
                  replays=None) -> torch.Tensor:
    """One GEMM of module m under NVFP4BlockScaling (x (..., in_features)); replays: the
    module's ReplayQueue when a checkpoint may recompute this forward."""
    name = type(m).__name__
    if fused_input:
        raise NotImplementedError(f"fp8mix.{name}: NVFP4BlockScaling runs in fp8mix.Linear (and the modules built "
                                  "of it); the fused norm / activation casts of the TE modules have no NVFP4 path")
    if not (x.is_cpu and weight.is_cpu):
        raise NotImplementedError(f"fp8mix.{name}: NVFP4BlockScaling runs on the CPU only (fp8mix has no NVFP4 "
                                  f"CUDA kernels); got x on {x.device}")
    check_shapes(m, in_features, out_features)
    w = weight if layout == "out_in" else weight.t()
    x2 = x.reshape(-1, in_features)
    replay = None
    if replays is not None:
        replay = _Replay(recipe)
        replays.push(replay)
    y2 = NVFP4LinearFunction.apply(x2, w, bias, recipe, m.fp8_rng, out_dtype, replay)
    return y2.reshape(*x.shape[:-1], out_features)
