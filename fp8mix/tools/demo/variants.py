"""The demo's variants ("runs"): float32, bfloat16 and the FP8 recipes, and what each one
trains under (precision context, recipe object, gradient scaler).

- ``fp32``: plain float32;
- ``bf16``: ``torch.autocast(dtype=torch.bfloat16)``;
- ``fp8-delayed`` / ``fp8-current`` / ``fp8-block``: every nn.Linear converted to
  fp8mix.Linear, under ``fp8mix.fp8_autocast`` with DelayedScaling(HYBRID, history 16),
  CurrentScaling(HYBRID) or BlockScaling(), trained with fp8mix.FP8GradScaler.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

import torch

import fp8mix

from .._common import UsageError

__all__ = ["RunSpec", "RUN_NAMES", "ALIASES", "DEFAULT_RUNS", "parse_recipes", "is_fp8", "fp8_recipe",
           "precision_context", "make_scaler"]

RUN_NAMES = ("fp32", "bf16", "fp8-delayed", "fp8-current", "fp8-block")
ALIASES = {"float32": "fp32", "bfloat16": "bf16", "fp8": "fp8-delayed", "delayed": "fp8-delayed",
           "current": "fp8-current", "block": "fp8-block"}
DEFAULT_RUNS = "fp32,bf16,fp8-delayed"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One training run: a variant (a name of RUN_NAMES) trained from `seed`. Runs of the
    same seed share initial weights and batch order. `tagged`: the seed is part of the
    run's id (when the demo trains several seeds), else the id is the variant."""

    variant: str
    seed: int
    tagged: bool = False

    @property
    def id(self) -> str:
        """The run's name in tables, checkpoint files and the loss log."""
        return f"{self.variant}-seed{self.seed}" if self.tagged else self.variant


def parse_recipes(spec: str) -> list[str]:
    """'fp32,bf16,delayed' -> canonical run names, in order, without duplicates."""
    names: list[str] = []
    for raw in spec.split(","):
        n = raw.strip().lower()
        n = ALIASES.get(n, n)
        if n not in RUN_NAMES:
            raise UsageError(f"unknown recipe {raw.strip()!r}; choose from {', '.join(RUN_NAMES)} "
                             f"(aliases: {', '.join(ALIASES)})")
        if n not in names:
            names.append(n)
    if not names:
        raise UsageError("--recipes is empty")
    return names


def is_fp8(name: str) -> bool:
    """Whether run `name` trains its linear layers in FP8."""
    return name.startswith("fp8")


@functools.lru_cache(maxsize=None)
def fp8_recipe(name: str):
    """The recipe object of FP8 run `name` (one per name, shared by its steps)."""
    if name == "fp8-delayed":
        return fp8mix.recipe.DelayedScaling(fp8_format=fp8mix.Format.HYBRID, amax_history_len=16)
    if name == "fp8-current":
        return fp8mix.recipe.CurrentScaling(fp8_format=fp8mix.Format.HYBRID)
    if name == "fp8-block":
        return fp8mix.recipe.BlockScaling()
    raise ValueError(f"{name!r} is not an FP8 run")


def precision_context(name: str, device: torch.device):
    """The context one training/eval step of run `name` executes in."""
    if name == "fp32":
        return contextlib.nullcontext()
    if name == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return fp8mix.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe(name))


def make_scaler(name: str, device: torch.device):
    """The run's gradient scaler (torch.amp.GradScaler's interface), or None: FP8 runs
    get fp8mix.FP8GradScaler (skips steps with inf/NaN gradients, reacts to the FP8
    gradient casts' counts); float32 and bfloat16 runs need none."""
    if not is_fp8(name):
        return None
    return fp8mix.FP8GradScaler(device=device.type)
