"""Experiment 8: a loss scale too high or too low; FP8GradScaler recovers.

The gradient cast is the unscaled E4M3 one of experiment 1 (ablation-only
FakeQuantLinear, scale 1: the loss scale alone decides where the gradients land in
E4M3's range [2^-9, 448]); it reports its cast statistics to fp8mix.grad_stats exactly as
fp8mix.Linear's grad_output cast does, which is what FP8GradScaler's feedback reads.
Too low (1): gradients underflow. Too high (2^24): they saturate at 448 -- silently,
since saturating casts never produce an inf, so torch.amp.GradScaler's rule (back off on
inf/NaN, grow every 2000 clean steps) never reacts. FP8GradScaler (fp8_feedback=True)
backs off on saturation/overflow and grows on underflow; shown with its default
fp8_feedback_interval (10: the casts are counted on every 10th iteration) and with 1.
"""
from __future__ import annotations

import math
import time

import common as C

import fp8mix

HIGH, LOW, GOOD = 2.0 ** 24, 1.0, 2.0 ** 14


FH, FL = "FP8GradScaler, init 2^24 (too high)", "FP8GradScaler, init 1 (too low)"
FH1, FL1 = "FP8GradScaler interval 1, init 2^24", "FP8GradScaler interval 1, init 1"
FT1 = "FP8GradScaler interval 1, init 2^24, overflow_threshold 1e-4"
GOOD_NAME = "static 2^14 (well chosen)"


def variants():
    q = dict(q_input=C.Q(C.E4M3), q_weight=C.Q(C.E4M3), q_grad=C.Q(C.E4M3, "unit"))
    S = fp8mix.FP8GradScaler
    return [
        C.FP32,
        C.Variant(GOOD_NAME, "ablation", scaler=lambda: C.StaticScaler(GOOD), **q),
        C.Variant("torch-style GradScaler, init 2^24 (too high)", "ablation",
                  scaler=lambda: S(init_scale=HIGH, fp8_feedback=False), **q),
        C.Variant("torch-style GradScaler, init 1 (too low)", "ablation",
                  scaler=lambda: S(init_scale=LOW, fp8_feedback=False), **q),
        C.Variant(FH, "ablation", scaler=lambda: S(init_scale=HIGH), **q),
        C.Variant(FL, "ablation", scaler=lambda: S(init_scale=LOW), **q),
        C.Variant(FH1, "ablation", scaler=lambda: S(init_scale=HIGH, fp8_feedback_interval=1), **q),
        C.Variant(FL1, "ablation", scaler=lambda: S(init_scale=LOW, fp8_feedback_interval=1), **q),
        C.Variant(FT1, "ablation", scaler=lambda: S(init_scale=HIGH, fp8_feedback_interval=1, overflow_threshold=1e-4),
                  **q),
    ]


def metrics(name, runs):
    sc = [r.extra.get("loss_scale") for r in runs if r.extra.get("loss_scale")]
    scaler = runs[0].extra.get("scaler")
    out = {"grad underflow %": C.pct(C.metric_mean(runs, "grad_output", "underflow_frac"), 1),
           "grad saturated %": C.pct(C.metric_mean(runs, "grad_output", "saturation_frac"), 1),
           "final log2 loss scale": f"{sum(math.log2(s[-1]) for s in sc) / len(sc):.1f}" if sc else "–",
           "FP8 backoffs / growths": (f"{scaler.fp8_backoffs} / {scaler.fp8_growths}"
                                      if scaler is not None and hasattr(scaler, "fp8_backoffs") else "–")}
    return out


def clip_evidence(runs) -> str:
    """' (run with the largest final scale, last sampled step: head X% clipped, all layers Y%)'."""
    r = max(runs, key=lambda r: r.extra["loss_scale"][-1])
    recs = [x for x in r.extra.get("records", []) if x["role"] == "grad_output"]
    if not recs:
        return ""
    last = max(x["step"] for x in recs)
    at = [x for x in recs if x["step"] == last]
    head = [x for x in at if x["layer"] == "head"]
    nz = sum(x["nonzero"] for x in at)
    pooled = sum(x["overflow"] for x in at) / nz if nz else float("nan")
    if not head:
        return ""
    return (f" (lr {r.lr:g} seed {r.seed}, step {last}: head {100 * head[0]['overflow_frac']:.2f}% clipped, all "
            f"layers pooled {100 * pooled:.3f}%)")


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    gpt = C.gpt_task()
    res = C.sweep(gpt, variants(), m, label="exp8 ")
    rows = C.summarize(res, metrics=metrics)

    fig, ax = C.figure(3)
    C.plot_losses(ax[0][0], res, "GPT, unscaled E4M3 gradients: loss", ylim=(1.8, 5.7))
    a = ax[0][1]
    for name, runs in res.items():
        s = runs[0].extra.get("loss_scale")
        if s:
            a.plot(range(len(s)), [math.log2(x) for x in s], label=name)
    a.set_title("log2 loss scale (first run)", fontsize=9)
    a.set_xlabel("step")
    a.grid(alpha=0.3)
    a.legend(fontsize=7)
    C.plot_metric(ax[0][2], res, "grad_output", "saturation_frac", "grad_output saturated (% of non-zero)",
                  names=[n for n in res if n != "fp32"])
    plot = C.save(fig, "exp8_loss_scale.png")
    csv = C.write_metrics_csv(res, "exp8_metrics.csv")

    r = {x["variant"]: x for x in rows}
    th, tl = r["torch-style GradScaler, init 2^24 (too high)"], r["torch-style GradScaler, init 1 (too low)"]

    def like_good(name):  # not significantly worse than the static scale, and within 2 points of it
        return C.compare(res, name, GOOD_NAME)[1] <= 0 and C.paired(res, name, GOOD_NAME)[0] < 2.0

    def per_run(name):
        sc = [x.extra["loss_scale"][-1] for x in res[name]]
        return ", ".join(f"lr {x.lr:g} seed {x.seed}: {d:+.1f}% (2^{math.log2(s_):.0f})"
                         for x, d, s_ in zip(res[name], C.rel_diffs(res[name], res["fp32"]), sc))

    def desc(name):
        x = r[name]
        return (f"{x['_rel']:+.2f}% vs float32 (final log2 scale {x['final log2 loss scale']}, backoffs/growths "
                f"{x['FP8 backoffs / growths']}; minus static: {C.compare(res, name, GOOD_NAME)[0]})")
    ok = {n: like_good(n) for n in (FH, FL, FH1, FL1, FT1)}
    n_steps = m.steps
    if ok[FL]:
        low = "FP8GradScaler recovers from too low"
    elif ok[FL1]:
        low = (f"FP8GradScaler recovers from too low only with fp8_feedback_interval=1 (the default 10 is too slow "
               f"for {n_steps} steps)")
    else:
        low = f"FP8GradScaler does not recover from too low within {n_steps} steps"
    if ok[FH]:
        high = "and from too high"
    elif ok[FH1]:
        high = "from too high only with fp8_feedback_interval=1"
    elif ok[FT1]:
        high = "from too high only with fp8_feedback_interval=1 and overflow_threshold=1e-4"
    else:
        high = (f"from too high it ends at a workable scale (log2 {r[FH]['final log2 loss scale']}; interval 1: "
                f"{r[FH1]['final log2 loss scale']}) but does not reach the static scale's loss in {n_steps} steps: "
                f"the saturated first steps cost {r[FH]['_rel']:+.2f}% (interval 1: {r[FH1]['_rel']:+.2f}%)")
    head = f"**Reproduced; {low}; {high}.**"
    verdict = (
        f"Too high: {th['grad saturated %']}% of the gradients saturate and torch's rule never reacts (log2 scale "
        f"{th['final log2 loss scale']} at the end; loss {th['_rel']:+.2f}% vs float32); too low: "
        f"{tl['grad underflow %']}% underflow and the interval growth (every 2000 steps) is far away (loss "
        f"{tl['_rel']:+.2f}%). Static 2^14: {r[GOOD_NAME]['_rel']:+.2f}%. FP8GradScaler with its default "
        "fp8_feedback_interval=10 (it counts the gradient casts on every 10th iteration, and on each iteration "
        f"after one where it acted): from 2^24 "
        f"{desc(FH)}; from 1 {desc(FL)}. With fp8_feedback_interval=1: from 2^24 {desc(FH1)}; from 1 {desc(FL1)}; "
        f"from 2^24 with overflow_threshold=1e-4 {desc(FT1)}. " + head
        + " How the scaler acts: it backs off when the pooled clipped fraction or that of any single cast (the "
        "head's gradient clips exactly its largest entries, the target-class logit of each token, 1 in 256 of its "
        "values, which the pooled fraction over all layers would hide) exceeds overflow_threshold, and after an "
        "iteration whose counts made it act it counts the next one too, so a moving scale is followed step by "
        f"step whatever the interval{clip_evidence(res[FH])}. From 2^24 that is one halving per step for the "
        "first steps, and those steps with saturated gradients are what the remaining gap to the static scale "
        f"costs. Per run (loss vs float32, final scale), defaults from 2^24: {per_run(FH)}; interval 1 from 2^24: "
        f"{per_run(FH1)}.")
    body = "\n".join([
        f"GPT: {gpt.desc}. Runs: {C.runs_text(m)}. Forward: amax-scaled E4M3; gradients: E4M3, scale 1, behind "
        "the loss scale.", "", C.md_table(rows),
        f"![exp8]({plot})  (per-step metrics: [{csv}]({csv}))", "", verdict, ""])
    return C.Section(8, "Loss scale too high or too low", body, rows, [plot], time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
