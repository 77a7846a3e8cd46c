"""inspect's format advice is Format.AUTO's rule, checked on tensors whose answer follows
from float64 reasoning about the formats (not from fp8mix itself):

* a narrow Gaussian fits E4M3's ~17.8 binades: with the scale taken from the amax, the
  values that flush to zero are those below amax / 448 * 2^-10 (half E4M3's smallest
  subnormal), a fraction erf(thr / sqrt 2) far below AutoFormat's 1% tolerance, so the
  precision rule decides, and E4M3's extra mantissa bit wins: E4M3;
* magnitudes log-uniform over 2^-30..2^0 exceed E4M3's range: the values below
  2^(-log2 448 - 10) flush, (30 - 18.807) / 30 = 37.3% of them, while E5M2 (threshold
  2^(-log2 57344 - 17) = 2^-32.8) loses none: E5M2.
"""
from __future__ import annotations

import math

import torch

import fp8mix
from fp8mix.tools import inspect as fp8inspect

N = 256 * 256


def _tol(p: float) -> float:
    """Four binomial standard deviations of a fraction p over N samples, plus two counts."""
    return 4.0 * math.sqrt(p * (1.0 - p) / N) + 2.0 / N


def _stats(x):
    return {f.name: fp8inspect.cast_stats(x, f) for f in (fp8mix.Format.E4M3, fp8mix.Format.E5M2)}


def test_narrow_gaussian_gets_e4m3():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 256, generator=g, dtype=torch.float64)
    amax = float(x.abs().max())
    thr = amax / 448.0 * 2.0 ** -10
    expected_flush = math.erf(thr / math.sqrt(2.0))  # P(|N(0,1)| < thr), float64
    assert expected_flush < 1e-4
    x = x.float()
    st = _stats(x)
    assert st["E4M3"].underflow_frac <= expected_flush + _tol(expected_flush)
    assert st["E4M3"].overflow_frac == 0.0  # the scale comes from the amax
    fmt, reason = fp8inspect.recommend(st)
    assert fmt == "E4M3" and reason.startswith("precision")
    # E4M3 keeps 3 mantissa bits, E5M2 2: about 6 dB more SQNR for values inside the range
    assert st["E4M3"].sqnr_db - st["E5M2"].sqnr_db > 5.0


def test_thirty_binades_get_e5m2():
    g = torch.Generator().manual_seed(1)
    u = torch.rand(256, 256, generator=g, dtype=torch.float64) * -30.0
    sign = torch.where(torch.rand(256, 256, generator=g) < 0.5, -1.0, 1.0).double()
    x = sign * torch.exp2(u)
    x.view(-1)[0] = 1.0  # the amax is exactly 2^0
    log2_thr4 = -math.log2(448.0) - 10.0
    log2_thr5 = -math.log2(57344.0) - 17.0
    assert log2_thr5 < -30.0 < log2_thr4
    expected4 = (log2_thr4 + 30.0) / 30.0  # fraction of u below E4M3's flush threshold
    st = _stats(x.float())
    assert abs(st["E4M3"].underflow_frac - expected4) < _tol(expected4), (st["E4M3"].underflow_frac, expected4)
    assert st["E5M2"].underflow_frac == 0.0
    fmt, reason = fp8inspect.recommend(st)
    assert fmt == "E5M2" and reason.startswith("range")


def test_gradient_role_is_not_forced_to_e5m2():
    """The old advice hard-coded E5M2 for grad_output; the rule now decides from the data,
    as Format.AUTO does: a Gaussian gradient gets E4M3."""
    g = torch.Generator().manual_seed(2)
    dy = torch.randn(64, 128, generator=g) * 1e-4
    rep = fp8inspect._role_report("grad_output", dy, None, None)
    assert rep["recommended"] == "E4M3"
    assert rep["formats"]["E4M3"]["underflow_pct"] < 1.0
