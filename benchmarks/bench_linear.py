"""Benchmark: fp8mix.Linear (each recipe) vs nn.Linear float32 / bfloat16 on CPU.

    python benchmarks/bench_linear.py              # M = N = K in 512 1024 2048 4096
    python benchmarks/bench_linear.py --quick      # 512 1024 2048, fewer repeats
    python benchmarks/bench_linear.py --sizes 1024,3000 --iters 5 --warmup 2

Targets (from the issue): FP8 step within 1.5x of the float32 step at 2048 and above;
the FP8 activation saved for backward <= 30% of float32's.

One "step" = a simulated optimizer update of the weight (an in-place no-op add, so the
parameter has a new version and fp8mix re-casts its FP8 weight, as in training; every
variant pays the same add), forward, and backward (dgrad and wgrad: the input requires
grad), one square layer y[M,N] = x[M,K] W[N,K]^T + b. Times are medians after warmup,
all variants of a size measured in the same run, interleaved round-robin so that load
from other processes hits all of them alike.

Memory columns:
  peak MB     resident-set high-water mark of one step above the resident set before it
              (Linux VmHWM after a clear_refs reset; this script re-executes itself with
              MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave the resident set at once),
              i.e. the step's outputs, gradients, saved tensors and any scratch, C side
              included.
  saved act   bytes of the tensors autograd saves for backward in one forward that grow
              with the batch M (torch.autograd.graph.saved_tensors_hooks; measured at
              M = 128 and 256 and scaled to M): the activation. The FP8 copy of the weight
              (and nn.Linear's reference to the weight) does not grow with M and is not
              in it; it is in "saved all", which counts every saved tensor that is not a
              Parameter's own storage.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

ENV_KEY = "MALLOC_MMAP_THRESHOLD_"
if os.environ.get(ENV_KEY) is None and sys.platform.startswith("linux"):
    os.environ[ENV_KEY] = "65536"
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling  # noqa: E402

VARIANTS = ["nn f32", "nn bf16 autocast", "nn bf16 module", "fp8 delayed", "fp8 current", "fp8 block"]
RECIPES = {"fp8 delayed": DelayedScaling, "fp8 current": CurrentScaling, "fp8 block": BlockScaling}


def _status(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Case:
    def __init__(self, variant, S, seed=0):
        self.variant = variant
        torch.manual_seed(seed)
        dt = torch.bfloat16 if variant == "nn bf16 module" else torch.float32
        cls = fp8mix.Linear if variant.startswith("fp8") else nn.Linear
        self.layer = cls(S, S, dtype=dt)
        self.x = torch.randn(S, S, dtype=dt).requires_grad_()
        self.g = torch.randn(S, S, dtype=dt)
        self.S = S

    def ctx(self):
        if self.variant == "nn bf16 autocast":
            return torch.autocast("cpu", dtype=torch.bfloat16)
        if self.variant.startswith("fp8"):
            return fp8mix.fp8_autocast(fp8_recipe=RECIPES[self.variant]())
        return fp8mix.fp8_autocast(enabled=False)

    def zero_grad(self):
        self.x.grad = None
        for p in self.layer.parameters():
            p.grad = None

    def step(self):
        with torch.no_grad():
            self.layer.weight.add_(0.0)  # "optimizer update": new weight version
        self.zero_grad()
        with self.ctx():
            y = self.layer(self.x)
        y.backward(self.g.to(y.dtype))

    def saved_bytes(self, M):
        """(all non-parameter saved bytes, list of (nbytes, grows-with-M unknown)) for one forward."""
        params = {p.untyped_storage().data_ptr() for p in self.layer.parameters()}
        seen = {}

        def pack(t):
            if isinstance(t, torch.Tensor):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in params:
                    seen[ptr] = t.untyped_storage().nbytes()
            return t

        x = torch.randn(M, self.S, dtype=self.x.dtype).requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), self.ctx():
            self.layer(x)
        return sum(seen.values())


def fmt_mb(b):
    return f"{b / 2**20:.1f}"


def machine_info():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return (f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}\n"
            f"- machine: {cpu}; {os.cpu_count()} logical CPUs; torch threads {torch.get_num_threads()}; "
            f"load average {', '.join(f'{l:.1f}' for l in load)}\n"
            f"- python {platform.python_version()}, torch {torch.__version__}, fp8mix {fp8mix.__version__}, "
            f"fp8mix CPU kernels: {fp8mix.cpu_isa()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=str, default=None, help="comma-separated M=N=K (default 512,1024,2048,4096)")
    ap.add_argument("--quick", action="store_true", help="sizes 512,1024,2048 and fewer repeats")
    ap.add_argument("--iters", type=int, default=None, help="timed steps per variant (default 7, quick 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per variant (default 2, quick 1)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--variants", type=str, default=None, help=f"comma-separated subset of {VARIANTS}")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    sizes = [int(s) for s in a.sizes.split(",")] if a.sizes else ([512, 1024, 2048] if a.quick else
                                                                  [512, 1024, 2048, 4096])
    iters = a.iters or (3 if a.quick else 7)
    warmup = a.warmup if a.warmup is not None else (1 if a.quick else 2)
    variants = [v.strip() for v in a.variants.split(",")] if a.variants else VARIANTS
    if "nn f32" not in variants:
        variants.insert(0, "nn f32")

    print("# fp8mix.Linear vs nn.Linear: forward+backward step on CPU\n")
    print("Targets: FP8 step <= 1.5x the float32 step at M=N=K >= 2048; "
          "FP8 saved activation <= 30% of float32's.\n")
    print(machine_info())
    print(f"- {warmup} warmup + {iters} timed steps per variant, median; variants interleaved round-robin\n")
    print("| M=N=K | variant | step ms (median) | x f32 step | peak MB | saved act MB | act % of f32 | saved all MB |")
    print("|---:|:---|---:|---:|---:|---:|---:|---:|")
    t_start = time.time()
    verdict = []
    for S in sizes:
        cases = {v: Case(v, S) for v in variants}
        for _ in range(warmup):
            for c in cases.values():
                c.step()
        times = {v: [] for v in variants}
        for _ in range(iters):
            for v, c in cases.items():
                t0 = time.perf_counter()
                c.step()
                times[v].append(time.perf_counter() - t0)
        rows = {}
        for v, c in cases.items():
            c.zero_grad()  # the previous step's gradients are not part of this step's peak
            base = _status("VmRSS")
            peak = None
            if base is not None and _reset_hwm():
                c.step()
                hwm = _status("VmHWM")
                peak = hwm - base if hwm is not None else None
            s1, s2 = c.saved_bytes(128), c.saved_bytes(256)
            act = (s2 - s1) / 128 * S
            rows[v] = (statistics.median(times[v]), peak, act, c.saved_bytes(S))
        t32, _, a32, _ = rows["nn f32"]
        for v in variants:
            t, peak, act, allb = rows[v]
            print(f"| {S} | {v} | {t * 1e3:.1f} | {t / t32:.2f} | {fmt_mb(peak) if peak is not None else 'n/a'} "
                  f"| {fmt_mb(act)} | {100 * act / a32:.0f}% | {fmt_mb(allb)} |", flush=True)
            if v.startswith("fp8"):
                verdict.append((S, v, t / t32, act / a32))
        del cases
    print()
    big = [r for r in verdict if r[0] >= 2048]
    if big:
        worst = max(big, key=lambda r: r[2])
        ok_t = all(r[2] <= 1.5 for r in big)
        print(f"- step-time target (<= 1.5x f32 at >= 2048): {'MET' if ok_t else 'NOT MET'} "
              f"(worst {worst[1]} at {worst[0]}: {worst[2]:.2f}x)")
    else:
        print("- step-time target: no size >= 2048 measured")
    worst_a = max(verdict, key=lambda r: r[3])
    print(f"- saved-activation target (<= 30% of f32): {'MET' if all(r[3] <= 0.30 for r in verdict) else 'NOT MET'} "
          f"(worst {worst_a[1]} at {worst_a[0]}: {100 * worst_a[3]:.0f}%)")
    print(f"- total benchmark time {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
