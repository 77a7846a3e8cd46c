"""convert_model: swap nn.Linear layers for fp8mix.Linear, keeping their weights."""
from __future__ import annotations

from typing import Callable, Optional

import torch.nn as nn

from .linear import Linear
from .recipe import BlockScaling, CurrentScaling, DelayedScaling

__all__ = ["convert_model"]


def convert_model(model: nn.Module, *, module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
                  recipe=None) -> nn.Module:
    """Replace every ``nn.Linear`` in `model` (recursively, in place) by :class:`fp8mix.Linear`
    sharing the same weight and bias Parameters (no copy), and return `model`.

    Args:
        module_filter_fn: ``fn(module, fqn) -> bool`` (torchao's signature); layers for which
            it returns False stay nn.Linear, e.g. the first and last layers, to raise the FP8
            share of a model step by step.
        recipe: accepted for API symmetry with Transformer Engine; the recipe is chosen by
            :func:`fp8mix.fp8_autocast` at run time, so a recipe given here only sets the
            amax-history length of converted layers.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_model expects an nn.Module, got {type(model).__name__}")
    if recipe is not None and not isinstance(recipe, (DelayedScaling, CurrentScaling, BlockScaling)):
        raise TypeError(f"convert_model: recipe must be an fp8mix.recipe object or None, got {type(recipe).__name__}")
    if module_filter_fn is not None and not callable(module_filter_fn):
        raise TypeError("module_filter_fn must be callable (module, fqn) -> bool")
    if isinstance(model, nn.Linear) and not isinstance(model, Linear):
        raise TypeError("convert_model swaps children in place; wrap a bare nn.Linear in a container first")
    for fqn, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if type(child) is not nn.Linear:
                continue
            child_fqn = f"{fqn}.{name}" if fqn else name
            if module_filter_fn is not None and not module_filter_fn(child, child_fqn):
                continue
            if isinstance(recipe, DelayedScaling):
                setattr(module, name, Linear.from_linear(child, recipe.amax_history_len))
            else:
                setattr(module, name, Linear.from_linear(child))
    return model
