"""The demo's figures (matplotlib is optional: without it no PNG is written).

- ``loss_curves.png``: training (lightly smoothed) and validation curves of every run of
  the first seed, and each variant's validation loss vs float32 in percent;
- ``val_gap.png``: the paired gap to float32 over seeds: left, the gap at every
  validation step (mean over seeds, shaded 95% interval); right, the final gap per
  variant (one dot per seed, mean with its 95% interval), zero line and +-0.25% band.
"""
from __future__ import annotations

import math

from .paired import TARGET_PCT, paired_gap

__all__ = ["have_matplotlib", "plot_curves", "plot_gaps"]


def have_matplotlib() -> bool:
    """Whether matplotlib can be imported."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _smooth(v: list) -> list:
    """Running mean over ~2% of the run."""
    k = max(1, len(v) // 50)
    return [sum(v[max(0, j - k + 1): j + 1]) / len(v[max(0, j - k + 1): j + 1]) for j in range(len(v))]


def plot_curves(path: str, cfg, results: list) -> None:
    """loss_curves.png from the runs of the first seed in `results`."""
    plt = _pyplot()
    first = results[0]["seed"] if results else None
    runs = [r for r in results if r["seed"] == first]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    ref = dict(next((r["val_curve"] for r in runs if r["run"] == "fp32"), []))
    for i, r in enumerate(runs):
        color = f"C{i}"
        if r["train_curve"]:
            s, v = zip(*r["train_curve"])
            ax.plot(s, _smooth(list(v)), color=color, alpha=0.5, lw=1, label=f"{r['run']} train")
        if r["val_curve"]:
            s, v = zip(*r["val_curve"])
            ax.plot(s, v, color=color, marker="o", ms=3, lw=1.5, label=f"{r['run']} val")
            pts = [(k, 100.0 * (x - ref[k]) / ref[k]) for k, x in r["val_curve"] if k in ref and ref[k]]
            if pts and r["run"] != "fp32":
                ax2.plot(*zip(*pts), color=color, marker="o", ms=3, label=r["run"])
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    seed = "" if len(runs) == len(results) else f", seed {first}"
    ax.set_title(f"fp8mix demo: GPT {cfg.layers}x{cfg.d_model}, seq {cfg.seq_len}, batch {cfg.batch_size}{seed}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    ax2.axhline(0.0, color="k", lw=0.8)
    ax2.axhspan(-1.0, 1.0, color="0.9", zorder=0)
    ax2.set_xlabel("step")
    ax2.set_ylabel("val loss vs float32 (%)")
    ax2.set_title("difference from float32 (grey: within 1%)")
    ax2.grid(alpha=0.3)
    if ax2.lines[1:]:
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gap_curve(results: list, variant: str, seeds: list) -> list:
    """(step, mean gap %, half-width) at every validation step all compared seeds share."""
    ref = {r["seed"]: dict(r["val_curve"]) for r in results if r["run"] == "fp32" and not r["diverged"]}
    oth = {r["seed"]: dict(r["val_curve"]) for r in results if r["run"] == variant and not r["diverged"]}
    both = [s for s in seeds if s in ref and s in oth]
    if not both:
        return []
    steps = sorted(set.intersection(*(set(ref[s]) & set(oth[s]) for s in both)))
    pts = []
    for k in steps:
        g = paired_gap(variant, [ref[s][k] for s in both], [oth[s][k] for s in both])
        if g.n:
            pts.append((k, g.mean, 0.0 if math.isnan(g.half95) else g.half95))
    return pts


def plot_gaps(path: str, results: list, gaps: dict, seeds: list) -> None:
    """val_gap.png: the gap to float32 over steps and at the end, with 95% intervals."""
    plt = _pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    for i, (v, g) in enumerate(gaps.items()):
        color = f"C{i + 1}"  # C0 is float32's color in loss_curves.png
        pts = _gap_curve(results, v, seeds)
        if pts:
            s, m, h = zip(*pts)
            ax.plot(s, m, color=color, marker="o", ms=3, label=v)
            ax.fill_between(s, [a - b for a, b in zip(m, h)], [a + b for a, b in zip(m, h)], color=color, alpha=0.2)
        ax2.plot([i] * g.n, list(g.diffs), "o", color=color, alpha=0.4, ms=4)
        if g.n >= 2:
            ax2.errorbar([i], [g.mean], yerr=[g.half95], fmt="s", color=color, capsize=6, ms=7)
        elif g.n == 1:
            ax2.plot([i], [g.mean], "s", color=color, ms=7)
    for a in (ax, ax2):
        a.axhline(0.0, color="k", lw=0.8)
        a.axhspan(-TARGET_PCT, TARGET_PCT, color="0.9", zorder=0)
        a.grid(alpha=0.3)
        a.set_ylabel("val loss vs float32 (%)")
    ax.set_xlabel("step")
    ax.set_title(f"gap to float32 over {len(seeds)} seed(s): mean, shaded 95% interval")
    if ax.lines[1:]:
        ax.legend(fontsize=8)
    ax2.set_xticks(range(len(gaps)))
    ax2.set_xticklabels(list(gaps), fontsize=8)
    ax2.set_xlim(-0.7, max(len(gaps), 1) - 0.3)
    ax2.set_title(f"final gap: seeds (dots), mean +- 95% (grey: +-{TARGET_PCT}%)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
