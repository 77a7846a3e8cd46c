"""Benchmark: fp8mix.scaled_mm (FP8 x FP8 -> float32, CPU) against torch's CPU GEMMs, PASS/FAIL.

    python benchmarks/bench_gemm.py                  # this machine's best ISA, 1 and 2 threads
    python benchmarks/bench_gemm.py --avx2           # fp8mix AND torch capped to AVX2 (fair on a wider CPU)
    python benchmarks/bench_gemm.py --quick          # 512 1024 2048 only
    python benchmarks/bench_gemm.py --sizes 512 2048x4096x11008 --threads 1
    python benchmarks/bench_gemm.py --layouts fwd,dgrad,wgrad   # the three GEMMs of a Linear step

For every shape (M x K x N), scale layout (per-tensor; DeepSeek-style 1x128 / 128x128
blocks) and thread count it prints GFLOP/s (2*M*N*K / median time) of
  * fp8mix.scaled_mm(a8, w8.t(), scale_a, scale_b), float32 output,
  * torch.mm in float32 and in bfloat16 on the same shapes (x @ w.t()),
timed in alternation in the same run (so that other load hits them alike), and the
ratios against torch with a PASS/FAIL verdict, by what fp8mix's GEMM kernel multiplies with
here (fp8mix.gemm_kernel; _machine.gemm_kernel_class):
  * float32 FMA (AVX2, AVX-512, and AVX-512 BF16 cores whose vdpbf16ps is no faster than FMA,
    e.g. the Sapphire Rapids class Xeons seen here, bench_isa_limits.py): fp8mix >= 0.95x
    torch float32 from 512^3 up (issues #17, #30 item 3);
  * bf16 (vdpbf16ps at the FMA rate: two products per lane, e.g. Zen 4): >= 1.5x torch
    float32 and >= 0.9x torch bfloat16 (issue #17);
  * amx (AMX tiles): >= 4x torch float32 and >= 0.9x torch bfloat16 (issue #30 item 2).
MX scales (1x32 blocks along K on both operands, `--scales ...,mx`) are judged against
fp8mix's own per-tensor GEMM timed in the same rounds (issue #30 item 4): MX speed >=
0.9x per-tensor speed (needs `tensor` in --scales).
--layouts adds the operand layouts of a Linear's backward GEMMs (per-tensor scales):
  * dgrad: A (M, K) row-major, B (K, N) row-major (dx = dy W; torch.mm(a, b));
  * wgrad: A (M, K) column-major, a transposed view (dW = dy^T x; torch.mm(at.t(), b)),
    B (K, N) row-major;
each fp8mix call against torch.mm on float32 tensors of the same layout.
torch bfloat16 is timed only where torch has native bf16 (not under --avx2, where it is
30-160x slower than float32).  torch._scaled_mm (CPU) is reported once at 512^3, being far
slower, from one call in a child process under --variant-limit seconds ("not run: > N s" past
it: on some CPU builds it takes minutes).  Operands, scales and transposes are prepared before
timing.
"""
from __future__ import annotations

import sys

if "--avx2" in sys.argv:  # before torch is imported: its libraries read the caps at load time
    from _machine import cap_to_avx2_and_reexec

    cap_to_avx2_and_reexec()

import argparse  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
from _machine import bench_interleaved, gemm_kernel_class, header_lines, seconds_in_child, verdict  # noqa: E402

import fp8mix  # noqa: E402

SQUARE = [512, 1024, 2048, 4096]
LLM = (2048, 4096, 11008)  # M, K, N: a Llama-7B MLP up-projection with 2048 tokens
MX_TARGET = 0.9  # MX speed / per-tensor speed (issue #30 item 4)


def parse_shape(s: str):
    if "x" in s:
        m, k, n = (int(v) for v in s.lower().split("x"))
        return m, k, n
    n = int(s)
    return n, n, n


def targets(kernel_class: str):
    """(min ratio vs float32, min ratio vs bfloat16 or None) for fp8mix's GEMM kernel class."""
    if kernel_class == "amx":
        return 4.0, 0.9
    if kernel_class == "bf16":
        return 1.5, 0.9
    return 0.95, None


def operands(M: int, K: int, N: int, gen: torch.Generator):
    """x, w and the fp8mix operands of both scale layouts."""
    x = torch.randn(M, K, generator=gen)
    w = torch.randn(N, K, generator=gen) * 0.05
    x8, w8 = fp8mix.quantize(x), fp8mix.quantize(w)
    xb = fp8mix.quantize(x, granularity="block")
    wb = fp8mix.quantize(w, granularity="block2d")
    ops = {
        "tensor": (x8.data, w8.data.t(), x8.scale_inv.reshape(()), w8.scale_inv.reshape(())),
        "block": (xb.data, wb.data.t(), xb.scale_inv.contiguous(), wb.scale_inv.t().contiguous()),
        "mx": (fp8mix.quantize(x, granularity="mx"), fp8mix.quantize(w, granularity="mx")),  # a @ w^T
    }
    return x, w, ops


def torch_scaled_mm_once(M: int, K: int, N: int, threads: int) -> None:
    """One torch._scaled_mm (CPU, E4M3, per-tensor scales) of M x K x N (seconds_in_child's target)."""
    torch.set_num_threads(threads)
    a8 = torch.randn(M, K).to(torch.float8_e4m3fn)
    b8 = torch.randn(N, K).to(torch.float8_e4m3fn).t()
    one = torch.tensor(1.0)
    torch._scaled_mm(a8, b8, one, one, out_dtype=torch.float32)


def scaled_mm_note(M: int, K: int, N: int, limit_s: float) -> str:
    """torch._scaled_mm on CPU at this shape: GFLOP/s of one call (in a child process, under
    limit_s seconds), or why it did not run."""
    t, why = seconds_in_child("bench_gemm", "torch_scaled_mm_once", (M, K, N, torch.get_num_threads()), limit_s)
    if t is None:
        return f"not run: {why}"
    return f"{2.0 * M * K * N / t / 1e9:.2f} GFLOP/s (one call)"


def layout_operands(layout: str, M: int, K: int, N: int, gen: torch.Generator):
    """(fp8mix operands, float32 A, float32 B) of a backward GEMM's layout, per-tensor scales."""
    b = torch.randn(K, N, generator=gen) * 0.05
    a = torch.randn(M, K, generator=gen) if layout == "dgrad" else torch.randn(K, M, generator=gen).t()
    a8 = fp8mix.quantize(a.contiguous())
    a8d = a8.data if layout == "dgrad" else a8.data.t().contiguous().t()  # wgrad: a column-major view
    b8 = fp8mix.quantize(b)
    return (a8d, b8.data, a8.scale_inv.reshape(()), b8.scale_inv.reshape(())), a, b


def run_layout(layout, M, K, N, budget, gen):
    """(layout, fp8mix, f32 GFLOP/s, None, best-of ratio) of one backward GEMM layout."""
    flop = 2.0 * M * N * K
    ops, a, b = layout_operands(layout, M, K, N, gen)
    res = bench_interleaved([lambda: fp8mix.scaled_mm(*ops), lambda: torch.mm(a, b)], budget_s=budget, min_reps=3,
                            max_reps=30)
    return layout, flop / res[0][0] / 1e9, flop / res[1][0] / 1e9, None, res[1][1] / res[0][1]


def run_shape(M, K, N, scales, native_bf16, budget, gen, limit_s):
    """Rows of (scale kind, fp8mix, f32, bf16 or None GFLOP/s, best-of ratio vs f32)."""
    flop = 2.0 * M * N * K
    x, w, ops = operands(M, K, N, gen)
    wt = w.t()
    fns = [lambda a=ops[k]: fp8mix.scaled_mm(*a) for k in scales] + [lambda: torch.mm(x, wt)]
    if native_bf16:
        xb, wbt = x.bfloat16(), w.bfloat16().t()
        fns.append(lambda: torch.mm(xb, wbt))
    res = bench_interleaved(fns, budget_s=budget, min_reps=3, max_reps=30)
    t32, t32_min = res[len(scales)]
    g16 = flop / res[len(scales) + 1][0] / 1e9 if native_bf16 else None
    rows = []
    for i, k in enumerate(scales):
        rows.append((k, flop / res[i][0] / 1e9, flop / t32 / 1e9, g16, t32_min / res[i][1]))
    note = scaled_mm_note(M, K, N, limit_s) if max(M, K, N) <= 512 else None
    return rows, note


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--avx2", action="store_true", help="cap fp8mix and torch (ATen, MKL, oneDNN) to AVX2")
    p.add_argument("--quick", action="store_true", help="512, 1024 and 2048 only")
    p.add_argument("--sizes", nargs="+", help="shapes: N (square) or MxKxN; replaces the default list")
    p.add_argument("--scales", default="tensor,block,mx", help="comma list of: tensor, block, mx")
    p.add_argument("--threads", default="1,2", help="comma list of thread counts (default 1,2)")
    p.add_argument("--budget", type=float, default=1.0, help="seconds of timed reps per shape and thread count")
    p.add_argument("--variant-limit", type=float, default=30.0,
                   help="seconds one torch._scaled_mm call may take (in a child process) before it is 'not run'")
    p.add_argument("--layouts", default="fwd", help="comma list of: fwd (the scales above), dgrad, wgrad "
                   "(a Linear backward's operand layouts, per-tensor scales)")
    args = p.parse_args(argv)

    shapes = ([parse_shape(s) for s in args.sizes] if args.sizes else
              [(n, n, n) for n in SQUARE if not (args.quick and n > 2048)] + ([] if args.quick else [LLM]))
    scales = [s.strip() for s in args.scales.split(",") if s.strip()]
    for s in scales:
        if s not in ("tensor", "block", "mx"):
            p.error(f"unknown scale layout {s!r}")
    layouts = [s.strip() for s in args.layouts.split(",") if s.strip()]
    for s in layouts:
        if s not in ("fwd", "dgrad", "wgrad"):
            p.error(f"unknown layout {s!r}")
    threads = [int(t) for t in args.threads.split(",")]
    isa = str(fp8mix.cpu_isa())
    native_bf16 = isa in ("avx512bf16", "amx") and not args.avx2
    kclass = gemm_kernel_class()
    t32_target, t16_target = targets(kclass)

    t_run = time.time()
    print("# fp8mix.scaled_mm vs torch CPU GEMM\n")
    for line in header_lines(isa):
        print(line)
    print(f"- target ({kclass} kernel): fp8mix >= {t32_target}x torch float32"
          + (f" and >= {t16_target}x torch bfloat16" if t16_target else "") + " from 512^3 up")
    print("- fp8mix: E4M3 x E4M3 -> float32, b = w.t(); torch.mm: x @ w.t(). GFLOP/s = 2MNK / median time; "
          "ratios of medians, fp8mix and torch timed in alternation; 'best-of' = ratio of the fastest reps\n")
    print("| threads | shape (MxKxN) | scales (layout) | fp8mix GFLOP/s | torch f32 | torch bf16 | fp8mix / f32 "
          "| (best-of) | fp8mix / bf16 | target | verdict |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    sys.stdout.flush()

    gen = torch.Generator().manual_seed(0)
    fails, notes = [], {}
    for nt in threads:
        torch.set_num_threads(nt)
        for M, K, N in shapes:
            rows, note = (run_shape(M, K, N, scales, native_bf16, args.budget, gen, args.variant_limit)
                          if "fwd" in layouts else ([], None))
            rows += [run_layout(lay, M, K, N, args.budget, gen) for lay in layouts if lay != "fwd"]
            if note:
                notes[(M, K, N)] = note
            g_tensor = next((r[1] for r in rows if r[0] == "tensor"), None)
            for kind, gf, g32, g16, best in rows:
                judged = min(M, K, N) >= 512
                if kind == "mx":  # against the per-tensor GEMM of the same rounds
                    judged = judged and g_tensor is not None
                    ok = g_tensor is not None and gf / g_tensor >= MX_TARGET
                    tgt = f"mx/tensor {gf / g_tensor:.2f}x >= {MX_TARGET}x" if g_tensor else "(needs tensor)"
                else:
                    ok = gf / g32 >= t32_target and (t16_target is None or g16 is None or gf / g16 >= t16_target)
                    tgt = f">= {t32_target}x f32" + (f", >= {t16_target}x bf16" if t16_target and g16 else "")
                v = verdict(ok) if judged else "(not judged)"
                if judged and not ok:
                    fails.append(f"{nt} thr {M}x{K}x{N} {kind}")
                print(f"| {nt} | {M}x{K}x{N} | {kind} | {gf:.1f} | {g32:.1f} | {f'{g16:.1f}' if g16 else 'n/a'} "
                      f"| {gf / g32:.2f}x | {best:.2f}x | {f'{gf / g16:.2f}x' if g16 else 'n/a'} | {tgt} | {v} |",
                      flush=True)
    print()
    for shape, note in notes.items():
        print(f"- torch._scaled_mm (CPU) at {'x'.join(map(str, shape))}: {note}")
    print(f"- {'all rows PASS' if not fails else f'{len(fails)} FAIL: ' + ', '.join(fails)}")
    print(f"- load average at end: {__import__('_machine').load_average()}; total time {time.time() - t_run:.0f} s")


if __name__ == "__main__":
    main()
