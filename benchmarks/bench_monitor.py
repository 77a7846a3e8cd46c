"""Benchmark: what fp8mix.Monitor costs a training step, and what one record costs.

    python benchmarks/bench_monitor.py                  # MLP of fp8mix.Linear, 512 wide
    python benchmarks/bench_monitor.py --model gpt      # fp8mix.tools.demo's GPT, tiny
    python benchmarks/bench_monitor.py --steps 300 --threads 2
    python benchmarks/bench_monitor.py --part kernel    # only the two statistics tables

Table 1, the statistics kernel fp8mix_quant_stats (ops.quant_stats) per ISA the CPU has
(FP8MIX_MAX_ISA caps it; fp8mix.ops.set_max_isa here), Melem/s on a 2048 x 2048 cast,
median of repeats, 1 thread: PASS when the best SIMD variant is >= 3x the scalar kernel.

Table 2, one Monitor.record() against the torch path the monitor used before it read
everything from the kernel (amax, NaN count, float32 two-pass kurtosis, a log2 histogram
with bincount: ~10 torch passes and several host reads, the kernel call NOT included, so
the ratio understates the gain): PASS when record() is >= 3x faster at every size.

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

A sampled step's cost grows with the tensors: one pass of the statistics kernel per
cast (tables 1 and 2).
"""
from __future__ import annotations

import argparse
import copy
import inspect
import math
import os
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import cpu_model  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.monitor import NumericsWarning  # noqa: E402
from fp8mix.recipe import DelayedScaling  # noqa: E402

EVERY = (None, 100, 10, 1)
ISAS = ("scalar", "avx2", "avx512", "avx512bf16")


def _median_time(fn, repeats: int) -> float:
    fn()  # warm
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def kernel_table(repeats: int) -> bool:
    """Melem/s of ops.quant_stats per ISA; True when the best SIMD variant is >= 3x scalar."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 2048, generator=g) * torch.exp2(torch.randint(-8, 8, (2048, 2048), generator=g).float())
    rows = []
    was = fp8mix.ops.cpu_isa()
    try:
        for isa in ISAS[: ISAS.index(was) + 1]:
            fp8mix.ops.set_max_isa(isa)
            if isa == "avx512bf16":  # the same statistics kernel as avx512
                continue
            for dtype, gran in ((torch.float32, "tensor"), (torch.bfloat16, "block")):
                xs = x.to(dtype)
                t = fp8mix.quantize(xs, "E4M3", granularity=gran)
                code = fp8mix.formats.GRANULARITIES[gran]
                dt = _median_time(lambda: fp8mix.ops.quant_stats(xs, t.data, t.scale_inv, code), repeats)
                rows.append((isa, str(dtype).split(".")[1], gran, x.numel() / dt / 1e6))
    finally:
        fp8mix.ops.set_max_isa(was)
    print("| ISA | x | granularity | Melem/s | x scalar |")
    print("|:---|:---|:---|---:|---:|")
    scalar = {(r[1], r[2]): r[3] for r in rows if r[0] == "scalar"}
    best = 0.0
    for isa, dt_name, gran, rate in rows:
        ratio = rate / scalar[(dt_name, gran)]
        if isa != "scalar":
            best = max(best, ratio)
        print(f"| {isa} | {dt_name} | {gran} | {rate:.0f} | {ratio:.2f} |")
    ok = best >= 3.0 or len(scalar) == len(rows)
    print(f"\n{'PASS' if ok else 'FAIL'}: best SIMD variant {best:.2f}x the scalar kernel (target >= 3x)"
          + (" -- no SIMD variant on this CPU" if len(scalar) == len(rows) else "") + "\n")
    return ok


def _torch_path(x: torch.Tensor, sinv: torch.Tensor, bins: int = 64, lo: float = -47.0, hi: float = 17.0):
    """What Monitor._measure computed with torch before the kernel did it all (per-tensor scale)."""
    xf = x.float()
    ax = xf.abs()
    fin = torch.isfinite(xf)
    nan = int(torch.isnan(xf).sum())
    vals, ax_f = xf[fin], ax[fin]
    amax_fin = float(ax_f.max()) if ax_f.numel() else 0.0
    d = vals - vals.mean()
    m2 = float(torch.dot(d, d)) / d.numel()
    d.square_()
    m4 = float(torch.dot(d, d)) / d.numel()
    lg = torch.log2(ax).sub_(math.log2(float(sinv)) + lo)[fin]
    idx = lg.mul_(bins / (hi - lo)).clamp_(0, bins - 1).to(torch.int32)
    return nan, amax_fin, m4 / (m2 * m2), torch.bincount(idx, minlength=bins).tolist()


def record_table(repeats: int) -> bool:
    """Monitor.record() vs the torch path; True when record() is >= 3x faster at every size."""
    mon = fp8mix.Monitor(every=1, warn=False, max_records=1)
    print("| cast | record() ms | torch path ms | torch path / record() |")
    print("|:---|---:|---:|---:|")
    ok = True
    for shape in ((256, 512), (1024, 1024), (4096, 1024)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        t = fp8mix.quantize(x, "E4M3")
        rec = _median_time(lambda: mon.record("l", "input", x, t.data, t.scale_inv), repeats)
        ref = _median_time(lambda: _torch_path(x, t.scale_inv), repeats)
        ok &= ref / rec >= 3.0
        print(f"| {shape[0]} x {shape[1]} float32 | {1e3 * rec:.3f} | {1e3 * ref:.3f} | {ref / rec:.2f} |")
    print(f"\n{'PASS' if ok else 'FAIL'}: record() >= 3x faster than the torch path at every size\n")
    return ok


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
    ap.add_argument("--part", choices=("all", "kernel", "step"), default="all",
                    help="kernel: the statistics tables only; step: the training-step table only")
    ap.add_argument("--repeats", type=int, default=21, help="repeats per statistics timing (median)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    ok = True
    if a.part in ("all", "kernel"):
        print(f"# fp8mix statistics kernel and Monitor.record()\n\n- machine: {cpu_model()}; torch threads "
              f"{a.threads}; load {load}; fp8mix kernels {fp8mix.cpu_isa()}\n")
        ok &= kernel_table(a.repeats)
        ok &= record_table(a.repeats)
    if a.part == "kernel":
        return 0 if ok else 1
    if "monitor" not in inspect.signature(fp8mix.fp8_autocast.__init__).parameters:
        print("fp8_autocast has no monitor= argument in this build: nothing to measure", file=sys.stderr)
        return 1
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
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
