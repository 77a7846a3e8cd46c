"""Experiment 3: delayed scaling lags behind an amax spike (and the converse).

(a) Lag. Every linear layer's input is multiplied by 4 on a random 20% of the steps after
warm-up (SpikeWrap: (lin(4x) + 3b) / 4, the same function in float32). A delayed scale
computed from the previous step's amax ("most_recent", history 1) is then 4x too large on
each spike step and the top of the distribution saturates at 448. Remedies: a margin of
2 (4x headroom), current scaling, 1x128 block scaling. The default max-over-16-steps
history is shown too (it only lags on the first spike of a quiet stretch).

(b) The converse. One transient 2^12 spike of the inputs at one step. A max-over-history
scale then stays ~4000x too small for the whole history: with the default
amax_history_len=1024 for the rest of the run, so small values underflow. A short history
(16) recovers after 16 steps; current scaling never notices.
"""
from __future__ import annotations

import math
import time

import common as C
import torch

import fp8mix

SPIKE = 4.0
P_SPIKE = 0.2
TRANSIENT = 2.0 ** 12
LAYERS = ("qkv", "proj", "fc", "fc_out", "head")


def spike_steps(seed: int, steps: int, warmup: int = 10) -> set:
    g = torch.Generator().manual_seed(500 + seed)
    u = torch.rand(steps, generator=g)
    return {i for i in range(warmup + 5, steps) if u[i] < P_SPIKE}


def transient_step(steps: int) -> int:
    return steps // 4


def random_spikes(steps: int):
    def inject(model, seed):
        wraps = C.wrap_linears(model, LAYERS, C.SpikeWrap)
        sp = spike_steps(seed, steps)

        def hook(step):
            for w in wraps:
                w.factor = SPIKE if step in sp else 1.0
        return hook
    return inject


def one_spike(steps: int):
    def inject(model, seed):
        wraps = C.wrap_linears(model, LAYERS, C.SpikeWrap)
        t = transient_step(steps)

        def hook(step):
            for w in wraps:
                w.factor = TRANSIENT if step == t else 1.0
        return hook
    return inject


def variants_a(steps):
    R = fp8mix.recipe
    inj = random_spikes(steps)
    H = fp8mix.Format.HYBRID
    return [
        C.FP32,
        C.Variant("fp32 + spikes (sanity)", inject=inj, cache="fp32+spikes"),
        C.Variant("delayed most_recent (history 1)", "recipe", inject=inj, monitor_every=1,
                  recipe=R.DelayedScaling(fp8_format=H, amax_history_len=1, amax_compute_algo="most_recent")),
        C.Variant("delayed max over 16", "recipe", inject=inj, monitor_every=1,
                  recipe=R.DelayedScaling(fp8_format=H, amax_history_len=16)),
        C.Variant("delayed most_recent + margin 2", "recipe", inject=inj, monitor_every=1,
                  recipe=R.DelayedScaling(fp8_format=H, amax_history_len=1, amax_compute_algo="most_recent",
                                          margin=2)),
        C.Variant("current scaling", "recipe", inject=inj, monitor_every=1, recipe=R.CurrentScaling(fp8_format=H)),
        C.Variant("block 1x128 (BlockScaling)", "recipe", inject=inj, monitor_every=1, recipe=R.BlockScaling()),
    ]


def variants_b(steps):
    R = fp8mix.recipe
    inj = one_spike(steps)
    H = fp8mix.Format.HYBRID
    return [
        C.FP32,
        C.Variant("delayed max over 1024 (default length)", "recipe", inject=inj,
                  recipe=R.DelayedScaling(fp8_format=H, amax_history_len=1024)),
        C.Variant("delayed max over 16", "recipe", inject=inj,
                  recipe=R.DelayedScaling(fp8_format=H, amax_history_len=16)),
        C.Variant("current scaling", "recipe", inject=inj, recipe=R.CurrentScaling(fp8_format=H)),
    ]


def scale_ratio(runs, t) -> float:
    """Geometric mean over layers and runs of (input scale at the last sampled step) /
    (input scale at the last sampled step before the spike)."""
    logs = []
    for r in runs:
        by = {}
        for x in r.extra.get("records", []):
            if x["role"] == "input":
                by.setdefault(x["layer"], {})[x["step"]] = x["scale"]
        for sc in by.values():
            pre = [s for s in sc if s < t]
            if pre and sc[max(sc)] > 0 and sc[max(pre)] > 0:
                logs.append(math.log(sc[max(sc)] / sc[max(pre)]))
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def mechanism() -> tuple:
    """Tensor-level: (a) N(0,1) samples cast with the scale of the data before a k-fold jump;
    (b) cast with a scale 2^-j too small."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 64, generator=g)  # the size of one GPT layer input: 8x64 tokens x 64 channels
    am = float(x.abs().max())
    ra = []
    for k in (1.0, 2.0, 4.0, 8.0):
        y = x * k
        s = fp8mix.numerics.quant_stats(y, fp8mix.quantize(y, C.E4M3, scale=torch.tensor(448.0 / am)))
        ra.append({"jump": f"{k:g}x", "saturated %": C.pct(s.saturation_frac, 1),
                   "clipped %": C.pct(s.overflow_frac, 1),
                   "SQNR dB": f"{s.sqnr_db:.1f}"})
    rb = []
    for j in (0, 4, 8, 10, 12, 14, 16):
        s = fp8mix.numerics.quant_stats(x, fp8mix.quantize(x, C.E4M3, scale=torch.tensor(448.0 / am / 2.0 ** j)))
        rb.append({"scale too small by": f"2^{j}", "underflow %": C.pct(s.underflow_frac, 2),
                   "subnormal %": C.pct(s.subnormal / s.nonzero, 1), "SQNR dB": f"{s.sqnr_db:.1f}"})
    return ra, rb


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    m = C.mode(quick)
    gpt = C.gpt_task()
    steps = m.steps
    res_a = C.sweep(gpt, variants_a(steps), m, label="exp3a ")
    res_b = C.sweep(gpt, variants_b(steps), m, label="exp3b ")
    t = transient_step(steps)

    def spk(r):
        return spike_steps(r.seed, steps)

    def after_spk(r):  # the step right after a spike (when it is not itself a spike)
        s = spike_steps(r.seed, steps)
        return {i + 1 for i in s if i + 1 not in s}

    def quiet(r):
        s = spike_steps(r.seed, steps)
        return {i for i in range(15, steps) if i not in s}

    def metrics_a(name, runs):
        return {"input saturated %, spike steps": C.pct(C.metric_mean(runs, "input", "saturation_frac", steps=spk), 2),
                "input saturated %, other steps":
                    C.pct(C.metric_mean(runs, "input", "saturation_frac", steps=quiet), 2),
                "input clipped %, spike steps": C.pct(C.metric_mean(runs, "input", "overflow_frac", steps=spk), 2),
                "input SQNR dB, spike steps": C.fmt_num(C.metric_mean(runs, "input", "sqnr_db", steps=spk), ".1f"),
                "input SQNR dB, step after": C.fmt_num(C.metric_mean(runs, "input", "sqnr_db", steps=after_spk), ".1f")}

    def metrics_b(name, runs):
        return {"input underflow % before spike": C.pct(C.metric_mean(runs, "input", "underflow_frac", before=t), 3),
                "input underflow % after spike": C.pct(C.metric_mean(runs, "input", "underflow_frac", after=t + 1), 3),
                "input SQNR dB after spike": C.fmt_num(C.metric_mean(runs, "input", "sqnr_db", after=t + 1), ".1f"),
                "input scale at end / before spike": C.fmt_num(scale_ratio(runs, t), ".3g")}

    rows_a = C.summarize(res_a, metrics=metrics_a)
    rows_b = C.summarize(res_b, metrics=metrics_b)

    fig, ax = C.figure(3)
    C.plot_losses(ax[0][0], res_a, "(a) 4x input spikes on 20% of steps: loss", ylim=(1.8, 4.0))
    C.plot_metric(ax[0][1], res_a, "input", "max_saturation_frac",
                  "(a) input: max saturated % over layers (first run)",
                  names=[n for n in res_a if n not in ("fp32", "fp32 + spikes (sanity)")])
    C.plot_metric(ax[0][2], res_b, "input", "underflow_frac",
                  f"(b) one 2^12 spike at step {t}: input underflow %", names=[n for n in res_b if n != "fp32"])
    plot = C.save(fig, "exp3_amax_spike.png")
    csv = C.write_metrics_csv({**{f"a/{k}": v for k, v in res_a.items()},
                               **{f"b/{k}": v for k, v in res_b.items()}}, "exp3_metrics.csv")

    ra = {r["variant"]: r for r in rows_a}
    rb = {r["variant"]: r for r in rows_b}
    lag = ra["delayed most_recent (history 1)"]
    fixes = ["delayed most_recent + margin 2", "current scaling", "block 1x128 (BlockScaling)"]
    fix_sat = ", ".join(f"{n} {ra[n]['input clipped %, spike steps']}%" for n in fixes)
    loss_a = ", ".join(f"{n} {ra[n]['_rel']:+.2f}" for n in ["delayed most_recent (history 1)", "delayed max over 16"]
                       + fixes)
    cmp_a = C.compare(res_a, "delayed most_recent (history 1)", "current scaling")
    cmp_b = C.compare(res_b, "delayed max over 1024 (default length)", "current scaling")
    verdict_a = (
        ("(a) **Reproduced: the lag costs loss; a margin, current scaling and block scaling fix it**: "
         if cmp_a[1] > 0 and all(C.compare(res_a, n, "current scaling")[1] <= 0 for n in fixes) else
         "(a) **Mechanism reproduced**: ")
        + f"on spike steps the lagging delayed scale saturates "
        f"{lag['input saturated %, spike steps']}% of the inputs (all layers together; the worst layer is in the "
        f"plot), {lag['input clipped %, spike steps']}% beyond the format's max (clipped), against "
        f"{lag['input saturated %, other steps']}% saturated on other steps; clipped on spike steps with the "
        f"remedies: {fix_sat} (block scaling's 'saturated' column counts each 1x64 tile's own maximum, which is "
        "exact, not clipped). "
        f"Loss vs float32 (%): {loss_a}. "
        + f"Lagging delayed vs current scaling: {cmp_a[0]}. "
        + ("The saturation costs loss at this scale. " if cmp_a[1] > 0 else
           "At this scale the loss impact of the saturation is within the run-to-run noise (clipping the top "
           "of a 4x-inflated input on a fifth of the steps is survivable for this model); the saturation "
           "metric is the evidence. ")
        + "The 16-step max history avoids most of it here because spikes recur within 16 steps.")
    d = rb["delayed max over 1024 (default length)"]
    s16 = rb["delayed max over 16"]
    verdict_b = (
        "(b) **Converse: "
        + ("mechanism reproduced, no loss effect at 2^12" if cmp_b[1] <= 0 else "reproduced") + "**: "
        f"after one 2^12 spike the 1024-long max history keeps the input scale at "
        f"{d['input scale at end / before spike']}x its former value to the end of the run, input underflow goes from "
        f"{d['input underflow % before spike']}% to {d['input underflow % after spike']}% and SQNR falls to "
        f"{d['input SQNR dB after spike']} dB (loss {d['vs fp32 %']}% vs float32); the 16-step history "
        f"({s16['input SQNR dB after spike']} dB after the spike, loss {s16['vs fp32 %']}%) and current scaling "
        f"({rb['current scaling']['input SQNR dB after spike']} dB, loss {rb['current scaling']['vs fp32 %']}%) "
        f"recover. 1024-history vs current scaling: {cmp_b[0]}. "
        + ("The scale stays too small as described, but E4M3's 17 binades absorb a 2^12 error for these inputs: "
           "the lost values are the smallest ones, the SQNR is set by the bulk, and the loss does not move beyond "
           "noise (the mechanism table shows where it starts to cost: a scale 2^14-2^16 too small). "
           if cmp_b[1] <= 0 else
           "The too-small scale costs loss. ")
        + "fp8mix's default `amax_history_len=1024` is Transformer Engine's; with spiky inputs prefer a short "
        "history or current scaling.")
    mech_a, mech_b = mechanism()
    body = "\n".join([
        f"GPT: {gpt.desc}. Runs: {C.runs_text(m)}. Spiked layers: every linear (qkv, proj, fc, fc_out, head); "
        "the spike is undone after the layer, so float32 is unchanged (sanity row). FP8 rows are HYBRID "
        "(E4M3 forward) except BlockScaling (E4M3). Monitor on every step for (a).",
        "", "Mechanism (N(0,1), 512x64 like one GPT layer input, E4M3): (a) cast with the scale of the data "
        "before a jump; (b) a scale too "
        "small by 2^j:", "", C.md_table(mech_a), C.md_table(mech_b),
        f"(a) {SPIKE:g}x input spikes on a random {P_SPIKE:.0%} of the steps:", "", C.md_table(rows_a),
        f"(b) one transient {TRANSIENT:g}x spike at step {t}:", "", C.md_table(rows_b),
        f"![exp3]({plot})  (per-step metrics: [{csv}]({csv}))", "", verdict_a, "", verdict_b, ""])
    return C.Section(3, "Delayed scaling lagging behind an amax spike", body, rows_a + rows_b, [plot],
                     time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
