"""What a cast lost, and what the tensor looked like, as numbers: `quant_stats`, `measure`
and `QuantStats` -- the one statistics path of fp8mix.

The counting is the C kernel fp8mix_quant_stats (csrc/core/stats.c: one pass, SIMD, the
same bits on every ISA and thread count). This module names its output once (`FIELDS`,
then `HIST_BINS` histogram counts) and derives what its callers read: the fractions, the
SQNR, amax, the dynamic range, mean, variance and kurtosis. The monitor, the gradient
scaler's feedback, the automatic format choice and the tools all read these names.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence, Union

import torch

from . import ops
from .formats import GRANULARITIES
from .tensor import Float8Tensor

__all__ = ["QuantStats", "quant_stats", "measure", "stats_from_counts", "stats_from_list", "FIELDS",
           "HIST_BINS", "HIST_MIN_LOG2", "STATS_N"]

# The entries of fp8mix_quant_stats' output, in order (fp8mix.h, enum FP8MIX_STATS_*), then HIST_BINS
# histogram counts. The first six are also what fp8mix.grad_stats adds up.
FIELDS = ("numel", "nonzero", "underflow", "saturated", "nonfinite", "overflow", "subnormal", "signal", "noise",
          "min_nonzero", "nan", "max_finite", "pivot", "sum1", "sum2", "sum3", "sum4", "bad_scales",
          "scale_inv_min", "scale_inv_max")
# The log2 histogram: bin b counts the finite non-zero x with floor(log2(|x| / scale_inv)) == HIST_MIN_LOG2 + b
# (exact, from the exponent bits); bin 0 also holds everything below, the last bin everything above.
HIST_BINS = 64
HIST_MIN_LOG2 = -47
STATS_N = len(FIELDS) + HIST_BINS

# Below this relative spread (variance / mean square about the pivot) the power sums cannot resolve the
# fourth moment in float64: kurtosis is NaN rather than noise.
_MIN_REL_SPREAD = 2.0 ** -40


@dataclasses.dataclass(frozen=True)
class QuantStats:
    """Statistics of one FP8 cast of a tensor x (fp8mix.h documents each entry).

    Counts: ``numel``; ``nonzero`` (x != 0, NaN/inf included); ``underflow`` (finite
    non-zero x that became 0); ``saturated`` (FP8 value is +-max, "|q| = max");
    ``overflow`` (|x| beyond the format's range after scaling, i.e. clipped);
    ``subnormal`` (FP8 value non-zero but subnormal: reduced precision);
    ``nonfinite`` (x NaN or inf), of which ``nan``. Energies: ``signal`` = sum x^2 and
    ``noise`` = sum (x - dequant(q))^2 over finite x. ``min_nonzero``: smallest finite
    non-zero |x| (inf when there is none); ``max_finite``: largest finite |x|. Power sums
    ``sum1`` .. ``sum4`` of (x - ``pivot``) over finite x, pivot being the first finite x.
    Scales: ``bad_scales`` (entries not finite and > 0, measured as 1), ``scale_inv_min``,
    ``scale_inv_max`` (of the others). ``hist``: HIST_BINS counts of log2|x * scale| by
    binade (see HIST_MIN_LOG2).
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
    nan: float
    max_finite: float
    pivot: float
    sum1: float
    sum2: float
    sum3: float
    sum4: float
    bad_scales: float
    scale_inv_min: float
    scale_inv_max: float
    hist: tuple

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
    def subnormal_frac(self) -> float:
        """Fraction of the non-zero values whose FP8 value is subnormal (fewer bits)."""
        return self.subnormal / self.nonzero if self.nonzero else 0.0

    @property
    def sqnr_db(self) -> float:
        """10 log10(signal / noise); inf for an exact cast, nan for an all-zero tensor or
        when a scale was bad (the noise was then measured against a made-up scale)."""
        if self.signal == 0 or self.bad_scales:
            return math.nan
        if self.noise == 0:
            return math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    @property
    def finite(self) -> float:
        """Number of finite values (the power sums' count)."""
        return self.numel - self.nonfinite

    @property
    def amax(self) -> float:
        """max |x| as fp8mix.amax defines it: NaN if any NaN, else inf if any inf."""
        if self.nan:
            return math.nan
        return math.inf if self.nonfinite else self.max_finite

    @property
    def log2_range(self) -> float:
        """log2(max |x| / min non-zero |x|) over finite x, in binades (0 without two magnitudes)."""
        if self.max_finite > 0 and math.isfinite(self.min_nonzero):
            return math.log2(self.max_finite / self.min_nonzero)
        return 0.0

    @property
    def mean(self) -> float:
        """Mean of the finite values (nan if none)."""
        return self.pivot + self.sum1 / self.finite if self.finite else math.nan

    @property
    def variance(self) -> float:
        """Population variance of the finite values (nan if none)."""
        if not self.finite:
            return math.nan
        d = self.sum1 / self.finite
        return max(self.sum2 / self.finite - d * d, 0.0)

    @property
    def kurtosis(self) -> float:
        """E[(x-mu)^4] / E[(x-mu)^2]^2 of the finite values (3 for a Gaussian); nan for
        fewer than two values, a constant tensor, or a spread float64 cannot resolve."""
        n = self.finite
        if n < 2:
            return math.nan
        d, m2raw = self.sum1 / n, self.sum2 / n
        m2 = m2raw - d * d
        if not m2 > _MIN_REL_SPREAD * m2raw:
            return math.nan
        m4 = self.sum4 / n - 4.0 * d * (self.sum3 / n) + 6.0 * d * d * m2raw - 3.0 * d ** 4
        return m4 / (m2 * m2)

    def as_dict(self) -> dict:
        """Every field (hist as a list) and every derived figure."""
        d = dataclasses.asdict(self)
        d["hist"] = list(self.hist)
        d.update(underflow_frac=self.underflow_frac, saturation_frac=self.saturation_frac,
                 overflow_frac=self.overflow_frac, subnormal_frac=self.subnormal_frac, sqnr_db=self.sqnr_db,
                 amax=self.amax, log2_range=self.log2_range, mean=self.mean, variance=self.variance,
                 kurtosis=self.kurtosis)
        return d


def stats_from_list(values: Sequence[float]) -> QuantStats:
    """A QuantStats from the STATS_N numbers of fp8mix_quant_stats' output."""
    if len(values) != STATS_N:
        raise ValueError(f"fp8mix.numerics: expected {STATS_N} statistics, got {len(values)}")
    n = len(FIELDS)
    return QuantStats(**dict(zip(FIELDS, values[:n])), hist=tuple(int(c) for c in values[n:]))


def stats_from_counts(counts: torch.Tensor) -> QuantStats:
    """A QuantStats from the float64 vector ops.quant_stats returns (one host read)."""
    return stats_from_list(counts.tolist())


def measure(x: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor, granularity: Union[str, int], *,
            bad_scale_as_one: bool = False) -> QuantStats:
    """Statistics of the FP8 tensor `q` (torch.float8_*) as the cast of `x` (same shape;
    float32, bfloat16 or float16) with dequantisation factors `scale_inv` laid out for
    `granularity` (a name of fp8mix.formats.GRANULARITIES or its code): one kernel call
    and one host read. bad_scale_as_one: report a scale_inv that is not finite and > 0
    (``bad_scales``) instead of raising."""
    code = GRANULARITIES[granularity] if isinstance(granularity, str) else int(granularity)
    if x.dim() == 0:
        x, q = x.reshape(1), q.reshape(1)
    return stats_from_counts(ops.quant_stats(x, q, scale_inv, code, bad_scale_as_one=bad_scale_as_one))


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
    return measure(x.detach(), t.data, t.scale_inv.detach(), t.granularity)
