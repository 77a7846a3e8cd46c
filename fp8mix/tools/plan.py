"""`python -m fp8mix plan`: search a per-layer FP8 precision plan for a model, print it, write it.

The model and its inputs are given as for ``inspect`` (``module.path:factory`` or a
torch.save'd file; random inputs of ``--input-shape`` / ``--input-dtype``, or
``--input-file``), and so is the default loss, ``out.float().pow(2).mean()`` (no targets
needed; the first tensor of a tuple/dict output). ``--loss module:function`` names a
``function(model, inputs) -> scalar loss`` instead (inputs: the tuple of input tensors).
:func:`fp8mix.search_plan` runs on ``--batches`` batches (the last third held out for
the verification); the table goes to stdout and the plan's JSON to ``--out``
(``fp8mix.Plan.load`` reads it; ``plan.apply(model)`` or ``convert_model(model, plan=plan)``
puts it on a model).

Entry points: :func:`main` (``python -m fp8mix.tools.plan``), and :func:`add_arguments` +
:func:`run` for the ``python -m fp8mix`` command line.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

import torch

import fp8mix

from ._common import UsageError, pick_device
from .inspect import first_tensor, load_model, make_inputs

__all__ = ["main", "add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `plan` (the model and input options are inspect's)."""
    p.add_argument("model", help="module.path:factory (called with no arguments, returns an nn.Module) or a "
                                 "torch.save'd model file (loaded with weights_only=False: trust the file)")
    p.add_argument("--input-shape", help="shape of a random example input, e.g. 8,128")
    p.add_argument("--input-dtype", default="float32",
                   help="float32 (default), bfloat16, float16, int64 or int32 (ints drawn from [0, --int-high))")
    p.add_argument("--int-high", type=int, default=256, help="upper bound of random integer inputs (default 256)")
    p.add_argument("--input-file", help="a torch.save'd tensor (or tuple of tensors) to use as every batch")
    p.add_argument("--loss", help="module.path:function(model, inputs) -> scalar loss (default: "
                                  "out.float().pow(2).mean() of the model's first output tensor)")
    p.add_argument("--batches", type=int, default=6,
                   help="batches to measure on (default 6: 4 for the search, 2 held out for the verification)")
    p.add_argument("--budget", type=float, default=fp8mix.plan.DEFAULT_BUDGET,
                   help="allowed loss increase, a fraction of the high-precision loss (default 0.01)")
    p.add_argument("--metric", default="loss", choices=("loss", "sqnr"),
                   help="loss (default: budgeted loss increase) or sqnr (the SQNR rule only, cheapest)")
    p.add_argument("--candidates", default="delayed,current,block",
                   help="comma-separated candidate recipes among delayed, current, block (default all three)")
    p.add_argument("--seed", type=int, default=0, help="seed of the model factory and random inputs (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--out", default="fp8mix_plan.json", help="where to write the plan's JSON (default "
                                                             "./fp8mix_plan.json)")


def _candidates(spec: str) -> dict:
    # fp8mix.plan by attribute: the tools import only fp8mix's public modules (tests/tools/test_layout.py)
    known = fp8mix.plan.default_candidates()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise UsageError(f"--candidates {spec!r}: choose from {', '.join(known)}")
    return {n: known[n] for n in names}


def _loss_fn(spec):
    """(model, batch) -> loss: the named function, or inspect's default loss."""
    if spec is None:
        def default(model, inputs):
            out = first_tensor(model(*inputs))
            if out is None:
                raise UsageError("the model's output holds no tensor")
            return out.float().pow(2).mean()
        return default
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise UsageError(f"--loss {spec!r}: expected module.path:function")
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--loss {spec!r}: {type(exc).__name__}: {exc}") from None
    if not callable(fn):
        raise UsageError(f"--loss {spec!r} is not callable")
    return fn


def run(args: argparse.Namespace) -> int:
    """Search, print the table, write the JSON; returns the exit code."""
    if args.batches < 1:
        raise UsageError(f"--batches must be >= 1, got {args.batches}")
    if not 0.0 <= args.budget < 1.0:
        raise UsageError(f"--budget is a fraction of the loss in [0, 1), got {args.budget}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.out))):
        raise UsageError(f"--out {args.out!r}: its folder does not exist")
    candidates = _candidates(args.candidates)
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    model = load_model(args.model, device)
    make = make_inputs(args, device)
    batches = [make(i) for i in range(args.batches)]
    loss_fn = _loss_fn(args.loss)
    try:
        plan = fp8mix.search_plan(model, batches, loss_fn, candidates=candidates, budget=args.budget,
                                  metric=args.metric)
    except UsageError:
        raise
    except (TypeError, ValueError, RuntimeError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise UsageError(f"the search failed: {type(exc).__name__}: {msg}") from None
    print(f"fp8mix plan: {args.model} - {len(plan.layers)} linear layers, {args.batches} batches "
          f"({'--loss ' + args.loss if args.loss else 'loss = out.float().pow(2).mean()'})")
    print("columns: cost = predicted loss increase in FP8 (max of solo and keep-gain); solo = loss increase with "
          "only this layer in FP8; keep-gain = loss decrease from keeping only it in high precision; SQNR = the "
          "layer's own output SQNR in dB per candidate and under the plan")
    print()
    print(plan.table())
    try:
        plan.save(args.out)
    except OSError as exc:
        raise UsageError(f"cannot write --out {args.out!r}: {exc.strerror}") from None
    print(f"\nwrote {args.out}")
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def main(argv=None) -> int:
    """`python -m fp8mix.tools.plan ARGS`: parse, run, and map usage errors to exit code 2."""
    p = _Parser(prog="python -m fp8mix plan",
                description="Search a per-layer FP8 precision plan: measure each linear layer's sensitivity on a "
                            "few batches, keep the sensitive ones in high precision, print the table and write the "
                            "plan as JSON.")
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        print(f"python -m fp8mix plan: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
