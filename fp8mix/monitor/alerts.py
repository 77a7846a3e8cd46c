"""Alerts of the numerics monitor: which problems a record shows (overflow, underflow,
NaN/inf, a bad scale) and the rate limit that keeps a persistent problem from flooding
the log. Pure functions of a record and the warning clock; the Monitor holds the state
and emits the warnings."""
from __future__ import annotations

from typing import Optional


class NumericsWarning(UserWarning):
    """An FP8 cast overflowed, underflowed, met a NaN/inf or a bad scale (fp8mix.Monitor)."""


def problems(row: dict, bad_scale: bool, overflow_warn: Optional[float], underflow_warn: Optional[float]) -> list:
    """(kind, message) for every problem `row` shows, in a fixed order."""
    found = []
    where = f"layer {row['layer']!r} {row['role']} (step {row['step']}, {row['fmt']}"
    if row["nonfinite"]:
        found.append(("nonfinite", f"{where}): {row['nonfinite']} non-finite values "
                                   f"({row['nan']} NaN, {row['nonfinite'] - row['nan']} inf) of {row['numel']}"))
    if bad_scale:
        found.append(("scale", f"{where}): scale_inv not finite and positive; counts use 1 there"))
    if overflow_warn is not None and row["overflow_frac"] > overflow_warn:
        found.append(("overflow", f"{where}): {100 * row['overflow_frac']:.3g}% of non-zero values overflowed "
                                  f"(clipped to max or not finite; threshold {100 * overflow_warn:.3g}%), "
                                  f"amax {row['amax']:.4g}, scale {row['scale']:.4g}"))
    if underflow_warn is not None and row["underflow_frac"] > underflow_warn:
        found.append(("underflow", f"{where}): {100 * row['underflow_frac']:.3g}% of non-zero values "
                                   f"underflowed to 0 (threshold {100 * underflow_warn:.3g}%), "
                                   f"log2 range {row['log2_range']:.1f} binades"))
    return found


def rate_limited(found: list, row: dict, last_warned: dict, interval: int) -> list:
    """The alerts (dicts step, layer, role, kind, message) of `found` that the clock lets
    through: each (layer, role, kind) at most once per `interval` steps. Updates
    `last_warned` ((layer, role, kind) -> step of the last warning)."""
    out = []
    for kind, msg in found:
        key = (row["layer"], row["role"], kind)
        last = last_warned.get(key)
        if last is not None and row["step"] - last < interval:
            continue
        last_warned[key] = row["step"]
        out.append({"step": row["step"], "layer": row["layer"], "role": row["role"], "kind": kind,
                    "message": "fp8mix: " + msg})
    return out
