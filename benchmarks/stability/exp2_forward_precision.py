"""Experiment 2: E5M2 or unscaled E4M3 in the forward pass loses precision.

Forward tensors (input, weight) cast as E4M3 or E5M2, amax-scaled (fp8mix CurrentScaling
HYBRID / E5M2) or with scale 1 (ablation-only FakeQuantLinear). Gradients are E5M2
amax-scaled in every FP8 row, so only the forward cast differs. bfloat16 autocast is the
yardstick (DeepSeek-V3 compares FP8 against BF16).
"""
from __future__ import annotations

import time

import common as C
import torch

import fp8mix


def variants():
    g = C.Q(C.E5M2)  # gradients: E5M2, amax-scaled (as HYBRID)
    return [
        C.FP32,
        C.Variant("bf16 autocast (yardstick)", "bf16", cache="bf16"),
        C.Variant("E4M3 fwd, amax-scaled (CurrentScaling HYBRID)", "recipe",
                  recipe=fp8mix.recipe.CurrentScaling(fp8_format=fp8mix.Format.HYBRID)),
        C.Variant("E5M2 fwd, amax-scaled (CurrentScaling E5M2)", "recipe",
                  recipe=fp8mix.recipe.CurrentScaling(fp8_format=C.E5M2)),
        C.Variant("E4M3 fwd, scale=1 (ablation)", "ablation", q_input=C.Q(C.E4M3, "unit"),
                  q_weight=C.Q(C.E4M3, "unit"), q_grad=g),
        C.Variant("E5M2 fwd, scale=1 (ablation)", "ablation", q_input=C.Q(C.E5M2, "unit"),
                  q_weight=C.Q(C.E5M2, "unit"), q_grad=g),
    ]


def mechanism() -> list:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 20, generator=g)
    w = torch.randn(1 << 20, generator=g) * 0.02  # the GPT's initial weights (std 0.02)
    rows = []
    for label, t in (("N(0, 1)", x), ("N(0, 0.02²) (GPT weights)", w)):
        for fmt in (C.E4M3, C.E5M2):
            for sc, scale in (("amax-scaled", None), ("scale=1", torch.ones(()))):
                s = fp8mix.numerics.quant_stats(t, fp8mix.quantize(t, fmt, scale=scale))
                rows.append({"data": label, "cast": f"{fmt.name} {sc}", "SQNR dB": f"{s.sqnr_db:.1f}",
                             "subnormal %": C.pct(s.subnormal / s.nonzero, 1),
                             "underflow %": C.pct(s.underflow_frac, 2)})
    return rows


def metrics(name, runs):
    return {"input SQNR dB": C.fmt_num(C.metric_mean(runs, "input", "sqnr_db"), ".1f"),
            "weight SQNR dB": C.fmt_num(C.metric_mean(runs, "weight", "sqnr_db"), ".1f"),
            "weight subnormal %": C.pct(C.metric_mean(runs, "weight", "subnormal_frac"), 1)}


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    gpt, mlp = C.gpt_task(), C.mlp_task()
    vs = variants()
    res_g = C.sweep(gpt, vs, m, label="exp2 ")
    res_m = C.sweep(mlp, vs, m, steps=m.mlp_steps, label="exp2 ")
    rows_g, rows_m = C.summarize(res_g, metrics=metrics), C.summarize(res_m, metrics=metrics)
    mech = mechanism()

    fig, ax = C.figure(3)
    C.plot_losses(ax[0][0], res_g, "GPT: loss", ylim=(1.8, 4.0))
    C.plot_losses(ax[0][1], res_m, "MLP (image): loss", logy=True)
    C.plot_metric(ax[0][2], res_m, "weight", "sqnr_db", "MLP: weight cast SQNR (dB)",
                  names=[v.name for v in vs if v.kind in ("recipe", "ablation")], scale=1.0, ylabel="dB")
    plot = C.save(fig, "exp2_forward_precision.png")
    csv = C.write_metrics_csv({**{f"gpt/{k}": v for k, v in res_g.items()},
                               **{f"mlp/{k}": v for k, v in res_m.items()}}, "exp2_metrics.csv")

    e4, e5 = "E4M3 fwd, amax-scaled (CurrentScaling HYBRID)", "E5M2 fwd, amax-scaled (CurrentScaling E5M2)"
    u4, u5 = "E4M3 fwd, scale=1 (ablation)", "E5M2 fwd, scale=1 (ablation)"
    lines, worse = [], {}
    for task, rows, res in (("GPT", rows_g, res_g), ("MLP", rows_m, res_m)):
        cmp = {n: C.compare(res, n, e4) for n in (e5, u4, u5)}
        worse[task] = {n: c[1] for n, c in cmp.items()}
        lines.append(
            f"{task}: loss vs float32 — E4M3 amax-scaled {C.rel(rows, e4):+.2f}%, E5M2 amax-scaled "
            f"{C.rel(rows, e5):+.2f}%, E4M3 scale=1 {C.rel(rows, u4):+.2f}%, E5M2 scale=1 {C.rel(rows, u5):+.2f}%, "
            f"bf16 {C.rel(rows, 'bf16 autocast (yardstick)'):+.2f}%. Against E4M3 amax-scaled: E5M2 "
            f"{cmp[e5][0]}; E4M3 scale=1 {cmp[u4][0]}; E5M2 scale=1 {cmp[u5][0]}.")
    e5_worse = [t for t in worse if worse[t][e5] > 0 or worse[t][u5] > 0]
    if e5_worse:
        head = (f"**Reproduced on the {' and '.join(e5_worse)}**: the 6 dB SQNR deficit of E5M2 forward tensors "
                "costs loss beyond the run-to-run noise. ")
    else:
        head = ("**Mechanism reproduced (E5M2 forward casts have ~6 dB lower SQNR), loss gap within the run-to-run "
                "noise at this scale.** ")
    verdict = head + " ".join(lines) + (
        " The fix is the format choice plus scaling: E4M3 with amax scaling for forward tensors (fp8mix's "
        "HYBRID default). Unscaled E4M3 puts std-0.02 weights among E4M3's subnormals (mechanism table: half of "
        "them subnormal, 2 dB lost, 4% flushed), which amax scaling avoids; at this size that alone is not "
        "visible in the loss.")
    body = "\n".join([
        f"GPT: {gpt.desc}. MLP: {mlp.desc}.",
        f"Runs: GPT {C.runs_text(m)}; MLP {C.runs_text(m, steps=m.mlp_steps)}. Gradients are E5M2 amax-scaled in "
        "every FP8 row; scale=1 rows use the ablation-only `FakeQuantLinear`.",
        "", "Mechanism (1M samples):", "", C.md_table(mech),
        "GPT:", "", C.md_table(rows_g), "MLP:", "", C.md_table(rows_m),
        f"![exp2]({plot})  (per-step metrics: [{csv}]({csv}))", "", verdict, ""])
    return C.Section(2, "E5M2 or unscaled E4M3 in the forward pass loses precision", body, rows_g + rows_m,
                     [plot], time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
