"""What a cast lost, as numbers: `quant_stats` and `QuantStats`.

The counting is the C kernel fp8mix_quant_stats (csrc/core/stats.c); this module
names its entries and derives the fractions and the SQNR that the monitor, the
gradient scaler's feedback and the automatic format choice read.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from . import ops
from .formats import GRANULARITIES
from .tensor import Float8Tensor

__all__ = ["QuantStats", "quant_stats", "stats_from_counts"]


@dataclasses.dataclass(frozen=True)
class QuantStats:
    """Statistics of one FP8 cast of a tensor x.

    Counts: ``numel``; ``nonzero`` (x != 0, NaN/inf included); ``underflow`` (finite
    non-zero x that became 0); ``saturated`` (FP8 value is +-max, "|q| = max");
    ``overflow`` (|x| beyond the format's range after scaling, i.e. clipped);
    ``subnormal`` (FP8 value non-zero but subnormal: reduced precision);
    ``nonfinite`` (x NaN or inf). Energies: ``signal`` = sum x^2 and ``noise`` =
    sum (x - dequant(q))^2 over finite x. ``min_nonzero``: smallest finite non-zero |x|
    (inf when there is none).
    """

    numel: float
    nonzero: float
    underflow: float
    saturated: float
    nonfinite: float
    overflow: float
    subnormal: float
    signal: float
    noise: float
    min_nonzero: float

    @property
    def underflow_frac(self) -> float:
        """Fraction of the non-zero values that flushed to zero."""
        return self.underflow / self.nonzero if self.nonzero else 0.0

    @property
    def saturation_frac(self) -> float:
        """Fraction of the non-zero values whose FP8 value is +-max."""
        return self.saturated / self.nonzero if self.nonzero else 0.0

    @property
    def overflow_frac(self) -> float:
        """Fraction of the non-zero values clipped at the format's max, or not finite."""
        return (self.overflow + self.nonfinite) / self.nonzero if self.nonzero else 0.0

    @property
    def sqnr_db(self) -> float:
        """10 log10(signal / noise); inf for an exact cast, nan for an all-zero tensor."""
        if self.signal == 0:
            return math.nan
        if self.noise == 0:
            return math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(underflow_frac=self.underflow_frac, saturation_frac=self.saturation_frac,
                 overflow_frac=self.overflow_frac, sqnr_db=self.sqnr_db)
        return d


def stats_from_counts(counts: torch.Tensor) -> QuantStats:
    """A QuantStats from the float64 vector ops.quant_stats returns (one host read)."""
    return QuantStats(*counts.tolist())


def quant_stats(x: torch.Tensor, t: Float8Tensor) -> QuantStats:
    """Statistics of `t` as the FP8 cast of `x` (same shape; t's scales and granularity).

    >>> x = torch.randn(256, 256)
    >>> s = quant_stats(x, fp8mix.quantize(x))   # about 31 dB for Gaussian data in E4M3
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fp8mix.quant_stats: x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(t, Float8Tensor):
        raise TypeError(f"fp8mix.quant_stats: t must be a Float8Tensor, got {type(t).__name__}")
    if x.shape != t.data.shape:
        raise ValueError(f"fp8mix.quant_stats: x has shape {tuple(x.shape)} but t has {tuple(t.data.shape)}")
    x2 = x.detach()
    q = t.data
    if x2.dim() == 0:
        x2, q = x2.reshape(1), q.reshape(1)
    return stats_from_counts(ops.quant_stats(x2, q, t.scale_inv.detach(), GRANULARITIES[t.granularity]))
