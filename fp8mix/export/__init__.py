"""fp8mix.export: FP8 checkpoints for inference engines (not imported by ``import fp8mix``:
``import fp8mix.export``; it needs safetensors, and transformers to build a model from a
folder).

    save_fp8_checkpoint(model, path, format="compressed-tensors" | "fp8-block", ...)
        safetensors + config.json: compressed-tensors' float-quantized FP8 (vLLM; per
        tensor or per channel) or DeepSeek-V3's 128x128 block FP8 (quant_method "fp8")
    load_fp8_checkpoint(path, model=None)
        back into fp8mix modules (FP8 primary weights keep their bytes) or plain torch
        modules (dequantised)

layouts.py: the weight layouts and their inverse; config.py: quantization_config;
checkpoint.py: the files.
"""
from .checkpoint import CONFIG_NAME, WEIGHTS_NAME, load_fp8_checkpoint, save_fp8_checkpoint
from .config import FORMATS, quantization_config
from .layouts import LAYOUTS, dequantize_weight, quantize_weight

__all__ = ["save_fp8_checkpoint", "load_fp8_checkpoint", "FORMATS", "LAYOUTS", "quantization_config",
           "quantize_weight", "dequantize_weight", "WEIGHTS_NAME", "CONFIG_NAME"]
