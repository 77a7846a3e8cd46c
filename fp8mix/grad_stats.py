"""Counts from the FP8 gradient casts: the feedback FP8GradScaler reads.

A :class:`GradStats` collects, while it is active, the statistics of every grad_output
cast of fp8mix's layers' backward passes: how many elements were cast, how many were
non-zero, how many non-zero finite values flushed to zero (underflow), how many landed
on the format's largest magnitude (saturated), how many were beyond it after scaling
(overflow, clipped) and how many were inf/NaN. Each FP8GradScaler owns one and activates
it on its sampled iterations. The counts stay tensors on the gradients' device while
they accumulate (no host sync in backward); :meth:`GradStats.pop` reads them once per
optimizer step.

The only process-wide thing is the list of active collectors (weakly held), which the
layers' backward passes report to: :func:`active`, :func:`add`, :func:`enabled`.
"""
from __future__ import annotations

import threading
import weakref
from typing import Optional

import torch

__all__ = ["GradStats", "active", "add", "enabled", "FIELDS"]

# Order of the count vector: the first entries of fp8mix.ops.quant_stats' output.
FIELDS = ("numel", "nonzero", "underflow", "saturated", "nonfinite", "overflow")
_N = len(FIELDS)
_NONZERO, _NONFINITE, _OVERFLOW = FIELDS.index("nonzero"), FIELDS.index("nonfinite"), FIELDS.index("overflow")

_lock = threading.Lock()
_active: "weakref.WeakSet[GradStats]" = weakref.WeakSet()


class GradStats:
    """One consumer's sum of gradient-cast counts (see the module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: Optional[torch.Tensor] = None
        self._max_overflow: Optional[torch.Tensor] = None  # the largest overflow fraction of one cast

    def __reduce__(self):  # a copy (pickle, deepcopy) starts empty and inactive
        return (GradStats, ())

    def activate(self) -> None:
        """Start receiving the counts of gradient casts (idempotent)."""
        with _lock:
            _active.add(self)

    def deactivate(self) -> None:
        """Stop receiving counts (what was received stays until pop())."""
        with _lock:
            _active.discard(self)

    @property
    def is_active(self) -> bool:
        with _lock:
            return self in _active

    def add(self, counts: torch.Tensor) -> None:
        """Add one cast's counts (a float64 tensor whose first len(FIELDS) entries follow
        FIELDS). Tensor ops only: no host read."""
        c = counts.detach()[:_N].to(torch.float64)
        frac = (c[_OVERFLOW] + c[_NONFINITE]) / torch.clamp(c[_NONZERO], min=1.0)
        with self._lock:
            self._counts = c.clone() if self._counts is None else self._counts + c.to(self._counts.device)
            self._max_overflow = frac if self._max_overflow is None else torch.maximum(
                self._max_overflow, frac.to(self._max_overflow.device))

    def pop(self) -> Optional[dict]:
        """The counts added since the last pop, as a dict of floats (None if nothing was
        added), plus ``underflow_frac`` and ``overflow_frac`` of the non-zero values (pooled
        over the casts) and ``max_overflow_frac``, the largest overflow fraction of a single
        cast (one layer's clipped gradients would vanish in the pooled figure). One host read."""
        with self._lock:
            c, self._counts = self._counts, None
            mo, self._max_overflow = self._max_overflow, None
        if c is None or mo is None:
            return None
        vals = torch.cat([c.cpu(), mo.reshape(1).cpu()]).tolist()
        d = dict(zip(FIELDS, vals[:_N]))
        nz = max(d["nonzero"], 1.0)
        d["underflow_frac"] = d["underflow"] / nz
        d["overflow_frac"] = (d["overflow"] + d["nonfinite"]) / nz
        d["max_overflow_frac"] = vals[_N]
        return d


def active() -> list:
    """The collectors receiving counts now."""
    with _lock:
        return list(_active)


def enabled() -> bool:
    """Whether any collector is receiving counts (layers skip the counting otherwise).
    Read without the lock (once per layer backward): a list's length is read atomically, and
    a collector that starts or stops during a backward pass sees that pass in part either way."""
    return len(_active) > 0


def add(counts: torch.Tensor) -> None:
    """Hand one cast's counts to every active collector."""
    for c in active():
        c.add(counts)
