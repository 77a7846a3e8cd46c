"""Reports over Monitor records: the records grouped by (layer, role) and step, as the
plots and the markdown summary read them, and the summary table itself."""
from __future__ import annotations

import math

from .fields import role_key

__all__ = ["series", "summary"]


def series(records: list) -> dict:
    """(layer, role) -> {step: [rows of that step]}; layers in order of first appearance,
    then roles as input, weight, grad_output, others by name."""
    out: dict = {}
    for r in records:
        out.setdefault((r["layer"], r["role"]), {}).setdefault(r["step"], []).append(r)
    first: dict = {}
    for layer, _ in out:
        first.setdefault(layer, len(first))
    return dict(sorted(out.items(), key=lambda kv: (first[kv[0][0]], role_key(kv[0][1]))))


def g(v: float, spec: str = ".4g") -> str:
    """A number for a table: formatted when finite, else its name (nan, inf)."""
    return format(v, spec) if isinstance(v, (int, float)) and math.isfinite(v) else str(v)


def summary(records: list, events: list, n_alerts: int, step: int, every: int, seconds: float) -> str:
    """A markdown table: per layer and role, its latest record (and its latest note)."""
    by_key = series(records)
    if not by_key:
        return f"fp8mix.Monitor: no records (step {step}, every {every})\n"
    notes: dict = {}
    for e in events:
        notes[(e["layer"], e["role"])] = f"{e['key']}: {e['value']}"
    head = ["layer", "role", "step", "fmt", "amax", "scale", "underflow %", "overflow %", "SQNR dB", "kurtosis"]
    if notes:
        head.append("note")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (layer, role), by_step in by_key.items():
        r = by_step[max(by_step)][-1]
        cells = [layer, role, str(r["step"]), r["fmt"], g(r["amax"]), g(r["scale"]), g(100 * r["underflow_frac"]),
                 g(100 * r["overflow_frac"]), g(r["sqnr_db"], ".1f"), g(r["kurtosis"], ".2f")]
        if notes:
            cells.append(notes.get((layer, role), ""))
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines.append(f"{len(records)} records over {len({r['step'] for r in records})} sampled steps "
                 f"(every {every}); {n_alerts} warnings; {seconds:.3f} s in record()")
    return "\n".join(lines) + "\n"
