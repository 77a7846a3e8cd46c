"""The ``quantization_config`` entry of config.json for each export format, and the reverse:
which layout a written config describes.

compressed-tensors ("float-quantized", what vLLM and transformers' compressed-tensors
quantizer read; the keys of compressed_tensors.QuantizationConfig)::

    {"quant_method": "compressed-tensors", "format": "float-quantized",
     "quantization_status": "compressed", "kv_cache_scheme": null, "ignore": [module, ...],
     "config_groups": {"group_0": {"targets": ["Linear"], "output_activations": null,
         "weights": {"num_bits": 8, "type": "float", "symmetric": true, "dynamic": false,
                     "strategy": "tensor" | "channel", ...},
         "input_activations": null | {"num_bits": 8, "type": "float", "symmetric": true,
                     "dynamic": true, "strategy": "token"}            (activations="dynamic")
                               | {..., "dynamic": false, "strategy": "tensor"}  ("static":
                                 each layer's input_scale)}}}

DeepSeek-V3 block FP8 (transformers' FineGrainedFP8Config, quant_method "fp8")::

    {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
     "weight_block_size": [128, 128], "modules_to_not_convert": [module, ...]}

Not here: the tensors (layouts.py), the files (checkpoint.py).
"""
from __future__ import annotations

from typing import Optional

from .layouts import BLOCK

__all__ = ["FORMATS", "ACTIVATIONS", "quantization_config", "layout_of"]

FORMATS = ("compressed-tensors", "fp8-block")
ACTIVATIONS = ("dynamic", "static", None)


def _args(strategy: str, dynamic: bool) -> dict:
    return {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": dynamic, "strategy": strategy,
            "group_size": None, "block_structure": None, "actorder": None, "observer": None if dynamic else "minmax",
            "observer_kwargs": {}}


def quantization_config(fmt: str, layout: str, ignore: list, activations: Optional[str]) -> dict:
    """The quantization_config dict for format `fmt` with weight layout `layout`."""
    if fmt == "fp8-block":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                "weight_block_size": [BLOCK, BLOCK], "modules_to_not_convert": list(ignore)}
    inputs = None
    if activations == "dynamic":
        inputs = _args("token", True)
    elif activations == "static":
        inputs = _args("tensor", False)
    group = {"targets": ["Linear"], "weights": _args(layout, False), "input_activations": inputs,
             "output_activations": None}
    return {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "kv_cache_scheme": None, "ignore": list(ignore), "config_groups": {"group_0": group}}


def layout_of(qc: dict) -> tuple:
    """(layout, ignore, has_input_scale) described by a written quantization_config
    (ValueError naming what this reader does not know)."""
    if not isinstance(qc, dict):
        raise ValueError("fp8mix.export: config.json has no quantization_config object")
    method = qc.get("quant_method")
    if method == "fp8":
        if list(qc.get("weight_block_size") or []) != [BLOCK, BLOCK]:
            raise ValueError(f"fp8mix.export: block FP8 with weight_block_size {qc.get('weight_block_size')!r}; "
                             f"this reader knows [{BLOCK}, {BLOCK}]")
        return "block", list(qc.get("modules_to_not_convert") or []), False
    if method != "compressed-tensors":
        raise ValueError(f"fp8mix.export: quant_method {method!r} is not one this reader knows "
                         "('compressed-tensors', 'fp8')")
    if qc.get("format") != "float-quantized":
        raise ValueError(f"fp8mix.export: compressed-tensors format {qc.get('format')!r}; this reader knows "
                         "'float-quantized'")
    groups = qc.get("config_groups") or {}
    if len(groups) != 1:
        raise ValueError(f"fp8mix.export: {len(groups)} config_groups; this reader knows exactly one")
    g = next(iter(groups.values()))
    w = g.get("weights") or {}
    if w.get("type") != "float" or w.get("num_bits") != 8 or w.get("strategy") not in ("tensor", "channel"):
        raise ValueError(f"fp8mix.export: weights {w!r} are not 8-bit float per tensor or per channel")
    inp = g.get("input_activations")
    return w["strategy"], list(qc.get("ignore") or []), bool(inp) and not inp.get("dynamic", True)
