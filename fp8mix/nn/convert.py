"""convert_model / unconvert_model, and moving checkpoints between plain and converted models.

Conversion changes modules in place (their class becomes the FP8 one and they gain the
FP8 state buffers), so every Parameter, hook and attribute stays, an optimizer made
before keeps working, and a module registered under several names stays one module.
What is converted: ``torch.nn.Linear`` (also with the hook-based ``weight_norm``) to
:class:`fp8mix.Linear`, and Hugging Face's ``transformers.pytorch_utils.Conv1D`` (GPT-2)
to :class:`fp8mix.nn.Conv1D`. Linear-like modules that are not converted are reported
with the reason: subclasses of nn.Linear (they may compute otherwise: LoRA layers,
quantised layers), parametrized Linears (``torch.nn.utils.parametrize``), and the output
projection of ``nn.MultiheadAttention``, which uses its weight directly.

``fsdp_fp8_all_gather=True`` also makes FSDP2 (``fully_shard``, applied afterwards) move
the fp8mix layers' GEMM weights in FP8 (fp8mix.nn.fp8_weight.FP8AllGatherWeight). A model
already sharded by fully_shard is refused: FSDP2 shards the Parameters it finds, so the
fp8mix modules must be in place before it runs.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Callable, Optional

import torch
import torch.nn as nn

from ..recipe import RECIPES, CurrentScaling, from_config
from .conv1d import Conv1D
from .fp8_state import FP8_STATE_KEYS, FP8StateMixin
from .fp8_weight import WeightScaling, enable_fp8_all_gather, gemm_weight_names
from .grouped_linear import GroupedLinear
from .hf_experts import ROUTER_REASON, HFExperts, experts_skip_reason, fp8_experts_class, is_hf_experts, router_linears
from .layer_order import mark_layer_order
from .linear import Linear

__all__ = ["convert_model", "unconvert_model", "strip_fp8_state", "load_fp8_state", "ConversionReport"]

log = logging.getLogger("fp8mix")


def _is_hf_conv1d(m: nn.Module) -> bool:
    t = type(m)
    return t.__name__ == "Conv1D" and t.__module__.startswith("transformers") and hasattr(m, "nf")


def _linear_like(m: nn.Module) -> bool:
    return isinstance(m, nn.Linear) or _is_hf_conv1d(m)


def _skip_reason(m: nn.Module) -> Optional[str]:
    """Why a Linear-like module is not converted (None: it is converted)."""
    if is_hf_experts(m):
        return experts_skip_reason(m)
    if isinstance(m, nn.modules.linear.NonDynamicallyQuantizableLinear):
        return "the output projection of nn.MultiheadAttention, which uses its weight directly (never its forward)"
    if torch.nn.utils.parametrize.is_parametrized(m):
        return "a parametrized Linear (torch.nn.utils.parametrize): its weight is computed; not converted"
    if type(m) is nn.Linear or _is_hf_conv1d(m):
        return None
    return (f"a subclass of nn.Linear ({type(m).__module__}.{type(m).__qualname__}) may compute otherwise; "
            "not converted (convert it yourself, or exclude it with module_filter_fn to silence this)")


class ConversionReport(list):
    """What convert_model did: a list of converted names, with ``skipped`` ({name: reason})
    and, with fsdp_fp8_all_gather, ``fp8_all_gather`` (names of the layers whose weights
    FSDP2 all-gathers in FP8) and ``fp8_all_gather_skipped`` ({name: reason})."""

    def __init__(self):
        super().__init__()
        self.skipped: dict = {}
        self.fp8_all_gather: list = []
        self.fp8_all_gather_skipped: dict = {}


def _convert_one(m: nn.Module) -> None:
    if is_hf_experts(m):
        m.__dict__["_fp8_orig_class"] = type(m)
        m.__class__ = fp8_experts_class(type(m))
        assert isinstance(m, FP8StateMixin)
        m._init_fp8_state(m.down_proj.device)
        return
    weight = m.weight
    assert isinstance(weight, torch.Tensor)
    m.__dict__["_fp8_orig_class"] = type(m)
    m.__class__ = Conv1D if _is_hf_conv1d(m) else Linear
    if isinstance(m, Conv1D) and not hasattr(m, "nx"):
        m.nx = int(weight.shape[0])
    assert isinstance(m, FP8StateMixin)
    m._init_fp8_state(weight.device)


def convert_model(model: nn.Module, *, module_filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
                  recipe=None, config=None, plan=None, fsdp_fp8_all_gather: Optional[bool] = None) -> nn.Module:
    """Turn every ``nn.Linear`` (and Hugging Face ``Conv1D``) of `model` into its fp8mix
    version in place, keeping its Parameters, and return `model`.

    Args:
        module_filter_fn: ``fn(module, fqn) -> bool`` (torchao's signature); modules for which
            it returns False stay in high precision, e.g. the first and last layers, to raise
            the FP8 share of a model step by step.
        recipe: accepted for symmetry with Transformer Engine; the recipe is chosen by
            :func:`fp8mix.fp8_autocast` at run time. With fsdp_fp8_all_gather, the recipe
            the FP8-gathered layers run with (their ``fp8_recipe``; default CurrentScaling()).
        config: for torchao users: one of torchao's recipe names (``"tensorwise"``,
            ``"rowwise"``, ``"rowwise_with_gw_hp"``), a torchao ``Float8LinearConfig`` (or
            an object with its fields) or an fp8mix recipe (see
            :func:`fp8mix.recipe.from_config`). The converted layers then use that recipe
            inside any :func:`fp8mix.fp8_autocast`, whatever recipe the autocast names (their
            ``fp8_recipe``, as a precision plan sets it); outside one they stay in high
            precision, as every fp8mix layer.
        plan: an :class:`fp8mix.Plan` (from :func:`fp8mix.search_plan` or ``Plan.load``):
            after converting, each planned layer gets its decision (``fp8_enabled`` /
            ``fp8_recipe``), layers the plan keeps stay in high precision.
        fsdp_fp8_all_gather: FSDP2 all-gathers the GEMM weights of every fp8mix layer
            (converted here or built as one) in FP8, cast before the all-gather by current
            per-tensor scaling of the whole weight, and the forward and backward GEMMs use
            the gathered bytes (torchao's enable_fsdp_float8_all_gather). Those layers run
            with that rule's recipe: `recipe`, or `config`'s, or CurrentScaling(), set as
            their ``fp8_recipe``; a recipe whose weight role is another (DelayedScaling,
            BlockScaling, rowwise, MX, Format.AUTO, stochastic weight rounding) raises
            ValueError. Default (None): as `config`'s ``enable_fsdp_float8_all_gather``
            says, else False. Layers a plan keeps in high precision, layers below
            ``fp8_min_features`` and fp8_model_init's (already FP8) are left as they are; a
            weight shared with another module (tied embeddings) raises. The weights become
            new Parameters (same storage): build the optimizer after fully_shard, as FSDP2
            wants anyway. Call :func:`fp8mix.distributed.precompute_fp8_scales_for_fsdp`
            after each optimizer step to compute every layer's scale in one all-reduce.

    Every fp8mix module of the model (converted here or built as one) is stamped with its
    place in module order (:func:`fp8mix.mark_layer_order`: what NVFP4BlockScaling's
    keep_last_layers_hp reads). The modules converted and those left out (with the reason) are logged at INFO level and
    kept in ``model.fp8_conversion`` (a list of names with ``.skipped``: {name: reason});
    Linear-like modules left out for a reason other than the filter warn, and so does a
    conversion that converts nothing.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_model expects an nn.Module, got {type(model).__name__}")
    if recipe is not None and not isinstance(recipe, RECIPES):
        raise TypeError(f"convert_model: recipe must be an fp8mix.recipe object or None, got {type(recipe).__name__}")
    if config is not None and recipe is not None:
        raise TypeError("convert_model: give recipe or config, not both")
    layer_recipe = from_config(config) if config is not None else None
    if module_filter_fn is not None and not callable(module_filter_fn):
        raise TypeError("module_filter_fn must be callable (module, fqn) -> bool")
    if plan is not None and not callable(getattr(plan, "apply", None)):  # duck-typed: nn never imports plan
        raise TypeError(f"convert_model: plan must be an fp8mix.Plan, got {type(plan).__name__}")
    all_gather = _all_gather_wanted(fsdp_fp8_all_gather, config)
    ag_recipe = None
    if all_gather:  # a recipe the FP8 all-gather cannot serve raises before anything changes
        ag_recipe = recipe or layer_recipe or CurrentScaling()
        WeightScaling.from_recipe(ag_recipe, "fp8mix.convert_model(fsdp_fp8_all_gather=True)")
    report = ConversionReport()
    seen: set = set()
    todo, candidates = [], []
    routers = router_linears(model)
    for fqn, m in model.named_modules(remove_duplicate=False):
        if id(m) in seen or isinstance(m, FP8StateMixin) or not (_linear_like(m) or is_hf_experts(m)):
            continue
        seen.add(id(m))
        name = fqn or type(model).__name__
        if module_filter_fn is not None and not module_filter_fn(m, fqn):
            report.skipped[name] = "module_filter_fn returned False"
            continue
        candidates.append(m)  # (fully_shard makes its class a subclass: checked before the skip reasons)
        reason = routers.get(id(m)) or _skip_reason(m)
        if reason is not None:
            report.skipped[name] = reason
            continue
        todo.append((name, m))
    _refuse_sharded(model, candidates, all_gather)
    for name, m in todo:
        _convert_one(m)
        if layer_recipe is not None:
            m.fp8_recipe = layer_recipe
        report.append(name)
    mark_layer_order(model)  # (NVFP4BlockScaling's last-layers rule reads it)
    if plan is not None:
        plan.apply(model)
    if all_gather:
        _fp8_all_gather(model, ag_recipe, report)
    _report(model, report)
    return model


def _all_gather_wanted(flag: Optional[bool], config) -> bool:
    """fsdp_fp8_all_gather, or torchao's Float8LinearConfig.enable_fsdp_float8_all_gather."""
    from_cfg = getattr(config, "enable_fsdp_float8_all_gather", None) if config is not None else None
    if flag is not None and not isinstance(flag, bool):
        raise TypeError(f"convert_model: fsdp_fp8_all_gather must be True, False or None, got {flag!r}")
    if flag is False and from_cfg:
        raise ValueError("convert_model: fsdp_fp8_all_gather=False contradicts the config's "
                         "enable_fsdp_float8_all_gather=True")
    return bool(flag) or bool(from_cfg)


def _fsdp_managed(model: nn.Module) -> set:
    """ids of the modules of `model` whose parameters FSDP2 (fully_shard) manages."""
    fsdp = sys.modules.get("torch.distributed.fsdp")  # (never imported: nothing can be sharded)
    cls = getattr(fsdp, "FSDPModule", None)
    if cls is None:
        return set()
    return {id(sub) for m in model.modules() if isinstance(m, cls) for sub in m.modules()}


def _refuse_sharded(model: nn.Module, to_convert: list, all_gather: bool) -> None:
    """A clear error (never a hang in a later collective) for modules fully_shard has sharded."""
    managed = _fsdp_managed(model)
    if not managed:
        return
    hit = [m for m in to_convert if id(m) in managed]
    if all_gather:
        hit += [m for m in model.modules() if isinstance(m, FP8StateMixin) and id(m) in managed]
    if hit:
        names = {id(m): n or type(model).__name__ for n, m in model.named_modules()}
        listed = ", ".join(repr(names.get(id(m), type(m).__name__)) for m in hit[:5])
        raise ValueError(f"fp8mix.convert_model: {listed}{' ...' if len(hit) > 5 else ''} already sharded by "
                         "fully_shard (FSDP2). Convert the model before fully_shard: FSDP2 shards the Parameters "
                         "it finds, so the fp8mix modules (and their FP8 all-gather) must be in place by then")


def _fp8_all_gather(model: nn.Module, recipe, report: ConversionReport) -> None:
    """FSDP2 FP8 all-gather for every fp8mix layer of `model` that can take it."""
    scaling = WeightScaling.from_recipe(recipe, "fp8mix.convert_model(fsdp_fp8_all_gather=True)")
    holders: dict = {}  # id(Parameter) -> names it is registered under
    for fqn, mod in model.named_modules(remove_duplicate=False):
        for pn, p in mod._parameters.items():
            if p is not None:
                holders.setdefault(id(p), set()).add(f"{fqn}.{pn}" if fqn else pn)
    for fqn, m in model.named_modules():
        if not isinstance(m, FP8StateMixin):
            continue
        name = fqn or type(model).__name__
        if isinstance(m, HFExperts) or isinstance(m, GroupedLinear):
            report.fp8_all_gather_skipped[name] = "expert weights: the FP8 all-gather is not built for them " \
                                                  "(all-gathered in high precision)"
            continue
        weights: list = [m._parameters[n] for n in gemm_weight_names(m)]
        if not m.fp8_enabled:
            report.fp8_all_gather_skipped[name] = "fp8_enabled=False (kept in high precision)"
            continue
        if min(min(w.shape) for w in weights) < m.fp8_min_features:
            report.fp8_all_gather_skipped[name] = f"fewer than fp8_min_features={m.fp8_min_features} features " \
                                                  "(runs in high precision)"
            continue
        for n, w in zip(gemm_weight_names(m), weights):
            if len(holders[id(w)]) > 1:
                raise ValueError(f"fp8mix.convert_model(fsdp_fp8_all_gather=True): {name}.{n} is shared "
                                 f"({sorted(holders[id(w)])}); a shared weight cannot be all-gathered in FP8 (the "
                                 "other module would read the FP8 value); untie it or exclude the layer")
        if m.fp8_recipe is not None and m.fp8_recipe != recipe:
            own = WeightScaling.from_recipe(m.fp8_recipe, f"fp8mix.convert_model: {name}'s fp8_recipe")
            if own != scaling:
                raise ValueError(f"fp8mix.convert_model: {name}'s fp8_recipe casts the weight as {own}, not as the "
                                 f"FP8 all-gather's {scaling}")
        if enable_fp8_all_gather(m, scaling):
            if m.fp8_recipe is None:
                m.fp8_recipe = recipe
            if getattr(m, "_fp8_name", None) is None:
                m.__dict__["_fp8_name"] = name  # (errors and monitor labels name it)
            report.fp8_all_gather.append(name)


def _report(model: nn.Module, report: ConversionReport) -> None:
    try:
        model.fp8_conversion = report  # type: ignore[assignment]
    except (AttributeError, TypeError):  # a module class that forbids new attributes
        pass
    log.info("fp8mix.convert_model: converted %d layer(s)%s", len(report),
             "" if not report.skipped else "; left in high precision: " +
             "; ".join(f"{k} ({v})" for k, v in report.skipped.items()))
    if report.fp8_all_gather or report.fp8_all_gather_skipped:
        log.info("fp8mix.convert_model: FSDP2 FP8 all-gather for %d layer(s)%s", len(report.fp8_all_gather),
                 "" if not report.fp8_all_gather_skipped else "; not for: " +
                 "; ".join(f"{k} ({v})" for k, v in report.fp8_all_gather_skipped.items()))
    odd = {k: v for k, v in report.skipped.items()
           if v != "module_filter_fn returned False" and not v.startswith(ROUTER_REASON)}  # (both by intent)
    if odd:
        warnings.warn("fp8mix.convert_model left these Linear-like modules in high precision: " +
                      "; ".join(f"{k}: {v}" for k, v in odd.items()), UserWarning, stacklevel=3)
    if not report and not report.fp8_all_gather:
        warnings.warn(f"fp8mix.convert_model: no layer of {type(model).__name__} was converted (it has no "
                      "nn.Linear or Conv1D, or the filter excluded them all)", UserWarning, stacklevel=3)


def _original_class(m: nn.Module):
    orig = m.__dict__.get("_fp8_orig_class")
    if orig is not None:
        return orig
    if isinstance(m, Linear):
        return nn.Linear
    try:  # an fp8mix Conv1D built directly: back to Hugging Face's when it is installed
        from transformers.pytorch_utils import Conv1D as HFConv1D
        return HFConv1D
    except ImportError:
        raise TypeError("fp8mix.unconvert_model: an fp8mix Conv1D has no high-precision class to return to "
                        "without transformers installed") from None


def unconvert_model(model: nn.Module) -> nn.Module:
    """The reverse of :func:`convert_model`, in place: fp8mix modules become ``nn.Linear``
    (or Hugging Face ``Conv1D``, or the Hugging Face experts class) again with the same
    Parameters, without the FP8 state."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"unconvert_model expects an nn.Module, got {type(model).__name__}")
    for m in [m for m in model.modules() if isinstance(m, (Linear, Conv1D, HFExperts))]:
        cls = _original_class(m)
        for h in m.__dict__.pop("_fp8_hooks", []):
            h.remove()
        for k in FP8_STATE_KEYS:
            m._buffers.pop(k, None)
        for k in [k for k in m.__dict__ if k.startswith(("_fp8", "_wcache", "_replay", "_nograd", "_auto_",
                                                          "_maybe_fresh", "_fallback", "_grouped"))
                  or k in ("fp8_recipe", "fp8_enabled")]:  # the per-module policy (config=, a plan)
            del m.__dict__[k]
        m.__class__ = cls
    return model


def strip_fp8_state(state_dict: dict) -> dict:
    """A copy of `state_dict` without fp8mix's FP8 state entries: what the plain (not
    converted) model loads with ``strict=True``. Only entries of fp8mix modules go: those
    under a prefix that has the FP8 state's core buffers (fp8_amax_history, fp8_scale,
    fp8_steps); a buffer of another module that happens to share a name stays."""
    def prefix(k: str) -> str:
        return k.rsplit(".", 1)[0] + "." if "." in k else ""

    fp8_prefixes = {prefix(k) for k in state_dict if k.endswith("fp8_amax_history")}
    fp8_prefixes = {p for p in fp8_prefixes if all(p + c in state_dict for c in FP8_STATE_KEYS[:3])}
    return type(state_dict)((k, v) for k, v in state_dict.items()
                            if not (prefix(k) in fp8_prefixes and k.rsplit(".", 1)[-1] in FP8_STATE_KEYS))


def _read_checkpoint(source) -> dict:
    """A state dict from a dict, a torch.save file, a safetensors file, or a Hugging Face
    checkpoint folder (model.safetensors, sharded or not, or pytorch_model.bin)."""
    if isinstance(source, dict):
        return source
    path = os.fspath(source)
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        st = [n for n in names if n.endswith(".safetensors")]
        if st:
            out: dict = {}
            for n in st:
                out.update(_read_checkpoint(os.path.join(path, n)))
            return out
        bins = [n for n in names if n.endswith(".bin") or n.endswith(".pt")]
        if not bins:
            raise FileNotFoundError(f"fp8mix.load_fp8_state: no checkpoint file (*.safetensors, *.bin, *.pt) in {path}")
        out = {}
        for n in bins:
            out.update(torch.load(os.path.join(path, n), map_location="cpu", weights_only=True))
        return out
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_fp8_state(model: nn.Module, source) -> list:
    """Restore the FP8 state of `model`'s fp8mix modules from `source` (a state dict, a
    file, or a Hugging Face checkpoint folder written by ``save_pretrained``): the round
    trip ``save_pretrained`` -> ``from_pretrained`` -> ``convert_model`` -> this. Only the
    FP8 state entries are read. Returns the names of the modules restored; a module whose
    state is absent from `source` keeps its fresh state and is named in a warning."""
    sd = _read_checkpoint(source)
    restored, absent = [], []
    for name, m in model.named_modules():
        if not isinstance(m, FP8StateMixin):
            continue
        prefix = f"{name}." if name else ""
        sub = {k: sd[prefix + k] for k in FP8_STATE_KEYS if prefix + k in sd}
        if not sub:
            absent.append(name)
            continue
        current = m.state_dict()
        current.update(sub)
        m.load_state_dict(current, strict=True)
        restored.append(name)
    if absent:
        warnings.warn(f"fp8mix.load_fp8_state: no FP8 state for {absent} in the checkpoint; they start fresh",
                      UserWarning, stacklevel=2)
    return restored
