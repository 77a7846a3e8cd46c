"""FP8 formats: the `Format` enum users pass around, and the facts of each format.

E4M3 is OCP's e4m3fn (torch.float8_e4m3fn): bias 7, max 448, no infinities, one NaN.
E5M2 is torch.float8_e5m2: bias 15, max 57344, infinities and NaNs like IEEE half.
HYBRID is a policy, not an encoding: E4M3 for forward tensors (activations, weights),
E5M2 for gradients. AUTO is a policy too: each layer chooses per tensor role from
observed statistics (fp8mix.auto_format), starting from HYBRID's assignment.
"""
from __future__ import annotations

import enum

import torch

__all__ = ["Format", "Granularity", "fp8_dtype", "fp8_max", "format_of_dtype", "GRANULARITIES", "MX_BLOCK",
           "MX_RULES"]


class Format(enum.Enum):
    """FP8 format choice, per tensor or per recipe."""

    E4M3 = "E4M3"
    E5M2 = "E5M2"
    HYBRID = "HYBRID"
    AUTO = "AUTO"

    def __repr__(self) -> str:  # like Transformer Engine's Format.HYBRID
        return f"Format.{self.name}"


_DTYPES = {Format.E4M3: torch.float8_e4m3fn, Format.E5M2: torch.float8_e5m2}
_MAX = {Format.E4M3: 448.0, Format.E5M2: 57344.0}

class Granularity(str, enum.Enum):
    """Where a scale applies, the one vocabulary of fp8mix's API: one per tensor, per row,
    per 1x128 tile along a row, per 128x128 block, or per 1x32 MX block along a row (OCP
    Microscaling: power-of-two scales, E8M0 exponents). A member is its name (a str:
    ``Granularity.ROW == "row"``), so every function taking a granularity takes either;
    ``int(g)`` is the C API's fp8mix_granularity code. As a GEMM operand's scale layout
    (fp8mix.ops.scaled_mm): ROW is one scale per row of A / per column of B, BLOCK A's 1x128
    tiles along K, BLOCK2D B's 128x128 blocks."""

    TENSOR = "tensor"
    ROW = "row"
    BLOCK = "block"
    BLOCK2D = "block2d"
    MX = "mx"

    @property
    def code(self) -> int:
        """The C API's fp8mix_granularity value."""
        return _CODES[self]

    def __int__(self) -> int:
        return _CODES[self]

    @property
    def label(self) -> str:
        """The user-facing name ("tensor", "row", "block", "block2d", "mx"): the value."""
        return self.value

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, g) -> "Granularity":
        """A Granularity from itself, its name or its C code (ValueError for anything else)."""
        if isinstance(g, cls):
            return g
        if isinstance(g, str) and g in GRANULARITIES:
            return cls(g)
        if isinstance(g, int) and not isinstance(g, bool) and 0 <= g < len(_BY_CODE):
            return _BY_CODE[g]
        raise ValueError(f"granularity must be one of {list(GRANULARITIES)}, got {g!r}")


_BY_CODE = (Granularity.TENSOR, Granularity.ROW, Granularity.BLOCK, Granularity.BLOCK2D, Granularity.MX)
_CODES = {g: i for i, g in enumerate(_BY_CODE)}
# name -> code of the C API's fp8mix_granularity
GRANULARITIES = {g.value: i for i, g in enumerate(_BY_CODE)}
MX_BLOCK = 32  # elements per MX block (OCP Microscaling v1.0)
MX_RULES = {"rceil": 0, "floor": 1}  # fp8mix_mx_rule: NVIDIA's round-up rule, OCP v1.0's floor rule


def _single(fmt) -> Format:
    if isinstance(fmt, str):
        try:
            fmt = Format[fmt.upper()]
        except KeyError:
            raise ValueError(f"unknown FP8 format {fmt!r}; expected 'E4M3' or 'E5M2'") from None
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an fp8mix.Format, got {type(fmt).__name__}")
    if fmt not in _DTYPES:
        raise ValueError(
            f"{fmt!r} is a per-role policy, not an encoding: a single tensor needs Format.E4M3 or Format.E5M2"
        )
    return fmt


def fp8_dtype(fmt) -> torch.dtype:
    """The torch dtype holding `fmt`'s bytes (E4M3 -> float8_e4m3fn, E5M2 -> float8_e5m2)."""
    return _DTYPES[_single(fmt)]


def fp8_max(fmt) -> float:
    """Largest finite value of `fmt` (448.0 or 57344.0)."""
    return _MAX[_single(fmt)]


def format_of_dtype(dtype: torch.dtype) -> Format:
    for f, d in _DTYPES.items():
        if d == dtype:
            return f
    raise TypeError(f"{dtype} is not an FP8 dtype; expected torch.float8_e4m3fn or torch.float8_e5m2")
