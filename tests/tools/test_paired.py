"""The demo's paired statistics (fp8mix.tools.demo.paired) against references written here:
printed Student t tables, the t density integrated with Simpson's rule (math.lgamma for
its constant), and float64 sums over the per-seed differences.
"""
from __future__ import annotations

import math
import statistics

import pytest

from fp8mix.tools.demo import paired

# Student t quantiles from the standard printed tables (3 decimals): df -> t
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        15: 2.131, 20: 2.086, 30: 2.042, 60: 2.000, 120: 1.980}
T80 = {1: 1.376, 2: 1.061, 3: 0.978, 4: 0.941, 5: 0.920, 6: 0.906, 7: 0.896, 8: 0.889, 9: 0.883, 10: 0.879,
       20: 0.860, 30: 0.854, 60: 0.848, 120: 0.845}
T995 = {1: 63.657, 2: 9.925, 5: 4.032, 10: 3.169}


def _t_cdf_simpson(t: float, df: int, n: int = 4000) -> float:
    """P(T <= t): 1/2 plus the t density integrated from 0 to t (Simpson, n intervals)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def f(x):
        return c * (1.0 + x * x / df) ** (-(df + 1) / 2)
    h = t / n
    s = f(0.0) + f(t) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, n))
    return 0.5 + s * h / 3.0


@pytest.mark.parametrize("p,table", [(0.975, T975), (0.80, T80), (0.995, T995)])
def test_t_quantiles_match_the_printed_tables(p, table):
    for df, t in table.items():
        assert paired.t_quantile(p, df) == pytest.approx(t, abs=6e-4), (p, df)
        assert paired.t_quantile(1.0 - p, df) == pytest.approx(-t, abs=6e-4)


@pytest.mark.parametrize("df", [1, 2, 3, 7, 29])
def test_t_cdf_matches_integrated_density(df):
    for t in (0.1, 0.7, 1.5, 3.0, 8.0):
        ref = _t_cdf_simpson(t, df)
        assert paired.t_cdf(t, df) == pytest.approx(ref, abs=1e-9), (df, t)
        assert paired.t_cdf(-t, df) == pytest.approx(1.0 - ref, abs=1e-9)


def test_t_quantile_rejects_bad_arguments():
    for p in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="p must be in"):
            paired.t_quantile(p, 3)
    with pytest.raises(ValueError, match="df must be > 0"):
        paired.t_cdf(1.0, 0)


def _expected(ref, other):
    d = [100.0 * (o - r) / r for r, o in zip(ref, other)]
    n = len(d)
    mean = math.fsum(d) / n
    sd = statistics.stdev(d)
    return d, mean, sd, T975[n - 1] * sd / math.sqrt(n)


def test_paired_gap_mean_interval_and_verdicts():
    ref = [2.00, 2.10, 1.95, 2.05, 2.02]
    worse = [r * (1.0 + x) for r, x in zip(ref, (0.010, 0.012, 0.009, 0.011, 0.010))]  # ~ +1.0%
    g = paired.paired_gap("fp8", ref, worse)
    d, mean, sd, half = _expected(ref, worse)
    assert g.n == 5 and g.excluded == 0
    assert list(g.diffs) == pytest.approx(d, rel=1e-12)
    assert g.mean == pytest.approx(mean, rel=1e-12) and g.sd == pytest.approx(sd, rel=1e-12)
    assert g.half95 == pytest.approx(half, rel=2e-4)  # the table has 3 decimals
    assert mean - half > 0 and g.verdict == f"worse by {mean:.2f} +- {g.half95:.2f} %"
    better = [r * (1.0 - x) for r, x in zip(ref, (0.010, 0.012, 0.009, 0.011, 0.010))]
    assert paired.paired_gap("fp8", ref, better).verdict.startswith("better by 1.0")
    noisy = [r * (1.0 + x) for r, x in zip(ref, (0.010, -0.012, 0.004, -0.006, 0.001))]
    gn = paired.paired_gap("fp8", ref, noisy)
    _, mean_n, _, half_n = _expected(ref, noisy)
    assert mean_n - half_n < 0 < mean_n + half_n
    assert gn.verdict.startswith("within noise at this size")


def test_paired_gap_leaves_out_diverged_seeds_and_handles_one_seed():
    g = paired.paired_gap("bf16", [2.0, 2.1, 2.2], [2.02, float("nan"), None])
    assert g.n == 1 and g.excluded == 2
    assert g.mean == pytest.approx(1.0) and math.isnan(g.half95) and g.seeds_for_target is None
    assert "1 seed: no interval" in g.verdict
    assert paired.paired_gap("bf16", [2.0], [float("inf")]).verdict.startswith("no seed")
    with pytest.raises(ValueError, match="3 reference losses but 2"):
        paired.paired_gap("bf16", [1.0, 2.0, 3.0], [1.0, 2.0])


def _power_sum(m: int) -> float:
    return T975[m - 1] + T80[m - 1]


@pytest.mark.parametrize("sd", [0.05, 0.1, 0.15, 0.2, 0.25])
def test_seeds_needed_is_the_smallest_sufficient_count(sd):
    """The defining inequality, with the printed tables: m seeds suffice, m - 1 do not."""
    m = paired.seeds_needed(sd, 0.25)
    assert m is not None and 2 <= m <= 11
    assert _power_sum(m) * sd / math.sqrt(m) <= 0.25 * (1 + 1e-3)
    if m > 2:
        assert _power_sum(m - 1) * sd / math.sqrt(m - 1) > 0.25 * (1 - 1e-3)


def test_seeds_needed_for_a_wide_spread_follows_the_normal_approximation():
    # n ~ ((z_0.975 + z_0.80) sd / target)^2 + z_0.975^2 / 2 for large n (the t correction)
    z = 1.959963984540054 + 0.8416212335729143
    for sd in (1.0, 2.5):
        est = (z * sd / 0.25) ** 2
        m = paired.seeds_needed(sd, 0.25)
        assert est <= m <= est + 4, (sd, m, est)
    assert paired.seeds_needed(0.0) == 2
    assert paired.seeds_needed(1e6) is None  # more than MAX_SEEDS
    assert paired.seeds_needed(float("nan")) is None
