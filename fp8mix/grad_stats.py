"""Counts from the FP8 gradient casts, the feedback FP8GradScaler reads.

While collection is on (``enable(True)``; FP8GradScaler turns it on), every
fp8mix.Linear backward adds the statistics of its grad_output cast here:
how many elements it cast, how many were non-zero, how many non-zero finite
values flushed to zero (underflow), how many landed on the format's largest
magnitude (saturated), how many were beyond it after scaling (overflow, clipped),
and how many were inf/NaN. The counts stay tensors (no host
sync in backward); ``pop()`` reads and clears them once per optimizer step.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

__all__ = ["enable", "enabled", "add", "pop", "FIELDS"]

# Order of the count vector: the first entries of fp8mix.ops.quant_stats' output.
FIELDS = ("numel", "nonzero", "underflow", "saturated", "nonfinite", "overflow")

_lock = threading.Lock()
_enabled = 0  # a count, so that two scalers (or nested users) can share it
_counts: Optional[torch.Tensor] = None
_max_overflow = 0.0  # the largest overflow fraction of one cast since the last pop()


def enable(on: bool) -> None:
    """Turn collection on (True) or release one earlier enable(True) (False)."""
    global _enabled, _counts, _max_overflow
    with _lock:
        _enabled = _enabled + 1 if on else max(0, _enabled - 1)
        if not _enabled:
            _counts, _max_overflow = None, 0.0


def enabled() -> bool:
    return _enabled > 0


def add(counts: torch.Tensor) -> None:
    """Add one cast's counts (a float64 tensor whose first len(FIELDS) entries follow FIELDS)."""
    global _counts, _max_overflow
    if not _enabled:
        return
    c = counts.detach()[: len(FIELDS)].to(device="cpu", dtype=torch.float64)
    nz, ovf, nonfin = float(c[1]), float(c[5]), float(c[4])
    frac = (ovf + nonfin) / nz if nz else 0.0
    with _lock:
        _counts = c.clone() if _counts is None else _counts + c
        _max_overflow = max(_max_overflow, frac)


def pop() -> Optional[dict]:
    """The counts added since the last pop, as a dict of floats (None if nothing was
    added), plus ``underflow_frac`` and ``overflow_frac`` of the non-zero values (pooled
    over the casts) and ``max_overflow_frac``, the largest overflow fraction of a single
    cast (one layer's clipped gradients would vanish in the pooled figure)."""
    global _counts, _max_overflow
    with _lock:
        c, _counts = _counts, None
        mo, _max_overflow = _max_overflow, 0.0
    if c is None:
        return None
    d = dict(zip(FIELDS, c.tolist()))
    nz = max(d["nonzero"], 1.0)
    d["underflow_frac"] = d["underflow"] / nz
    d["overflow_frac"] = (d["overflow"] + d["nonfinite"]) / nz
    d["max_overflow_frac"] = mo
    return d
