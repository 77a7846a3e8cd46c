"""Benchmark: fp8mix.optim.AdamW's state formats against torch.optim.AdamW on real text.

    python benchmarks/bench_optim.py            # GPT 2x64, 150 steps, 3 seeds (a few minutes)
    python benchmarks/bench_optim.py --quick    # GPT 1x32, 40 steps, 1 seed; large 512x512
    python benchmarks/bench_optim.py --steps 300 --seeds 5 --threads 2

The model and data are fp8mix.tools.demo's: a byte-level GPT (float32 layers; only the
optimizer differs between runs) trained on the Python standard library's sources, the
last 10% of the bytes held out for validation. Every run of a seed starts from the same
weights and sees the same batches; the demo's recipe: AdamW betas (0.9, 0.95), weight
decay 0.1 on matrices and embeddings and 0 on biases and norms, linear warmup then
cosine decay, gradients clipped to norm 1.

Columns:
  state B/param  bytes of optimizer state per parameter, measured from the tensors in
                 opt.state after training (moments, scales, exponents, step counters;
                 the last FP8 block of a tensor is padded to block_size).
  step ms        median wall time of opt.step() alone over all steps and seeds; all
                 configurations of a seed train in lockstep (one step of each in turn), so
                 load from other processes hits them alike.
  vs torch       that median over torch.optim.AdamW's, measured in the same run.
  val loss       validation cross-entropy (nats/byte) after the last step, mean over seeds.
  dval %         (val loss - torch's) / torch's, per seed: mean [min, max].
  large ms       median opt.step() on one --large x --large float32 weight (default 2048:
                 4.2M parameters), configurations interleaved: the cost per element once
                 the per-tensor and per-op overheads that dominate the tiny GPT are
                 amortised.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import cpu_model  # noqa: E402

import fp8mix  # noqa: E402
from fp8mix.optim import AdamW, bytes_per_param  # noqa: E402
from fp8mix.tools.demo.data import batch, load_corpus, split_corpus  # noqa: E402
from fp8mix.tools.demo.model import GPT, evaluate, lr_at  # noqa: E402

# (label, exp_avg_dtype, exp_avg_sq_dtype); None = torch.optim.AdamW, the reference
CONFIGS = [
    ("torch AdamW", None, None),
    ("fp32 / fp32", "fp32", "fp32"),
    ("bf16 / bf16", "bf16", "bf16"),
    ("e4m3 / bf16 (default)", "e4m3", "bf16"),
    ("e4m3 / e4m3_expand", "e4m3", "e4m3_expand"),
    ("e4m3 / e4m3", "e4m3", "e4m3"),
    ("e5m2 / e5m2", "e5m2", "e5m2"),
]


def make_optimizer(model, m_fmt, v_fmt, lr):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    if m_fmt is None:
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))
    return AdamW(groups, lr=lr, betas=(0.9, 0.95), exp_avg_dtype=m_fmt, exp_avg_sq_dtype=v_fmt)


def run_seed(seed, args, train, val):
    """Train one copy of a seeded GPT per configuration, in lockstep; returns per config
    (step times in s, bytes per param, final val loss)."""
    gen = torch.Generator().manual_seed(seed)
    train_starts = torch.randint(0, len(train) - args.seq_len - 1, (args.steps, args.batch_size), generator=gen)
    val_starts = torch.randint(0, len(val) - args.seq_len - 1, (args.eval_batches, args.batch_size), generator=gen)
    torch.manual_seed(seed)
    base = GPT(args.layers, args.d_model, args.heads, args.seq_len)
    models = [copy.deepcopy(base) for _ in CONFIGS]
    opts = [make_optimizer(m, mf, vf, args.lr) for m, (_, mf, vf) in zip(models, CONFIGS)]
    times = [[] for _ in CONFIGS]
    warmup = max(1, args.steps // 20)
    for step in range(args.steps):
        x, y = batch(train, train_starts[step], args.seq_len, "cpu")
        lr = lr_at(step, args.steps, args.lr, warmup)
        for i, (model, opt) in enumerate(zip(models, opts)):
            for g in opt.param_groups:
                g["lr"] = lr
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            t0 = time.perf_counter()
            opt.step()
            times[i].append(time.perf_counter() - t0)
            opt.zero_grad(set_to_none=True)
    out = []
    for model, opt, t in zip(models, opts, times):
        vl = evaluate(model, "fp32", torch.device("cpu"), val, val_starts, args.seq_len)
        out.append((t[1:], bytes_per_param(opt), vl))  # step 0 creates the state: not timed
    return out, sum(p.numel() for p in base.parameters())


def time_large(n: int, reps: int) -> list:
    """Median opt.step() seconds per configuration on one (n, n) weight, interleaved."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, n) * 0.02) for _ in CONFIGS]
    opts = []
    for p, (_, mf, vf) in zip(params, CONFIGS):
        opts.append(torch.optim.AdamW([p], lr=1e-3) if mf is None else
                    AdamW([p], lr=1e-3, exp_avg_dtype=mf, exp_avg_sq_dtype=vf))
    times = [[] for _ in CONFIGS]
    for r in range(reps + 1):
        g = torch.randn(n, n) * 1e-3
        for i, (p, opt) in enumerate(zip(params, opts)):
            p.grad = g
            t0 = time.perf_counter()
            opt.step()
            if r:  # the first step creates the state
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="GPT 1x32, 40 steps, 1 seed")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--d-model", type=int)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--large", type=int, help="side of the weight timed alone (default 2048; --quick 512)")
    ap.add_argument("--large-reps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: steady on a shared machine)")
    args = ap.parse_args(argv)
    q = args.quick
    args.steps = args.steps or (40 if q else 150)
    args.seeds = args.seeds or (1 if q else 3)
    args.layers = args.layers or (1 if q else 2)
    args.d_model = args.d_model or (32 if q else 64)
    args.large = args.large or (512 if q else 2048)
    torch.set_num_threads(args.threads)

    corpus, desc = load_corpus(None)
    train, val = split_corpus(corpus, args.seq_len)
    print(f"# fp8mix.optim.AdamW vs torch.optim.AdamW ({datetime.date.today()})\n")
    print(f"- machine: {cpu_model()}, {platform.system()}, torch {torch.__version__}, fp8mix {fp8mix.__version__}, "
          f"{args.threads} thread(s), CPU ISA {fp8mix.cpu_isa()}")
    print(f"- corpus: {desc}")
    t_all = time.perf_counter()
    results = [[] for _ in CONFIGS]
    n_params = 0
    for seed in range(args.seeds):
        per_cfg, n_params = run_seed(seed, args, train, val)
        for r, x in zip(results, per_cfg):
            r.append(x)
    print(f"- model: GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads, seq {args.seq_len}, "
          f"{n_params:,} parameters; {args.steps} steps of batch {args.batch_size}, lr {args.lr:g}, "
          f"{args.seeds} seed(s); {time.perf_counter() - t_all:.0f} s")
    large = time_large(args.large, args.large_reps)
    print(f"- large: one {args.large}x{args.large} float32 weight, median of {args.large_reps} steps\n")

    med = [1e3 * statistics.median([t for times, _, _ in r for t in times]) for r in results]
    ref_loss = [vl for _, _, vl in results[0]]
    print("| state (exp_avg / exp_avg_sq) | state B/param | step ms | vs torch | val loss | dval % [min, max] "
          "| large ms | vs torch |")
    print("|---|---:|---:|---:|---:|---|---:|---:|")
    for (label, _, _), r, ms, lg in zip(CONFIGS, results, med, large):
        bpp = r[0][1]
        losses = [vl for _, _, vl in r]
        d = [100.0 * (vl - rl) / rl for vl, rl in zip(losses, ref_loss)]
        dtxt = "-" if r is results[0] else f"{statistics.mean(d):+.2f} [{min(d):+.2f}, {max(d):+.2f}]"
        print(f"| {label} | {bpp:.3f} | {ms:.2f} | {ms / med[0]:.2f}x | {statistics.mean(losses):.4f} | {dtxt} "
              f"| {1e3 * lg:.1f} | {lg / large[0]:.2f}x |")
    print("\nstate B/param: optimizer state bytes / parameters (measured); step ms: median opt.step() in the GPT "
          "runs; dval %: validation loss vs torch.optim.AdamW, per seed; large ms: median opt.step() on the "
          "large weight alone.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
