"""Format.AUTO: choose E4M3 or E5M2 per layer and tensor role from what each would lose.

On an evaluated use of a role, the tensor is cast both ways with its amax scale
(margin and power-of-two rule of the recipe) and fp8mix_quant_stats measures, for
each format, the fraction of non-zero values lost (flushed to zero or clipped), the
SQNR and the dynamic range (fp8mix.numerics.QuantStats). The preference of that evaluation:

* **range first**: if E4M3 would lose more than ``range_tolerance`` of the non-zero
  values and E5M2 loses less than half as many, E5M2 (the tensor's dynamic range,
  log2(amax / min non-zero), exceeds E4M3's ~17.8 binades);
* **else precision**: the format with the higher SQNR (E4M3 for nearly every tensor
  whose range fits: one more mantissa bit is ~6 dB).

Warm-up: the first ``warmup`` uses of a role are all evaluated and the majority
decides (ties keep HYBRID's assignment: E4M3 forward, E5M2 gradients). After that a
role is re-evaluated every ``interval`` uses and switches only after ``patience``
consecutive evaluations preferring the other format (hysteresis), so it cannot flip
every step. Each decision keeps its reason (``Linear.fp8_format_report()``).

The state of each role is 5 integers, kept in the layer's ``fp8_auto`` buffer so a
resumed run decides exactly as an uninterrupted one:
``[format (0 E4M3, 1 E5M2), uses, votes for E4M3, votes for E5M2, streak]``.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from . import ops
from .formats import Format, fp8_dtype
from .numerics import QuantStats, stats_from_list

__all__ = ["AutoFormat", "evaluate", "prefer", "due", "tick", "vote", "STATE_LEN"]

STATE_LEN = 5
_FMT, _USES, _V4, _V5, _STREAK = range(STATE_LEN)
CODES = (Format.E4M3, Format.E5M2)


@dataclasses.dataclass(frozen=True)
class AutoFormat:
    """Policy of Format.AUTO (the ``auto`` field of every recipe).

    Args:
        warmup: uses of a role evaluated before the first decision (all of them).
        interval: after warm-up, evaluate a role every this many uses.
        patience: consecutive evaluations preferring the other format needed to switch.
        range_tolerance: fraction of non-zero values E4M3 may lose (underflow + clip)
            before E5M2 is preferred for range.
    """

    warmup: int = 8
    interval: int = 50
    patience: int = 3
    range_tolerance: float = 0.01

    def __post_init__(self):
        for name in ("warmup", "interval", "patience"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"AutoFormat.{name} must be an int >= 1, got {v!r}")
        t = self.range_tolerance
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) < 1.0:
            raise ValueError(f"AutoFormat.range_tolerance must be in [0, 1), got {t!r}")


def evaluate(x2: torch.Tensor, granularity: int, margin: int, power_2_scale: bool, tolerance: float):
    """Cast x2 (2-D) as E4M3 and as E5M2 with current scales, measure both with
    fp8mix_quant_stats (one host read for the two), and return prefer()'s (Format, reason)."""
    counts = []
    for fmt in CODES:
        q, _, sinv, _ = ops.quantize_current(x2, fp8_dtype(fmt), granularity=granularity, margin=margin,
                                             power_2_scale=power_2_scale)
        counts.append(ops.quant_stats(x2, q, sinv, granularity))
    s4, s5 = (stats_from_list(v) for v in torch.stack(counts).tolist())
    return prefer(s4, s5, tolerance)


def prefer(s4: QuantStats, s5: QuantStats, tolerance: float):
    """(Format, reason) that one evaluation prefers; see the module docstring."""
    lost4 = s4.underflow_frac + s4.overflow_frac
    lost5 = s5.underflow_frac + s5.overflow_frac
    rng = s4.log2_range
    if lost4 > tolerance and lost5 < 0.5 * lost4:
        return Format.E5M2, (f"range: E4M3 would lose {100 * lost4:.2f}% of values, E5M2 {100 * lost5:.2f}% "
                             f"(dynamic range 2^{rng:.1f})")
    if s4.sqnr_db >= s5.sqnr_db or math.isnan(s5.sqnr_db):
        return Format.E4M3, (f"precision: SQNR E4M3 {s4.sqnr_db:.1f} dB vs E5M2 {s5.sqnr_db:.1f} dB, "
                             f"E4M3 loses {100 * lost4:.2f}% (dynamic range 2^{rng:.1f})")
    return Format.E5M2, f"precision: SQNR E5M2 {s5.sqnr_db:.1f} dB vs E4M3 {s4.sqnr_db:.1f} dB"


def due(state: list, policy: AutoFormat) -> bool:
    """Whether the next use of a role (state: its ints) is evaluated."""
    uses = state[_USES]
    return uses < policy.warmup or (uses - policy.warmup) % policy.interval == policy.interval - 1


def tick(state: list) -> int:
    """Count one use of a role; returns its index (0 for the first use)."""
    state[_USES] += 1
    return state[_USES] - 1


def vote(state: list, use: int, choice: Format, policy: AutoFormat) -> bool:
    """Fold the preference of the evaluation of use number `use` into state.
    Mutates state; True when the role's format changed."""
    code = CODES.index(choice)
    if use < policy.warmup:
        state[_V4 + code] += 1
        if state[_V4] + state[_V5] == policy.warmup and state[_V4] != state[_V5]:
            new = 0 if state[_V4] > state[_V5] else 1
            changed = new != state[_FMT]
            state[_FMT] = new
            return changed
        return False
    if code == state[_FMT]:
        state[_STREAK] = 0
        return False
    state[_STREAK] += 1
    if state[_STREAK] >= policy.patience:
        state[_FMT], state[_STREAK] = code, 0
        return True
    return False


def initial_state(default: Format) -> list:
    return [CODES.index(default), 0, 0, 0, 0]


def current(state: list) -> Format:
    return CODES[state[_FMT]]
