"""fp8mix: FP8 mixed-precision training for PyTorch.

Bit-exact E4M3/E5M2 casting with scaling and amax tracking, in C kernels that
run on any CPU (SIMD chosen at run time) and, where built, on NVIDIA GPUs.

Layout: the core API is flat here (formats, tensor, quantize, gemm, ops, recipe,
autocast, grad_scaler, optim, numerics); modules live in fp8mix.nn, the numerics
monitor in fp8mix.monitor; the demo, inspect and CLI tools in fp8mix.tools, which
``import fp8mix`` never imports.
"""
from . import compat, cuda, nn, nvfp4, optim, recipe  # (importing cuda registers the op layer's CUDA hooks)
from ._version import __version__
from .compat import FP8GlobalState, autocast, convert_module_to_fp8
from .context import fp8_autocast, is_fp8_enabled
from .formats import Format, Granularity, fp8_dtype, fp8_max
from .gemm import scaled_mm
from .gemm_order import gemm_kernel, get_gemm_order, order_from_env, set_gemm_order, using_gemm_order
from .grad_scaler import FP8GradScaler
from .monitor import Monitor
from .nn import (
    GroupedLinear,
    LayerNorm,
    LayerNormLinear,
    LayerNormMLP,
    Linear,
    RMSNorm,
    TransformerLayer,
    checkpoint,
    convert_model,
    load_fp8_state,
    mark_layer_order,
    strip_fp8_state,
    unconvert_model,
)
from .nn.fp8_weight import dequantize_fp8_weights
from .nn.fp8_weight_init import fp8_model_init
from .ops import cpu_isa, set_max_isa
from .plan import FP8Guard, Plan, ProgressiveFP8, search_plan
from .quantization import amax, cast_transpose, dequantize, quantize
from .tensor import Float8Tensor

set_gemm_order(order_from_env())  # the op layer starts canonical; this process's default or FP8MIX_GEMM_ORDER

# The seed text's aliases were first importable from fp8mix.nn too; fp8mix.nn cannot import
# fp8mix.compat (compat builds on fp8mix.nn), so they are attached to it here.
nn.convert_module_to_fp8 = convert_module_to_fp8  # type: ignore[attr-defined]
nn.FP8GlobalState = FP8GlobalState  # type: ignore[attr-defined]

__all__ = [
    "Format", "Granularity", "Float8Tensor", "FP8GradScaler", "Linear", "GroupedLinear", "Monitor", "convert_model",
    "unconvert_model", "strip_fp8_state", "load_fp8_state", "checkpoint", "fp8_autocast", "autocast",
    "is_fp8_enabled", "nn", "nvfp4", "optim", "recipe", "compat", "cuda",
    "quantize", "dequantize", "amax", "cast_transpose", "scaled_mm",
    "fp8_dtype", "fp8_max", "cpu_isa", "set_max_isa", "gemm_kernel", "set_gemm_order", "get_gemm_order",
    "using_gemm_order",
    "__version__",
    "LayerNorm", "RMSNorm", "LayerNormLinear", "LayerNormMLP", "TransformerLayer", "convert_module_to_fp8",
    "FP8GlobalState",
    "search_plan", "Plan", "ProgressiveFP8", "FP8Guard", "fp8_model_init", "dequantize_fp8_weights",
    "mark_layer_order",
]
