"""What the demo prints and writes: the comparison table, the FP8-vs-float32 gaps over
seeds, the summary sentences, ``loss_curves.csv`` and ``results.json``.

With one seed the table has one row per run; with several, one row per variant holding
the means over its seeds (sat casts: summed), and the gap table gives each variant's
paired gap to float32 (paired.py). The plots are plots.py's.
"""
from __future__ import annotations

import csv
import json
import math
import os

from .._common import json_safe
from .paired import TARGET_PCT, Gap, paired_gap

__all__ = ["LEGEND", "GAP_LEGEND", "format_table", "aggregate", "compute_gaps", "format_gaps", "print_summary",
           "write_csv", "write_json"]

LEGEND = """\
train loss: mean of the last 10% of steps; val loss: fixed validation batches after the last step;
dval %: val loss vs float32; step ms: median training step (forward+backward+optimizer);
{mem}
sat casts (delayed scaling): FP8 casts in which the tensor's amax times its scale was out of the
format's range (some elements saturated) / casts checked, over all steps, layers and roles;
ovf % / unf %: elements of sampled casts (input, weight, grad_output of every FP8 layer, every
--eval-every steps) that were out of range / nonzero but cast to 0."""

GAP_LEGEND = f"""\
gap: per seed 100 (val loss - float32's) / float32's, same initial weights and batches; mean +- 95%
interval of the paired differences (Student t, n-1 degrees of freedom); sd: their spread;
seeds for {TARGET_PCT}%: seeds that would resolve a gap of {TARGET_PCT}% at this spread (paired t-test, 5% two-sided,
80% power). More steps change the gap itself, not only its noise: compare at the length you train."""


def _pct(v):
    return "-" if v is None else f"{v:.2f}"


def _mean(vals):
    vals = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else float("nan")


def aggregate(results: list) -> list:
    """One row per variant (first-seen order): means over its seeds of the table's numbers;
    diverged if any seed diverged; FP8 counts summed. With one seed per variant, `results`."""
    variants = list(dict.fromkeys(r["run"] for r in results))
    if len(variants) == len(results):
        return results
    rows = []
    for v in variants:
        rs = [r for r in results if r["run"] == v]
        row = {"run": v, "seeds": len(rs), "diverged": any(r["diverged"] for r in rs),
               "stop_reason": next((r["stop_reason"] for r in rs if r["diverged"]), None),
               "steps_done": min(r["steps_done"] for r in rs), "run_wall_s": sum(r["run_wall_s"] for r in rs)}
        for k in ("final_train_loss", "final_val_loss", "step_ms_median", "saved_for_backward_mib"):
            row[k] = _mean([r[k] for r in rs])
        row["peak_cuda_mib"] = None if rs[0]["peak_cuda_mib"] is None else max(r["peak_cuda_mib"] for r in rs)
        row["fp8"] = _sum_fp8([r["fp8"] for r in rs])
        rows.append(row)
    return rows


def _sum_fp8(parts: list):
    """FP8 counter summaries of several seeds, added up (None for non-FP8 variants)."""
    if parts[0] is None:
        return None
    sat = None if parts[0]["saturated_casts"] is None else sum(p["saturated_casts"] for p in parts)
    casts = None if parts[0]["casts_checked"] is None else sum(p["casts_checked"] for p in parts)
    tot = {k: sum(c[k] for p in parts for c in p["sampled"].values()) for k in ("numel", "overflow", "underflow")}
    n = max(tot["numel"], 1)
    return {"saturated_casts": sat, "casts_checked": casts, "sampled_overflow_pct": 100.0 * tot["overflow"] / n,
            "sampled_underflow_pct": 100.0 * tot["underflow"] / n}


def format_table(results: list, on_cuda: bool) -> str:
    """The comparison table (fixed-width text), one row per entry of `results`."""
    ref = next((r for r in results if r["run"] == "fp32" and not r["diverged"]), None)
    bf16 = next((r for r in results if r["run"] == "bf16" and r.get("step_ms_median")), None)
    mem = "peak CUDA MiB" if on_cuda else "saved MiB"
    hdr = (f"{'run':<12} {'train loss':>10} {'val loss':>9} {'dval %':>7} {'step ms':>8} {'x bf16':>6} {mem:>13} "
           f"{'sat casts':>11} {'ovf %':>6} {'unf %':>6}")
    lines = [hdr, "-" * len(hdr)]
    for r in results:
        dv = "-"
        if ref is not None and not r["diverged"]:
            dv = f"{100.0 * (r['final_val_loss'] - ref['final_val_loss']) / ref['final_val_loss']:+.2f}"
        m = r["peak_cuda_mib"] if on_cuda else r["saved_for_backward_mib"]
        f = r["fp8"]
        if f is None:
            sat, ovf, unf = "-", "-", "-"
        else:
            sat = "n/a" if f["saturated_casts"] is None else f"{f['saturated_casts']}/{f['casts_checked']}"
            ovf, unf = _pct(f["sampled_overflow_pct"]), _pct(f["sampled_underflow_pct"])
        status = "  DIVERGED" if r["diverged"] else ""
        # the step beside bf16 autocast's (the speed a user would otherwise get): "-" without a bf16 run
        xb = f"{r['step_ms_median'] / bf16['step_ms_median']:.2f}" if bf16 else "-"
        lines.append(f"{r['run']:<12} {r['final_train_loss']:>10.4f} {r['final_val_loss']:>9.4f} {dv:>7} "
                     f"{r['step_ms_median']:>8.1f} {xb:>6} {m:>13.1f} {sat:>11} {ovf:>6} {unf:>6}{status}")
    return "\n".join(lines)


def compute_gaps(results: list, seeds: list) -> dict:
    """variant -> Gap to float32 over `seeds` (empty without a float32 run)."""
    def losses(v):
        by_seed = {r["seed"]: r for r in results if r["run"] == v}
        return [None if s not in by_seed or by_seed[s]["diverged"] else by_seed[s]["final_val_loss"] for s in seeds]

    variants = list(dict.fromkeys(r["run"] for r in results))
    if "fp32" not in variants:
        return {}
    ref = losses("fp32")
    return {v: paired_gap(v, ref, losses(v)) for v in variants if v != "fp32"}


def format_gaps(gaps: dict) -> str:
    """The gap table: one row per variant with its verdict."""
    hdr = f"{'run':<12} {'seeds':>5} {'gap %':>7} {'+-95% ':>7} {'sd %':>6} {f'seeds for {TARGET_PCT}%':>15}  verdict"
    lines = [hdr, "-" * (len(hdr) + 30)]
    for v, g in gaps.items():
        half = "-" if math.isnan(g.half95) else f"{g.half95:.2f}"
        sd = "-" if math.isnan(g.sd) else f"{g.sd:.2f}"
        need = "-" if g.n < 2 else (f">{100_000}" if g.seeds_for_target is None else str(g.seeds_for_target))
        seeds = f"{g.n}" + (f"+{g.excluded}" if g.excluded else "")
        mean = "-" if math.isnan(g.mean) else f"{g.mean:+.2f}"
        lines.append(f"{v:<12} {seeds:>5} {mean:>7} {half:>7} {sd:>6} {need:>15}  {g.verdict}")
    if any(g.excluded for g in gaps.values()):
        lines.append("(seeds a+b: a seeds compared, b left out because a run diverged)")
    return "\n".join(lines)


def print_summary(results: list, gaps: dict) -> None:
    """A few sentences on what the table shows."""
    ref = next((r for r in results if r["run"] == "fp32" and not r["diverged"]), None)
    for r in results:
        if r["diverged"]:
            print(f"{r['run']}: DIVERGED ({r.get('stop_reason') or 'non-finite loss'} at step {r['steps_done'] - 1})")
            continue
        line = f"{r['run']}: {r['run_wall_s']:.0f} s, val loss {r['final_val_loss']:.4f}"
        g: Gap | None = gaps.get(r["run"])
        if g is not None and g.n >= 2:
            line += f" ({g.verdict} vs float32)"
        elif ref is not None and r is not ref:
            d = 100.0 * (r["final_val_loss"] - ref["final_val_loss"]) / ref["final_val_loss"]
            verdict = "within" if abs(d) <= 1.0 else "NOT within"
            line += f" ({d:+.2f}% vs float32, {verdict} 1%; one seed, no interval)"
        f = r["fp8"]
        if f is not None and "sampled" in f:
            unf = ", ".join(f"{role} {c['underflow_pct']:.3f}%" for role, c in f["sampled"].items())
            line += f"; sampled underflow: {unf}"
        print(line)


def write_csv(path: str, results: list) -> None:
    """Every curve point: run, step, split (train/val), loss, seed."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "step", "split", "loss", "seed"])
        for r in results:
            for split in ("train", "val"):
                for s, v in r[f"{split}_curve"]:
                    w.writerow([r["run"], s, split, f"{v:.6f}", r["seed"]])


def write_json(path: str, cfg, corpus_desc: str, results: list, gaps: dict, extra: dict) -> None:
    """results.json: config, corpus, machine/plan facts (`extra`), runs, gaps."""
    config = {k: v for k, v in vars(cfg).items() if isinstance(v, (int, float, str, bool, type(None)))}
    doc = {"config": config, "corpus": corpus_desc, **extra, "runs": results,
           "gaps": {v: g.as_dict() for v, g in gaps.items()}}
    with open(path, "w") as f:
        json.dump(json_safe(doc), f, indent=2)


def output_paths(out: str) -> dict:
    """The files the demo writes in `out`."""
    names = {"curves_png": "loss_curves.png", "gap_png": "val_gap.png", "csv": "loss_curves.csv",
             "json": "results.json"}
    return {k: os.path.join(out, n) for k, n in names.items()}
