"""The summation order of fp8mix's CPU GEMMs (docs/gemm_order.md).

Every product of two FP8 values is exact in float32, so two GEMMs over the same FP8 operands
differ only in the order their float32 sums are added:

* ``"canonical"``: one fixed order (pairs k = 1, 0, 3, 2, ...), the same bytes on every CPU,
  ISA and thread count, and the CPU oracle the CUDA path is checked against. Use it for
  bit-for-bit reproducibility across machines (checkpoints, logs compared byte for byte).
* ``"native"`` (the default): the fastest exact-product kernel of this CPU (AMX tiles where
  the CPU and OS offer them, else the kernel canonical uses): the same bytes run to run and
  for every thread count on one machine, within the error bound of docs/gemm_order.md of the
  exact sum everywhere.

The choice is process-wide: ``fp8mix.set_gemm_order``, the ``fp8mix.using_gemm_order`` context
manager, or the environment variable ``FP8MIX_GEMM_ORDER`` (read when fp8mix is imported).
The order travels to the C core with every call (``fp8mix_gemm_args.order``).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

from . import ops

__all__ = ["ORDERS", "ENV_VAR", "DEFAULT", "set_gemm_order", "get_gemm_order", "using_gemm_order", "order_from_env",
           "gemm_kernel"]

ORDERS = ("canonical", "native")  # index = the C code (fp8mix_gemm_order)
ENV_VAR = "FP8MIX_GEMM_ORDER"
DEFAULT = "native"


def _checked(order: object, where: str) -> str:
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"{where}: the GEMM order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
    return order


def set_gemm_order(order: str) -> None:
    """Sum every later CPU GEMM in `order` ("canonical" or "native"); process-wide."""
    ops.set_gemm_order(ORDERS.index(_checked(order, "fp8mix.set_gemm_order")))


def get_gemm_order() -> str:
    """The order in force: "canonical" or "native"."""
    return ORDERS[ops.get_gemm_order()]


def gemm_kernel(order: str | None = None) -> str:
    """The CPU GEMM microkernel that sums in `order` (default: the order in force) on this
    CPU, under the current ISA cap (fp8mix.set_max_isa / FP8MIX_MAX_ISA). Its name says what
    it multiplies with and its tile, e.g. ``"f32_14x32__avx512"`` (float32 FMA),
    ``"bf16_14x32__avx512bf16"`` (AVX512-BF16 ``vdpbf16ps``, where that is faster than FMA),
    ``"bf16_32x32__amx"`` (AMX tiles), ``"f32_6x16__avx2"``, ``"f32_4x16__scalar"``. A float32
    FMA kernel bounds an FP8 GEMM at the CPU's float32 GEMM speed; a bf16 or AMX kernel
    does two or more products per float32 FMA slot."""
    code = ORDERS.index(_checked(order, "fp8mix.gemm_kernel")) if order is not None else ops.get_gemm_order()
    return ops.gemm_kernel(code)


@contextlib.contextmanager
def using_gemm_order(order: str) -> Iterator[None]:
    """Run the block's CPU GEMMs in `order`, then restore the order in force before."""
    before = get_gemm_order()
    set_gemm_order(order)
    try:
        yield
    finally:
        set_gemm_order(before)


def order_from_env() -> str:
    """FP8MIX_GEMM_ORDER's order, or the default when it is unset or empty."""
    value = os.environ.get(ENV_VAR, "")
    return _checked(value, f"environment variable {ENV_VAR}") if value else DEFAULT
