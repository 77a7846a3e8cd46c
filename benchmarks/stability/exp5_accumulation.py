"""Experiment 5: limited-precision accumulation error grows with K; promotion bounds it.

GEMM level, no training: E4M3 x E4M3 products (M = N = 64) of amax-scaled data, summed
by fp8mix.scaled_mm with accumulate="fp22" (the emulation of Hopper's ~14-bit tensor-core
accumulator: partial sums truncated to 13 mantissa bits) and promoted to float32 every
128 products (DeepSeek-V3's remedy) or never (promote_interval=0, i.e. p >= K), against
the float64 product of the same FP8 values (so the FP8 rounding of the inputs is not
counted; only the accumulation). Two data sets: zero-mean Gaussian (partial sums do a
random walk) and |Gaussian| (all products positive: the sum grows linearly with K, the
worst case, as for post-ReLU activations against positive weights).
"""
from __future__ import annotations

import time

import common as C
import torch

import fp8mix

M = N = 64


def operands(K: int, positive: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g)
    b = torch.randn(N, K, generator=g)
    if positive:
        a, b = a.abs(), b.abs()
    qa, qb = fp8mix.quantize(a, C.E4M3), fp8mix.quantize(b, C.E4M3)
    ref = qa.dequantize().double() @ qb.dequantize().double().t()
    return qa, qb, ref


def rel_err(qa, qb, ref, accumulate: str, p: int) -> float:
    c = fp8mix.scaled_mm(qa.data, qb.data.t(), qa.scale_inv, qb.scale_inv, accumulate=accumulate,
                         promote_interval=p)
    return float((c.double() - ref).norm() / ref.norm())


def main(quick: bool) -> C.Section:
    t0 = time.perf_counter()
    ks = [128 * 2 ** i for i in range(8)]  # 128 .. 16384
    seeds = (0,) if quick else (0, 1, 2)
    rows, curves = [], {}
    for positive in (False, True):
        data = "|N(0,1)|" if positive else "N(0,1)"
        for K in ks:
            errs = {"fp32": [], "fp22, promote every 128": [], "fp22, no promotion": []}
            for s in seeds:
                qa, qb, ref = operands(K, positive, s)
                errs["fp32"].append(rel_err(qa, qb, ref, "fp32", 128))
                errs["fp22, promote every 128"].append(rel_err(qa, qb, ref, "fp22", 128))
                errs["fp22, no promotion"].append(rel_err(qa, qb, ref, "fp22", 0))
            mean = {k: sum(v) / len(v) for k, v in errs.items()}
            for k, v in mean.items():
                curves.setdefault((data, k), []).append(v)
            rows.append({"data": data, "K": K, "fp32 accumulate": f"{mean['fp32']:.2e}",
                         "fp22, promote every 128": f"{mean['fp22, promote every 128']:.2e}",
                         "fp22, no promotion (p >= K)": f"{mean['fp22, no promotion']:.2e}",
                         "no promotion / promoted":
                             f"{mean['fp22, no promotion'] / mean['fp22, promote every 128']:.1f}x"})
    # promotion interval at K = 4096
    prow = []
    for positive in (False, True):
        qa, qb, ref = operands(4096, positive, 0)
        r = {"data": "|N(0,1)|" if positive else "N(0,1)"}
        for p in (32, 128, 512, 1024, 4096):
            r[f"p={p}"] = f"{rel_err(qa, qb, ref, 'fp22', p):.2e}"
        prow.append(r)

    fig, ax = C.figure(2)
    for i, data in enumerate(("N(0,1)", "|N(0,1)|")):
        a = ax[0][i]
        for k, style in (("fp32", "k-"), ("fp22, promote every 128", "o-"), ("fp22, no promotion", "s--")):
            a.plot(ks, curves[(data, k)], style, label=k, ms=4)
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("K (reduction length)")
        a.set_ylabel("relative error vs float64 (Frobenius)")
        a.set_title(f"E4M3 GEMM 64xKx64, {data}", fontsize=9)
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    plot = C.save(fig, "exp5_accumulation.png")

    def r_(data, K, col):
        return next(r for r in rows if r["data"] == data and r["K"] == K)[col]
    verdict = (
        f"**Reproduced.** Without promotion the error of the ~14-bit accumulator grows with K: N(0,1) "
        f"{r_('N(0,1)', 128, 'fp22, no promotion (p >= K)')} at K=128 to "
        f"{r_('N(0,1)', 4096, 'fp22, no promotion (p >= K)')} at K=4096 and "
        f"{r_('N(0,1)', 16384, 'fp22, no promotion (p >= K)')} at K=16384 (|N(0,1)|: "
        f"{r_('|N(0,1)|', 4096, 'fp22, no promotion (p >= K)')} at 4096); promoting every 128 products keeps it "
        f"flat at the single-interval level ({r_('N(0,1)', 16384, 'fp22, promote every 128')} at K=16384), "
        "float32 accumulation is ~1e-7. For comparison, DeepSeek-V3 reports a maximum relative error of "
        "nearly 2% at K=4096 on H800 without promotion; the emulation gives "
        f"{r_('N(0,1)', 4096, 'fp22, no promotion (p >= K)')} (N(0,1)) and "
        f"{r_('|N(0,1)|', 4096, 'fp22, no promotion (p >= K)')} (|N(0,1)|) there, so it is, if anything, more "
        "pessimistic than the hardware (its partial sums are truncated to 13 mantissa bits at every addition, and "
        "the error grows about linearly in K, the signature of a systematic bias towards zero). Promotion every "
        "128 products (fp8mix's default `promote_interval`) fixes it; the interval table shows the error is "
        "roughly proportional to p.")
    body = "\n".join([
        f"E4M3 x E4M3, M = N = {M}, amax-scaled inputs, {len(seeds)} seed(s), reference: float64 product of the "
        "same FP8 values.", "", C.md_table(rows),
        "Promotion interval p at K = 4096 (relative error):", "", C.md_table(prow),
        f"![exp5]({plot})", "", verdict, ""])
    return C.Section(5, "Limited-precision accumulation error growing with K", body, rows, [plot],
                     time.perf_counter() - t0)


if __name__ == "__main__":
    import sys
    C.setup()
    print(main("--quick" in sys.argv).body)
