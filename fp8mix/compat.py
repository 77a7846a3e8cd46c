"""Other libraries' names for fp8mix's API, in one namespace: what a Transformer Engine
script or the seed text (/work/shared/seeds) spells differently from fp8mix. Each name is
also importable where users of that library look for it (``fp8mix.autocast``,
``fp8mix.recipe.Float8CurrentScaling``, ``fp8mix.convert_module_to_fp8``,
``fp8mix.nn.te_compat.FP8GlobalState``, ...).

    Transformer Engine   autocast (TE 2.x's fp8_autocast spelling), Float8CurrentScaling,
                         Float8BlockScaling (recipe classes, defined beside the recipes in
                         fp8mix.recipe; the modules take TE's names themselves),
                         fp8_model_init and quantized_model_init (TE 1.x's and 2.x's names
                         of fp8mix.fp8_model_init: FP8 primary weights)
    the seed text        convert_module_to_fp8 (convert_model with the recipe positional),
                         FP8GlobalState (a namespace holding fp8_autocast)

Not here: TE's constructor options and checkpoint keys (fp8mix.nn.te_options), TE's recipe
field names (fp8mix.recipe's base class), torchao's distributed names
(Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput,
precompute_float8_dynamic_scale_for_fsdp: fp8mix.distributed, which ``import fp8mix`` does
not import, as it imports torch.distributed's tensor-parallel modules).
"""
from __future__ import annotations

from typing import Any

import torch.nn as nn

from .context import fp8_autocast, get_fp8_recipe, is_fp8_enabled
from .nn.convert import convert_model
from .nn.fp8_weight_init import fp8_model_init, quantized_model_init
from .recipe import Float8BlockScaling, Float8CurrentScaling

__all__ = ["autocast", "Float8CurrentScaling", "Float8BlockScaling", "convert_module_to_fp8", "FP8GlobalState",
           "fp8_model_init", "quantized_model_init"]


def autocast(enabled: bool = True, recipe=None, amax_reduction_group=None, monitor=None,
             calibrating: bool = False) -> fp8_autocast:
    """Transformer Engine 2.x's name and argument spelling for :class:`fp8_autocast`."""
    return fp8_autocast(enabled=enabled, fp8_recipe=recipe, fp8_group=amax_reduction_group, monitor=monitor,
                        calibrating=calibrating)


def convert_module_to_fp8(model: nn.Module, fp8_recipe: Any = None, **kwargs) -> nn.Module:
    """Alias (the seed text's spelling) of :func:`fp8mix.convert_model`: ``fp8_recipe`` is
    accepted as convert_model's ``recipe``; the recipe in force is still the one
    :func:`fp8mix.fp8_autocast` gets."""
    return convert_model(model, recipe=fp8_recipe, **kwargs)


class FP8GlobalState:
    """The seed text's namespace for the autocast: ``FP8GlobalState.fp8_autocast(...)`` is
    :class:`fp8mix.fp8_autocast` (an alias; fp8mix keeps no process-global FP8 state, the
    context is per thread and every module owns its own state)."""

    fp8_autocast = fp8_autocast
    is_fp8_enabled = staticmethod(is_fp8_enabled)
    get_fp8_recipe = staticmethod(get_fp8_recipe)

    def __init__(self):
        raise TypeError("FP8GlobalState is a namespace; call FP8GlobalState.fp8_autocast(...)")
