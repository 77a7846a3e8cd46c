"""fp8_model_init: build fp8mix modules whose GEMM weights are stored in FP8 (Transformer
Engine's fp8_model_init / quantized_model_init).

Inside the context every fp8mix module built (Linear, Conv1D, LayerNormLinear,
LayerNormMLP, those of a TransformerLayer; also those convert_model makes) ends its
construction holding its GEMM weights as :class:`fp8mix.nn.fp8_weight.FP8Weight`: the
initialised high-precision weight cast by the recipe's weight rule (current per-tensor
scaling), 1 byte per element plus one scale. Norm weights and biases stay in high
precision. The module's ``fp8_recipe`` is set to the context's recipe, so it runs with the
recipe its weights were made for inside any fp8_autocast. Train such a model with
:class:`fp8mix.optim.FP8MasterWeights` (float32 masters in the optimizer). Under FSDP2
(fully_shard) the FP8 bytes are what is sharded and all-gathered.

How it knows a module was built: every fp8mix module calls fp8_state.ON_BUILT's callable
(a ContextVar: per thread and asyncio task, the innermost context wins) at the end of its
construction, FP8StateMixin._init_fp8_state, after its weights are initialised; this
context sets it on enter and restores it on exit. Not covered: the meta device
(NotImplementedError: the cast needs the values).
"""
from __future__ import annotations

import contextvars
from typing import Optional

from ..context import as_bool
from ..recipe import RECIPES, CurrentScaling
from .fp8_state import ON_BUILT
from .fp8_weight import WeightScaling, to_fp8_weights

__all__ = ["fp8_model_init", "quantized_model_init"]



class fp8_model_init:
    """Build fp8mix modules with FP8 weights inside this context (the module docstring).

    Args:
        enabled: False builds modules as usual inside (nesting: the innermost context wins).
        recipe: the recipe the weights are cast by and the modules run with; its weight
            role must be current per-tensor scaling (default ``fp8mix.recipe.CurrentScaling()``);
            any other raises ValueError here.
        preserve_high_precision_init_val: keep each weight's high-precision initial value on
            the CPU (``weight.get_high_precision_init_val()`` /
            ``clear_high_precision_init_val()``, as Transformer Engine);
            FP8MasterWeights starts its masters from it. Not kept through fully_shard.
    """

    def __init__(self, enabled: bool = True, recipe=None, preserve_high_precision_init_val: bool = False):
        as_bool("fp8_model_init", "enabled", enabled)
        as_bool("fp8_model_init", "preserve_high_precision_init_val", preserve_high_precision_init_val)
        if recipe is None:
            recipe = CurrentScaling()
        if not isinstance(recipe, RECIPES):
            raise TypeError(f"fp8_model_init: recipe must be an fp8mix recipe, got {type(recipe).__name__}")
        if enabled:
            WeightScaling.from_recipe(recipe, "fp8_model_init")  # a recipe it cannot serve raises now
        self.enabled, self.recipe, self.keep_hp = enabled, recipe, preserve_high_precision_init_val
        self._token: Optional[contextvars.Token] = None

    def _built(self, module) -> None:
        to_fp8_weights(module, self.recipe, owner=f"fp8_model_init: fp8mix.{type(module).__name__}",
                       keep_high_precision=self.keep_hp)

    def __enter__(self):
        if self._token is not None:
            raise RuntimeError("fp8_model_init: this context is already active (make a new one to nest)")
        self._token = ON_BUILT.set(self._built if self.enabled else None)
        return self

    def __exit__(self, *exc):
        assert self._token is not None
        ON_BUILT.reset(self._token)
        self._token = None
        return False


def quantized_model_init(enabled: bool = True, recipe=None, preserve_high_precision_init_val: bool = False):
    """Transformer Engine 2.x's name for :class:`fp8_model_init`."""
    return fp8_model_init(enabled=enabled, recipe=recipe,
                          preserve_high_precision_init_val=preserve_high_precision_init_val)
