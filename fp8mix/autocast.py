"""fp8_autocast: the context in which fp8mix modules compute in FP8.

A stack of frames; the innermost wins, ``enabled=False`` turns FP8 off inside.
Usable as a context manager or a decorator. State is per thread (like
torch.autocast). Transformer Engine 2.x's spelling ``autocast(enabled, recipe,
amax_reduction_group)`` is accepted too.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any, Optional

from .recipe import BlockScaling, CurrentScaling, DelayedScaling

__all__ = ["fp8_autocast", "autocast", "is_fp8_enabled", "get_fp8_recipe", "get_fp8_group", "FP8Frame"]

_RECIPES = (DelayedScaling, CurrentScaling, BlockScaling)


@dataclass(frozen=True)
class FP8Frame:
    enabled: bool
    recipe: Any
    group: Any
    monitor: Any = None


class _State(threading.local):
    def __init__(self):
        self.stack = []


_state = _State()


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

    The backward pass uses the recipe its forward pass used, wherever backward runs.
    A module may run any number of times inside one context.
    """

    def __init__(self, enabled: bool = True, fp8_recipe=None, fp8_group=None, monitor=None):
        if not isinstance(enabled, bool):
            raise TypeError(f"fp8_autocast: enabled must be a bool, got {type(enabled).__name__}")
        if fp8_recipe is None:
            fp8_recipe = DelayedScaling()
        if not isinstance(fp8_recipe, _RECIPES):
            raise TypeError("fp8_autocast: fp8_recipe must be a DelayedScaling, CurrentScaling or BlockScaling, "
                            f"got {type(fp8_recipe).__name__}")
        fp8_recipe.__post_init__()  # fields may have been changed since construction
        if monitor is not None and not (callable(getattr(monitor, "record", None)) and hasattr(monitor, "sampling")):
            raise TypeError(f"fp8_autocast: monitor must be an fp8mix.Monitor, got {type(monitor).__name__}")
        self.frame = FP8Frame(enabled, fp8_recipe, fp8_group, monitor)

    def __enter__(self):
        _state.stack.append(self.frame)
        return self

    def __exit__(self, *exc):
        _state.stack.pop()
        return False


def autocast(enabled: bool = True, recipe=None, amax_reduction_group=None, monitor=None) -> fp8_autocast:
    """Transformer Engine 2.x's name and argument spelling for :class:`fp8_autocast`."""
    return fp8_autocast(enabled=enabled, fp8_recipe=recipe, fp8_group=amax_reduction_group, monitor=monitor)
