"""Soak run: train the demo's byte-level GPT in FP8 (delayed scaling) for a long time and
watch for NaNs and divergence.

    python benchmarks/soak.py                        # 20000 steps (see docs/soak.md for timing)
    python benchmarks/soak.py --steps 300            # a quick check that it works
    python benchmarks/soak.py --checkpoint-dir soak_ck            # checkpoint every 1000 steps
    python benchmarks/soak.py --checkpoint-dir soak_ck --resume   # continue after a kill

The model, corpus (this Python's stdlib sources unless --data), batches, AdamW and the
warmup + cosine schedule are the demo's (same code: fp8mix.tools.demo.train_one), at a size
chosen so that 20k steps take well under 40 minutes on 2 CPU cores.

Every --log-every steps (default 100) one row goes to ``soak.csv`` (flushed): the mean,
min and max training loss of that window, the running minimum of the window means, their
ratio, and wall time. Checks:
  * NaN/inf: any non-finite training loss stops the run at once;
  * divergence: after warm-up, a window mean above --diverge-factor (default 2) times the
    running minimum of window means stops the run. Window means, not single steps: one
    step's loss on 8 sequences is noisy; a single step above the threshold is counted and
    reported as a spike but is not a failure.
At the end ``soak.png`` (loss curve, window means, validation, the divergence threshold)
and ``soak.json`` (summary) are written. Exit code 0 when the run finished healthy, 1 when
it stopped on a NaN or divergence, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_model  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.tools._common import UsageError, json_safe  # noqa: E402
from fp8mix.tools.demo import checkpoint, data, model, train  # noqa: E402
from fp8mix.tools.demo.main import check_args  # noqa: E402
from fp8mix.tools.demo.variants import RunSpec  # noqa: E402

RECIPE = "fp8-delayed"


class Monitor:
    """train.train_one's `monitor`: CSV rows per window of steps, divergence check."""

    FIELDS = ["step", "loss_mean", "loss_min", "loss_max", "running_min", "ratio_to_min", "wall_s", "wall_ms_per_step"]

    def __init__(self, csv_path: str, every: int, warmup: int, factor: float):
        self.every, self.warmup, self.factor = every, warmup, factor
        self.windows = 0  # windows written
        self.running_min = math.inf
        self.spikes = 0  # single steps above factor x running min (after warm-up)
        self.worst_spike = (None, 0.0)  # (step, ratio)
        self.rows = []
        self.t0 = time.perf_counter()
        self.base = None  # (time, steps) of the last window end seen by this process
        self.f = open(csv_path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(self.FIELDS)
        self.f.flush()

    def __call__(self, step: int, curve: list):
        """Called after every step with the whole curve (steps restored from a checkpoint
        included: their windows are written at the first call, without timing)."""
        now = time.perf_counter()
        if self.base is None:
            self.base = (now, len(curve))
        reason = None
        while (self.windows + 1) * self.every <= len(curve):
            lo = self.windows * self.every
            vals = [v for _, v in curve[lo: lo + self.every]]
            end = curve[lo + self.every - 1][0]
            mean = sum(vals) / len(vals)
            self.running_min = min(self.running_min, mean)
            ratio = mean / self.running_min
            wall_ms = None
            if lo + self.every == len(curve) and len(curve) > self.base[1]:
                wall_ms = 1000.0 * (now - self.base[0]) / (len(curve) - self.base[1])
            row = {"step": end, "loss_mean": mean, "loss_min": min(vals), "loss_max": max(vals),
                   "running_min": self.running_min, "ratio_to_min": ratio, "wall_s": now - self.t0,
                   "wall_ms_per_step": wall_ms}
            self.rows.append(row)
            self.w.writerow([f"{v:.6f}" if isinstance(v, float) else ("" if v is None else v)
                             for v in row.values()])
            self.f.flush()
            self.windows += 1
            if end >= self.warmup and ratio > self.factor and reason is None:
                reason = (f"window mean loss {mean:.4f} at step {end} is {ratio:.2f}x the running minimum "
                          f"{self.running_min:.4f}")
        if len(curve) % self.every == 0:
            self.base = (now, len(curve))
        v = curve[-1][1]
        if step >= self.warmup and math.isfinite(self.running_min) and v > self.factor * self.running_min:
            self.spikes += 1
            if v / self.running_min > self.worst_spike[1]:
                self.worst_spike = (step, v / self.running_min)
        return reason

    def close(self):
        self.f.close()


def plot(path: str, res: dict, mon: Monitor, cfg) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    if res["train_curve"]:
        s, v = zip(*res["train_curve"])
        ax.plot(s, v, color="C0", alpha=0.25, lw=0.5, label="train loss (per step)")
    if mon.rows:
        ax.plot([r["step"] for r in mon.rows], [r["loss_mean"] for r in mon.rows], color="C0", lw=1.8,
                label=f"train loss (mean of {mon.every} steps)")
        ax.plot([r["step"] for r in mon.rows], [mon.factor * r["running_min"] for r in mon.rows], "k--", lw=0.8,
                label=f"divergence threshold ({mon.factor:g}x running min, after step {mon.warmup})")
    if res["val_curve"]:
        s, v = zip(*res["val_curve"])
        ax.plot(s, v, "o-", color="C1", ms=3, lw=1.2, label="validation loss")
    lo = min([r["loss_min"] for r in mon.rows] or [0.0])
    ax.set_ylim(max(0.0, lo * 0.9), min(6.0, max(lo * mon.factor * 1.4, 3.0)))
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/byte)")
    status = "healthy" if not res["diverged"] else f"STOPPED: {res['stop_reason']}"
    ax.set_title(f"fp8mix soak, {RECIPE}: GPT {cfg.layers}x{cfg.d_model}, seq {cfg.seq_len}, batch "
                 f"{cfg.batch_size}, {res['steps_done']} steps ({status})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20000, help="training steps (default 20000)")
    p.add_argument("--out", default="soak_out", help="output folder (default ./soak_out)")
    p.add_argument("--data", default=None, help="text file or folder (default: the stdlib's *.py)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2, help="transformer blocks (default 2)")
    p.add_argument("--d-model", type=int, default=128, help="model width (default 128)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default d_model/32)")
    p.add_argument("--seq-len", type=int, default=128, help="bytes per sequence (default 128)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step (default 8)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default steps/20)")
    p.add_argument("--eval-every", type=int, default=1000, help="validate every N steps (default 1000)")
    p.add_argument("--eval-batches", type=int, default=8, help="validation batches (default 8)")
    p.add_argument("--log-every", type=int, default=100, help="steps per CSV row (default 100)")
    p.add_argument("--diverge-factor", type=float, default=2.0,
                   help="divergence: a window mean above this times the running minimum (default 2)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch (and fp8mix) threads (default 1: on a shared 2-core machine two threads "
                        "contend with other processes and run several times slower; see docs/soak.md)")
    p.add_argument("--checkpoint-dir", default=None, help="checkpoint here (the demo's format)")
    p.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints (default 1000)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --checkpoint-dir")
    p.add_argument("--loss-log", default=None, help="also log every step's loss exactly (demo --loss-log format)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return soak(args)
    except UsageError as exc:
        print(f"soak.py: error: {exc}", file=sys.stderr)
        return 2


def soak(args) -> int:
    if args.threads is not None and args.threads < 1:
        raise UsageError("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    if args.heads is None:
        args.heads = max(1, args.d_model // 32)
    if args.warmup is None:
        args.warmup = max(1, args.steps // 20)
    if args.log_every < 1 or not args.diverge_factor > 1:
        raise UsageError("--log-every must be >= 1 and --diverge-factor > 1")
    if not args.checkpoint_dir:
        args.checkpoint_every = None
    check_args(args)
    device = torch.device("cpu")
    os.makedirs(args.out, exist_ok=True)
    corpus, desc = data.load_corpus(args.data)
    train_bytes, val_bytes = data.split_corpus(corpus, args.seq_len)
    train_starts, val_starts = data.draw_starts(train_bytes, val_bytes, steps=args.steps, batch_size=args.batch_size,
                                                eval_batches=args.eval_batches, seq_len=args.seq_len, seed=args.seed)
    torch.manual_seed(args.seed)
    base = model.GPT(args.layers, args.d_model, args.heads, args.seq_len)
    n_params = sum(p.numel() for p in base.parameters())
    ckpt, configs, resume = checkpoint.prepare_checkpoints(args, [RunSpec(RECIPE, args.seed)], device, corpus)
    loss_log = checkpoint.LossLog(args.loss_log, args.resume) if args.loss_log else None
    print(f"soak: corpus {desc}")
    print(f"model: GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads, {n_params:,} parameters; "
          f"{args.steps} steps of {args.batch_size}x{args.seq_len} bytes, {RECIPE}, AdamW lr {args.lr:g}, warmup "
          f"{args.warmup}; {torch.get_num_threads()} threads, fp8mix ISA {fp8mix.cpu_isa()}, {cpu_model()}",
          flush=True)
    csv_path, png, js = (os.path.join(args.out, n) for n in ("soak.csv", "soak.png", "soak.json"))
    mon = Monitor(csv_path, args.log_every, args.warmup, args.diverge_factor)
    t0 = time.perf_counter()
    try:
        res = train.train_one(RECIPE, base, args, (train_bytes, val_bytes, train_starts, val_starts), device,
                             not args.no_progress, ckpt=ckpt, resume_from=resume.get(RECIPE),
                             config=configs.get(RECIPE), loss_log=loss_log, monitor=mon)
    finally:
        mon.close()
    wall = time.perf_counter() - t0
    new_steps = res["steps_done"] - (res["resumed_from_step"] or 0)
    plot(png, res, mon, args)
    timed = sorted(r["wall_ms_per_step"] for r in mon.rows if r["wall_ms_per_step"] is not None)
    steady = timed[len(timed) // 2] if timed else None  # per-window wall time, startup excluded
    summary = {
        "status": "ok" if not res["diverged"] else "stopped", "reason": res["stop_reason"],
        "steps": args.steps, "steps_done": res["steps_done"], "resumed_from_step": res["resumed_from_step"],
        "config": {k: getattr(args, k) for k in checkpoint.CONFIG_KEYS}, "recipe": RECIPE, "parameters": n_params,
        "corpus": desc, "threads": torch.get_num_threads(), "cpu": cpu_model(), "python": platform.python_version(),
        "torch": str(torch.__version__), "wall_s": wall,
        "wall_ms_per_step": 1000.0 * wall / new_steps if new_steps else None,
        "steady_wall_ms_per_step": steady,
        "train_step_ms_median": res["step_ms_median"],
        "final_window_mean": mon.rows[-1]["loss_mean"] if mon.rows else None,
        "min_window_mean": mon.running_min if mon.rows else None,
        "final_val_loss": res["final_val_loss"], "val_curve": res["val_curve"],
        "single_step_spikes": mon.spikes, "worst_spike": {"step": mon.worst_spike[0], "ratio": mon.worst_spike[1]},
        "fp8": res["fp8"],
    }
    with open(js, "w") as f:
        json.dump(json_safe(summary), f, indent=2)
    print(f"\n{res['steps_done']} of {args.steps} steps in {wall:.1f} s "
          f"({summary['wall_ms_per_step'] or float('nan'):.1f} ms/step wall incl. eval and logging; "
          f"median train step {res['step_ms_median']:.1f} ms)")
    if mon.rows:
        print(f"loss: first window {mon.rows[0]['loss_mean']:.4f}, last {mon.rows[-1]['loss_mean']:.4f}, "
              f"min {mon.running_min:.4f}; val {res['final_val_loss']:.4f}; single-step spikes above "
              f"{mon.factor:g}x min: {mon.spikes}")
    if steady is not None:
        print(f"steady state {steady:.1f} ms/step (median over windows): 20000 steps take about "
              f"{20000 * steady / 60000:.0f} min")
    print(("HEALTHY" if not res["diverged"] else f"STOPPED: {res['stop_reason']}")
          + f"; wrote {csv_path}, {png}, {js}")
    return 1 if res["diverged"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
