"""NVFP4 on the CPU: what the scalar NVFP4 GEMM and the NVFP4 Linear step cost beside
torch's float32 and fp8mix's per-tensor FP8, measured in the same run (interleaved,
medians), on the ISA the machine has.

    python benchmarks/bench_nvfp4.py [--sizes 256,512,1024] [--threads 1]

No target: the NVFP4 GEMM is a reference kernel (decoded operands, vectorised over N only
as far as the compiler does it without reordering a sum); the table states its speed.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _machine import bench_interleaved, header_lines  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix import nvfp4  # noqa: E402
from fp8mix.recipe import CurrentScaling, NVFP4BlockScaling  # noqa: E402


def gemm_row(n: int) -> str:
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    qa, qb = nvfp4.quantize(a), nvfp4.quantize(b)
    fa, fbt = fp8mix.quantize(a), fp8mix.quantize(b.T.contiguous())  # E4M3, per tensor; b^T (K, N)
    (t32, _), (t8, _), (t4, _) = bench_interleaved([lambda: torch.mm(a, b.T), lambda: fp8mix.scaled_mm(fa, fbt),
                                                    lambda: nvfp4.mm(qa, qb)], budget_s=1.5, max_reps=10)
    flops = 2 * n ** 3
    return (f"| GEMM {n}^3 | {flops / t32 / 1e9:.1f} | {flops / t8 / 1e9:.1f} | {flops / t4 / 1e9:.1f} | "
            f"{t4 / t32:.2f}x |")


def linear_row(n: int, tokens: int) -> str:
    torch.manual_seed(0)
    ref = torch.nn.Linear(n, n)
    lin = fp8mix.Linear(n, n)
    lin.load_state_dict(ref.state_dict(), strict=False)
    x = torch.randn(tokens, n, requires_grad=True)

    def step(model, recipe):
        def run():
            with fp8mix.fp8_autocast(enabled=recipe is not None, fp8_recipe=recipe):
                y = model(x)
            F.mse_loss(y, torch.zeros_like(y)).backward()
        return run
    nv = NVFP4BlockScaling(keep_last_layers_hp=0)  # (one layer: NVFP4 whatever the last-layers rule says)
    (t32, _), (t8, _), (t4, _) = bench_interleaved([step(ref, None), step(lin, CurrentScaling()),
                                                    step(lin, nv)], budget_s=1.5, max_reps=10)
    return (f"| Linear({n}) fwd+bwd, {tokens} tokens | {t32 * 1e3:.1f} ms | {t8 * 1e3:.1f} ms | {t4 * 1e3:.1f} ms "
            f"| {t4 / t32:.2f}x |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,512,1024")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    print("\n".join(header_lines(fp8mix.cpu_isa())) + f"\n- threads: {args.threads}\n")
    print("| GEMM | torch float32 GFLOP/s | fp8mix FP8 per-tensor GFLOP/s | fp8mix NVFP4 GFLOP/s | "
          "NVFP4 time / float32 |")
    print("|---|---|---|---|---|")
    for n in sizes:
        print(gemm_row(n), flush=True)
    print("\n| step | nn.Linear float32 | fp8mix FP8 (CurrentScaling) | fp8mix NVFP4 | NVFP4 / float32 |")
    print("|---|---|---|---|---|")
    for n in sizes:
        print(linear_row(n, tokens=n), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
