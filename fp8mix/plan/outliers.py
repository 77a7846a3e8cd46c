"""What FP8 casts lose on channel-structured inputs (activation outliers), and which cast
fixes it: the planner's outlier rule.

A linear layer's input x[M, K] has *outlier channels* when a few channels (columns) have
an amax far above the others' (trained LLMs: 100-10000x, a handful of channels, which meet
small weight columns). A cast whose scale covers a whole row or tensor fits the outliers
into FP8's range and pushes the other channels down, towards and below E4M3's smallest
normal (2^-6; below it subnormals with a fixed step of 2^-9, then zero), and the weight's
small columns likewise. The whole output's SQNR does not see that when the outliers'
share dominates it. Measured here in float64 on (up to 512 rows of) one batch's input and
the layer's weight, per cast option:

    spread          max channel amax / median channel amax
    outliers        channels with amax >= OUTLIER_SPREAD x the median
    below_normal    the fraction of the non-outlier channels' energy whose scaled values
                    fall below E4M3's smallest normal (subnormal or flushed)
    group SQNR      channels grouped by decade of amax below the largest; each group's
                    share of the output, y_g = x[:, g] W[:, g]^T, against the same share
                    from the cast operands: SQNR_g = |y_g|^2 / |y_g - x^_g W^_g^T|^2;
                    ``worst_group_db`` the lowest over the groups. Per group, because a
                    group whose values the cast flushes contributes little energy to the
                    whole output but is still lost.

Cast options (how x and W would be cast; fp8mix's kernels do the casts, current scales):
"tensor" (x and W per tensor: delayed and current scaling), "row" (x per row, W per row),
"block" (x in 1x128 tiles, W in 128x128 blocks), "mx" (1x32 blocks along K, power-of-two
scales), and "smooth" (per tensor after per-channel smoothing, x * s and W / s:
fp8mix.nn.smooth); each in E4M3, "tensor" / "row" / "block" also in E5M2 (key
"block:E5M2", ...), the formats the candidate recipes use for the forward GEMM.

The rule: a layer whose input has outlier channels and whose chosen recipe's cast leaves a
group below GROUP_SQNR_LIMIT_DB moves to the first fix that passes, in FIX_ORDER (smooth
keeps the recipe and its per-tensor speed; then the finer recipes), or stays in high
precision when none does. Not here: running the model (measure.py) and the search (search.py).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from ..formats import Format, Granularity
from ..nn.smooth import smoothing_scales
from ..quantization import quantize
from .measure import sqnr_db

__all__ = ["ChannelReport", "CastLoss", "assess", "option_key", "OUTLIER_SPREAD", "GROUP_SQNR_LIMIT_DB",
           "FIX_ORDER", "E4M3_MIN_NORMAL", "MAX_ROWS"]

OUTLIER_SPREAD = 100.0
GROUP_SQNR_LIMIT_DB = 20.0  # the planner's SQNR rule (SQNR_LIMIT_DB), applied per channel group
E4M3_MIN_NORMAL = 2.0 ** -6
FIX_ORDER = ("smooth", "row", "block", "mx")
MAX_ROWS = 512  # rows of the input measured (the float64 products are the cost)
_X_GRAN = {"tensor": Granularity.TENSOR, "smooth": Granularity.TENSOR, "row": Granularity.ROW,
           "block": Granularity.BLOCK, "mx": Granularity.MX}
_W_GRAN = {**_X_GRAN, "block": Granularity.BLOCK2D}
_TILE = {"block": 128, "mx": 32}
_OPTIONS = tuple((o, Format.E4M3) for o in ("tensor",) + FIX_ORDER) + tuple(
    (o, Format.E5M2) for o in ("tensor", "row", "block"))


def option_key(option: str, fmt: Format) -> str:
    """The report's key of a cast option in a format: "block", "block:E5M2", ..."""
    return option if fmt is Format.E4M3 else f"{option}:{fmt.name}"


@dataclasses.dataclass
class CastLoss:
    """What one cast option loses: the worst channel group's output SQNR, and the share of
    the non-outlier channels' energy below E4M3's smallest normal after scaling."""

    worst_group_db: float
    below_normal: float

    def text(self) -> str:
        return (f"worst channel-group SQNR {self.worst_group_db:.1f} dB, "
                f"{100 * self.below_normal:.1f}% of the other channels' energy below normal")


@dataclasses.dataclass
class ChannelReport:
    """One layer's input: its channel structure and what each cast option loses."""

    spread: float
    outliers: int
    channels: int
    loss: dict  # option_key -> CastLoss

    @property
    def has_outliers(self) -> bool:
        return self.outliers > 0

    def passes(self, key: str) -> bool:
        c = self.loss.get(key)
        return c is not None and c.worst_group_db >= GROUP_SQNR_LIMIT_DB

    def describe(self) -> str:
        return f"{self.outliers} outlier channel(s) of {self.channels}, spread {self.spread:.3g}x"


def _per_element_scale(t, shape, option: str) -> torch.Tensor:
    """The scale (1 / scale_inv) of every element of a cast's Float8Tensor t."""
    sinv = t.scale_inv.double()
    m, k = shape
    if t.granularity == Granularity.TENSOR:
        return 1.0 / sinv.reshape(()).expand(m, k)
    if t.granularity == Granularity.ROW:
        return 1.0 / sinv.reshape(-1, 1).expand(m, k)
    rep = torch.repeat_interleave(sinv.reshape(m, -1), _TILE[option], dim=1)[:, :k]
    return 1.0 / rep


def _groups(amax: torch.Tensor) -> list:
    """Index tensors of the channels by decade of amax below the largest (nonzero ones)."""
    idx = torch.nonzero(amax > 0).flatten()
    if idx.numel() == 0:
        return []
    dec = torch.floor(torch.log10(float(amax[idx].max()) / amax[idx])).long()
    return [idx[dec == d] for d in torch.unique(dec).tolist()]


def _worst_group(xd, wd, xq, wq, groups) -> float:
    worst = math.inf
    for g in groups:
        y = xd[:, g] @ wd[:, g].t()
        v = sqnr_db(float(y.pow(2).sum()), float((y - xq[:, g] @ wq[:, g].t()).pow(2).sum()))
        if not math.isnan(v):
            worst = min(worst, v)
    return worst


def _cast_back(t2: torch.Tensor, option: str, fmt: Format, weight: bool):
    g = (_W_GRAN if weight else _X_GRAN)[option]
    t = quantize(t2.contiguous(), fmt, granularity=g)
    return t, t.dequantize(torch.float32).double()


def assess(x2: torch.Tensor, weight: torch.Tensor, *, fixed_weight: bool = False, options=_OPTIONS,
           alpha: float = 0.5) -> ChannelReport:
    """The ChannelReport of input x2 [M, K] (float32/bf16/fp16) and weight [N, K] under each
    (cast option, format) of `options` (keys: option_key). fixed_weight: the weight is an FP8
    primary weight (its value is what the GEMM uses: not cast again, not smoothed)."""
    x2 = x2.detach()[:MAX_ROWS].float().contiguous()
    w = weight.detach().float().contiguous()
    xd, wd = x2.double(), w.double()
    amax = xd.abs().amax(dim=0)
    nz = amax[amax > 0]
    med = float(nz.median()) if nz.numel() else 0.0
    out_mask = amax >= OUTLIER_SPREAD * med if med > 0 else torch.zeros_like(amax, dtype=torch.bool)
    keep = ~out_mask
    groups = _groups(amax)
    energy = float(xd[:, keep].pow(2).sum())
    loss = {}
    for opt, fmt in options:
        if opt == "smooth" and fixed_weight:
            continue
        s = smoothing_scales(x2, w, alpha) if opt == "smooth" else torch.ones(x2.shape[1])
        t, xq = _cast_back(x2 * s, opt, fmt, weight=False)
        scaled = (xd * s.double()).abs() * _per_element_scale(t, x2.shape, opt)
        below = float(xd[(scaled < E4M3_MIN_NORMAL) & keep].pow(2).sum()) / energy if energy > 0 else 0.0
        wq = wd if fixed_weight else _cast_back(w / s, opt, fmt, weight=True)[1] * s.double()
        loss[option_key(opt, fmt)] = CastLoss(_worst_group(xd, wd, xq / s.double(), wq, groups), below)
    spread = float(amax.max()) / med if med > 0 else math.nan
    return ChannelReport(spread=spread, outliers=int(out_mask.sum()), channels=int(x2.shape[1]), loss=loss)
