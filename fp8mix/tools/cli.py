"""Command line of fp8mix: ``python -m fp8mix {demo,inspect}``.

- ``demo``: train a small GPT on a local corpus in float32, bfloat16 and FP8 and
  compare losses (over seeds: gap to float32 with a 95% interval), speed, memory and FP8
  overflow/underflow (fp8mix.tools.demo).
- ``inspect``: run a model for a few steps under FP8 and report, per linear layer and
  tensor role, amax ranges, the recommended FP8 format and which layers should stay in
  high precision (fp8mix.tools.inspect).

The tools are imported only when their command runs. Bad arguments print one line on
stderr and exit with code 2 (no traceback).
"""
from __future__ import annotations

import argparse
import os
import sys

from ._common import UsageError

__all__ = ["main", "build_parser", "UsageError"]


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are a single line (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="train a small GPT in fp32, bf16 and FP8 and compare",
                       description="Train a small byte-level GPT on a local corpus (default: this Python's "
                                   "stdlib sources) in float32, bfloat16 and FP8 from the same initial weights "
                                   "and batches (with --seeds N: N seeds, and each run's gap to float32 with a "
                                   "95% interval); print a comparison table and write loss curves (PNG, CSV, "
                                   "JSON). Before the runs, a few timed steps give an ETA. Exit code 1 if a run "
                                   "diverges.")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per run (default 400; fewer, with a note, when the timed steps say 400 "
                        "would take the demo over 5 minutes)")
    p.add_argument("--recipes", default=None,
                   help="comma-separated runs: fp32, bf16, fp8-delayed, fp8-current, fp8-block "
                        "(aliases delayed, current, block; default fp32,bf16,fp8-delayed, where bf16 is skipped "
                        "with a note when this CPU's bfloat16 is many times slower than float32)")
    p.add_argument("--seeds", type=int, default=1,
                   help="train every run for this many seeds (--seed, --seed+1, ...; the same seed gives the "
                        "same initial weights and batches to every run) and report each run's validation-loss "
                        "gap to fp32 as mean +- 95%% interval (default 1)")
    p.add_argument("--out", default="fp8mix_out", help="output folder (default ./fp8mix_out)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for torch and fp8mix (default: torch's, or 1 when the machine is already "
                        "busier than its cores, where several threads spin against other processes)")
    p.add_argument("--data", default=None, help="text file or folder to train on (default: the stdlib's *.py)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and batch order (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto (cuda when available)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--seq-len", type=int, default=128, help="bytes per sequence (default 128)")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks (default 4)")
    p.add_argument("--d-model", type=int, default=128, help="model width (default 128)")
    p.add_argument("--heads", type=int, default=None, help="attention heads (default d_model/32)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak AdamW learning rate (default 3e-3)")
    p.add_argument("--warmup", type=int, default=None, help="warmup steps (default steps/20)")
    p.add_argument("--eval-every", type=int, default=50,
                   help="validate (and sample FP8 casts) every N steps (default 50)")
    p.add_argument("--eval-batches", type=int, default=8, help="validation batches (default 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--checkpoint-dir", default=None,
                   help="write each run's checkpoints here (atomically; the last 2 per run are kept)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="checkpoint every N steps, and after the last (default: --eval-every)")
    p.add_argument("--resume", action="store_true",
                   help="continue each run from its newest checkpoint in --checkpoint-dir (runs whose final "
                        "checkpoint exists are not retrained; a different configuration is refused)")
    p.add_argument("--loss-log", default=None,
                   help="write every training step's loss here: '<run> <step> <repr> <float.hex>' per line, "
                        "flushed each step (rewritten from the checkpoints on --resume)")
    p.set_defaults(func=_run_demo)


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="per-layer FP8 format advice for a model",
                       description="Convert a model with fp8mix.convert_model, run a few forward/backward steps "
                                   "under fp8_autocast(DelayedScaling) with loss out.float().pow(2).mean(), and "
                                   "report per linear layer: amax ranges, recommended FP8 format per tensor role "
                                   "with the reason, overflow/underflow fractions, SQNR, and which layers to keep "
                                   "in high precision.")
    p.add_argument("model", help="module.path:factory (called with no arguments, returns an nn.Module) or a "
                                 "torch.save'd model file (loaded with weights_only=False: trust the file)")
    p.add_argument("--input-shape", help="shape of a random example input, e.g. 8,128")
    p.add_argument("--input-dtype", default="float32",
                   help="float32 (default), bfloat16, float16, int64 or int32 (ints drawn from [0, --int-high))")
    p.add_argument("--int-high", type=int, default=256, help="upper bound of random integer inputs (default 256)")
    p.add_argument("--input-file", help="a torch.save'd tensor (or tuple of tensors) to use as input instead")
    p.add_argument("--steps", type=int, default=3, help="forward/backward steps (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--json", help="write the report as JSON here (one entry per linear layer)")
    p.set_defaults(func=_run_inspect)


def build_parser() -> argparse.ArgumentParser:
    """The `python -m fp8mix` parser with its subcommands."""
    parser = _Parser(prog="python -m fp8mix", description="fp8mix command-line tools.")
    sub = parser.add_subparsers(title="commands", dest="command", metavar="{demo,inspect,plan}", required=True,
                                parser_class=_Parser)
    _add_demo(sub)
    _add_inspect(sub)
    _add_plan(sub)
    return parser


def _add_plan(sub) -> None:
    from .plan import add_arguments

    p = sub.add_parser("plan", help="measure which layers FP8 hurts and write a precision plan",
                       description="Search a per-layer FP8 plan (fp8mix.search_plan) for a model: print the "
                                   "table and write the plan as JSON.")
    add_arguments(p)
    p.set_defaults(func=_run_plan)


def _run_plan(args) -> int:
    from .plan import run

    return run(args)


def _run_demo(args) -> int:
    from .demo.main import run

    return run(args)


def _run_inspect(args) -> int:
    from .inspect import run

    return run(args)


def main(argv=None) -> int:
    """Parse `argv` (default sys.argv[1:]) and run the chosen command; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"python -m fp8mix {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"python -m fp8mix {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into e.g. `head`, which stopped reading
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
