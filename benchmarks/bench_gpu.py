"""GPU benchmark of the fp8mix CUDA backend: one table.

  cast (+amax), cast+transpose (+amax), quantize_current: GB/s (bytes read + written)
      against device-to-device copy bandwidth measured in the same run;
  scaled_mm: TFLOP/s against torch._scaled_mm (same operands) and bf16 torch.mm;
  fp8mix.Linear forward+backward step time against nn.Linear in bf16.

Timing: CUDA events around `iters` back-to-back calls after warm-up; the median
of `reps` such runs.  Run by benchmarks/gpu_check.sh; usage:
    python benchmarks/bench_gpu.py [--quick]
"""
from __future__ import annotations

import argparse
import statistics
import sys

import torch

import fp8mix
from fp8mix import ops

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2


def timed(fn, iters=20, reps=5, warmup=3):
    """Median seconds per call of fn()."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3 / iters)
    return statistics.median(out)


ROWS = []


def row(kind, what, value, unit, ref_name, ref_value, target=None):
    ratio = value / ref_value if ref_value else float("nan")
    ok = "" if target is None else ("PASS" if ratio >= target else "FAIL")
    ROWS.append((kind, what, f"{value:9.1f} {unit}", f"{ref_name} {ref_value:9.1f}", f"{ratio:6.3f}",
                 "" if target is None else f">= {target}", ok))


def bench_casts(quick):
    n = (8192, 8192)
    copy_src = torch.empty(n[0] * n[1] * 4 // 4, dtype=torch.float32, device="cuda")
    copy_dst = torch.empty_like(copy_src)
    t = timed(lambda: copy_dst.copy_(copy_src))
    copy_bw = 2 * copy_src.numel() * 4 / t / 1e9
    ROWS.append(("copy", "d2d copy 256 MiB", f"{copy_bw:9.1f} GB/s", "", "", "", ""))
    for dt in (torch.bfloat16, torch.float32):
        x = torch.randn(n, device="cuda").to(dt)
        esz = x.element_size()
        s = torch.tensor(2.0, device="cuda")
        ne = x.numel()
        t = timed(lambda: ops.cast(x, s, E4, 0, True, False, 0, 0, True, False))
        row("cast", f"cast+amax {dt} {n}", ne * (esz + 1) / t / 1e9, "GB/s", "copy", copy_bw, 0.85)
        t = timed(lambda: ops.cast(x, s, E4, 0, True, False, 0, 0, True, True))
        row("cast", f"cast+T+amax {dt} {n}", ne * (esz + 2) / t / 1e9, "GB/s", "copy", copy_bw, 0.85)
        if not quick:
            t = timed(lambda: ops.cast(x, s, E4, 0, True, True, 1, 0, True, False))
            row("cast", f"cast SR {dt}", ne * (esz + 1) / t / 1e9, "GB/s", "copy", copy_bw)
            for g, name in ((0, "tensor"), (2, "1x128"), (3, "128x128")):
                t = timed(lambda: ops.quantize_current(x, E4, g, 0, False, 0.0, True, False, 0, 0, True, False))
                reads = 2 if g in (0, 3) else 1
                row("cast", f"quantize_current {name} {dt}", ne * (reads * esz + 1) / t / 1e9, "GB/s", "copy",
                    copy_bw)
            t = timed(lambda: ops.amax(x, 0))
            row("cast", f"amax {dt}", ne * esz / t / 1e9, "GB/s", "copy", copy_bw)


def bench_gemm(quick):
    shapes = [(4096, 4096, 4096), (8192, 8192, 8192)]
    if not quick:
        shapes += [(8192, 4096, 14336), (8192, 14336, 4096), (4096, 12288, 4096), (16384, 8192, 8192)]
    for M, N, K in shapes:
        a = (torch.randn(M, K, device="cuda")).to(E4)
        b = (torch.randn(N, K, device="cuda")).to(E4).t()
        s = torch.tensor(1.0, device="cuda")
        fl = 2.0 * M * N * K
        t_ours = timed(lambda: ops.scaled_mm(a, b, s, s, None, torch.bfloat16, "fp32", 128), iters=10)
        t_ref = timed(lambda: torch._scaled_mm(a, b, scale_a=s, scale_b=s, out_dtype=torch.bfloat16), iters=10)
        ab, bb = torch.randn(M, K, device="cuda", dtype=torch.bfloat16), torch.randn(K, N, device="cuda",
                                                                                     dtype=torch.bfloat16)
        t_bf = timed(lambda: torch.mm(ab, bb), iters=10)
        row("gemm", f"scaled_mm {M}x{N}x{K} tensor", fl / t_ours / 1e12, "TFLOP/s", "_scaled_mm",
            fl / t_ref / 1e12, 0.95)
        row("gemm", f"  (bf16 torch.mm {M}x{N}x{K})", fl / t_bf / 1e12, "TFLOP/s", "", 0.0)
        if not quick and (M, N, K) == (8192, 8192, 8192):
            sa, sb = torch.rand(M, 1, device="cuda") + 0.5, torch.rand(1, N, device="cuda") + 0.5
            t_r = timed(lambda: ops.scaled_mm(a, b, sa, sb, None, torch.bfloat16, "fp32", 128), iters=10)
            row("gemm", f"scaled_mm {M}^3 row-wise", fl / t_r / 1e12, "TFLOP/s", "_scaled_mm tensor",
                fl / t_ref / 1e12)
            kb = K // 128
            sa, sb = torch.rand(M, kb, device="cuda") + 0.5, torch.rand(kb, N // 128, device="cuda") + 0.5
            try:
                t_b = timed(lambda: ops.scaled_mm(a, b, sa, sb, None, torch.bfloat16, "fp32", 128), iters=10)
                row("gemm", f"scaled_mm {M}^3 block 1x128/128x128", fl / t_b / 1e12, "TFLOP/s",
                    "_scaled_mm tensor", fl / t_ref / 1e12)
            except Exception as e:  # noqa: BLE001 - report and go on
                ROWS.append(("gemm", "block scales", f"error: {e}"[:60], "", "", "", "FAIL"))


def bench_linear(quick):
    M = N = K = 8192
    lin = torch.nn.Linear(K, N, device="cuda", dtype=torch.bfloat16)
    f8 = fp8mix.Linear.from_linear(lin)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    rec = fp8mix.recipe.DelayedScaling(amax_history_len=16)

    def step_bf16():
        lin(x).backward(dy)

    def step_fp8():
        with fp8mix.fp8_autocast(enabled=True, fp8_recipe=rec):
            y = f8(x)
        y.backward(dy)

    t_bf = timed(step_bf16, iters=5)
    try:
        t_f8 = timed(step_fp8, iters=5)
    except Exception as e:  # noqa: BLE001
        ROWS.append(("linear", "fp8mix.Linear fwd+bwd", f"error: {e}"[:60], "", "", "", "FAIL"))
        return
    # reported as speed (1/time) so that the ratio reads "times faster"
    row("linear", f"Linear fwd+bwd {M}x{N}x{K} ms", t_f8 * 1e3, "ms", "nn.Linear bf16 ms", t_bf * 1e3)
    ratio = t_bf / t_f8
    ROWS.append(("linear", "  speed-up vs bf16", f"{ratio:9.3f} x", "", "", ">= 1.3", "PASS" if ratio >= 1.3 else
                 "FAIL"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no GPU: nothing to benchmark")
        return 0
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  CUDA {torch.version.cuda}")
    for part in (bench_casts, bench_gemm, bench_linear):
        try:
            part(args.quick)
        except Exception as e:  # noqa: BLE001 - one failing part must not hide the others
            ROWS.append((part.__name__, "error", str(e)[:80], "", "", "", "FAIL"))
    head = ("kind", "what", "value", "reference", "ratio", "target", "")
    w = [max(len(str(r[i])) for r in ROWS + [head]) for i in range(len(head))]
    for r in [head] + ROWS:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(r)))
    return 1 if any(r[-1] == "FAIL" for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
