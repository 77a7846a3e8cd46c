"""Benchmark: what fp8mix.Monitor costs a training step.

    python benchmarks/bench_monitor.py                  # MLP of fp8mix.Linear, 512 wide
    python benchmarks/bench_monitor.py --model gpt      # fp8mix.demo's GPT, tiny
    python benchmarks/bench_monitor.py --steps 300 --threads 2

One step = forward under fp8_autocast(DelayedScaling, monitor=m), backward, AdamW
step, m.step(). Variants: no monitor, Monitor(every=100), (every=10), (every=1); each
has its own copy of the same model and optimizer, and the variants run interleaved
round-robin, one step each in turn, so that load from other processes hits them
alike. Columns:

  median ms    median step time: a step that samples nothing (for every >= 3)
  mean ms      mean over all steps: the cost amortised over a sampling period (use
               --steps a multiple of 100 so every variant sees whole periods)
  x none       ratio to the no-monitor variant measured in the same run
  sampled ms   mean time of the steps that sampled (every cast of every layer recorded)
  record ms    time inside Monitor.record() per sampled step (Monitor.seconds)

The part this script does not show: a sampled step's cost grows with the tensors
(fp8mix_quant_stats is one scalar pass; kurtosis and the histogram a few torch passes).
"""
from __future__ import annotations

import argparse
import copy
import inspect
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fp8mix  # noqa: E402
from _machine import cpu_model  # noqa: E402
from fp8mix.monitor import NumericsWarning  # noqa: E402
from fp8mix.recipe import DelayedScaling  # noqa: E402

EVERY = (None, 100, 10, 1)


def build(kind: str, width: int, layers: int, seed: int = 0):
    """(model, batch function) with fp8mix.Linear layers."""
    torch.manual_seed(seed)
    if kind == "mlp":
        mods = []
        for i in range(layers):
            mods += [fp8mix.Linear(width, width), nn.GELU()]
        model = nn.Sequential(*mods[:-1])
        x = torch.randn(256, width)
        y = torch.randn(256, width)

        def loss_fn(m):
            return nn.functional.mse_loss(m(x), y)
        return model, loss_fn
    from fp8mix.tools.demo.model import GPT

    seq = 64
    model = fp8mix.convert_model(GPT(layers=layers, d_model=width, heads=4, seq_len=seq))
    idx = torch.randint(0, 256, (8, seq + 1), generator=torch.Generator().manual_seed(seed))

    def loss_fn(m):
        logits = m(idx[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, 256).float(), idx[:, 1:].reshape(-1))
    return model, loss_fn


class Variant:
    def __init__(self, every, base, loss_fn):
        self.every = every
        self.name = "no monitor" if every is None else f"Monitor(every={every})"
        self.model = copy.deepcopy(base)
        self.loss_fn = loss_fn
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.mon = None if every is None else fp8mix.Monitor(every=every, warn=False).attach(self.model)
        self.times, self.sampled = [], []

    def step(self, timed: bool):
        sampling = self.mon is not None and self.mon.sampling
        t0 = time.perf_counter()
        with fp8mix.fp8_autocast(fp8_recipe=DelayedScaling(), monitor=self.mon):
            loss = self.loss_fn(self.model)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.mon is not None:
            self.mon.step()
        dt = time.perf_counter() - t0
        if timed:
            self.times.append(dt)
            if sampling:
                self.sampled.append(dt)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("mlp", "gpt"), default="mlp")
    ap.add_argument("--width", type=int, default=None, help="MLP width / GPT d_model (default 512 / 128)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200, help="timed steps per variant (default 200)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steadier on a shared box)")
    a = ap.parse_args()
    if "monitor" not in inspect.signature(fp8mix.fp8_autocast.__init__).parameters:
        print("fp8_autocast has no monitor= argument in this build: nothing to measure", file=sys.stderr)
        return 1
    torch.set_num_threads(a.threads)
    width = a.width or (512 if a.model == "mlp" else 128)
    base, loss_fn = build(a.model, width, a.layers)
    variants = [Variant(e, base, loss_fn) for e in EVERY]
    warnings.simplefilter("ignore", NumericsWarning)
    for v in variants:  # warmup, then reset every monitor to step 0
        for _ in range(a.warmup):
            v.step(timed=False)
        if v.mon is not None:
            v.mon.reset()
    t_start = time.time()
    for _ in range(a.steps):
        for v in variants:
            v.step(timed=True)
    n_lin = sum(isinstance(m, fp8mix.Linear) for m in base.modules())
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"# fp8mix.Monitor overhead: {a.model} ({n_lin} fp8mix.Linear, width {width}), DelayedScaling\n")
    print(f"- machine: {cpu_model()}; {os.cpu_count()} logical CPUs; torch threads {a.threads}; load {load}")
    print(f"- torch {torch.__version__}, fp8mix kernels {fp8mix.cpu_isa()}; {a.warmup} warmup + {a.steps} timed "
          f"steps per variant, interleaved; {time.time() - t_start:.0f} s\n")
    print("| variant | median ms | x none | mean ms | x none | sampled steps | sampled ms | record ms / sampled step |")
    print("|:---|---:|---:|---:|---:|---:|---:|---:|")
    ref_med = statistics.median(variants[0].times)
    ref_mean = statistics.fmean(variants[0].times)
    for v in variants:
        med, mean = statistics.median(v.times), statistics.fmean(v.times)
        ns = len(v.sampled)
        samp = f"{1e3 * statistics.fmean(v.sampled):.2f}" if ns else "-"
        rec = f"{1e3 * v.mon.seconds / ns:.2f}" if ns else "-"
        print(f"| {v.name} | {1e3 * med:.2f} | {med / ref_med:.3f} | {1e3 * mean:.2f} | {mean / ref_mean:.3f} | "
              f"{ns} | {samp} | {rec} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
