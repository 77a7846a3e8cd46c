"""Transformer Engine's spellings for fp8mix's modules: constructor options and checkpoint
keys. A leaf of fp8mix.nn (it imports no other fp8mix module), so every module can use it.

* :func:`te_options` checks the keyword arguments a TE script passes that have no
  meaning for fp8mix's single-device modules: tensor / sequence parallelism (which
  fp8mix.Linear takes itself: fp8mix.nn._tp), userbuffer overlap (``ub_*``), fused wgrad
  accumulation and ``parallel_mode`` raise ``NotImplementedError`` naming the option
  (never silently ignored);
  ``get_rng_state_tracker``, ``name``, ``seq_length`` ... are accepted and ignored; any
  other name is a ``TypeError`` as Python's own.
* :func:`params_dtype_of` merges TE's ``params_dtype`` with torch's ``dtype``;
  :func:`apply_init` runs TE's ``init_method(weight)`` callables.
* :class:`TECheckpointMixin` lets TE checkpoints load: their ``*._extra_state`` entries
  (TE's serialized FP8 metadata) are dropped with a one-line warning, since TE's FP8
  state does not carry over (fp8mix starts a fresh one; the weights load).
Not here: the aliases of TE's and the seed text's names (fp8mix.compat) and the recipe
classes' TE field names (fp8mix.recipe's base class).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable, Optional

import torch
import torch.nn as nn

__all__ = ["te_options", "params_dtype_of", "apply_init", "te_default_init", "TECheckpointMixin",
           "strip_te_extra_state"]

# TE options whose non-default value asks for something fp8mix does not do, with the
# value that means "off" and what the option is.
_UNSUPPORTED = {
    "tp_group": (None, "tensor parallelism"),
    "tp_size": (1, "tensor parallelism"),
    "sequence_parallel": (False, "sequence parallelism"),
    "set_parallel_mode": (False, "tensor parallelism"),
    "parallel_mode": (None, "tensor parallelism"),
    "fuse_wgrad_accumulation": (False, "fused weight-gradient accumulation into main_grad"),
    "parameters_split": (None, "split parameters"),
    "return_layernorm_output_gathered": (False, "sequence-parallel gathering"),
    "delay_wgrad_compute": (False, "delayed weight-gradient computation"),
    "symmetric_ar_type": (None, "symmetric all-reduce"),
    "save_original_input": (False, "saving the high-precision input for backward"),
}
_LINEAR_ONLY = ("tp_group", "tp_size", "sequence_parallel", "parallel_mode")  # fp8mix.Linear takes these itself
# Accepted and ignored: labels, and hints for TE's JIT warm-up or RNG forks with no
# meaning here.
_IGNORED = {"get_rng_state_tracker", "rng_tracker_name", "name", "ub_name", "seq_length", "micro_batch_size",
            "layer_number"}


def te_options(owner: str, options: dict) -> None:
    """Check the Transformer Engine keyword arguments `options` of fp8mix.`owner`."""
    for key, value in options.items():
        if key.startswith("ub_") and key != "ub_name":
            if value:
                raise NotImplementedError(f"fp8mix.{owner}: {key}={value!r} asks for Transformer Engine's userbuffer "
                                          "communication overlap, which fp8mix does not implement (single-device "
                                          "modules)")
            continue
        if key in _UNSUPPORTED:
            off, what = _UNSUPPORTED[key]
            if not (value is off or value == off or (value is None and off is False)):
                hint = ("fp8mix.Linear (column and row) and fp8mix.LayerNormLinear (column) implement it (tp_group, "
                        "tp_size, sequence_parallel, parallel_mode), and torch's ColwiseParallel / RowwiseParallel "
                        "serve fp8mix.Linear layers"
                        if key in _LINEAR_ONLY else "use torch's DDP or FSDP2 for data parallelism")
                raise NotImplementedError(f"fp8mix.{owner}: {key}={value!r} asks for Transformer Engine's {what}, "
                                          f"which fp8mix does not implement for {owner}; {hint}")
            continue
        if key not in _IGNORED:
            raise TypeError(f"fp8mix.{owner}() got an unexpected keyword argument {key!r}")


def params_dtype_of(owner: str, params_dtype, dtype) -> Optional[torch.dtype]:
    """TE's params_dtype and torch's dtype name the same thing: one of them, or both equal."""
    if params_dtype is not None and dtype is not None and params_dtype != dtype:
        raise ValueError(f"fp8mix.{owner}: params_dtype={params_dtype} and dtype={dtype} disagree; give one")
    out = params_dtype if params_dtype is not None else dtype
    if out is not None and not (isinstance(out, torch.dtype) and out.is_floating_point):
        raise TypeError(f"fp8mix.{owner}: params_dtype must be a floating-point torch.dtype, got {out!r}")
    return out


def te_default_init(weight: torch.Tensor) -> None:
    """Transformer Engine's default init_method: normal(0, 0.023)."""
    nn.init.normal_(weight, mean=0.0, std=0.023)


def apply_init(owner: str, weight: torch.Tensor, init_method: Optional[Callable]) -> None:
    """init_method(weight) under no_grad (TE's convention); None: leave weight as it is."""
    if init_method is None:
        return
    if not callable(init_method):
        raise TypeError(f"fp8mix.{owner}: init_method must be a callable taking the weight, got "
                        f"{type(init_method).__name__}")
    with torch.no_grad():
        init_method(weight)


def strip_te_extra_state(state_dict: dict, prefix: str = "") -> list:
    """Remove Transformer Engine's ``_extra_state`` entries under `prefix` from state_dict
    (in place); returns the removed keys, warning once when there were any."""
    keys = [k for k in state_dict if k.startswith(prefix) and (k == prefix + "_extra_state"
                                                                or k.endswith("._extra_state"))]
    for k in keys:
        del state_dict[k]
    if keys:
        warnings.warn("fp8mix: Transformer Engine checkpoint entries *._extra_state (TE's FP8 scaling state) are "
                      "not carried over; the weights load and fp8mix starts a fresh FP8 state", UserWarning,
                      stacklevel=3)
    return keys


if TYPE_CHECKING:  # the mixin sits before an nn.Module
    _Module = nn.Module
else:
    _Module = object


class TECheckpointMixin(_Module):
    """Accept Transformer Engine's ``*._extra_state`` entries when loading (for this module
    and the modules inside it). Put it first among the bases."""

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        strip_te_extra_state(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict,  # type: ignore[misc]
                                      missing_keys, unexpected_keys, error_msgs)
