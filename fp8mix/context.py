"""fp8_autocast: the context in which fp8mix modules compute in FP8.

A stack of frames; the innermost wins, ``enabled=False`` turns FP8 off inside.
Usable as a context manager or a decorator. State is per thread (like
torch.autocast). Transformer Engine 2.x's spelling ``autocast(enabled, recipe,
amax_reduction_group)`` is fp8mix.compat's.

Only training forwards change FP8 state: under ``torch.no_grad()``,
``torch.inference_mode()`` or ``module.eval()`` the modules read their scales and write
nothing (evaluation, ``generate()``). ``calibrating=True`` records amaxes in any mode —
with ``enabled=False`` the modules then compute in high precision while their delayed
scaling state learns the tensors' ranges (Transformer Engine's calibration).
"""
from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Optional

from .recipe import RECIPES, DelayedScaling, NVFP4BlockScaling

__all__ = ["fp8_autocast", "is_fp8_enabled", "get_fp8_recipe", "get_fp8_group", "FP8Frame", "as_bool"]


def as_bool(owner: str, name: str, v) -> bool:
    """The one rule for flags: a Python bool, else a TypeError naming the argument (an int
    or a tensor is not silently taken for a flag)."""
    if not isinstance(v, bool):
        raise TypeError(f"{owner}: {name} must be True or False, got {type(v).__name__} {v!r}")
    return v


@dataclass(frozen=True)
class FP8Frame:
    enabled: bool
    recipe: Any
    group: Any
    monitor: Any = None
    calibrating: bool = False


class _State(threading.local):
    def __init__(self):
        self.stack: list = []


_state = _State()
# The recipe of fp8_autocast() without one, built once: recipes are frozen values, and
# building one (with its validation) on every step's context cost more than a layer's casts.
_default_recipe: list = []
# Whether any fp8mix module has run inside an enabled fp8_autocast in this process: a
# context around a model without fp8mix modules (convert_model forgotten) warns once.
_ran = [False]
_warned = [False]


def note_module_ran() -> None:
    _ran[0] = True


def current_frame() -> Optional[FP8Frame]:
    """The innermost active fp8_autocast frame, or None outside any."""
    return _state.stack[-1] if _state.stack else None


def is_fp8_enabled() -> bool:
    f = current_frame()
    return bool(f and f.enabled)


def get_fp8_recipe():
    f = current_frame()
    return f.recipe if f else None


def get_fp8_group():
    f = current_frame()
    return f.group if f else None


class fp8_autocast(contextlib.ContextDecorator):
    """Run fp8mix modules in FP8 inside this context.

    Args:
        enabled: False turns FP8 off inside (nesting: the innermost context wins).
        fp8_recipe: a :class:`~fp8mix.recipe.DelayedScaling` (default, HYBRID format),
            :class:`~fp8mix.recipe.CurrentScaling` or :class:`~fp8mix.recipe.BlockScaling`.
        fp8_group: process group over which amaxes are all-reduced (MAX) so every
            data-parallel rank uses identical scales; default: the world group when
            torch.distributed is initialised.
        monitor: an :class:`fp8mix.Monitor`; on its sampled steps every fp8mix module
            inside reports the statistics of each of its casts (eager mode only).
        calibrating: record amaxes (delayed scaling) even in evaluation; with
            ``enabled=False`` the modules compute in high precision meanwhile.

    The backward pass uses the recipe its forward pass used, wherever backward runs.
    A module may run any number of times inside one context.
    """

    def __init__(self, enabled: bool = True, fp8_recipe=None, fp8_group=None, monitor=None,
                 calibrating: bool = False):
        as_bool("fp8_autocast", "enabled", enabled)
        as_bool("fp8_autocast", "calibrating", calibrating)
        if fp8_recipe is None:
            if not _default_recipe:
                _default_recipe.append(DelayedScaling())
            fp8_recipe = _default_recipe[0]
        if not isinstance(fp8_recipe, (*RECIPES, NVFP4BlockScaling)):
            raise TypeError("fp8_autocast: fp8_recipe must be a DelayedScaling, CurrentScaling, BlockScaling, "
                            f"RowwiseScaling, MXFP8BlockScaling or NVFP4BlockScaling, got {type(fp8_recipe).__name__}")
        if monitor is not None and not (callable(getattr(monitor, "record", None)) and hasattr(monitor, "sampling")):
            raise TypeError(f"fp8_autocast: monitor must be an fp8mix.Monitor, got {type(monitor).__name__}")
        self.frame = FP8Frame(enabled, fp8_recipe, fp8_group, monitor, calibrating)

    def __enter__(self):
        _state.stack.append(self.frame)
        return self

    def __exit__(self, *exc):
        _state.stack.pop()
        if self.frame.enabled and not _ran[0] and not _warned[0] and exc[0] is None:
            _warned[0] = True
            warnings.warn("fp8mix.fp8_autocast: no fp8mix module ran inside this context, so nothing computed in "
                          "FP8; convert the model first (fp8mix.convert_model) or use fp8mix modules "
                          "(warned once per process)", UserWarning, stacklevel=2)
        return False
