"""The op layer's value types, a leaf module (no fp8mix imports but formats): the enums and
specs the typed wrappers of fp8mix.ops take, and the shape rules their fake impls
(fp8mix._ops_fake) share. Both import it; neither imports the other.
"""
from __future__ import annotations

import dataclasses
import enum

import torch

from .formats import Granularity

__all__ = ["MmScale", "DelayedSpec", "NormKind", "Act", "QUANT_STATS_N", "rows_cols", "scale_shape"]


class MmScale(enum.IntEnum):
    """Scale layout of a GEMM operand (the C API's fp8mix_mm_scale)."""

    TENSOR = 0  # one value
    OUTER = 1   # one per row of a / column of b
    BLOCK = 2   # a: 1x128 tiles (M, ceil(K/128)); b: 128x128 blocks (ceil(K/128), ceil(N/128))
    MX = 3      # a: (M, ceil(K/32)) MX blocks; b: (N, ceil(K/32)), [n][k-block] (CPU)


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


def scale_shape(x: torch.Tensor, g: int) -> list:
    """Shape of the per-granularity scale / amax tensor of x (granularity code or enum g)."""
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
