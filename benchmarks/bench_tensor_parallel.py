"""Benchmark: 2-way tensor parallel in FP8 (torch's ColwiseParallel / RowwiseParallel over
fp8mix.Linear), 2 processes on gloo (spawned here, no torchrun): the collectives a step
makes and its time, with and without fp8mix's per-forward check that the ranks agree on
their FP8 settings.

    python benchmarks/bench_tensor_parallel.py            # 2 MLP blocks of 1024 -> 4096 -> 1024
    python benchmarks/bench_tensor_parallel.py --quick    # 2 blocks of 256 -> 1024 -> 256

The model: `--blocks` MLP blocks (fc1 colwise, GELU, fc2 rowwise), 64 rows (replicated on
both ranks), AdamW. Configurations, each stepping in turn (load from elsewhere hits them
alike):

  high precision      the TP model outside fp8_autocast (torch's DTensor math): the baseline
  FP8                 inside fp8_autocast(DelayedScaling(reduce_amax=False)): the amaxes
                      all-reduced over the TP group only
  FP8, no check       the same with every layer's ``fp8_tp_check = False``

Columns: all-reduces and all-gathers per step (counted by wrapping torch.distributed's
functions in the workers: fp8mix's amax all-reduces and recipe checks; DTensor's own
collectives go through functional collectives and are not counted), the median step time
of the slower rank, and its ratio to the baseline. PASS when the recipe check costs at most
10% of the FP8 step (FP8 / FP8 no check <= 1.10). On one machine gloo runs over loopback,
so the times say what fp8mix adds around the collectives, not what a network costs.
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
ROWS = 64
CONFIGS = ["high precision", "FP8", "FP8, no check"]


class _Counter:
    def __init__(self):
        import torch.distributed as dist
        self.counts = {"all_reduce": 0, "all_gather": 0}
        for name in self.counts:
            setattr(dist, name, self._wrap(name, getattr(dist, name)))

    def _wrap(self, name, fn):
        def counted(*args, **kwargs):
            self.counts[name] += 1
            return fn(*args, **kwargs)
        return counted


def _build(hidden: int, blocks: int, check: bool):
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import fp8mix
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
                            for _ in range(blocks)])
    fp8mix.convert_model(model)
    mesh = init_device_mesh("cpu", (WORLD,))
    parallelize_module(model, mesh, {f"{b}.{i}": ColwiseParallel() if i == 0 else RowwiseParallel()
                                     for b in range(blocks) for i in (0, 2)})
    for m in model.modules():
        if isinstance(m, fp8mix.Linear):
            m.fp8_tp_check = check
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _worker(rank: int, port: int, out: str, hidden: int, blocks: int, steps: int, warmup: int, threads: int):
    import torch.distributed as dist

    import fp8mix
    torch.set_num_threads(threads)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=60))
    runs = {c: _build(hidden, blocks, check=c != "FP8, no check") for c in CONFIGS}
    counter = _Counter()
    res: dict = {c: {"ms": [], "all_reduce": 0, "all_gather": 0} for c in CONFIGS}
    gen = torch.Generator().manual_seed(0)  # the same rows on both ranks (the TP input is replicated)
    recipe = fp8mix.recipe.DelayedScaling(reduce_amax=False)
    for step in range(warmup + steps):
        x = torch.randn(ROWS, hidden, generator=gen)
        for c, (model, opt) in runs.items():
            before = dict(counter.counts)
            dist.barrier()
            t0 = time.perf_counter()
            with fp8mix.fp8_autocast(enabled=c != "high precision", fp8_recipe=recipe):
                loss = (model(x) - x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            t = torch.tensor([time.perf_counter() - t0])
            if step >= warmup:
                for k in ("all_reduce", "all_gather"):
                    res[c][k] += counter.counts[k] - before[k]
            dist.all_reduce(t, op=dist.ReduceOp.MAX)  # (after the counts: not counted)
            if step >= warmup:
                res[c]["ms"].append(1e3 * t.item())
            if not torch.isfinite(loss):
                raise RuntimeError(f"{c}: loss is {loss.item()}")
    if rank == 0:
        with open(out, "w") as f:
            json.dump({c: {"all_reduce": r["all_reduce"] / steps, "all_gather": r["all_gather"] / steps,
                           "ms": r["ms"]} for c, r in res.items()}, f)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=2)
    add_run_args(ap, steps=10, warmup=2, quick_help="blocks of 256, 6 timed steps")
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.steps, a.warmup = 256, 6, 2
    if a.worker:
        _worker(int(a.worker[0]), int(a.worker[1]), a.worker[2], a.hidden, a.blocks, a.steps, a.warmup, a.threads)
        return 0

    import fp8mix
    load_before = load_average()
    res = run_workers(__file__, a, ("hidden", "blocks", "steps", "warmup", "threads"), WORLD)
    if res is None:
        return 1
    ms = {c: statistics.median(res[c]["ms"]) for c in CONFIGS}
    check = ms["FP8"] / ms["FP8, no check"]
    ok = check <= 1.10
    lines = ["# 2-way tensor parallel in FP8 (2 processes, gloo)", "", *header_lines(fp8mix.cpu_isa()),
             f"- load average after: {load_average()} (before: {load_before})",
             f"- model: {a.blocks} x MLP({a.hidden} -> {4 * a.hidden} -> {a.hidden}), fc1 colwise, fc2 rowwise, "
             f"{ROWS} rows, AdamW, {a.steps} timed steps after {a.warmup}, {a.threads} torch thread(s) per process",
             "", "| configuration | all-reduces/step | all-gathers/step | step ms (median) | vs high precision |",
             "|---|---:|---:|---:|---:|"]
    for c in CONFIGS:
        r = res[c]
        lines.append(f"| {c} | {r['all_reduce']:.1f} | {r['all_gather']:.1f} | {ms[c]:.2f} | "
                     f"{ms[c] / ms[CONFIGS[0]]:.2f} |")
    lines += ["", f"recipe check: FP8 / FP8 no check = {check:.3f} (<= 1.10): {verdict(ok)}"]
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
