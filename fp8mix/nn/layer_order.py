"""The order of a model's fp8mix layers, and the NVFP4 recipe's default rule that reads it:
the last layers run in high precision (NVFP4BlockScaling.keep_last_layers_hp).

Which layers are "last": the fp8mix modules of the model in *module order* -- the order
of ``model.modules()`` (registration order, the order of named_modules and of the
state_dict), each module once (a shared module at its first place) -- stamped on each
module as (position, count) by :func:`mark_layer_order`. convert_model stamps the model
it converts, Plan.apply the model it plans; a model built of fp8mix modules without
either calls ``fp8mix.mark_layer_order(model)`` once.

Why module order and not the order layers first run in a forward:

- it is known before the first forward: a run-time order knows which layer is last only
  when the forward has ended, so the first step could not apply the rule;
- it is a function of the model's structure only, so it is deterministic, the same after
  a checkpoint is loaded into a freshly built model (nothing needs saving: the state_dict
  has no new key), the same in eval() and under no_grad(), and the same in a checkpoint's
  recompute (activation checkpointing repeats the forward: each layer decides as it did);
- a run-time order changes with control flow (a layer skipped by one batch, an encoder
  run twice, generate()'s cached steps) and with who calls first.

Its limit: a model whose registration order is not its depth order (a head registered
before the blocks) names other layers "last"; set those layers' policy instead (a plan,
or ``fp8_enabled`` / ``fp8_recipe`` by hand), which always wins over the default.

Not here: the NVFP4 GEMMs (fp8mix.nn._nvfp4) and how a frame is made per module (_forward).
"""
from __future__ import annotations

import warnings

import torch.nn as nn

from ..recipe import NVFP4BlockScaling
from .fp8_state import FP8StateMixin

__all__ = ["mark_layer_order", "layer_position", "keeps_high_precision", "has_own_policy"]

_POS = "_fp8_layer_pos"  # instance attribute: (position, count) in the model's module order
_warned = [False]


def mark_layer_order(model: nn.Module) -> nn.Module:
    """Stamp every fp8mix module of `model` with its position among them in module order
    (what NVFP4BlockScaling.keep_last_layers_hp reads) and return `model`. Idempotent; call
    it again on the whole model after adding or removing layers."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"fp8mix.mark_layer_order expects an nn.Module, got {type(model).__name__}")
    layers, seen = [], set()
    for m in model.modules():  # (modules() yields a shared module once)
        if isinstance(m, FP8StateMixin) and id(m) not in seen:
            seen.add(id(m))
            layers.append(m)
    for i, m in enumerate(layers):
        m.__dict__[_POS] = (i, len(layers))
    return model


def layer_position(m: nn.Module):
    """(position, count) of an fp8mix module in its model's module order, or None when unmarked."""
    return m.__dict__.get(_POS)


def has_own_policy(m: nn.Module) -> bool:
    """Whether a precision plan or the user set this module's policy (fp8_enabled or
    fp8_recipe on the module itself): then it, not a recipe's default, decides."""
    d = m.__dict__
    return "fp8_enabled" in d or d.get("fp8_recipe") is not None


def keeps_high_precision(m: nn.Module, recipe: NVFP4BlockScaling) -> bool:
    """Whether the recipe's default rule (keep_last_layers_hp) keeps module m in high
    precision: m is among the model's last layers and has no policy of its own."""
    if recipe.keep_last_layers_hp == 0 or has_own_policy(m):
        return False
    pos = m.__dict__.get(_POS)
    if pos is None:
        if not _warned[0]:
            _warned[0] = True
            warnings.warn(f"fp8mix: NVFP4BlockScaling(keep_last_layers_hp={recipe.keep_last_layers_hp!r}) does not "
                          f"know where fp8mix.{type(m).__name__} sits in its model (built without convert_model), "
                          "so it runs in NVFP4; call fp8mix.mark_layer_order(model) once to apply the rule, or "
                          "set keep_last_layers_hp=0 (warned once per process)", UserWarning, stacklevel=4)
        return False
    i, n = pos
    return i >= n - recipe.high_precision_tail(n)
