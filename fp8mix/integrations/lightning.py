"""FP8 training with PyTorch Lightning: a precision plugin.

    import fp8mix
    from fp8mix.integrations.lightning import FP8Precision
    trainer = lightning.pytorch.Trainer(plugins=[FP8Precision(recipe=fp8mix.recipe.DelayedScaling())])
    trainer.fit(model)                            # the LightningModule's nn.Linear layers now run in FP8
    trainer.fit(model, ckpt_path="last.ckpt")     # resumes the FP8 state too, bit for bit

What the plugin does, at Lightning's extension points (``lightning.pytorch.plugins.Precision``):

- ``convert_module``: :func:`fp8mix.convert_model` on the LightningModule, in place (same
  Parameters), with `module_filter_fn` (``fn(module, fqn) -> bool``, fqn relative to the
  LightningModule); a module that already holds fp8mix modules is left as it is.
- ``train_step_context`` (and ``forward_context``): ``fp8_autocast(fp8_recipe=recipe)``, inside
  ``torch.autocast(dtype=torch.bfloat16)`` when ``dtype=torch.bfloat16``. Master weights,
  gradients and optimizer state stay float32.
- validation / test / predict: Lightning runs them in ``eval()`` under ``no_grad`` /
  ``inference_mode``, where fp8mix modules read their FP8 state and write nothing. They
  compute in FP8 (``fp8_evaluation=True``, default) or in high precision (False).
- checkpoints: the FP8 state (amax histories, scales, ...) is saved under the plugin's
  key (``checkpoint["FP8Precision"]["fp8_state"]``) and taken out of
  ``checkpoint["state_dict"]``, so that state dict loads into the plain LightningModule
  (Lightning restores the weights before it lets the plugin convert the model) and
  ``Trainer.fit(ckpt_path=...)`` restores the FP8 state after converting. Strategies
  that restore after setup (FSDPStrategy, ModelParallelStrategy: the model is converted
  and sharded before the load) keep the FP8 state in ``checkpoint["state_dict"]``
  instead, where their sharded checkpoints save it and their load restores it. Weights-only
  checkpoints (``ModelCheckpoint(save_weights_only=True)``) are written without the
  plugin's hooks, so their ``state_dict`` keeps the FP8 entries: load those into a
  converted model, or drop the entries with :func:`fp8mix.strip_fp8_state`.
- `scaler`: an optional :class:`fp8mix.FP8GradScaler` (loss scaling with FP8 feedback),
  used as Lightning's own mixed-precision plugin uses torch's GradScaler; its state is
  checkpointed with the FP8 state.

Sharded strategies (tests/integrations/test_scale_lightning.py, resumed bit for bit):
``FSDPStrategy`` takes only ``FSDPPrecision`` plugins: pass :class:`FP8FSDPPrecision` (the
same plugin, also one); it converts the LightningModule before FSDP wraps it. Under
ModelParallelStrategy ``configure_model`` applies ``fully_shard``, which runs before this
plugin sees the model: convert there first (``fp8mix.convert_model(self.model, ...)``, with
``fsdp_fp8_all_gather=True`` for FP8 all-gathers); the plugin then leaves the converted
model as it is, and refuses a sharded model that is not converted. Not covered:
DeepSpeedStrategy.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Generator, Optional

import torch

from . import (
    check_filter,
    check_monitor,
    check_recipe,
    convert,
    fp8_module_prefixes,
    fp8_state_of,
    is_converted,
    require,
    split_fp8_state,
)

pl = require("lightning.pytorch", pip_name="lightning", integration="lightning")

from lightning.fabric.plugins.precision.amp import _optimizer_handles_unscaling  # noqa: E402
from lightning.pytorch.plugins.precision import FSDPPrecision, Precision  # noqa: E402
from lightning.pytorch.utilities import GradClipAlgorithmType  # noqa: E402
from lightning.pytorch.utilities.exceptions import MisconfigurationException  # noqa: E402

from ..context import as_bool, fp8_autocast  # noqa: E402
from ..grad_scaler import FP8GradScaler  # noqa: E402
from ..nn import load_fp8_state  # noqa: E402

__all__ = ["FP8Precision", "FP8FSDPPrecision"]

_DTYPES = (torch.float32, torch.bfloat16)


def _sharded_by_fully_shard(module: torch.nn.Module) -> bool:
    if not torch.distributed.is_available():
        return False
    from torch.distributed.fsdp import FSDPModule
    return any(isinstance(m, FSDPModule) for m in module.modules())


class FP8Precision(Precision):
    """Lightning precision plugin: the LightningModule's linear layers in FP8.

    Args:
        recipe: an fp8mix recipe (``DelayedScaling``, ``CurrentScaling``, ``BlockScaling``);
            None: ``DelayedScaling()``.
        module_filter_fn: ``fn(module, fqn) -> bool``; layers for which it returns False stay
            in high precision (e.g. ``lambda m, fqn: "lm_head" not in fqn``).
        dtype: ``torch.float32`` (default) or ``torch.bfloat16``: the compute dtype of what
            does not run in FP8 (``torch.autocast``); weights stay float32 either way.
        fp8_group: process group of the amax all-reduce (default: the world group under DDP).
        monitor: an :class:`fp8mix.Monitor` recording training casts.
        scaler: an :class:`fp8mix.FP8GradScaler` for loss scaling, or None (no scaling).
        fp8_evaluation: validation / test / predict in FP8 (True, default; read-only) or in
            high precision (False).
    """

    def __init__(self, recipe=None, module_filter_fn: Optional[Callable] = None, dtype: torch.dtype = torch.float32,
                 *, fp8_group=None, monitor=None, scaler: Optional[FP8GradScaler] = None,
                 fp8_evaluation: bool = True) -> None:
        owner = "FP8Precision"
        self.recipe = check_recipe(owner, recipe)
        self.module_filter_fn = check_filter(owner, module_filter_fn)
        if dtype not in _DTYPES:
            raise ValueError(f"{owner}: dtype must be torch.float32 or torch.bfloat16, got {dtype!r}")
        if scaler is not None and not isinstance(scaler, FP8GradScaler):
            raise TypeError(f"{owner}: scaler must be an fp8mix.FP8GradScaler or None, got {type(scaler).__name__}")
        self.dtype = dtype
        self.fp8_group = fp8_group
        self.monitor = check_monitor(monitor)
        self.scaler = scaler
        self.fp8_evaluation = as_bool(owner, "fp8_evaluation", fp8_evaluation)
        # Lightning reads this label (model summary, throughput monitor): the weights' precision
        self.precision = "32-true" if dtype is torch.float32 else "bf16-mixed"  # type: ignore[assignment]
        self._module: Optional[torch.nn.Module] = None

    # ---- the model -------------------------------------------------------------------
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Convert the LightningModule's linear layers in place (Lightning calls this in
        ``Strategy.setup``, before the optimizers are made and before DDP or FSDP wraps it;
        under ModelParallelStrategy after ``configure_model`` sharded it)."""
        if not is_converted(module) and _sharded_by_fully_shard(module):
            raise ValueError("FP8Precision: the LightningModule was sharded by fully_shard (in configure_model, "
                             "under ModelParallelStrategy) before the plugin could convert it; FSDP2 shards the "
                             "Parameters it finds, so convert first: call fp8mix.convert_model(self.model, "
                             "module_filter_fn=...) in configure_model before fully_shard (with "
                             "fsdp_fp8_all_gather=True to all-gather the weights in FP8)")
        self._module = convert("FP8Precision", module, self.module_filter_fn)
        return module

    def _fp8_in_state_dict(self) -> bool:
        """Whether the FP8 state stays in ``checkpoint["state_dict"]``: the strategy loads
        checkpoints into the set-up (converted, maybe sharded) model."""
        trainer = getattr(self._module, "_trainer", None)
        return bool(getattr(getattr(trainer, "strategy", None), "restore_checkpoint_after_setup", False))

    def _device_type(self) -> str:
        dev = getattr(self._module, "device", None)
        return dev.type if isinstance(dev, torch.device) else "cpu"

    @contextlib.contextmanager
    def _context(self, *, fp8: bool) -> Generator[None, None, None]:
        with contextlib.ExitStack() as stack:
            if self.dtype is torch.bfloat16:
                stack.enter_context(torch.autocast(self._device_type(), dtype=torch.bfloat16))
            if fp8:
                stack.enter_context(fp8_autocast(enabled=True, fp8_recipe=self.recipe, fp8_group=self.fp8_group,
                                                 monitor=self.monitor))
            yield

    def forward_context(self) -> contextlib.AbstractContextManager:
        """FP8 (and bf16 autocast if asked) around the training step and other forwards."""
        return self._context(fp8=True)

    @contextlib.contextmanager
    def val_step_context(self) -> Generator[None, None, None]:
        with self._context(fp8=self.fp8_evaluation):
            yield

    @contextlib.contextmanager
    def test_step_context(self) -> Generator[None, None, None]:
        with self._context(fp8=self.fp8_evaluation):
            yield

    @contextlib.contextmanager
    def predict_step_context(self) -> Generator[None, None, None]:
        with self._context(fp8=self.fp8_evaluation):
            yield

    # ---- loss scaling (only with a scaler) ----------------------------------------------
    def pre_backward(self, tensor: torch.Tensor, module: "pl.LightningModule") -> torch.Tensor:  # type: ignore
        if self.scaler is not None:
            tensor = self.scaler.scale(tensor)
        return super().pre_backward(tensor, module)

    def optimizer_step(self, optimizer, model: "pl.LightningModule", closure: Callable[[], Any],  # type: ignore
                       **kwargs: Any) -> Any:
        """Without a scaler: Lightning's step. With one: as Lightning's MixedPrecision
        plugin does with torch's GradScaler (unscale before clipping, step skipped on an
        inf/NaN gradient or an FP8 cast that saw one, then update)."""
        if self.scaler is None:
            return super().optimizer_step(optimizer, model=model, closure=closure, **kwargs)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise MisconfigurationException("FP8Precision with a scaler and the LBFGS optimizer are not compatible")
        closure_result = closure()
        skip_unscaling = closure_result is None and model.automatic_optimization  # the step returned None
        if not _optimizer_handles_unscaling(optimizer) and not skip_unscaling:
            self.scaler.unscale_(optimizer)  # so that gradient clipping sees the true gradients
        self._after_closure(model, optimizer)
        if skip_unscaling:
            return closure_result
        out = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        return out

    def clip_gradients(self, optimizer, clip_val=0.0,  # type: ignore[override]
                       gradient_clip_algorithm=GradClipAlgorithmType.NORM) -> None:
        if self.scaler is not None and clip_val > 0 and _optimizer_handles_unscaling(optimizer):
            raise RuntimeError(f"FP8Precision: {type(optimizer).__qualname__} unscales gradients inside its step, so "
                               "they cannot be clipped with a scaler (a 'fused' optimizer?)")
        super().clip_gradients(optimizer, clip_val=clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    # ---- checkpoints ------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What Lightning saves under ``checkpoint["FP8Precision"]``: the model's FP8 state
        entries (keyed as in the LightningModule's state_dict) and the scaler's state."""
        out: dict = {"format": 1}
        if self._module is not None and not self._fp8_in_state_dict():
            out["fp8_state"] = fp8_state_of(self._module.state_dict())
        if self.scaler is not None:
            out["scaler"] = self.scaler.state_dict()
        return out

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Take the FP8 entries out of ``checkpoint["state_dict"]`` (they are in the plugin's
        entry): the weights then load into the plain LightningModule. Left in place for
        strategies that load into the set-up model (their load restores it)."""
        if self._module is not None and isinstance(checkpoint.get("state_dict"), dict) \
                and not self._fp8_in_state_dict():
            split_fp8_state(checkpoint["state_dict"], fp8_module_prefixes(self._module))

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the FP8 state and the scaler (Lightning calls this after convert_module,
        before the first step of a resumed fit)."""
        fp8 = state_dict.get("fp8_state")
        if fp8 and self._module is not None:
            load_fp8_state(self._module, fp8)
        if self.scaler is not None and state_dict.get("scaler"):
            self.scaler.load_state_dict(state_dict["scaler"])

    def teardown(self) -> None:
        if self.scaler is not None:
            self.scaler.close()


class FP8FSDPPrecision(FP8Precision, FSDPPrecision):  # type: ignore[misc]  # (scaler: always None here)
    """:class:`FP8Precision` for Lightning's ``FSDPStrategy``, which takes only
    ``FSDPPrecision`` plugins: the same arguments and behaviour, and FSDP's mixed-precision
    config from `dtype` (float32: FSDP gathers and reduces in float32, tested; bfloat16: as
    Lightning's ``"bf16-mixed"``, untested). No `scaler`: FP8GradScaler's inf checks are per rank,
    and FSDP shards the gradients they read."""

    def __init__(self, recipe=None, module_filter_fn: Optional[Callable] = None, dtype: torch.dtype = torch.float32,
                 *, fp8_group=None, monitor=None, fp8_evaluation: bool = True) -> None:
        FP8Precision.__init__(self, recipe, module_filter_fn, dtype, fp8_group=fp8_group, monitor=monitor,
                              fp8_evaluation=fp8_evaluation)
        self._desired_input_dtype = torch.float32  # (what FSDPPrecision's __init__ sets: inputs stay float32)
