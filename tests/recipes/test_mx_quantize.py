"""fp8mix.quantize(x, fmt, granularity="mx") and the MX GEMM, against a reference written
here from the OCP Microscaling Formats v1.0 spec (32-element blocks along the last
dimension, one power-of-two scale 2^e per block with e in E8M0's [-127, 127]; the exponent
by NVIDIA's "rceil" rule or the spec's "floor(log2(amax)) - emax_elem"; elements rounded to
nearest even by torch's own float8 cast, saturating). E8M0 round trip through ml_dtypes.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from mx_reference import ref_mx

import fp8mix
from fp8mix import Format


def _data(rows=37, cols=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-6, 6, rows).unsqueeze(1)
    x[1, :32] = 0.0                 # an all-zero block
    x[2, :] *= 1e-38                # subnormal float32 values
    x[3, 5] = 3e38                  # near FLT_MAX
    return x


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("fmt", [Format.E4M3, Format.E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("rule", ["rceil", "floor"])
@pytest.mark.parametrize("margin", [0, 2])
def test_quantize_mx_matches_the_spec(fmt, rule, margin):
    x = _data()
    t = fp8mix.quantize(x, fmt, granularity="mx", mx_rule=rule, margin=margin)
    q, s = ref_mx(x, fmt, rule, margin)
    assert t.granularity == "mx" and t.scale_inv.shape == (37, 3) and t.scale_inv.dtype == torch.float32
    assert torch.equal(t.scale_inv, s)
    assert _same(t.data, q)
    assert torch.equal(t.amax, x.abs().reshape(37, -1)[:, :].new_tensor(
        [[float(x[i, 32 * b: 32 * b + 32].abs().max()) for b in range(3)] for i in range(37)]))


def test_scale_inv_is_e8m0():
    """Every scale is a power of two that E8M0 (ml_dtypes.float8_e8m0fnu) holds exactly."""
    t = fp8mix.quantize(_data(), Format.E4M3, granularity="mx")
    s = t.scale_inv.numpy()
    back = s.astype(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    assert np.array_equal(back, s)
    e = np.log2(s.astype(np.float64))
    assert np.array_equal(e, np.round(e)) and e.min() >= -127 and e.max() <= 127


def test_nonfinite_blocks():
    x = torch.linspace(-3, 3, 64).reshape(1, 64)
    x[0, 3] = float("nan")
    x[0, 40] = float("inf")
    t = fp8mix.quantize(x, Format.E4M3, granularity="mx")
    q, s = ref_mx(x, Format.E4M3, "rceil")
    assert torch.equal(t.scale_inv, torch.ones(1, 2))
    assert torch.isnan(t.data.float()[0, 3]) and t.data.float()[0, 40] == 448
    assert _same(t.data, q)


def test_bf16_leading_dims_and_dequantize():
    x = _data(rows=12, cols=45).reshape(3, 4, 45).clamp(-1e4, 1e4)
    xb = x.bfloat16()
    t = fp8mix.quantize(xb, Format.E4M3, granularity="mx")
    assert t.scale_inv.shape == (3, 4, 2)
    q, s = ref_mx(xb.float().reshape(12, 45), Format.E4M3, "rceil")
    assert _same(t.data.reshape(12, 45), q) and torch.equal(t.scale_inv.reshape(12, 2), s)
    d = fp8mix.dequantize(t).reshape(12, 45)
    want = q.float() * s.repeat_interleave(32, dim=1)[:, :45]
    assert torch.equal(d, want)


def test_bad_arguments():
    x = torch.randn(4, 40)
    with pytest.raises(ValueError, match="mx_rule"):
        fp8mix.quantize(x, granularity="mx", mx_rule="round")
    with pytest.raises(ValueError, match="scale=None"):
        fp8mix.quantize(x, granularity="mx", scale=2.0)
    with pytest.raises(ValueError, match="margin"):
        fp8mix.quantize(x, granularity="mx", margin=200)
    with pytest.raises(ValueError, match="granularity"):
        fp8mix.cast_transpose(x, granularity="mx")


def test_transposed_quantisation_is_a_second_quantisation():
    """ops.quantize_mx(transpose=True): qt and its scales equal the quantisation of x^T
    (not the bytes of q transposed), stochastic rounding included."""
    x = _data(rows=70, cols=45)
    for kw in ({}, {"stochastic": True, "seed": 7, "offset": 12}):
        q, s, qt, st, _ = fp8mix.ops.quantize_mx(x, torch.float8_e4m3fn, transpose=True, **kw)
        q2, s2, _, _, _ = fp8mix.ops.quantize_mx(x.t().contiguous(), torch.float8_e4m3fn, **kw)
        assert _same(qt, q2) and torch.equal(st, s2), kw
        assert st.shape == (45, 3)
    qr, sr = ref_mx(x.t().contiguous(), Format.E4M3, "rceil")
    q, s, qt, st, _ = fp8mix.ops.quantize_mx(x, torch.float8_e4m3fn, transpose=True)
    assert _same(qt, qr) and torch.equal(st, sr)
    assert not _same(qt, q.t().contiguous())  # blocks along the other dimension: other bytes


def test_mx_scaled_mm_against_float64():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(20, 100, generator=g) * torch.logspace(-3, 3, 100)  # K blocks of unlike magnitude
    w = torch.randn(24, 100, generator=g)
    bias = torch.randn(24, generator=g)
    a8 = fp8mix.quantize(a, Format.E4M3, granularity="mx")
    w8 = fp8mix.quantize(w, Format.E5M2, granularity="mx")
    y = fp8mix.scaled_mm(a8, w8, bias=bias)
    want = fp8mix.dequantize(a8).double() @ fp8mix.dequantize(w8).double().t() + bias.double()
    mag = fp8mix.dequantize(a8).double().abs() @ fp8mix.dequantize(w8).double().abs().t() + bias.double().abs()
    assert ((y.double() - want).abs() <= 102 * 2.0 ** -24 * mag).all()
    with pytest.raises(ValueError, match="both operands"):
        fp8mix.scaled_mm(a8, fp8mix.quantize(w, Format.E4M3))
    yb = fp8mix.scaled_mm(a8, w8, bias=bias, out_dtype=torch.bfloat16)
    assert torch.equal(yb, y.bfloat16())  # one rounding of the same float32 value (bias added before it)


def _canonical_mx_mm(a8, w8, bias):
    """The MX GEMM's documented float32 order, written with torch's float32 ops: per 32-deep
    K block a partial sum started at +0 that adds the exact products in pairs (k+1, then k),
    each add rounded; acc = acc + part * (sa * sb); then + bias."""
    a = a8.data.float()  # FP8 -> float32 is exact
    b = w8.data.float()
    sa, sb = a8.scale_inv.float(), w8.scale_inv.float()
    M, K = a.shape
    acc = torch.zeros(M, b.shape[0])
    for kb in range(0, K, 32):
        part = torch.zeros_like(acc)
        for p in range(kb, min(kb + 32, K), 2):
            if p + 1 < min(kb + 32, K):
                part = part + a[:, p + 1, None] * b[None, :, p + 1]
            part = part + a[:, p, None] * b[None, :, p]
        acc = acc + part * (sa[:, kb // 32, None] * sb[None, :, kb // 32])
    return acc + bias


@pytest.mark.parametrize("shape", [(20, 24, 100), (37, 70, 600), (15, 33, 1030)])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("spread", [3, 20])
def test_mx_scaled_mm_canonical_order_bit_exact(shape, threads, spread):
    """The blocked MX GEMM (every tile, K step and thread count) gives the bytes of the
    documented order, computed here with torch's own float32 arithmetic. spread 3: every
    block scale within [2^-45, 2^45], where the CPU GEMM packs the operands times their
    scales (fp8mix_gemm_ukernel's fn_mx_scaled); spread 20: blocks of 1e-20 .. 1e20 put
    scales outside it, where it takes the per-block scale step."""
    M, N, K = shape
    g = torch.Generator().manual_seed(M + K)
    a = torch.randn(M, K, generator=g) * torch.logspace(-spread, spread, K)
    w = torch.randn(N, K, generator=g)
    bias = torch.randn(N, generator=g)
    a8 = fp8mix.quantize(a, Format.E4M3, granularity="mx")
    w8 = fp8mix.quantize(w, Format.E5M2, granularity="mx")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = fp8mix.scaled_mm(a8, w8, bias=bias)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(y.view(torch.int32), _canonical_mx_mm(a8, w8, bias).view(torch.int32))
