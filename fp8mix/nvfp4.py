"""NVFP4 tensors on the CPU: E2M1 values in 1x16 (or 16x16) blocks with E4M3 block scales
and one float32 tensor scale (NVIDIA's 4-bit training format, Transformer Engine's
``NVFP4BlockScaling`` arithmetic), their decoding, the GEMM of two of them and the 16-point
random Hadamard transform the recipe applies to the weight gradient's operands.

The numerics are the C core's (``csrc/include/fp8mix.h``, section "NVFP4"), bit-exact and
the same for every thread count; the GEMM is a scalar loop. Not yet here: an NVFP4 recipe
for fp8mix's modules (``fp8mix.Linear`` runs FP8 recipes only).

    >>> t = fp8mix.nvfp4.quantize(x)                  # x (..., K), K a multiple of 16
    >>> t.dequantize()                                 # back to x's shape and dtype
    >>> fp8mix.nvfp4.mm(t, fp8mix.nvfp4.quantize(w))   # x @ w.T in float32
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import ops

__all__ = ["NVFP4Tensor", "quantize", "mm", "random_hadamard", "BLOCK"]

BLOCK = 16  # elements per block scale (along the last dimension)


@dataclass(frozen=True)
class NVFP4Tensor:
    """An NVFP4 quantisation of a tensor of ``shape`` (last dimension K).

    codes: (rows, K/2) uint8, two E2M1 codes per byte, element 2j in the low nibble (the
    layout of torch.float4_e2m1fn_x2); block_scale: (rows, K/16) float8_e4m3fn, one per 16
    elements of a row (with 2-D scaling the 16 rows of a tile hold the same byte);
    scale_inv: () float32, the tensor's decode scale (``global_amax / 2688``, rounded)."""

    codes: torch.Tensor
    block_scale: torch.Tensor
    scale_inv: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The values, as ``dtype`` (default: the quantised tensor's), in its shape (float64:
        the float32 values, exactly)."""
        want = dtype or self.dtype
        kernel = want if want in (torch.float32, torch.bfloat16, torch.float16) else torch.float32
        out = ops.dequantize_nvfp4(self.codes, self.block_scale, self.scale_inv, out_dtype=kernel)
        return out.reshape(self.shape).to(want)


def quantize(x: torch.Tensor, *, global_amax: Optional[torch.Tensor] = None, tile_2d: bool = False,
             stochastic: bool = False, seed: int = 0, offset: int = 0, rng: Optional[torch.Tensor] = None,
             rng_skip: int = 0) -> NVFP4Tensor:
    """Quantise ``x`` (float32 / bf16 / fp16, CPU, last dimension a multiple of 16) to NVFP4.

    global_amax: the amax the tensor scale comes from (default ``x.abs().amax()``: current
    scaling; pass the all-reduced amax of a sharded tensor). Blocks above it saturate.
    tile_2d: 16x16 blocks (the recipe's weight scaling), else 1x16. stochastic: stochastic
    rounding of the E2M1 values with Philox words under (seed, offset), element (i, j)
    taking word i * K + j; ``rng`` (an int64 [key, offset] stream, as fp8mix layers keep in
    ``fp8_rng``) replaces stochastic/seed/offset with the words from offset + rng_skip on.
    A block holding NaN or inf decodes to NaN."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fp8mix.nvfp4.quantize: x must be a tensor, got {type(x).__name__}")
    if x.dim() == 0 or x.shape[-1] % BLOCK:
        raise ValueError(f"fp8mix.nvfp4.quantize: x's last dimension must be a multiple of {BLOCK} "
                         f"(NVFP4 blocks), got shape {tuple(x.shape)}")
    if global_amax is None:
        global_amax = ops.amax(x)
    codes, block_scale, scale_inv = ops.quantize_nvfp4(x, global_amax, tile_2d=tile_2d, stochastic=stochastic,
                                                       seed=seed, offset=offset, rng=rng, rng_skip=rng_skip)
    return NVFP4Tensor(codes, block_scale, scale_inv, shape=x.shape, dtype=x.dtype)


def mm(a: NVFP4Tensor, b: NVFP4Tensor) -> torch.Tensor:
    """``a @ b.T`` in float32 for a of shape (..., K) and b of shape (N, K)."""
    if a.shape[-1] != b.shape[-1] or len(b.shape) != 2:
        raise ValueError(f"fp8mix.nvfp4.mm: need a (..., K) and b (N, K) with the same K, got {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")
    out = ops.nvfp4_mm(a.codes, a.block_scale, a.scale_inv, b.codes, b.block_scale, b.scale_inv)
    return out.reshape(*a.shape[:-1], b.shape[0])


def random_hadamard(x: torch.Tensor, *, signs: int) -> torch.Tensor:
    """``x`` with every group of 16 consecutive elements of its last dimension multiplied by
    H D / 4 (H the 16x16 Sylvester Hadamard matrix, D = diag(-1 where bit c of ``signs`` is
    set)): an orthogonal map, so two operands transformed alike along their shared dimension
    keep their product, while outliers spread over the group. float32 in and out."""
    return ops.rht16(x, signs=signs)
