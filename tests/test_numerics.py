"""fp8mix.numerics.quant_stats against counts, sums, moments and a histogram computed
independently with float64 torch ops; the field list against the op; every CPU kernel
variant bit-identical through the op; thread counts; bad scales; opcheck."""
import math

import pytest
import torch
from fp8_reference import FMAX, MIN_NORMAL, OVF, expand_scale_inv

import fp8mix
from fp8mix import numerics, ops
from fp8mix.numerics import FIELDS, HIST_BINS, HIST_MIN_LOG2, quant_stats


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
    v = x2[fin]
    c = v - v.mean()
    binade = torch.floor(torch.log2(x2.abs()[fin & nz] / si[fin & nz])) - HIST_MIN_LOG2
    return {
        "numel": x2.numel(),
        "nonzero": int(nz.sum()),
        "underflow": int((fin & nz & (d == 0)).sum()),
        "saturated": int((fin & (d.abs() == FMAX[fmt])).sum()),
        "nonfinite": int((~fin).sum()),
        "nan": int(torch.isnan(x2).sum()),
        "overflow": int((fin & (x2.abs() > OVF[fmt] * si)).sum()),
        "subnormal": int((fin & (d != 0) & (d.abs() < MIN_NORMAL[fmt])).sum()),
        "signal": float((xf * xf).sum()),
        "noise": float((err * err).sum()),
        "min_nonzero": float(mags.min()) if mags.numel() else math.inf,
        "max_finite": float(v.abs().max()) if v.numel() else 0.0,
        "mean": float(v.mean()),
        "variance": float((c * c).mean()),
        "kurtosis": float((c ** 4).mean() / (c ** 2).mean() ** 2),
        "hist": tuple(torch.bincount(binade.clamp(0, HIST_BINS - 1).long(), minlength=HIST_BINS).tolist()),
        "scale_inv_min": float(t.scale_inv.double().min()),
        "scale_inv_max": float(t.scale_inv.double().max()),
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
    for k in ("numel", "nonzero", "underflow", "saturated", "nonfinite", "nan", "overflow", "subnormal",
              "min_nonzero", "max_finite", "hist", "scale_inv_min", "scale_inv_max"):
        assert got[k] == (list(ref[k]) if k == "hist" else ref[k]), k
    for k in ("signal", "noise", "mean", "variance", "kurtosis"):
        assert got[k] == pytest.approx(ref[k], rel=1e-9), k
    assert got["bad_scales"] == 0 and got["amax"] != got["amax"]  # NaN present: amax is NaN
    assert got["log2_range"] == pytest.approx(math.log2(ref["max_finite"] / ref["min_nonzero"]), rel=1e-12)
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
    with pytest.raises(TypeError, match="t must be a Float8Tensor"):
        quant_stats(x, t.data)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16|dtype"):
        quant_stats(x.double(), t)
    bad = fp8mix.Float8Tensor(t.data, torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="finite"):
        quant_stats(x, bad)


def test_fields_name_the_op_output():
    x = torch.randn(3, 5)
    t = fp8mix.quantize(x)
    out = ops.quant_stats(x, t.data, t.scale_inv, 0)
    assert out.dtype == torch.float64 and out.numel() == len(FIELDS) + HIST_BINS == ops.QUANT_STATS_N
    assert numerics.STATS_N == ops.QUANT_STATS_N and len(set(FIELDS)) == len(FIELDS)
    s = numerics.stats_from_counts(out)
    assert s.numel == 15 and s.nonzero == 15 and s.pivot == float(x[0, 0]) and sum(s.hist) == 15
    with pytest.raises(ValueError, match="84"):
        numerics.stats_from_list([0.0] * 10)


def _isas():
    order = ["scalar", "avx2", "avx512", "avx512bf16"]
    best = ops.cpu_isa()
    return order[: order.index(best) + 1]


def test_every_kernel_variant_gives_the_same_bits():
    torch.manual_seed(4)
    x = (torch.randn(130, 333) * torch.exp2(torch.randint(-30, 10, (130, 333)).float()))
    x.view(-1)[::71] = float("nan")
    x.view(-1)[5::97] = -float("inf")
    for dtype, gran in ((torch.float32, "block"), (torch.bfloat16, "tensor"), (torch.float16, "block2d")):
        xs = x.to(dtype)
        t = fp8mix.quantize(torch.nan_to_num(xs, nan=0.0, posinf=0.0, neginf=0.0), "E5M2", granularity=gran)
        was = ops.cpu_isa()
        outs = {}
        try:
            for isa in _isas():
                ops.set_max_isa(isa)
                assert ops.cpu_isa() == isa
                outs[isa] = ops.quant_stats(xs, t.data, t.scale_inv, fp8mix.formats.GRANULARITIES[gran])
        finally:
            ops.set_max_isa(was)
        for isa, out in outs.items():
            assert torch.equal(out, outs["scalar"]), (isa, dtype)
    assert len(outs) >= 2 or ops.cpu_isa() == "scalar"  # a SIMD variant was compared where there is one


def test_moments_for_any_mean():
    # a mean 10^4 standard deviations away: raw power sums would cancel to noise, the pivot keeps them exact
    g = torch.Generator().manual_seed(7)
    for mean, std in ((0.0, 1.0), (1e4, 1.0), (-3e5, 0.5), (1.0, 1e-3)):
        x = (mean + std * torch.randn(256, 512, generator=g)).float()
        t = fp8mix.quantize(x, "E4M3")
        s = quant_stats(x, t)
        v = x.double()
        c = v - v.mean()
        assert s.mean == pytest.approx(float(v.mean()), rel=1e-12, abs=1e-12)
        assert s.variance == pytest.approx(float((c * c).mean()), rel=1e-9)
        assert s.kurtosis == pytest.approx(float((c ** 4).mean() / (c * c).mean() ** 2), rel=1e-9)
    const = torch.full((4, 64), 3.5)
    s = quant_stats(const, fp8mix.quantize(const))
    assert s.variance == 0 and math.isnan(s.kurtosis) and s.mean == 3.5


def test_bad_scales_counted_when_asked():
    x = torch.randn(4, 300)
    t = fp8mix.quantize(x, granularity="block")
    sinv = t.scale_inv.clone()
    sinv[1, 2], sinv[3, 0] = float("nan"), -1.0
    with pytest.raises(ValueError, match="finite"):
        ops.quant_stats(x, t.data, sinv, 2)
    s = numerics.stats_from_counts(ops.quant_stats(x, t.data, sinv, 2, bad_scale_as_one=True))
    good = torch.cat([t.scale_inv[0], t.scale_inv[1, :2], t.scale_inv[2], t.scale_inv[3, 1:]])
    assert s.bad_scales == 2 and math.isnan(s.sqnr_db) and s.numel == 1200
    assert s.scale_inv_min == float(good.min()) and s.scale_inv_max == float(good.max())


def test_opcheck():
    # test_schema is left out: it fails inside torch on FP8 inputs (tests/test_cast.py documents why)
    x = torch.randn(70, 200)
    for gran in ("tensor", "row", "block", "block2d"):
        t = fp8mix.quantize(x, "E4M3", granularity=gran)
        torch.library.opcheck(torch.ops.fp8mix.quant_stats.default,
                              (x, t.data, t.scale_inv, fp8mix.formats.GRANULARITIES[gran]),
                              {"bad_scale_as_one": gran == "row"},
                              test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"))
