"""Experiment 12: the recipes side by side — bf16, FP8 (delayed, block, MX) and NVFP4.

The byte-level GPT trained with every recipe fp8mix has, from the same initial weights on
the same batches, over 3 seeds at one learning rate. Gaps are paired per seed against the
float32 run (and against bf16 autocast), with 95% confidence intervals from Student's t
(n - 1 degrees of freedom). NVFP4 is Transformer Engine's NVFP4BlockScaling (1x16 E2M1
blocks with E4M3 scales, 16x16 weight tiles, stochastically rounded gradients, the random
Hadamard transform on the weight gradient's operands) on the C core's scalar NVFP4 GEMM;
every Linear of the model (the head included) runs in it (``keep_last_layers_hp=0``: the
recipe's default since keeps the last 15% of the layers in high precision), so this is the
harsh case the paper's "keep the last layers in high precision" rule avoids.
"""
from __future__ import annotations

import math
import statistics
import time

import common as C

from fp8mix.recipe import BlockScaling, DelayedScaling, MXFP8BlockScaling, NVFP4BlockScaling

SEEDS = (0, 1, 2)
LR = 3e-3
# Student's t at 97.5% for n - 1 = 1..9 degrees of freedom
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def variants():
    return [C.FP32, C.Variant("bf16 autocast", "bf16", cache="bf16"),
            C.Variant("FP8 delayed (HYBRID)", "recipe", recipe=DelayedScaling(), monitor_every=0),
            C.Variant("FP8 block 1x128 / 128x128", "recipe", recipe=BlockScaling(), monitor_every=0),
            C.Variant("MXFP8 1x32", "recipe", recipe=MXFP8BlockScaling(), monitor_every=0),
            C.Variant("NVFP4 (RHT, SR, 2-D weights)", "recipe", recipe=NVFP4BlockScaling(keep_last_layers_hp=0),
                      monitor_every=0)]


def gap(runs, ref) -> tuple:
    """(mean, half-width of the 95% interval, n) of the paired relative gap in %."""
    d = [x for x in C.rel_diffs(runs, ref) if math.isfinite(x)]
    if len(d) < 2:
        return (d[0] if d else math.nan), math.nan, len(d)
    return statistics.mean(d), _T975[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d)), len(d)


def fmt_gap(g: tuple) -> str:
    mean, hw, n = g
    if not math.isfinite(mean):
        return "–"
    return f"{mean:+.2f} ± {hw:.2f}" if math.isfinite(hw) else f"{mean:+.2f}"


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    gpt = C.gpt_task()
    res = C.sweep(gpt, variants(), m, seeds=SEEDS, lrs=(LR,), label="exp12 ")
    secs = {k: statistics.mean(r.seconds for r in v) for k, v in res.items()}

    def metrics(name, runs):
        return {"gap vs fp32 %, 95% CI": fmt_gap(gap(runs, res["fp32"])),
                "gap vs bf16 %, 95% CI": fmt_gap(gap(runs, res["bf16 autocast"])),
                "s / run": f"{secs[name]:.1f}"}
    rows = C.summarize(res, metrics=metrics)
    fig, ax = C.figure(1)
    C.plot_losses(ax[0][0], res, "GPT: loss by recipe", ylim=(1.8, 4.0))
    plot = C.save(fig, "exp12_recipes.png")

    gaps = {k: gap(v, res["fp32"]) for k, v in res.items() if k != "fp32"}
    apart = [k for k, g in gaps.items() if math.isfinite(g[1]) and abs(g[0]) > g[1]]
    widths = [g[1] for g in gaps.values() if math.isfinite(g[1])]
    g4 = gaps["NVFP4 (RHT, SR, 2-D weights)"]
    verdict = (("**No recipe's gap to float32 is distinguishable from zero with 3 seeds** (every 95% interval "
                f"contains 0; half-widths {min(widths):.1f} to {max(widths):.1f} points)") if not apart else
               ("**Gaps distinguishable from zero: " + ", ".join(f"{k} {fmt_gap(gaps[k])}%" for k in apart) + "**"))
    verdict += (f"; NVFP4, every layer in 4 bits, ends {fmt_gap(g4)}% from float32: at this size and length its "
                "cost, if any, hides in the seed-to-seed spread. Intervals are 95% Student-t over the paired seeds; "
                "the s / run column is wall time on a shared machine (NVFP4 and MX run scalar GEMMs).")
    body = "\n".join([
        f"GPT: {gpt.desc}. Runs: {C.runs_text(m, seeds=SEEDS, lrs=(LR,))}. Every variant from the same initial "
        "weights on the same batches; gaps are 100 (L - L_ref) / L_ref of the final loss (mean of the last 10% "
        "of steps), paired per seed, mean ± the 95% half-width.", "", C.md_table(rows), f"![exp12]({plot})", "",
        verdict, ""])
    return C.Section(12, "Recipes side by side: bf16, FP8 (delayed, block, MX), NVFP4", body, rows, [plot],
                     time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
