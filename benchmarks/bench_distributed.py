"""Benchmark: FSDP2 (fully_shard) all-gather bytes and step time, bf16 against FP8 all-gather,
2 processes on gloo (spawned here, no torchrun).

    python benchmarks/bench_distributed.py              # 4 layers of 1024, 20 timed steps
    python benchmarks/bench_distributed.py --quick      # 3 layers of 256, 6 timed steps
    python benchmarks/bench_distributed.py --hidden 2048 --layers 8 --steps 30 --threads 2

The model: `--layers` torch nn.Linear(hidden, hidden) with GELU between, converted by
fp8mix.convert_model, fully_shard per layer and at the root, AdamW, 32 rows per rank, every
configuration's FP8 GEMMs under CurrentScaling (the FP8 all-gather's rule). Configurations:

  bf16 all-gather     MixedPrecisionPolicy(param_dtype=bfloat16): FSDP2's usual baseline
  fp32 all-gather     float32 weights gathered, fp8mix casting them after the gather
  FP8 all-gather      convert_model(fsdp_fp8_all_gather=True): shards cast to FP8 first
  FP8 AG + precompute the same, precompute_fp8_scales_for_fsdp after each step
  FP8 primary         fp8mix.fp8_model_init weights, FP8MasterWeights(AdamW)

Columns:
  AG bytes/step   bytes the all-gathers deliver per rank per step (the gathered outputs,
                  counted by wrapping torch.distributed's all-gather in the workers),
                  forward and backward (FSDP2 gathers each layer again for its backward)
  vs bf16         that over the bf16 configuration's; PASS when <= 0.55 (FP8 rows)
  all-reduces     all-reduce calls per step (fp8mix's amax reductions, the FP8 scales)
  step ms         median over the timed steps of the slower rank's wall time per step
                  (forward, backward, optimizer step, precompute); every configuration
                  steps in turn, so load from elsewhere hits them alike
  vs bf16         that over bf16's median

On one machine gloo moves bytes through loopback TCP, so the step times say what the
FP8 casts around the gather cost here, not what a network saves; the bytes are what a
real interconnect would carry.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _machine import header_lines, load_average, verdict  # noqa: E402
from _spawn import add_run_args, run_workers  # noqa: E402

WORLD = 2
ROWS = 32
CONFIGS = ["bf16 all-gather", "fp32 all-gather", "FP8 all-gather", "FP8 AG + precompute", "FP8 primary"]


# --------------------------------------------------------------------------------------
# worker
# --------------------------------------------------------------------------------------
class _Counter:
    """Bytes of all-gather outputs and all-reduce calls, by wrapping torch.distributed's
    functions (FSDP2 calls all_gather_single on torch >= 2.13, all_gather_into_tensor before)."""

    def __init__(self):
        import torch.distributed as dist
        self.gather_bytes = 0
        self.reduces = 0
        for name in ("all_gather_single", "all_gather_into_tensor", "all_reduce"):
            if hasattr(dist, name):
                setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            if name == "all_reduce":
                self.reduces += 1
            else:
                self.gather_bytes += args[0].numel() * args[0].element_size()
            return fn(*args, **kwargs)
        return counted


def _build(config: str, hidden: int, layers: int):
    import torch.nn as nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import fp8mix
    from fp8mix.optim import FP8MasterWeights
    torch.manual_seed(0)
    mods = []
    with fp8mix.fp8_model_init(enabled=config == "FP8 primary"):
        for _ in range(layers):
            mods += [fp8mix.Linear(hidden, hidden) if config == "FP8 primary" else nn.Linear(hidden, hidden), nn.GELU()]
    model = nn.Sequential(*mods)
    if config != "FP8 primary":
        fp8mix.convert_model(model, fsdp_fp8_all_gather=config in ("FP8 all-gather", "FP8 AG + precompute"))
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16)} if config.startswith("bf16") else {}
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    if config == "FP8 primary":
        return model, FP8MasterWeights(model.parameters(), torch.optim.AdamW, lr=1e-4)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _worker(rank: int, port: int, out: str, hidden: int, layers: int, steps: int, warmup: int, threads: int):
    import torch.distributed as dist
    import torch.nn.functional as F

    import fp8mix
    from fp8mix.distributed import precompute_fp8_scales_for_fsdp
    from fp8mix.recipe import CurrentScaling
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    counter = _Counter()
    runs = {c: _build(c, hidden, layers) for c in CONFIGS}
    res: dict = {c: {"ms": [], "bytes": 0, "reduces": 0} for c in CONFIGS}
    gen = torch.Generator().manual_seed(rank)
    for step in range(warmup + steps):
        x = torch.randn(ROWS, hidden, generator=gen)
        for c, (model, opt) in runs.items():  # in turn: load from elsewhere hits them alike
            b0, r0 = counter.gather_bytes, counter.reduces
            dist.barrier()
            t0 = time.perf_counter()
            with fp8mix.fp8_autocast(fp8_recipe=CurrentScaling()):
                loss = F.mse_loss(model(x).float(), x)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if c == "FP8 AG + precompute":
                precompute_fp8_scales_for_fsdp(model)
            t = torch.tensor([time.perf_counter() - t0])
            if step >= warmup:
                res[c]["bytes"] += counter.gather_bytes - b0
                res[c]["reduces"] += counter.reduces - r0
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slower rank's time (after the counts: not counted)
            if step >= warmup:
                res[c]["ms"].append(1e3 * t.item())
            if not torch.isfinite(loss):
                raise RuntimeError(f"{c}: loss is {loss.item()}")
    if rank == 0:
        with open(out, "w") as f:
            json.dump({c: {"bytes": r["bytes"] / steps, "reduces": r["reduces"] / steps, "ms": r["ms"]}
                       for c, r in res.items()}, f)
    dist.destroy_process_group()


# --------------------------------------------------------------------------------------
# launcher and table
# --------------------------------------------------------------------------------------
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    add_run_args(ap, steps=20, warmup=3, quick_help="3 layers of 256, 6 timed steps")
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.layers, a.steps, a.warmup = 256, 3, 6, 2
    if a.worker:
        _worker(int(a.worker[0]), int(a.worker[1]), a.worker[2], a.hidden, a.layers, a.steps, a.warmup, a.threads)
        return 0

    import fp8mix
    load_before = load_average()
    res = run_workers(__file__, a, ("hidden", "layers", "steps", "warmup", "threads"), WORLD)
    if res is None:
        return 1
    base = res[CONFIGS[0]]
    base_ms = statistics.median(base["ms"])
    lines = ["# FSDP2 all-gather: bf16 vs FP8 (2 processes, gloo)", "", *header_lines(fp8mix.cpu_isa()),
             f"- load average after: {load_average()} (before: {load_before})",
             f"- model: {a.layers} x Linear({a.hidden}, {a.hidden}) + GELU, {ROWS} rows per rank, AdamW, "
             f"{a.steps} timed steps after {a.warmup}, {a.threads} torch thread(s) per process", "",
             "| configuration | AG bytes/step | vs bf16 | all-reduces/step | step ms (median) | vs bf16 "
             "| bytes <= 0.55x |", "|---|---:|---:|---:|---:|---:|---|"]
    ok = True
    for c in CONFIGS:
        r = res[c]
        ratio = r["bytes"] / base["bytes"]
        ms = statistics.median(r["ms"])
        fp8 = c.startswith("FP8")
        ok = ok and (ratio <= 0.55 or not fp8)
        lines.append(f"| {c} | {r['bytes']:,.0f} | {ratio:.3f} | {r['reduces']:.1f} | {ms:.2f} | {ms / base_ms:.2f} | "
                     f"{verdict(ratio <= 0.55) if fp8 else '-'} |")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
