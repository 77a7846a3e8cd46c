"""The op layer's value types, a leaf module (no fp8mix imports but formats): the enums and
specs the typed wrappers of fp8mix.ops take, and the shape rules their fake impls
(fp8mix._ops_fake) share. Both import it; neither imports the other.
"""
from __future__ import annotations

import dataclasses
import enum

import torch

from .formats import Granularity

__all__ = ["mm_scale_code", "DelayedSpec", "NormKind", "Act", "QUANT_STATS_N", "rows_cols", "scale_shape"]


# The C API's fp8mix_mm_scale of a GEMM operand whose scales have this granularity:
# 0 one value; 1 one per row of A / column of B; 2 A's 1x128 tiles (M, ceil(K/128)) or B's
# 128x128 blocks (ceil(K/128), ceil(N/128)); 3 MX blocks, A (M, ceil(K/32)), B (N, ceil(K/32)).
_MM_SCALE = {Granularity.TENSOR: 0, Granularity.ROW: 1, Granularity.BLOCK: 2, Granularity.BLOCK2D: 2,
             Granularity.MX: 3}


def mm_scale_code(g) -> int:
    """fp8mix_mm_scale of a GEMM operand whose scales have granularity `g` (a Granularity or
    its name)."""
    return _MM_SCALE[Granularity.of(g)]


@dataclasses.dataclass(frozen=True)
class DelayedSpec:
    """What the delayed-scaling ops need of a DelayedScaling recipe."""

    history_len: int
    margin: int = 0
    power_2_scale: bool = False
    algo: str = "max"  # "max" or "most_recent"
    interval: int = 1


def rows_cols(x: torch.Tensor):
    cols = 1 if x.dim() == 0 else x.shape[-1]
    rows = 1
    for d in x.shape[:-1]:
        rows *= d
    return rows, cols


def scale_shape(x: torch.Tensor, g) -> list:
    """Shape of the per-granularity scale / amax tensor of x (g: a Granularity, its name or code)."""
    g = Granularity.of(g)
    rows, cols = rows_cols(x)
    lead = list(x.shape[:-1]) if x.dim() >= 1 else []
    if g == Granularity.TENSOR:
        return []
    if g == Granularity.ROW:
        return lead + [1]
    if g == Granularity.BLOCK:
        return lead + [(cols + 127) // 128]
    if g == Granularity.MX:
        return lead + [(cols + 31) // 32]
    return [(rows + 127) // 128, (cols + 127) // 128]


class NormKind(enum.IntEnum):
    """fp8mix_norm_kind."""

    LAYER = 0  # LayerNorm
    RMS = 1    # RMSNorm


class Act(enum.IntEnum):
    """fp8mix_act_kind: Transformer Engine's activations (gelu is the tanh form); the gated
    ones read a row as two halves a | b and give act(a) * b."""

    GELU = 0
    RELU = 1
    SILU = 2
    QGELU = 3
    SRELU = 4
    GEGLU = 5
    SWIGLU = 6
    REGLU = 7
    QGEGLU = 8
    SREGLU = 9

    @property
    def gated(self) -> bool:
        return self >= Act.GEGLU


# Length of fp8mix_quant_stats' output (FP8MIX_STATS_N in fp8mix.h); fp8mix.numerics.FIELDS and
# HIST_BINS name its entries (the one list; tests/test_numerics.py checks that the two agree).
QUANT_STATS_N = 84
