"""`python -m fp8mix demo`: the command that puts the demo's pieces together.

Order: check the options, load the corpus, print the header (corpus, model, machine and
its ISA), check checkpoints, time a few steps per variant (budget.py: slow bfloat16
skipped, the default demo's steps fitted to 5 minutes, ETA), train every variant for
every seed (seed outer, so a stopped demo has whole seeds), then print the table, the
gaps to float32 (with several seeds) and the summary, and write the CSV, JSON and (with
matplotlib) PNGs.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import platform
import time

import torch

import fp8mix

from .._common import UsageError, pick_device, require_positive
from .budget import PROBE_STEPS, fit_steps, format_duration, plan_runs, probe
from .checkpoint import LossLog, prepare_checkpoints
from .data import draw_starts, load_corpus, split_corpus
from .model import GPT
from .plots import have_matplotlib, plot_curves, plot_gaps
from .progress import have_tqdm
from .report import (
    GAP_LEGEND,
    LEGEND,
    aggregate,
    compute_gaps,
    format_gaps,
    format_table,
    output_paths,
    print_summary,
    write_csv,
    write_json,
)
from .train import train_one
from .variants import DEFAULT_RUNS, RunSpec, is_fp8, parse_recipes

__all__ = ["run", "check_args", "machine_info"]

BUDGET_S = 300.0  # the default demo is meant to finish within 5 minutes
DEFAULT_STEPS = 400


@dataclasses.dataclass(frozen=True)
class Choices:
    """What the user left to the demo: the variants (explicit_recipes False: the default
    set, a slow bf16 may be skipped), the steps (may_fit: shortened to the budget), the
    warmup (derived from the steps)."""

    explicit_recipes: bool
    may_fit: bool
    warmup_given: bool


def check_args(cfg) -> None:
    """Usage errors for sizes that cannot work."""
    require_positive(cfg, "steps", "batch_size", "seq_len", "layers", "d_model", "eval_every", "eval_batches",
                     "heads", "seeds", "checkpoint_every")
    if cfg.d_model % cfg.heads:
        raise UsageError(f"--d-model {cfg.d_model} is not divisible by --heads {cfg.heads}")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise UsageError(f"--lr must be > 0, got {cfg.lr}")
    ckdir, every = getattr(cfg, "checkpoint_dir", None), getattr(cfg, "checkpoint_every", None)
    if ckdir is None and every is not None:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if ckdir is None and getattr(cfg, "resume", False):
        raise UsageError("--resume needs --checkpoint-dir (the folder to resume from)")


def auto_threads(load: float, cpus: int, current: int) -> tuple:
    """(threads, note) for the default demo on the CPU: on a machine whose 1-minute load
    average already reaches its CPU count, torch's threads wait on each other behind other
    processes (measured on 2 busy cores: a demo step took 2x as long on 2 threads as on 1),
    so one thread; otherwise torch's choice."""
    if current > 1 and load >= cpus:
        return 1, (f"note: the machine is busy (load {load:.1f} on {cpus} CPUs): training on 1 thread instead of "
                   f"{current} (--threads {current} to override)")
    return current, ""


def _choose_threads(args, choices, device) -> str:
    """Apply --threads, or auto_threads for the default demo; returns the note to print."""
    threads = getattr(args, "threads", None)
    if threads is not None:
        if threads < 1:
            raise UsageError(f"--threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)  # fp8mix's kernels follow torch's thread count
        return ""
    if not choices.may_fit or device.type != "cpu" or not hasattr(os, "getloadavg"):
        return ""
    n, note = auto_threads(os.getloadavg()[0], os.cpu_count() or 1, torch.get_num_threads())
    if note:
        torch.set_num_threads(n)
    return note


def machine_info() -> dict:
    """The machine facts the header prints and results.json keeps."""
    return {"machine": platform.machine(), "fp8mix_isa": str(fp8mix.cpu_isa()),
            "torch_cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
            "threads": torch.get_num_threads(), "torch": str(torch.__version__)}


def _prepare(args) -> tuple:
    """Defaults, checks, device, output folder; returns (variants, Choices, device)."""
    if getattr(args, "seeds", None) is None:
        args.seeds = 1
    choices = Choices(explicit_recipes=args.recipes is not None, warmup_given=args.warmup is not None,
                      may_fit=args.steps is None and args.seeds == 1 and getattr(args, "checkpoint_dir", None) is None)
    if args.steps is None:
        args.steps = DEFAULT_STEPS
    if args.heads is None:
        args.heads = max(1, args.d_model // 32)
    if args.warmup is None:
        args.warmup = max(1, args.steps // 20)
    check_args(args)
    names = parse_recipes(args.recipes if choices.explicit_recipes else DEFAULT_RUNS)
    device = pick_device(args.device)
    if device.type == "cuda" and any(is_fp8(n) for n in names) and not \
            torch._C._dispatch_has_kernel_for_dispatch_key("fp8mix::scaled_mm", "CUDA"):
        raise UsageError("this fp8mix build has no CUDA kernels; use --device cpu or --recipes fp32,bf16")
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {args.out!r}: {exc.strerror}") from None
    args.thread_note = _choose_threads(args, choices, device)
    return names, choices, device


def _seed_data(args, train, val, seed: int) -> tuple:
    """(base model, train_starts, val_starts) of `seed`: the same for every variant."""
    train_starts, val_starts = draw_starts(train, val, steps=args.steps, batch_size=args.batch_size,
                                           eval_batches=args.eval_batches, seq_len=args.seq_len, seed=seed)
    torch.manual_seed(seed)
    return GPT(args.layers, args.d_model, args.heads, args.seq_len), train_starts, val_starts


def _print_header(args, desc: str, names: list, seeds: list, device, n_params: int) -> None:
    m = machine_info()
    print(f"fp8mix demo: corpus {desc}")
    print(f"model: GPT {args.layers} layers, d_model {args.d_model}, {args.heads} heads, {n_params:,} parameters; "
          f"{args.steps} steps of {args.batch_size}x{args.seq_len} bytes, AdamW lr {args.lr:g}; device {device}, "
          f"{m['threads']} threads")
    print(f"machine: {m['machine']}, fp8mix CPU kernels {m['fp8mix_isa']}, torch CPU kernels "
          f"{m['torch_cpu_capability']} (torch {m['torch']})")
    seed_txt = f"seed {seeds[0]}" if len(seeds) == 1 else f"{len(seeds)} seeds ({seeds[0]}..{seeds[-1]})"
    print(f"runs: {', '.join(names)}; {seed_txt}", flush=True)
    if getattr(args, "thread_note", ""):
        print(args.thread_note)
    if not args.no_progress and not have_tqdm():
        print("note: no progress bars (tqdm is not installed: pip install tqdm); one line per validation instead")


def _steps_left(specs: list, resume: dict, steps: int) -> dict:
    """variant -> steps still to train over all its seeds (resumed runs count the rest)."""
    left: dict = {}
    for s in specs:
        ck = resume.get(s.id)
        done = 0 if ck is None else (steps if ck[1]["done"] else ck[1]["step"])
        left[s.variant] = left.get(s.variant, 0) + steps - done
    return left


def _plan(args, names: list, choices: Choices, specs: list, resume: dict, seed0: tuple, train, device):
    """Time a few steps of every variant with steps left; print the timings and notes."""
    left = _steps_left(specs, resume, args.steps)
    base, train_starts, _ = seed0
    samples = probe([n for n in names if left.get(n)], base, args, train, train_starts, device)
    plan = plan_runs(names, samples, left, args, explicit=choices.explicit_recipes,
                     torch_isa=str(torch.backends.cpu.get_cpu_capability()))
    if samples:
        print(f"timing (1 warm-up + up to {PROBE_STEPS} steps each, taking turns; median / fastest): "
              + ", ".join(f"{n} {1000 * plan.step_s[n]:.0f} / {1000 * min(v):.0f} ms" for n, v in samples.items()))
    for note in plan.notes:
        print(note)
    return plan


def _fit(args, plan, choices: Choices, budget_s: float) -> bool:
    """Shorten every run of the default demo to fit `budget_s` (see budget.fit_steps);
    True when the steps changed (the batches must be drawn again)."""
    if not choices.may_fit:
        return False
    steps = fit_steps(args.steps, plan.total_s, budget_s, args.eval_every)
    if steps == args.steps:
        return False
    print(f"steps: {args.steps} per run would take ~{format_duration(plan.total_s)}, over the default demo's "
          f"{BUDGET_S / 60:.0f} minutes: training {steps} steps per run instead (--steps {args.steps} trains "
          "them all)")
    plan.scale(steps / args.steps)
    args.steps = steps
    if not choices.warmup_given:
        args.warmup = max(1, steps // 20)
    return True


def _print_eta(plan) -> None:
    if not plan.step_s:
        print("ETA: nothing to train (every run's final checkpoint exists)", flush=True)
        return
    per = ", ".join(f"{n} ~{format_duration(t)}" for n, t in plan.eta_s.items() if t)
    over = f" - over {BUDGET_S / 60:.0f} minutes: fewer --steps or --recipes shorten it" \
        if plan.total_s > BUDGET_S else ""
    print(f"ETA: ~{format_duration(plan.total_s)} ({per}){over}", flush=True)


def _train_all(args, specs: list, seed_data: dict, split: tuple, device, ckpt, configs, resume) -> list:
    """Every run of `specs` in order; returns their summaries."""
    loss_log = LossLog(args.loss_log, bool(getattr(args, "resume", False))) \
        if getattr(args, "loss_log", None) else None
    results = []
    for i, spec in enumerate(specs):
        base, train_starts, val_starts = seed_data[spec.seed]
        cfg = argparse.Namespace(**{**vars(args), "seed": spec.seed})
        results.append(train_one(spec.variant, base, cfg, (split[0], split[1], train_starts, val_starts), device,
                                 not args.no_progress, ckpt=ckpt, resume_from=resume.pop(spec.id, None),
                                 config=configs.get(spec.id), loss_log=loss_log,
                                 earlier=tuple(s.id for s in specs[:i]), run_id=spec.id))
    return results


def _write_outputs(args, desc: str, results: list, gaps: dict, seeds: list, extra: dict) -> list:
    """CSV, JSON and (with matplotlib) the PNGs; returns the paths written."""
    p = output_paths(args.out)
    write_csv(p["csv"], results)
    write_json(p["json"], args, desc, results, gaps, extra)
    written = [p["csv"], p["json"]]
    if have_matplotlib():
        plot_curves(p["curves_png"], args, results)
        written.insert(0, p["curves_png"])
        if gaps:
            plot_gaps(p["gap_png"], results, gaps, seeds)
            written.insert(1, p["gap_png"])
    else:
        print("note: no PNG plots (matplotlib is not installed: pip install matplotlib)")
    return written


def run(args: argparse.Namespace) -> int:
    """Entry point of `python -m fp8mix demo` (args from fp8mix.tools.cli). Returns the exit code.
    The CPU GEMMs sum in the canonical order: the demo's losses and checkpoints are the same
    bytes on every machine (docs/gemm_order.md)."""
    with fp8mix.using_gemm_order("canonical"):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    t_start = time.perf_counter()
    names, choices, device = _prepare(args)
    corpus, desc = load_corpus(args.data)
    train, val = split_corpus(corpus, args.seq_len)
    seeds = [args.seed + i for i in range(args.seeds)]
    seed_data = {s: _seed_data(args, train, val, s) for s in seeds}
    _print_header(args, desc, names, seeds, device, sum(p.numel() for p in seed_data[seeds[0]][0].parameters()))
    specs = [RunSpec(n, s, tagged=len(seeds) > 1) for s in seeds for n in names]
    ckpt, configs, resume = prepare_checkpoints(args, specs, device, corpus)
    if ckpt is not None:
        print(f"checkpoints: {ckpt.folder} every {ckpt.every} steps"
              + (f"; resuming {len(resume)} of {len(specs)} runs" if ckpt.resume else ""), flush=True)
    plan = _plan(args, names, choices, specs, resume, seed_data[seeds[0]], train, device)
    if _fit(args, plan, choices, BUDGET_S - (time.perf_counter() - t_start)):
        seed_data = {s: _seed_data(args, train, val, s) for s in seeds}
    _print_eta(plan)
    specs = [s for s in specs if s.variant in plan.runs]
    t0 = time.perf_counter()
    results = _train_all(args, specs, seed_data, (train, val), device, ckpt, configs, resume)
    wall = time.perf_counter() - t0
    gaps = compute_gaps(results, seeds)
    extra = {"machine": machine_info(), "seeds": seeds, "wall_s": wall,
             "plan": {"step_s": plan.step_s, "probe_s": plan.samples, "eta_s": plan.eta_s, "skipped": plan.skipped,
                      "notes": plan.notes}}
    paths = _write_outputs(args, desc, results, gaps, seeds, extra)
    on_cuda = device.type == "cuda"
    mem = ("peak CUDA MiB: torch.cuda.max_memory_allocated during the run" if on_cuda else
           "saved MiB: bytes autograd saved for backward in one step (unique storages, parameters excluded)")
    rows = aggregate(results)
    print()
    if len(seeds) > 1:
        print(f"means over {len(seeds)} seeds:")
    print(format_table(rows, on_cuda))
    print()
    print(LEGEND.format(mem=mem))
    if len(seeds) > 1 and gaps:
        print()
        print(format_gaps(gaps))
        print(GAP_LEGEND)
    print()
    print_summary(rows, gaps)
    for v, why in plan.skipped.items():
        print(f"{v}: skipped ({why})")
    print(f"total training time {wall:.1f} s; wrote {', '.join(paths)}")
    return 1 if any(r["diverged"] for r in results) else 0
