"""How long the demo will take, and which runs fit: a few timed steps per variant.

Before the runs start each variant trains a throwaway copy of the model for one warm-up
and up to ``PROBE_STEPS`` timed steps, the variants taking turns step by step so that a
change in the machine's load (other processes) hits all of them alike; a variant whose
timed step took ``LONG_STEP_S`` or more is measured enough and sits out the other turns.
torch's RNG state is restored afterwards, so the real runs are unchanged. Then:

* ETA per variant = remaining steps x median step x (1 + validation share), validation
  share = eval_batches / (3 eval_every) (a validation batch is a forward, about a third
  of a training step);
* the default demo fits 5 minutes: when ``--steps`` was not given (and the demo neither
  checkpoints nor trains several seeds) and the ETA exceeds the budget, every run trains
  fewer steps, the same number for all (``fit_steps``: a multiple of eval_every, at least
  ``MIN_FIT_STEPS``, half the default), with a note;
* a slow bfloat16: on CPUs without native bfloat16 (AVX2 only; torch's bf16 matmul is
  30-160x slower than float32 there) a bf16 step takes many times a float32 one. When
  the runs were not chosen with ``--recipes`` (the default set) and bf16's fastest step
  took more than ``SLOW_BF16`` times fp32's fastest (the fastest: the step least
  disturbed by other processes), the bf16 run is skipped with a note; with an explicit
  ``--recipes`` it runs, and the note gives its ETA.
"""
from __future__ import annotations

import dataclasses
import statistics

import torch

from .data import batch
from .train import Run

__all__ = ["PROBE_STEPS", "SLOW_BF16", "MIN_FIT_STEPS", "RunSchedule", "probe", "plan_runs", "fit_steps",
           "format_duration"]

PROBE_WARMUP = 1
PROBE_STEPS = 3
LONG_STEP_S = 2.0  # one timed step this long is measurement enough (an emulated bf16 step: 4-9 s)
SLOW_BF16 = 3.0
MIN_FIT_STEPS = 200  # half the default: shorter runs compare points where the loss still falls steeply


def probe(names: list, base: torch.nn.Module, cfg, train: torch.Tensor, train_starts: torch.Tensor,
          device: torch.device) -> dict:
    """variant -> seconds of its timed training steps (1 to PROBE_STEPS), each variant on a
    throwaway copy of `base` after a warm-up step, on the first batches of `train_starts`;
    the variants take turns step by step (see the module docstring)."""
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    runs = {n: Run(n, base, cfg, device) for n in names}
    try:
        for i in range(PROBE_WARMUP + PROBE_STEPS):
            x, y = batch(train, train_starts[i % len(train_starts)], cfg.seq_len, device)
            for r in runs.values():
                if i > PROBE_WARMUP and r.times[-1] >= LONG_STEP_S:
                    continue
                r.step(i, x, y, sample=False)
    finally:
        for r in runs.values():
            r.close()
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    return {n: r.times[PROBE_WARMUP:] for n, r in runs.items()}


@dataclasses.dataclass
class RunSchedule:
    """Which variants train, which were skipped (variant -> reason), notes to print, the
    estimated seconds per variant (all its seeds) and in total, the median step per
    variant and the probe's samples."""

    runs: list
    skipped: dict
    notes: list
    eta_s: dict
    step_s: dict
    samples: dict

    @property
    def total_s(self) -> float:
        return sum(self.eta_s.values())

    def scale(self, factor: float) -> None:
        """Every ETA times `factor` (the runs' steps changed by it)."""
        self.eta_s = {n: t * factor for n, t in self.eta_s.items()}


def fit_steps(steps: int, total_s: float, budget_s: float, eval_every: int) -> int:
    """The steps per run whose ETA fits `budget_s`, the ETA `total_s` of `steps` scaling
    linearly: `steps` when it fits, else the largest multiple of `eval_every` that does,
    but never below MIN_FIT_STEPS (or `steps`, if smaller)."""
    if total_s <= budget_s or steps <= MIN_FIT_STEPS:
        return steps
    n = int(steps * max(budget_s, 0.0) / total_s)
    if n >= eval_every:
        n -= n % eval_every
    return max(MIN_FIT_STEPS, min(n, steps))


def format_duration(s: float) -> str:
    """'45 s', '3.2 min', '1.5 h'."""
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def plan_runs(names: list, samples: dict, steps_left: dict, cfg, *, explicit: bool, torch_isa: str) -> RunSchedule:
    """The plan for variants `names` given the probe's `samples` (variant -> seconds of its
    timed steps) and `steps_left` (variant -> steps still to train over all seeds).
    `explicit`: the user chose the variants (--recipes), so none is skipped."""
    share = 1.0 + cfg.eval_batches / (3.0 * cfg.eval_every)
    step_s = {n: statistics.median(v) for n, v in samples.items() if v}
    eta = {n: steps_left.get(n, 0) * step_s.get(n, 0.0) * share for n in names}
    plan = RunSchedule(list(names), {}, [], eta, step_s, dict(samples))
    ref = min(samples["fp32"]) if samples.get("fp32") else None
    slow = min(samples["bf16"]) if samples.get("bf16") else None
    if ref and slow and slow > SLOW_BF16 * ref:
        why = (f"a bfloat16 step took {slow / ref:.0f}x a float32 one here (torch's CPU kernels: {torch_isa}; "
               "CPUs without native bfloat16 run it 30-160x slower, a loaded machine a few times), so the bf16 run "
               f"alone would take ~{format_duration(eta['bf16'])}")
        if explicit:
            plan.notes.append(f"note: {why}; it runs because --recipes asked for it")
        else:
            plan.runs.remove("bf16")
            plan.skipped["bf16"] = why
            del plan.eta_s["bf16"]
            forced = ",".join(names)
            plan.notes.append(f"bf16: skipped - {why}. Run it anyway with --recipes {forced}")
    return plan
