"""fp8mix.nvfp4 (NVFP4 on the CPU) against references nobody here wrote: ml_dtypes' E2M1
and E4M3 casts (round to nearest even), numpy's float32 arithmetic for Transformer Engine's
scale formulas, float64 matrix products for the GEMM and the Hadamard transform."""
import ml_dtypes
import numpy as np
import pytest
import torch

import fp8mix
from fp8mix import nvfp4

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn


def _unpack(codes: torch.Tensor) -> np.ndarray:
    b = codes.numpy()
    out = np.empty((b.shape[0], b.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = b & 0xF, b >> 4
    return out


def _reference(x: np.ndarray, tile: int = 1):
    """TE's NVFP4 arithmetic in numpy float32, with ml_dtypes doing every rounding."""
    x = x.astype(np.float32)
    gam = np.float32(np.abs(x).max())
    s_enc = np.float32(2688.0) / gam if gam > 0 else np.float32(1)
    s_dec = np.float32(1) / s_enc
    rows, cols = x.shape
    blocks = np.abs(x).reshape(rows, cols // 16, 16).max(axis=2)
    if tile == 16:
        pad = -rows % 16
        bt = np.pad(blocks, ((0, pad), (0, 0))).reshape(-1, 16, cols // 16).max(axis=1)
        blocks = np.repeat(bt, 16, axis=0)[:rows]
    t = s_enc * np.float32(np.float32(1) / np.float32(6))
    d = (blocks * t).astype(np.float32)
    d8 = np.minimum(d, np.float32(448)).astype(F8)  # saturating, as the recipe's satfinite cast
    den = d8.astype(np.float32) * s_dec
    with np.errstate(divide="ignore"):
        enc = np.minimum(np.float32(1) / den, np.float32(np.finfo(np.float32).max)).astype(np.float32)
    y = (x * np.repeat(enc, 16, axis=1)).astype(np.float32)
    codes = np.clip(y, -6, 6).astype(F4).view(np.uint8)
    return codes, d8.view(np.uint8), s_dec


@pytest.mark.parametrize("shape,tile,spread", [((8, 64), 1, 4), ((37, 160), 1, 20), ((40, 48), 16, 8),
                                               ((1, 16), 16, 2)])
def test_quantize_matches_ml_dtypes(shape, tile, spread):
    g = torch.Generator().manual_seed(sum(shape) + tile)
    x = (torch.randn(shape, generator=g) * torch.exp2(torch.randint(-spread, spread + 1, shape, generator=g)))
    t = nvfp4.quantize(x, tile_2d=tile == 16)
    codes, d8, s_dec = _reference(x.numpy(), tile)
    assert t.codes.dtype == torch.uint8 and t.codes.shape == (shape[0], shape[1] // 2)
    assert t.block_scale.dtype == torch.float8_e4m3fn and t.block_scale.shape == (shape[0], shape[1] // 16)
    np.testing.assert_array_equal(_unpack(t.codes), codes)
    np.testing.assert_array_equal(t.block_scale.view(torch.uint8).numpy(), d8)
    assert t.scale_inv.item() == s_dec
    # decoding: E2M1 value * E4M3 scale * S_dec, from ml_dtypes' decoders
    want = (codes.view(F4).astype(np.float32) * np.repeat(d8.view(F8).astype(np.float32), 16, axis=1)
            ).astype(np.float32) * s_dec
    np.testing.assert_array_equal(t.dequantize().numpy(), want.astype(np.float32))


def test_dequantised_error_and_dtypes():
    x = torch.randn(64, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    t = nvfp4.quantize(x)
    y = t.dequantize()
    assert y.dtype == torch.bfloat16 and y.shape == x.shape
    same = nvfp4.quantize(x.float())
    assert torch.equal(t.codes, same.codes) and torch.equal(t.block_scale.view(torch.uint8),
                                                            same.block_scale.view(torch.uint8))
    # per block, the error is at most half the E2M1 spacing at the top (2 / 2) plus what the E4M3
    # rounding of the block scale lets saturate (6 / 16), in units of the block's scale, plus
    # the bf16 rounding of the output
    scale = (t.block_scale.float() * t.scale_inv).repeat_interleave(16, dim=1)
    err = (y.float() - x.float()).abs()
    assert (err <= scale * (1.0 + 6 / 16) + y.float().abs() * 2 ** -8).all()
    assert err.max() > 0.25 * scale.max()  # (and the bound is not vacuous: FP4 loses that much)


def test_stochastic_rounding_is_unbiased_and_deterministic():
    x = torch.full((256, 64), 0.37)
    x[:, 0] = 6.0  # fixes each block's scale
    a = nvfp4.quantize(x, stochastic=True, seed=3)
    b = nvfp4.quantize(x, stochastic=True, seed=3)
    c = nvfp4.quantize(x, stochastic=True, seed=4)
    assert torch.equal(a.codes, b.codes) and not torch.equal(a.codes, c.codes)
    mean = a.dequantize()[:, 1:16].mean().item()
    assert abs(mean - 0.37) < 0.01, mean
    # nearest rounding of the same value is biased: every element goes one way
    rn = nvfp4.quantize(x).dequantize()[:, 1:16]
    assert rn.unique().numel() == 1 and abs(rn[0, 0].item() - 0.37) > 0.05


def test_thread_count_does_not_change_bytes():
    x = torch.randn(300, 512)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = nvfp4.quantize(x, stochastic=True, seed=1)
        ma = nvfp4.mm(a, a)
        torch.set_num_threads(2)
        b = nvfp4.quantize(x, stochastic=True, seed=1)
        mb = nvfp4.mm(b, b)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(a.codes, b.codes) and torch.equal(ma, mb)


def test_mm_against_float64():
    g = torch.Generator().manual_seed(0)
    a = nvfp4.quantize(torch.randn(3, 5, 96, generator=g))
    b = nvfp4.quantize(torch.randn(24, 96, generator=g), tile_2d=True)
    c = nvfp4.mm(a, b)
    assert c.shape == (3, 5, 24) and c.dtype == torch.float32
    ref = a.dequantize(torch.float64).reshape(15, 96) @ b.dequantize(torch.float64).T
    mag = a.dequantize(torch.float64).reshape(15, 96).abs() @ b.dequantize(torch.float64).abs().T
    err = (c.reshape(15, 24).double() - ref).abs()
    assert (err <= 16 * 2 ** -23 * mag + 1e-30).all(), err.max()
    # and close to the float32 product of the originals (FP4 error, not a wrong product)
    assert torch.corrcoef(torch.stack([c.flatten(), ref.float().flatten()]))[0, 1] > 0.999


def test_non_finite_blocks_decode_to_nan():
    x = torch.ones(2, 32)
    x[0, 3] = float("inf")
    x[1, 20] = float("nan")
    t = nvfp4.quantize(x, global_amax=torch.tensor(1.0))
    y = t.dequantize()
    assert y[0, :16].isnan().all() and y[1, 16:].isnan().all()
    assert torch.equal(y[0, 16:], torch.ones(16)) and torch.equal(y[1, :16], torch.ones(16))


def _hadamard16() -> np.ndarray:
    h = np.array([[1.0]])
    for _ in range(4):
        h = np.block([[h, h], [h, -h]])
    return h


def test_random_hadamard_against_float64():
    x = torch.randn(7, 48)
    signs = 0x5A3C
    y = nvfp4.random_hadamard(x, signs=signs)
    d = np.array([-1.0 if (signs >> c) & 1 else 1.0 for c in range(16)])
    m = _hadamard16() * d[None, :] / 4.0  # y_g = (H D / 4) x_g
    ref = np.einsum("rc,igc->igr", m, x.double().numpy().reshape(7, 3, 16)).reshape(7, 48)
    np.testing.assert_allclose(y.double().numpy(), ref, rtol=0, atol=16 * 2 ** -23 * np.abs(x.numpy()).max())
    assert np.allclose(m @ m.T, np.eye(16))  # orthogonal: products kept
    z = torch.randn(5, 48)
    lhs = nvfp4.random_hadamard(x, signs=signs) @ nvfp4.random_hadamard(z, signs=signs).T
    torch.testing.assert_close(lhs, x @ z.T, rtol=1e-5, atol=1e-5)


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="multiple of 16"):
        nvfp4.quantize(torch.randn(4, 24))
    with pytest.raises(ValueError, match="global_amax must be >= 0"):
        nvfp4.quantize(torch.randn(4, 16), global_amax=torch.tensor(-1.0))
    with pytest.raises(TypeError, match="must be a tensor"):
        nvfp4.quantize([1.0] * 16)
    with pytest.raises(TypeError, match="float32"):
        nvfp4.random_hadamard(torch.randn(2, 16, dtype=torch.float64), signs=1)
    with pytest.raises(ValueError, match="16-bit mask"):
        nvfp4.random_hadamard(torch.randn(2, 16), signs=1 << 16)
    a = nvfp4.quantize(torch.randn(4, 32))
    with pytest.raises(ValueError, match="same K"):
        nvfp4.mm(a, nvfp4.quantize(torch.randn(4, 48)))
    with pytest.raises(ValueError, match="scale_inv must be finite"):
        fp8mix.ops.dequantize_nvfp4(a.codes, a.block_scale, torch.tensor(0.0))


def test_fake_shapes_under_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(6, 64)
        q, s, sinv = fp8mix.ops.quantize_nvfp4(x, torch.empty(()))
        assert q.shape == (6, 32) and s.shape == (6, 4) and s.dtype == torch.float8_e4m3fn and sinv.shape == ()
        assert fp8mix.ops.nvfp4_mm(q, s, sinv, q, s, sinv).shape == (6, 6)
