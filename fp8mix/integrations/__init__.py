"""fp8mix.integrations: FP8 training inside the libraries people already train with.

    lightning     FP8Precision: a Lightning precision plugin, ``Trainer(plugins=[FP8Precision()])``
    accelerate    prepare(accelerator, model, optimizer, ...): convert, wrap the forward, accelerator.prepare
    transformers  FP8TrainerCallback: the Hugging Face Trainer, ``Trainer(..., callbacks=[FP8TrainerCallback()])``

``import fp8mix`` never imports this package, and importing it imports no third-party
library. Each submodule imports its library when it is imported and raises an
ImportError naming the pip package when the library is missing.

What lives here is what the integrations share and needs no library: argument checks,
a conversion that leaves a converted model alone, and a model forward wrapped in
:func:`fp8mix.fp8_autocast` (for the libraries that call ``model(...)`` themselves and
offer no context hook around it). Each integration also runs under its library's sharded
training (FSDP, DeepSpeed ZeRO-2 through Accelerate: docs/integrations.md); LayerNorm
fusion is not covered.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import inspect
import logging
import types
from typing import Any, Callable, Optional

import torch

from ..context import fp8_autocast
from ..nn import FP8StateMixin, convert_model
from ..nn.fp8_state import FP8_STATE_KEYS
from ..recipe import RECIPES, DelayedScaling

__all__ = ["require", "check_recipe", "check_filter", "check_monitor", "is_converted", "convert", "wrap_forward",
           "unwrap_forward", "fp8_state_of", "split_fp8_state", "fp8_module_prefixes"]

log = logging.getLogger("fp8mix")


def require(module: str, *, pip_name: str, integration: str):
    """Import `module` for fp8mix.integrations.`integration`, or raise an ImportError that
    names the pip package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"fp8mix.integrations.{integration} needs the '{pip_name}' package, which is not "
                          f"installed (or failed to import: {exc}); install it with: pip install {pip_name}") from exc


def check_recipe(owner: str, recipe):
    """`recipe` validated (None: the default DelayedScaling)."""
    if recipe is None:
        return DelayedScaling()
    if not isinstance(recipe, RECIPES):
        raise TypeError(f"{owner}: recipe must be an fp8mix.recipe.DelayedScaling, CurrentScaling or BlockScaling "
                        f"(or None for the default), got {type(recipe).__name__}")
    return recipe


def check_filter(owner: str, module_filter_fn):
    """`module_filter_fn` validated: None or a callable ``(module, fqn) -> bool``."""
    if module_filter_fn is not None and not callable(module_filter_fn):
        raise TypeError(f"{owner}: module_filter_fn must be callable (module, fqn) -> bool, "
                        f"got {type(module_filter_fn).__name__}")
    return module_filter_fn


def check_monitor(monitor):
    """`monitor` validated by fp8_autocast's own rule (None or an fp8mix.Monitor), so a bad
    one fails where it is passed, not at the first training step."""
    fp8_autocast(enabled=True, monitor=monitor)
    return monitor


def is_converted(model: torch.nn.Module) -> bool:
    """Whether `model` already holds fp8mix modules (converted, or built with them)."""
    return any(isinstance(m, FP8StateMixin) for m in model.modules())


def convert(owner: str, model: torch.nn.Module, module_filter_fn) -> torch.nn.Module:
    """:func:`fp8mix.convert_model` in place, unless `model` already holds fp8mix modules
    (the user converted it, or a second ``fit``/``train`` call): then it is left as it is,
    so converting twice can neither warn nor change which layers run in FP8."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"{owner}: the model must be a torch.nn.Module, got {type(model).__name__}")
    if is_converted(model):
        log.info("%s: %s already holds fp8mix modules; not converting it again", owner, type(model).__name__)
        return model
    return convert_model(model, module_filter_fn=module_filter_fn)


@dataclasses.dataclass(frozen=True)
class _Autocast:
    """What a wrapped forward runs under, and what it wraps (kept on the model)."""

    recipe: Any
    group: Any
    monitor: Any
    inner: Callable   # the forward before wrapping: a function of (self, ...) when `bound`
    bound: bool
    previous: Any     # model.__dict__'s "forward" before wrapping (None: the class's)

    def __deepcopy__(self, memo):
        # a copied model shares the recipe, group and monitor; a previous forward bound to
        # the model is rebound to the copy (memo maps the model to its copy)
        return dataclasses.replace(self, previous=copy.deepcopy(self.previous, memo))


_ATTR = "_fp8mix_autocast"


def _signature(inner: Callable, bound: bool) -> Optional[inspect.Signature]:
    """The signature of the wrapper as a function of (self, ...): `inner`'s, with a leading
    self when `inner` does not take one (None when `inner` has no readable signature)."""
    try:
        sig = inspect.signature(inner)
    except (TypeError, ValueError):
        return None
    if bound:
        return sig
    return sig.replace(parameters=[inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
                                   *sig.parameters.values()])


def _wrapped(inner: Callable, bound: bool) -> Callable:
    """A forward that runs `inner` inside fp8_autocast with the settings kept on the model.

    It carries `inner`'s name, docstring and ``__signature__`` (the HF Trainer reads the
    signature to choose dataset columns) but no ``__wrapped__``: Accelerate's
    ``unwrap_model(keep_fp32_wrapper=False)`` peels ``__wrapped__`` chains to remove its
    autocast, and stops at this function instead of removing FP8 with it."""

    def forward(self, *args, **kwargs):
        cfg = self.__dict__[_ATTR]
        with fp8_autocast(enabled=True, fp8_recipe=cfg.recipe, fp8_group=cfg.group, monitor=cfg.monitor):
            return cfg.inner(self, *args, **kwargs) if cfg.bound else cfg.inner(*args, **kwargs)

    functools.update_wrapper(forward, inner, updated=())
    del forward.__wrapped__  # type: ignore[attr-defined]
    sig = _signature(inner, bound)
    if sig is not None:
        forward.__signature__ = sig  # type: ignore[attr-defined]
    return forward


def wrap_forward(model: torch.nn.Module, *, recipe, fp8_group=None, monitor=None) -> torch.nn.Module:
    """Make every ``model(...)`` call run inside ``fp8_autocast(fp8_recipe=recipe, ...)``.

    The wrapper is an instance attribute bound with ``types.MethodType`` (as Accelerate
    binds its autocast wrapper), so ``copy.deepcopy(model)`` rebinds it to the copy.
    Wrapping a wrapped model only changes its settings. Backward needs no context: it
    uses the recipe its forward used. Evaluation forwards (``eval()``, ``no_grad``) run in
    FP8 and change no FP8 state."""
    cfg = model.__dict__.get(_ATTR)
    if cfg is not None:
        object.__setattr__(model, _ATTR, dataclasses.replace(cfg, recipe=recipe, group=fp8_group, monitor=monitor))
        return model
    fwd = model.forward
    bound = isinstance(fwd, types.MethodType) and fwd.__self__ is model
    inner: Callable = fwd.__func__ if isinstance(fwd, types.MethodType) and bound else fwd
    cfg = _Autocast(recipe=recipe, group=fp8_group, monitor=monitor, inner=inner, bound=bound,
                    previous=model.__dict__.get("forward"))
    object.__setattr__(model, _ATTR, cfg)
    model.forward = types.MethodType(_wrapped(inner, bound), model)  # type: ignore[method-assign]
    return model


def unwrap_forward(model: torch.nn.Module) -> torch.nn.Module:
    """Undo :func:`wrap_forward` (no-op on a model that is not wrapped)."""
    cfg = model.__dict__.pop(_ATTR, None)
    if cfg is None:
        return model
    if cfg.previous is None:
        model.__dict__.pop("forward", None)
    else:
        model.forward = cfg.previous  # type: ignore[method-assign]
    return model


def _is_fp8_key(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in FP8_STATE_KEYS


def fp8_state_of(state_dict: dict) -> dict:
    """The FP8 state entries of a state dict (the complement of fp8mix.strip_fp8_state)."""
    return {k: v for k, v in state_dict.items() if _is_fp8_key(k)}


def split_fp8_state(state_dict: dict, fp8_modules: Optional[set] = None) -> dict:
    """Remove the FP8 state entries from `state_dict` in place and return them.
    `fp8_modules` (prefixes such as ``"model.layers.0.mlp.up_proj."``), when given,
    limits the removal to those modules (a user buffer that happens to be called
    ``fp8_scale`` elsewhere stays)."""
    keys = [k for k in state_dict if _is_fp8_key(k)
            and (fp8_modules is None or k[: len(k) - len(k.rsplit(".", 1)[-1])] in fp8_modules)]
    return {k: state_dict.pop(k) for k in keys}


def fp8_module_prefixes(model: torch.nn.Module) -> set:
    """State-dict prefixes of `model`'s fp8mix modules (``""`` for the root)."""
    return {f"{n}." if n else "" for n, m in model.named_modules() if isinstance(m, FP8StateMixin)}
