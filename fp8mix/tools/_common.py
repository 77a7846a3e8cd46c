"""What the command-line tools share: the usage error, device choice and JSON helpers.

Nothing here knows about a particular tool; the tools import this module, never each other.
"""
from __future__ import annotations

import math

import torch

__all__ = ["UsageError", "pick_device", "json_safe", "require_positive"]


class UsageError(ValueError):
    """A bad command-line argument or input: reported as one line, exit code 2."""


def pick_device(name: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a usage error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UsageError(f"unknown --device {name!r}; use auto, cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device available")
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"unsupported --device {name!r}; use auto, cpu or cuda")
    return dev


def require_positive(args, *names: str) -> None:
    """UsageError naming the first option among `names` (attributes of `args`) that is set
    and below 1; None means "not given" and passes."""
    for k in names:
        v = getattr(args, k, None)
        if v is not None and v < 1:
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1, got {v}")


def json_safe(o):
    """`o` with non-finite floats replaced by strings ("inf", "nan"), so the JSON is standard."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: json_safe(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [json_safe(v) for v in o]
    return o
