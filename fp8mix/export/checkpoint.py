"""save_fp8_checkpoint / load_fp8_checkpoint: a model's linear weights in FP8 with their
scales, in a folder an inference engine (vLLM, transformers) loads: ``model.safetensors``
and ``config.json`` (the model's Hugging Face config, when it has one, plus
``quantization_config``: config.py).

Which weights are FP8: every fp8mix linear module (fp8mix.Linear, what convert_model
makes) that runs in FP8 -- ``fp8_enabled`` (a plan's kept layers are not) and at least
``fp8_min_features`` in and out features (smaller ones run in high precision in fp8mix
too). Every other nn.Linear is named in the config's ignore list and written in high
precision, as is every other tensor (embeddings, norms, biases). fp8mix's FP8 state
buffers (amax histories, scales) are not written: an inference engine has no use for them.

Loading: ``load_fp8_checkpoint(path, model)`` puts the folder's tensors into `model`
(built from the same config): plain torch modules get the dequantised weights (layouts.py:
q * scale in float32, rounded once to the parameter's dtype); a module holding an FP8
primary weight (built under fp8mix.fp8_model_init) gets the bytes and scale as they are
when the layout is per tensor. ``load_fp8_checkpoint(path)`` without a model builds one
with transformers from config.json (random init replaced by the checkpoint). Not here: the
GPU kernels that would run the FP8 weights (an inference engine's job).
"""
from __future__ import annotations

import json
import os
from typing import Any, Optional

import torch
import torch.nn as nn

from ..formats import fp8_max
from ..nn.fp8_state import FP8_STATE_KEYS, FP8StateMixin
from ..nn.fp8_weight import FP8Weight
from .config import ACTIVATIONS, FORMATS, layout_of, quantization_config
from .layouts import dequantize_weight, quantize_weight, scale_key

__all__ = ["save_fp8_checkpoint", "load_fp8_checkpoint", "WEIGHTS_NAME", "CONFIG_NAME"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


def _fp8_linears(model: nn.Module) -> dict:
    """{name: module} of the linear modules that run in FP8 (the module docstring's rule)."""
    out = {}
    for name, mod in model.named_modules():
        m: Any = mod
        if not isinstance(mod, FP8StateMixin) or not hasattr(m, "in_features") or getattr(m, "weight", None) is None:
            continue
        if m.weight.dim() != 2 or not m.fp8_enabled:
            continue
        if min(int(m.in_features), int(m.out_features)) < int(m.fp8_min_features):
            continue
        out[name] = m
    return out


def _input_scale(name: str, m) -> torch.Tensor:
    """Static input scale (compressed-tensors: x_q = x / input_scale): the largest input
    amax the layer's FP8 state recorded, over E4M3's max."""
    amax = float(m.fp8_amax_history[:, 0].max())
    if not amax > 0:
        raise ValueError(f"fp8mix.export: activations='static' needs each FP8 layer's recorded input amax; "
                         f"{name!r} has none (train it with delayed scaling, or run a few batches under "
                         "fp8_autocast(enabled=False, calibrating=True); or use 'dynamic')")
    return torch.tensor([amax / fp8_max("E4M3")], dtype=torch.float32)


def _check_save(model, path, fmt, strategy, activations) -> str:
    if not isinstance(model, nn.Module):
        raise TypeError(f"fp8mix.export.save_fp8_checkpoint expects an nn.Module, got {type(model).__name__}")
    if fmt not in FORMATS:
        raise ValueError(f"fp8mix.export: format must be one of {FORMATS}, got {fmt!r}")
    if fmt == "compressed-tensors" and strategy not in ("tensor", "channel"):
        raise ValueError(f"fp8mix.export: compressed-tensors strategy must be 'tensor' or 'channel', got {strategy!r}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"fp8mix.export: activations must be one of {ACTIVATIONS}, got {activations!r}")
    if fmt == "fp8-block" and activations == "static":
        raise ValueError("fp8mix.export: the block FP8 format has dynamic activations only")
    return "block" if fmt == "fp8-block" else strategy


def save_fp8_checkpoint(model: nn.Module, path, *, format: str = "compressed-tensors", strategy: str = "tensor",
                        activations: Optional[str] = "dynamic") -> str:
    """Write `model` to the folder `path` (created) as FP8 weights + scales (see the module
    docstring) and return the folder.

    Args:
        format: "compressed-tensors" (vLLM's float-quantized, per tensor or per channel) or
            "fp8-block" (DeepSeek-V3's 128x128 blocks, quant_method "fp8").
        strategy: compressed-tensors' weight strategy, "tensor" or "channel".
        activations: what the config tells the engine about the layers' inputs: "dynamic"
            (per-token scales at run time), "static" (a per-tensor input_scale per layer from
            the amax its FP8 state recorded; compressed-tensors only) or None (weight-only).
    """
    from safetensors.torch import save_file

    layout = _check_save(model, path, format, strategy, activations)
    path = os.fspath(path)
    fp8 = _fp8_linears(model)
    tensors: dict = {}
    for name, m in fp8.items():
        q, scale = quantize_weight(m.weight, layout)
        tensors[f"{name}.weight"] = q
        tensors[f"{name}.{scale_key(layout)}"] = scale
        if activations == "static":
            tensors[f"{name}.input_scale"] = _input_scale(name, m)
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in fp8]
    state = model.state_dict()
    for key, v in state.items():
        mod, _, leaf = key.rpartition(".")
        if mod in fp8 and leaf in ("weight", "weight_fp8", "weight_scale_inv"):
            continue
        if leaf in FP8_STATE_KEYS or not isinstance(v, torch.Tensor):
            continue
        tensors[key] = v
    _dequantize_leftovers(model, fp8, tensors)
    # safetensors stores no shared or strided storage: contiguous copies
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt"})
    config: Any = getattr(model, "config", None)
    cfg = config.to_dict() if hasattr(config, "to_dict") else {}
    cfg["quantization_config"] = quantization_config(format, layout, ignore, activations)
    with open(os.path.join(path, CONFIG_NAME), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    return path


def _dequantize_leftovers(model: nn.Module, fp8: dict, tensors: dict) -> None:
    """FP8 primary weights of layers written in high precision: their dequantised value
    under the plain name (not <name>_fp8 / _scale_inv, which no engine reads)."""
    for name, m in model.named_modules():
        if name in fp8:
            continue
        for pname, p in m.named_parameters(recurse=False):
            if isinstance(p, FP8Weight):
                prefix = f"{name}." if name else ""
                tensors.pop(f"{prefix}{pname}_fp8", None)
                tensors.pop(f"{prefix}{pname}_scale_inv", None)
                tensors[f"{prefix}{pname}"] = p.dequantize()


def _read(path: str) -> tuple:
    from safetensors.torch import load_file

    cfg_path, w_path = os.path.join(path, CONFIG_NAME), os.path.join(path, WEIGHTS_NAME)
    for p in (cfg_path, w_path):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"fp8mix.export.load_fp8_checkpoint: {p!r} does not exist")
    with open(cfg_path) as f:
        cfg = json.load(f)
    return cfg, load_file(w_path)


def _build(cfg: dict) -> nn.Module:
    import transformers

    conf = {k: v for k, v in cfg.items() if k != "quantization_config"}
    config = transformers.AutoConfig.for_model(**conf)
    return transformers.AutoModelForCausalLM.from_config(config)


def load_fp8_checkpoint(path, model: Optional[nn.Module] = None, *, strict: bool = True) -> nn.Module:
    """Load a folder written by :func:`save_fp8_checkpoint` (or any checkpoint in the same
    formats) into `model` (built with transformers from config.json when None) and return it.
    FP8 weights become `model`'s parameters dequantised, or stay FP8 bytes + scale where the
    module holds an FP8 primary weight and the layout is per tensor. strict: as
    load_state_dict's (fp8mix's FP8 state buffers are never required)."""
    path = os.fspath(path)
    cfg, tensors = _read(path)
    layout, _, _ = layout_of(cfg.get("quantization_config"))
    if model is None:
        model = _build(cfg)
    skey = scale_key(layout)
    mods = dict(model.named_modules())
    state: dict = {}
    for key, v in tensors.items():
        mod, _, leaf = key.rpartition(".")
        if leaf in (skey, "input_scale"):
            continue
        if leaf == "weight" and v.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            scale = tensors.get(f"{mod}.{skey}")
            if scale is None:
                raise ValueError(f"fp8mix.export: {key!r} is FP8 but {mod}.{skey} is missing")
            target = getattr(mods.get(mod), "weight", None)
            if isinstance(target, FP8Weight) and layout == "tensor":
                state[f"{mod}.weight_fp8"] = v.to(target._data.dtype)
                state[f"{mod}.weight_scale_inv"] = scale.float().reshape(target._scale_inv.shape)
                continue
            dtype = target.dtype if isinstance(target, torch.Tensor) else torch.float32
            state[key] = dequantize_weight(v, scale, layout, dtype)
            continue
        state[key] = v
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k.rpartition(".")[2] not in FP8_STATE_KEYS]
    if strict and (missing or unexpected):
        raise ValueError(f"fp8mix.export.load_fp8_checkpoint: the checkpoint does not fit the model: missing "
                         f"{missing[:8]}{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}")
    return model
