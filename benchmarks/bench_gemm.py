"""Benchmark: fp8mix.scaled_mm (FP8 x FP8 -> float32, CPU) against torch's CPU GEMMs.

    python benchmarks/bench_gemm.py            # full run (< 4 min on 2 cores)
    python benchmarks/bench_gemm.py --quick    # skip 4096^3 and the LLM shape
    python benchmarks/bench_gemm.py --sizes 512 1024 2048x4096x11008

For every shape (M x K x N) and scale layout (per-tensor, and DeepSeek-style
1x128 / 128x128 blocks) it prints GFLOP/s (2*M*N*K / median time) of
  * fp8mix.scaled_mm(a8, w8.t(), scale_a, scale_b), float32 output,
  * torch.mm in float32 and in bfloat16 on the same (dequantised) shapes,
  * torch._scaled_mm on CPU, if this torch runs it for that scale layout,
all with b = w.t() (column-major, torch's convention).  Operands, scales and
transposes are prepared before timing; each measurement is the median of
several calls after warm-up.  Not a test: it prints a markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time

import torch
from _machine import cpu_model

import fp8mix

TARGET = ("Target: fp8mix >= 1.0x torch float32 GFLOP/s at 1024^3 and above (aim 1.5x); "
          "the ratio vs torch bfloat16 is reported, not targeted.")
SQUARE = [256, 512, 1024, 2048, 4096]
LLM = (2048, 4096, 11008)  # M, K, N: a Llama-7B MLP up-projection with 2048 tokens


def cpu_busy_seconds():
    """(seconds all CPUs were busy, seconds this process used) so far; None where
    /proc/stat is missing.  Their difference over the run is other processes' load."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    busy = (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait
    t = os.times()
    return busy, t.user + t.system


def parse_shape(s: str):
    if "x" in s:
        m, k, n = (int(v) for v in s.lower().split("x"))
        return m, k, n
    n = int(s)
    return n, n, n


def bench(fn, min_time: float, min_reps: int, max_reps: int, warmup: int):
    """Median seconds per call: `warmup` untimed calls, then at least `min_reps`
    timed calls and more until about `min_time` seconds have been spent."""
    for _ in range(warmup):
        fn()
    times = []
    t_start = time.perf_counter()
    while len(times) < max_reps:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= min_reps and time.perf_counter() - t_start >= min_time:
            break
    return statistics.median(times), len(times)


def try_call(fn):
    try:
        fn()
        return True, ""
    except Exception as e:  # noqa: BLE001 — torch's CPU coverage of _scaled_mm varies
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="skip 4096^3 and the LLM shape")
    p.add_argument("--sizes", nargs="+", help="shapes: N (square) or MxKxN; replaces the default list")
    p.add_argument("--scales", default="tensor,block", help="comma list of: tensor, block")
    p.add_argument("--min-time", type=float, default=0.6, help="seconds of timed calls per measurement")
    p.add_argument("--min-reps", type=int, default=3)
    p.add_argument("--max-reps", type=int, default=50)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sizes:
        shapes = [parse_shape(s) for s in args.sizes]
    else:
        shapes = [(n, n, n) for n in SQUARE if not (args.quick and n >= 4096)]
        if not args.quick:
            shapes.append(LLM)
    scale_kinds = [s.strip() for s in args.scales.split(",") if s.strip()]
    for s in scale_kinds:
        if s not in ("tensor", "block"):
            p.error(f"unknown scale layout {s!r}")

    t_run = time.time()
    busy0 = cpu_busy_seconds()
    load0 = os.getloadavg() if hasattr(os, "getloadavg") else None
    print("# fp8mix.scaled_mm vs torch CPU GEMM\n")
    print(f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}")
    print(f"- cpu: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"- torch {torch.__version__}, threads: {torch.get_num_threads()}; fp8mix {fp8mix.__version__}, "
          f"ISA: {fp8mix.ops.cpu_isa()}; python {platform.python_version()}")
    if load0:
        print(f"- load average at start: {load0[0]:.2f}")
    print(f"- {TARGET}")
    print("- fp8mix: E4M3 x E4M3 -> float32, b = w.t(); torch.mm: float32 / bfloat16 (x @ w.t()); "
          "torch._scaled_mm: same FP8 operands, float32 out. GFLOP/s = 2MNK / median time; "
          f"median of >= {args.min_reps} calls after warm-up.\n")

    header = ("| shape (MxKxN) | scales | fp8mix GFLOP/s | torch f32 | torch bf16 | torch._scaled_mm "
              "| fp8mix / f32 | fp8mix / bf16 |")
    print(header)
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    sys.stdout.flush()

    gen = torch.Generator().manual_seed(0)
    verdict = []
    scaled_mm_notes = {}
    for M, K, N in shapes:
        flop = 2.0 * M * N * K
        warm = 1 if flop > 2e10 else 2
        x = torch.randn(M, K, generator=gen)
        w = torch.randn(N, K, generator=gen) * 0.05
        # torch baselines on the same shape (independent of the scale layout)
        xb, wb = x.bfloat16(), w.bfloat16()
        wt, wbt = w.t(), wb.t()
        t32, _ = bench(lambda: torch.mm(x, wt), args.min_time, args.min_reps, args.max_reps, warm)
        t16, _ = bench(lambda: torch.mm(xb, wbt), args.min_time, args.min_reps, args.max_reps, warm)
        del xb, wb, wbt
        g32, g16 = flop / t32 / 1e9, flop / t16 / 1e9
        for kind in scale_kinds:
            if kind == "tensor":
                x8, w8 = fp8mix.quantize(x), fp8mix.quantize(w)
                sa, sb = x8.scale_inv.reshape(()), w8.scale_inv.reshape(())
            else:
                x8 = fp8mix.quantize(x, granularity="block")
                w8 = fp8mix.quantize(w, granularity="block2d")
                sa, sb = x8.scale_inv.contiguous(), w8.scale_inv.t().contiguous()
            a8, b8 = x8.data, w8.data.t()
            tf, nf = bench(lambda: fp8mix.scaled_mm(a8, b8, sa, sb), args.min_time, args.min_reps,
                           args.max_reps, warm)
            gf = flop / tf / 1e9
            ok, why = try_call(lambda: torch._scaled_mm(a8[:1], b8[:, :1], sa if sa.dim() == 0 else sa[:1],
                                                        sb if sb.dim() == 0 else sb[:, :1],
                                                        out_dtype=torch.float32))
            if ok:
                ok, why = try_call(lambda: torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.float32))
            if ok:
                ts, _ = bench(lambda: torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.float32), args.min_time,
                              args.min_reps, args.max_reps, warm)
                sm = f"{flop / ts / 1e9:.1f}"
            else:
                sm = "n/a"
                scaled_mm_notes.setdefault(kind, why)
            print(f"| {M}x{K}x{N} | {kind} | {gf:.1f} | {g32:.1f} | {g16:.1f} | {sm} | {gf / g32:.2f}x "
                  f"| {gf / g16:.2f}x |")
            sys.stdout.flush()
            if min(M, K, N) >= 1024:
                verdict.append((M, K, N, kind, gf / g32))
            del x8, w8, a8, b8
        del x, w, wt

    busy1 = cpu_busy_seconds()
    elapsed = time.time() - t_run
    print()
    for kind, why in scaled_mm_notes.items():
        print(f"- torch._scaled_mm n/a for {kind} scales on this CPU build: {why}")
    if verdict:
        worst = min(v[4] for v in verdict)
        met = all(v[4] >= 1.0 for v in verdict)
        print(f"- target (>= 1.0x torch f32 at >= 1024^3): {'MET' if met else 'NOT MET'}; "
              f"worst ratio {worst:.2f}x, aim 1.5x {'met' if worst >= 1.5 else 'not met'}")
    if busy0 and busy1:
        other = max(0.0, (busy1[0] - busy0[0]) - (busy1[1] - busy0[1])) / (elapsed * (os.cpu_count() or 1))
        print(f"- other processes used {other:.0%} of the CPUs during the run"
              + (" -- timings disturbed, rerun for clean numbers" if other > 0.05 else ""))
    print(f"- total time: {elapsed:.0f} s")


if __name__ == "__main__":
    main()
