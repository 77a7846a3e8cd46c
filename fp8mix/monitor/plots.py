"""PNG plots of Monitor records (matplotlib's object API, no pyplot: no global backend
or figure state): amax, SQNR and flush/clip percentages over steps, one panel per tensor
role, and each role's latest log2|x*scale| histograms against the FP8 formats' ranges."""
from __future__ import annotations

import math
import os
from typing import Callable

from .fields import FP8_RANGES, role_key
from .report import series as group

__all__ = ["plot"]


def _colours(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20" if n <= 20 else "viridis"]
    return [cmap(i if n <= 20 else i / max(n - 1, 1)) for i in range(n)]


def _legend(fig, axes, n_layers: int) -> None:
    if n_layers > 16:  # unreadable; the CSV has the names
        return
    for row in axes:
        for ax in row:
            if ax.has_data():
                ax.legend(fontsize=7)
                return


def _steps_text(steps: set) -> str:
    return ", ".join(str(s) for s in sorted(steps)) if len(steps) <= 3 else f"{min(steps)}..{max(steps)}"


class _Canvas:
    """What every figure of one plot() call shares: the grouped records, the roles and
    layers in report order, their colours, and where the PNGs go."""

    def __init__(self, by_key: dict, out_dir: str):
        from matplotlib.figure import Figure

        self.Figure = Figure
        self.series = by_key
        self.roles = sorted({role for _, role in by_key}, key=role_key)
        self.layers = list(dict.fromkeys(layer for layer, _ in by_key))
        self.colours = _colours(len(self.layers))
        self.out_dir = out_dir
        self.paths: list = []

    def save(self, fig, name: str) -> None:
        p = os.path.join(self.out_dir, name)
        fig.savefig(p, dpi=90)
        self.paths.append(p)


def _panel(c: _Canvas, ax, role: str, value_of: Callable, panel: str) -> None:
    """One line per layer: value_of(panel, rows of a step) over the sampled steps."""
    for li, layer in enumerate(c.layers):
        by_step = c.series.get((layer, role))
        if not by_step:
            continue
        pts = [(s, value_of(panel, rs)) for s, rs in sorted(by_step.items())]
        pts = [(s, v) for s, v in pts if math.isfinite(v)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", ms=3, lw=1, color=c.colours[li],
                    label=layer)


def _per_role(c: _Canvas, fname: str, panels: list, ylabel_of: Callable, value_of: Callable, logy: bool) -> None:
    """A figure of len(panels) rows x one column per role."""
    fig = c.Figure(figsize=(5.0 * len(c.roles), 3.6 * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), len(c.roles), squeeze=False)
    for pi, panel in enumerate(panels):
        for ri, role in enumerate(c.roles):
            ax = axes[pi][ri]
            _panel(c, ax, role, value_of, panel)
            if logy and ax.has_data():
                ax.set_yscale("log")
            elif not logy and panel != "sqnr":
                ax.set_ylim(bottom=0)
            ax.set_title(f"{role}", fontsize=9)
            ax.set_xlabel("step")
            ax.set_ylabel(ylabel_of(panel))
            ax.grid(alpha=0.3)
    _legend(fig, axes, len(c.layers))
    c.save(fig, fname)


def _hist_role(c: _Canvas, role: str, hist_bins: int, hist_range: tuple) -> None:
    """``hist_<role>.png``: each layer's latest histogram, as fractions of its non-zero values."""
    lo, hi = hist_range
    w = (hi - lo) / hist_bins
    edges = [lo + i * w for i in range(hist_bins + 1)]
    fig = c.Figure(figsize=(8.0, 4.2), layout="constrained")
    ax = fig.subplots()
    for name, colour in (("E5M2", "tab:orange"), ("E4M3", "tab:blue")):
        mn, mnorm, mx = FP8_RANGES[name]
        ax.axvspan(math.log2(mn), math.log2(mnorm), color=colour, alpha=0.07)
        ax.axvspan(math.log2(mnorm), math.log2(mx), color=colour, alpha=0.15,
                   label=f"{name} [2^{math.log2(mn):.0f}, {mx:g}] (pale: subnormal)")
    steps = set()
    for li, layer in enumerate(c.layers):
        by_step = c.series.get((layer, role))
        if not by_step:
            continue
        s = max(by_step)
        h = [sum(col) for col in zip(*(r["hist"] for r in by_step[s]))]
        n = sum(h)
        if not n:
            continue
        steps.add(s)
        ax.stairs([v / n for v in h], edges, color=c.colours[li], label=f"{layer} ({by_step[s][-1]['fmt']})")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("log2 |x * scale|  (FP8 units; first/last bin hold everything beyond)")
    ax.set_ylabel("fraction of non-zero values")
    ax.set_title(f"{role}: latest sample per layer (step {_steps_text(steps)})", fontsize=9)
    ax.grid(alpha=0.3)
    if len(c.layers) <= 16:
        ax.legend(fontsize=7, loc="upper left")
    c.save(fig, f"hist_{role}.png")


def plot(records: list, hist_bins: int, hist_range: tuple, out_dir: str) -> list:
    """Write ``amax.png``, ``sqnr.png``, ``flush.png`` and ``hist_<role>.png`` (when
    hist_bins) for `records` to `out_dir`; returns their paths (none for no records)."""
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError as e:
        raise ImportError(f"fp8mix.Monitor.plot needs matplotlib (pip install matplotlib): {e}") from None
    by_key = group(records)
    if not by_key:
        return []
    os.makedirs(out_dir, exist_ok=True)
    c = _Canvas(by_key, out_dir)
    _per_role(c, "amax.png", ["amax"], lambda _: "amax (max over calls)", lambda _, rs: max(r["amax"] for r in rs),
              logy=True)
    _per_role(c, "sqnr.png", ["sqnr"], lambda _: "SQNR dB (worst call)", lambda _, rs: min(r["sqnr_db"] for r in rs),
              logy=False)
    _per_role(c, "flush.png", ["underflow_frac", "overflow_frac"],
              lambda k: ("underflow" if k.startswith("under") else "overflow") + " % of non-zero",
              lambda k, rs: 100 * max(r[k] for r in rs), logy=False)
    if hist_bins:
        for role in c.roles:
            _hist_role(c, role, hist_bins, hist_range)
    return c.paths
