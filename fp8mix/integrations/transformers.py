"""FP8 training with the Hugging Face Trainer: one callback.

    from fp8mix.integrations.transformers import FP8TrainerCallback
    fp8 = FP8TrainerCallback(recipe=DelayedScaling(), module_filter_fn=lambda m, fqn: fqn != "lm_head")
    trainer = transformers.Trainer(model=model, args=args, train_dataset=ds, callbacks=[fp8])
    trainer.train()                                   # linear layers in FP8 (lm_head kept in high precision)
    trainer.train(resume_from_checkpoint=True)        # the FP8 state comes back exactly

Why a callback (``TrainerCallback``, the Trainer's documented extension point) and not a
Trainer subclass: it composes with any Trainer subclass (TRL's trainers included) and
changes none of the Trainer's methods. At ``on_init_end`` (the end of ``Trainer.__init__``,
before any checkpoint is loaded) it converts the model in place with
:func:`fp8mix.convert_model` (same Parameters, so an optimizer passed in ``optimizers=``
stays valid) and wraps the model's forward in ``fp8_autocast`` (as Accelerate, which the
Trainer runs on, wraps it in ``torch.autocast`` for ``bf16=True``). Then:

- checkpoints: the FP8 state is buffers of the model, so ``save_strategy`` checkpoints
  carry it in ``model.safetensors``, and ``resume_from_checkpoint`` loads it into the
  converted model: a resumed run equals the uninterrupted one bit for bit.
- ``gradient_checkpointing=True`` (``activation_checkpointing``): fp8mix's layers
  recompute bit-identically under torch.utils.checkpoint (both modes).
- evaluation and prediction: in FP8, in ``eval()`` under ``no_grad``: they change no FP8 state.
- ``bf16=True`` (``torch.autocast``) for what does not run in FP8; master weights stay float32.

A ``model_init`` model is made inside ``train()``: it is converted at ``on_train_begin``,
which is after the Trainer loaded any checkpoint, so resuming such a run is refused
rather than silently restarting the FP8 state. ``mixed_precision="fp8"`` (Accelerate's FP8
backends, from ``ACCELERATE_MIXED_PRECISION``) is refused: it would stack a second FP8
backend.

FSDP (``fsdp=True``, ``fsdp_config={"version": 2, ...}``): the model is converted
at ``on_init_end``, before the Trainer's ``accelerator.prepare`` shards it, so FSDP2
gathers the high-precision weights and fp8mix casts the gathered weight; the FP8 state
is replicated buffers that the FSDP checkpoints save and ``resume_from_checkpoint``
restores bit for bit (tests/integrations/test_scale_hf_trainer.py). Not covered:
DeepSpeed through the Trainer.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import check_filter, check_monitor, check_recipe, convert, is_converted, require, wrap_forward

require("transformers", pip_name="transformers", integration="transformers")

from transformers import TrainerCallback  # noqa: E402

__all__ = ["FP8TrainerCallback"]


class FP8TrainerCallback(TrainerCallback):
    """Train a transformers model with the Trainer in FP8 (see the module docstring).

    Args:
        recipe: an fp8mix recipe; None: ``DelayedScaling()``.
        module_filter_fn: ``fn(module, fqn) -> bool``; False keeps that layer in high
            precision (``lambda m, fqn: fqn != "lm_head"`` keeps the output projection).
        fp8_group: process group of the amax all-reduce (default: the world group).
        monitor: an :class:`fp8mix.Monitor`.
    """

    def __init__(self, recipe=None, module_filter_fn: Optional[Callable] = None, *, fp8_group=None,
                 monitor=None) -> None:
        owner = "FP8TrainerCallback"
        self.recipe = check_recipe(owner, recipe)
        self.module_filter_fn = check_filter(owner, module_filter_fn)
        self.fp8_group = fp8_group
        self.monitor = check_monitor(monitor)

    def _setup(self, args, model) -> None:
        owner = "FP8TrainerCallback"
        if getattr(args, "mixed_precision", "no") == "fp8":
            raise ValueError(f"{owner}: the Trainer's mixed_precision is 'fp8' (ACCELERATE_MIXED_PRECISION), which "
                             "adds a second FP8 backend on top of fp8mix; use 'no' or bf16=True")
        if getattr(args, "deepspeed", None):
            raise NotImplementedError(f"{owner}: DeepSpeed is not supported (single process, DDP and FSDP are)")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{owner}: the Trainer has no model to convert (got {type(model).__name__})")
        convert(owner, model, self.module_filter_fn)
        wrap_forward(model, recipe=self.recipe, fp8_group=self.fp8_group, monitor=self.monitor)

    def on_init_end(self, args, state, control, model=None, **kwargs):
        """Convert and wrap the Trainer's model (before any checkpoint is loaded into it)."""
        if model is not None:
            self._setup(args, model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        """A model_init model (made inside train()) is converted here; resuming one is
        refused, as its checkpoint was loaded before it had FP8 state to receive."""
        if model is None or (is_converted(model) and "_fp8mix_autocast" in model.__dict__):
            return
        if state.global_step > 0:
            raise RuntimeError("FP8TrainerCallback: this run resumes a checkpoint into a model made by model_init, "
                               "which the Trainer loaded before the callback could convert it, so its FP8 state "
                               "would restart silently; pass model= instead of model_init= to resume in FP8")
        self._setup(args, model)
