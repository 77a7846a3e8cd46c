"""fp8mix.numerics.quant_stats against counts computed independently with torch ops."""
import math

import pytest
import torch

import fp8mix
from fp8mix.numerics import quant_stats
from fp8_reference import FMAX, MIN_NORMAL, OVF, expand_scale_inv


def _reference(x, t, fmt):
    x2 = x.reshape(-1, x.shape[-1]).double()
    d = t.data.reshape(x2.shape).double()
    si = expand_scale_inv(t.scale_inv, x2.shape[0], x2.shape[1], t.granularity)
    fin = torch.isfinite(x2)
    dfin = torch.isfinite(d)
    nz = x2 != 0
    xf = torch.where(fin, x2, 0.0)
    err = torch.where(fin & dfin, xf - torch.where(dfin, d, 0.0) * si, 0.0)
    mags = x2.abs()[fin & nz]
    return {
        "numel": x2.numel(),
        "nonzero": int(nz.sum()),
        "underflow": int((fin & nz & (d == 0)).sum()),
        "saturated": int((fin & (d.abs() == FMAX[fmt])).sum()),
        "nonfinite": int((~fin).sum()),
        "overflow": int((fin & (x2.abs() > OVF[fmt] * si)).sum()),
        "subnormal": int((fin & (d != 0) & (d.abs() < MIN_NORMAL[fmt])).sum()),
        "signal": float((xf * xf).sum()),
        "noise": float((err * err).sum()),
        "min_nonzero": float(mags.min()) if mags.numel() else math.inf,
    }


def _data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 4, shape, generator=g).float())
    x[torch.rand(shape, generator=g) < 0.05] = 0.0
    flat = x.view(-1)
    flat[:: 97] = float("inf")
    flat[5:: 131] = float("nan")
    flat[7:: 59] *= 1e4  # some values beyond a delayed scale
    return x.to(dtype)


@pytest.mark.parametrize("fmt", ["E4M3", "E5M2"])
@pytest.mark.parametrize("gran", ["tensor", "row", "block", "block2d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_counts_match_torch(fmt, gran, dtype):
    x = _data((150, 300), dtype, seed=hash((fmt, gran)) % 1000)
    finite = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    t = fp8mix.quantize(finite, fmt, granularity=gran)
    if gran == "tensor":  # a scale too large: some values overflow, others underflow
        t = fp8mix.quantize(x, fmt, scale=torch.tensor(8.0 * FMAX[fmt]) / finite.abs().amax().float())
    got = quant_stats(x, t).as_dict()
    ref = _reference(x, t, fmt)
    for k in ("numel", "nonzero", "underflow", "saturated", "nonfinite", "overflow", "subnormal", "min_nonzero"):
        assert got[k] == ref[k], k
    for k in ("signal", "noise"):
        assert got[k] == pytest.approx(ref[k], rel=1e-9), k
    if gran == "tensor":
        assert got["overflow"] > 0 and got["underflow"] > 0 and got["subnormal"] > 0


def test_gaussian_sqnr_matches_the_formats():
    x = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    e4 = quant_stats(x, fp8mix.quantize(x, "E4M3")).sqnr_db
    e5 = quant_stats(x, fp8mix.quantize(x, "E5M2")).sqnr_db
    assert 30.5 < e4 < 32.5 and 24.5 < e5 < 26.5  # ~ 6 dB per mantissa bit apart


def test_spike_saturates_a_fifth():
    x = torch.randn(512, 512, generator=torch.Generator().manual_seed(1))
    lagging = torch.tensor(448.0) / (x.abs().amax() / 4)  # delayed scale from an amax 4x too small
    s = quant_stats(x, fp8mix.quantize(x, "E4M3", scale=lagging))
    assert 0.15 < s.overflow_frac < 0.28 and s.saturation_frac >= s.overflow_frac


def test_same_for_every_thread_count():
    x = torch.randn(1500, 700, generator=torch.Generator().manual_seed(2))
    t = fp8mix.quantize(x, "E5M2", granularity="block")
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = quant_stats(x, t)
        torch.set_num_threads(max(2, n))
        many = quant_stats(x, t)
    finally:
        torch.set_num_threads(n)
    assert one == many


def test_empty_and_bad_input():
    e = torch.empty(0, 4)
    s = quant_stats(e, fp8mix.quantize(e))
    assert s.numel == 0 and s.min_nonzero == math.inf and math.isnan(s.sqnr_db)
    x = torch.randn(4, 4)
    t = fp8mix.quantize(x)
    with pytest.raises(ValueError, match="shape"):
        quant_stats(x[:2], t)
    with pytest.raises(TypeError):
        quant_stats(x, t.data)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16|dtype"):
        quant_stats(x.double(), t)
    bad = fp8mix.Float8Tensor(t.data, torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="finite"):
        quant_stats(x, bad)
