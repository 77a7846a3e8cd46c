"""Helpers shared by the Python tests: one copy of what several test files need.

Imported as ``from helpers import ...`` from any folder below tests/ (tests/conftest.py puts
tests/ on sys.path, also when pytest runs a single file). What is here:

  * RECIPES / RECIPE_IDS: DelayedScaling, CurrentScaling and BlockScaling at their defaults;
  * sqnr_db: the signal-to-quantization-noise ratio every accuracy bound is written in;
  * make_pair: an nn.Linear and an fp8mix.Linear with the same initial parameters;
  * fp8_state / assert_same_state: a module's FP8 state entries, and their bitwise equality;
  * OpNames: a dispatch mode that records the name of every op a block runs;
  * write_corpus: the demo's training text in the CLI / resume / tools tests (conftest's
    ``corpus`` fixture writes it into tmp_path).

What is not here: fixtures (tests/conftest.py: one_thread), and the reference computations
of a single topic (tests/fp8_reference.py, tests/recipes/mx_reference.py, each test file's
own float64 references): a helper must not hide what a test asserts.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import fp8mix
from fp8mix.recipe import BlockScaling, CurrentScaling, DelayedScaling

# Each recipe at its defaults (a fresh object per call: a test may not share one).
RECIPES = {
    "delayed": lambda: DelayedScaling(),
    "current": lambda: CurrentScaling(),
    "block": lambda: BlockScaling(),
}
RECIPE_IDS = list(RECIPES)


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """SQNR of `out` against `ref` in dB, in float64 on the CPU: 10 log10(sum ref^2 / sum (out - ref)^2).

    inf when out equals ref exactly; -inf when ref is all zeros and out is not."""
    ref = ref.detach().double().cpu()
    err = out.detach().double().cpu() - ref
    num, den = float(ref.pow(2).sum()), float(err.pow(2).sum())
    if den == 0.0:
        return math.inf
    return 10.0 * math.log10(num / den) if num > 0 else -math.inf


def make_pair(in_f, out_f, bias=True, dtype=None, seed=0):
    """An nn.Linear and an fp8mix.Linear built from the same RNG state."""
    torch.manual_seed(seed)
    ref = nn.Linear(in_f, out_f, bias=bias, dtype=dtype)
    torch.manual_seed(seed)
    lin = fp8mix.Linear(in_f, out_f, bias=bias, dtype=dtype)
    return ref, lin


def fp8_state(module: nn.Module) -> dict:
    """Copies of the FP8 state entries (``*.fp8_*``) of module's state_dict."""
    return {k: v.clone() for k, v in module.state_dict().items() if k.rsplit(".", 1)[-1].startswith("fp8_")}


def assert_same_state(a: dict, b: dict) -> None:
    """Two non-empty state dicts with the same keys and bitwise-equal tensors."""
    assert a.keys() == b.keys() and a
    for k in a:
        assert torch.equal(a[k], b[k]), k


class OpNames(TorchDispatchMode):
    """Records the name (overload packet) of every op dispatched inside it, in order, in `names`."""

    def __init__(self):
        super().__init__()
        self.names: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def write_corpus(path):
    """Writes a ~28 KB text (600 small Python functions) to path, a pathlib.Path; returns path."""
    path.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}  # line {i}\n" for i in range(600)))
    return path
