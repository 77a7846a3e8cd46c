"""FP8 training with Hugging Face Accelerate: ``prepare`` instead of ``accelerator.prepare``.

    from accelerate import Accelerator
    from fp8mix.integrations.accelerate import prepare
    accelerator = Accelerator(mixed_precision="bf16")        # or "no"; not "fp8" (that is another FP8 backend)
    model, optimizer, loader = prepare(accelerator, model, optimizer, loader, recipe=DelayedScaling())
    for x, y in loader:
        loss = loss_fn(model(x), y)                          # the linear layers run in FP8
        accelerator.backward(loss); optimizer.step(); optimizer.zero_grad()
    accelerator.save_state("ckpt")                           # the FP8 state is in the model's state_dict

Accelerate has no plugin registry (its ``mixed_precision="fp8"`` backends are a closed
list: torchao, Transformer Engine, MS-AMP), so this is the path that needs no change to
it: convert the model in place before ``accelerator.prepare`` (same Parameters, so an
optimizer made before stays valid), wrap the model's forward in ``fp8_autocast`` (as
Accelerate wraps it in ``torch.autocast`` for bf16), then let Accelerate prepare
everything. The FP8 state is buffers of the model, so ``save_state`` / ``load_state``
carry it; evaluation (``model.eval()``, ``no_grad``) computes in FP8 and changes no FP8
state.

FSDP (the ``FullyShardedDataParallelPlugin``, tested with fsdp_version=2): the model is
converted before ``accelerator.prepare`` shards it, so FSDP gathers the high-precision
weights and fp8mix casts the gathered weight (amaxes all-reduced over the world group, so
every rank casts alike); the FP8 state is replicated buffers, which the sharded state
dict saves and ``load_state`` restores (tests/integrations/test_scale_accelerate.py: a
resumed run equals the uninterrupted one bit for bit). DeepSpeed ZeRO-0/1/2 (the
weights stay whole on every rank) work the same way (tests/integrations/test_scale_deepspeed.py);
ZeRO-3 is refused. Not covered: Megatron-LM, and FSDP2's FP8 all-gather
(``convert_model(..., fsdp_fp8_all_gather=True)``) through ``prepare``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import check_filter, check_monitor, check_recipe, convert, require, wrap_forward

accelerate = require("accelerate", pip_name="accelerate", integration="accelerate")

__all__ = ["prepare"]


def _check_accelerator(accelerator) -> None:
    if not isinstance(accelerator, accelerate.Accelerator):
        raise TypeError(f"fp8mix.integrations.accelerate.prepare: the first argument must be an "
                        f"accelerate.Accelerator, got {type(accelerator).__name__}")
    if accelerator.mixed_precision == "fp8" or getattr(accelerator, "fp8_enabled", False):
        backend = getattr(accelerator, "fp8_backend", None)
        raise ValueError("fp8mix.integrations.accelerate.prepare: the Accelerator has mixed_precision='fp8', which "
                         f"adds a second FP8 backend ({getattr(backend, 'value', backend)}) on top of fp8mix; "
                         "create it with mixed_precision='no' or 'bf16' (fp8mix does the FP8 part)")
    dist = str(getattr(accelerator, "distributed_type", ""))
    if dist.endswith("MEGATRON_LM"):
        raise NotImplementedError(f"fp8mix.integrations.accelerate.prepare: {dist} is not supported "
                                  "(single process, multi-process DDP, FSDP and DeepSpeed ZeRO-1/2 are)")
    if dist.endswith("DEEPSPEED"):
        stage = _zero_stage(accelerator)
        if stage not in (0, 1, 2):
            raise NotImplementedError(f"fp8mix.integrations.accelerate.prepare: DeepSpeed ZeRO stage {stage} is not "
                                      "supported (ZeRO-3 partitions the weights fp8mix casts; stages 0-2 are)")


def _zero_stage(accelerator):
    """The ZeRO stage of the Accelerator's DeepSpeed config (0 when it names none)."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    cfg = getattr(plugin, "deepspeed_config", None) or {}
    return cfg.get("zero_optimization", {}).get("stage", 0)


def prepare(accelerator, model: torch.nn.Module, *objects, recipe=None,
            module_filter_fn: Optional[Callable] = None, fp8_group=None, monitor=None, device_placement=None):
    """Convert `model` to FP8 and ``accelerator.prepare(model, *objects)``.

    Args:
        accelerator: an ``accelerate.Accelerator`` with ``mixed_precision`` "no" or "bf16".
        model: the model (not prepared yet); converted in place, its Parameters kept.
        objects: what else ``accelerator.prepare`` takes (optimizers, data loaders, schedulers).
        recipe: an fp8mix recipe; None: ``DelayedScaling()``.
        module_filter_fn: ``fn(module, fqn) -> bool``; False keeps that layer in high precision.
        fp8_group: process group of the amax all-reduce (default: the world group).
        monitor: an :class:`fp8mix.Monitor`.
        device_placement: passed to ``accelerator.prepare``.

    Returns:
        what ``accelerator.prepare(model, *objects)`` returns (a single object for one).

    Raises:
        TypeError: not an Accelerator, a model that is not an nn.Module, bad recipe/filter/monitor.
        ValueError: ``mixed_precision="fp8"`` (a second FP8 backend), or a model that
            ``accelerator.prepare`` has already prepared (convert before preparing).
    """
    _check_accelerator(accelerator)
    owner = "fp8mix.integrations.accelerate.prepare"
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{owner}: model must be a torch.nn.Module, got {type(model).__name__}")
    if getattr(model, "_is_accelerate_prepared", False) or isinstance(
            model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        raise ValueError(f"{owner}: the model was already prepared by accelerator.prepare; pass the unprepared "
                         "model here instead (it must be converted before Accelerate wraps it)")
    recipe = check_recipe(owner, recipe)
    check_filter(owner, module_filter_fn)
    check_monitor(monitor)
    convert(owner, model, module_filter_fn)
    wrap_forward(model, recipe=recipe, fp8_group=fp8_group, monitor=monitor)
    kw = {} if device_placement is None else {"device_placement": device_placement}
    return accelerator.prepare(model, *objects, **kw)
