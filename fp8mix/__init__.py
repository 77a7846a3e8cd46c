"""fp8mix: FP8 mixed-precision training for PyTorch.

Bit-exact E4M3/E5M2 casting with scaling and amax tracking, in C kernels that
run on any CPU (SIMD chosen at run time) and, where built, on NVIDIA GPUs.
"""
from . import optim
from ._version import __version__
from . import recipe
from .autocast import autocast, fp8_autocast, is_fp8_enabled
from .convert import convert_model
from .gemm import scaled_mm
from .grad_scaler import FP8GradScaler
from .linear import Linear
from .monitor import Monitor
from .formats import Format, fp8_dtype, fp8_max
from .ops import cpu_isa, set_max_isa
from .quantize import amax, cast_transpose, dequantize, quantize
from .tensor import Float8Tensor


__all__ = [
    "Format", "Float8Tensor", "FP8GradScaler", "Linear", "Monitor", "convert_model", "fp8_autocast", "autocast", "is_fp8_enabled", "optim", "recipe", "quantize", "dequantize", "amax", "cast_transpose",
    "scaled_mm", "fp8_dtype", "fp8_max", "cpu_isa", "set_max_isa",
]
