"""fp8mix's GEMM summation orders (docs/gemm_order.md): the API (set_gemm_order,
get_gemm_order, using_gemm_order, FP8MIX_GEMM_ORDER), the canonical order's bytes against
the documented order written with torch's float32 ops, and the native order against a
float64 reference within the bound gamma_K * sum |a_k b_k|, deterministic run to run and
across thread counts. The test session pins canonical (conftest); these tests switch.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import fp8mix

U = 2.0 ** -24


def _operands(M: int, K: int, N: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-2, 2, K)  # wide range: the order shows
    w = torch.randn(N, K, generator=g)
    x8 = fp8mix.quantize(x, fp8mix.Format.E5M2, scale=torch.tensor(1.0))
    w8 = fp8mix.quantize(w, fp8mix.Format.E5M2, scale=torch.tensor(1.0))
    one = torch.tensor(1.0)
    return x8.data, w8.data, one


def _canonical(a8: torch.Tensor, w8: torch.Tensor) -> torch.Tensor:
    """The canonical order with torch's float32 ops: pairs (k+1, then k), each add rounded."""
    a, b = a8.float(), w8.float()
    acc = torch.zeros(a.shape[0], b.shape[0])
    K = a.shape[1]
    for p in range(0, K, 2):
        if p + 1 < K:
            acc = acc + a[:, p + 1, None] * b[None, :, p + 1]
        acc = acc + a[:, p, None] * b[None, :, p]
    return acc


def test_api_and_the_session_pin():
    assert fp8mix.get_gemm_order() == "canonical"  # conftest's pin (FP8MIX_GEMM_ORDER)
    with fp8mix.using_gemm_order("native"):
        assert fp8mix.get_gemm_order() == "native"
        with fp8mix.using_gemm_order("canonical"):
            assert fp8mix.get_gemm_order() == "canonical"
        assert fp8mix.get_gemm_order() == "native"
    assert fp8mix.get_gemm_order() == "canonical"
    for bad in ("fast", "", None, 1):
        with pytest.raises(ValueError, match="GEMM order must be one of 'canonical', 'native'"):
            fp8mix.set_gemm_order(bad)  # type: ignore[arg-type]
    assert fp8mix.get_gemm_order() == "canonical"


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def test_gemm_kernel_names_follow_the_isa_cap():
    """fp8mix.gemm_kernel names the microkernel by what it multiplies with; the ISA cap
    moves it down the ladder, and native equals canonical wherever AMX is not in use."""
    assert fp8mix.gemm_kernel() == fp8mix.gemm_kernel("canonical")
    with fp8mix.using_gemm_order("native"):
        assert fp8mix.gemm_kernel() == fp8mix.gemm_kernel("native")
    if fp8mix.cpu_isa() != "amx":
        assert fp8mix.gemm_kernel("native") == fp8mix.gemm_kernel("canonical")
    flags = _cpu_flags()
    try:
        fp8mix.set_max_isa("scalar")
        assert fp8mix.gemm_kernel("canonical") == fp8mix.gemm_kernel("native") == "f32_4x16__scalar"
        if {"avx2", "fma", "f16c"} <= flags:
            fp8mix.set_max_isa("avx2")
            assert fp8mix.gemm_kernel("native") == "f32_6x16__avx2"
        if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
            fp8mix.set_max_isa("avx512")
            assert fp8mix.gemm_kernel("native") == "f32_14x32__avx512"
            fp8mix.set_max_isa("avx512bf16")  # the bf16 kernel only where it is faster and exact
            assert fp8mix.gemm_kernel("canonical") in ("f32_14x32__avx512", "bf16_14x32__avx512bf16")
    finally:
        fp8mix.set_max_isa("amx")
    for bad in ("fast", 1):
        with pytest.raises(ValueError, match="GEMM order must be one of"):
            fp8mix.gemm_kernel(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="order must be 0 .canonical. or 1 .native., got 7"):
        fp8mix.ops.gemm_kernel(7)


def _import_order(env_value):
    env = dict(os.environ)
    if env_value is None:
        env.pop("FP8MIX_GEMM_ORDER", None)
    else:
        env["FP8MIX_GEMM_ORDER"] = env_value
    return subprocess.run([sys.executable, "-c", "import fp8mix; print(fp8mix.get_gemm_order())"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("value,want", [(None, "native"), ("", "native"), ("canonical", "canonical"),
                                        ("native", "native")])
def test_environment_variable_and_default(value, want):
    r = _import_order(value)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == want


def test_bad_environment_variable_names_itself():
    r = _import_order("fastest")
    assert r.returncode != 0
    assert "FP8MIX_GEMM_ORDER" in r.stderr and "'fastest'" in r.stderr


@pytest.mark.parametrize("shape", [(9, 700, 13), (33, 1030, 40)])
def test_canonical_bytes_are_the_documented_order(shape):
    M, K, N = shape
    a8, w8, one = _operands(M, K, N, seed=K)
    for threads in (1, 3):
        torch.set_num_threads(threads)
        y = fp8mix.scaled_mm(a8, w8.t(), one, one)
        assert torch.equal(y.view(torch.int32), _canonical(a8, w8).view(torch.int32))


@pytest.mark.parametrize("shape", [(9, 3000, 13), (40, 1030, 70)])
def test_native_within_the_bound_and_deterministic(shape):
    """|native - exact| <= gamma_K * sum |a_k b_k| (docs/gemm_order.md: K bounds the
    additions any native kernel puts a product through); the same bits for every run
    and thread count."""
    M, K, N = shape
    a8, w8, one = _operands(M, K, N, seed=K + 1)
    with fp8mix.using_gemm_order("native"):
        torch.set_num_threads(1)
        y = fp8mix.scaled_mm(a8, w8.t(), one, one)
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for _ in range(2):
                assert torch.equal(fp8mix.scaled_mm(a8, w8.t(), one, one).view(torch.int32), y.view(torch.int32))
    a, b = a8.double(), w8.double()
    ref = a @ b.t()  # float64: its own error is below K * 2^-53 * sum |a_k b_k|, added to the bound
    mag = a.abs() @ b.abs().t()
    gamma = K * U / (1 - K * U) + 1.01 * K * 2.0 ** -53
    assert ((y.double() - ref).abs() <= gamma * mag).all()
    assert (y.double() != ref).any()  # the data are hard enough for float32 sums to round
