"""fp8mix: FP8 mixed-precision training for PyTorch.

Bit-exact E4M3/E5M2 casting with scaling and amax tracking, in C kernels that
run on any CPU (SIMD chosen at run time) and, where built, on NVIDIA GPUs.

Layout: the core API is flat here (formats, tensor, quantize, gemm, ops, recipe,
autocast, grad_scaler, optim, numerics); modules live in fp8mix.nn, the numerics
monitor in fp8mix.monitor; the demo, inspect and CLI tools in fp8mix.tools, which
``import fp8mix`` never imports.
"""
from . import nn, optim, recipe
from ._version import __version__
from .autocast import autocast, fp8_autocast, is_fp8_enabled
from .formats import Format, Granularity, fp8_dtype, fp8_max
from .gemm import scaled_mm
from .grad_scaler import FP8GradScaler
from .monitor import Monitor
from .nn import (
    FP8GlobalState,
    LayerNorm,
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    RMSNorm,
    TransformerLayer,
    checkpoint,
    convert_model,
    convert_module_to_fp8,
    load_fp8_state,
    strip_fp8_state,
    unconvert_model,
)
from .ops import cpu_isa, set_max_isa
from .plan import FP8Guard, Plan, ProgressiveFP8, search_plan
from .quantize import amax, cast_transpose, dequantize, quantize
from .tensor import Float8Tensor

__all__ = [
    "Format", "Granularity", "Float8Tensor", "FP8GradScaler", "Linear", "Monitor", "convert_model",
    "unconvert_model", "strip_fp8_state", "load_fp8_state", "checkpoint", "fp8_autocast", "autocast",
    "is_fp8_enabled", "nn", "optim", "recipe", "quantize", "dequantize", "amax", "cast_transpose", "scaled_mm",
    "fp8_dtype", "fp8_max", "cpu_isa", "set_max_isa", "__version__",
    "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "TransformerLayer", "convert_module_to_fp8",
    "FP8GlobalState",
    "search_plan", "Plan", "ProgressiveFP8", "FP8Guard",
]
