"""Is a variant as good as float32? Paired differences over seeds, in plain float64 math.

Each seed trains every variant from the same initial weights and batches, so the
per-seed difference of validation losses cancels most of what the seed changes. With
``d_i = 100 (L_variant,i - L_fp32,i) / L_fp32,i`` (percent) over n seeds:

* gap = mean(d), spread s = sample standard deviation (n - 1 in the denominator);
* 95% interval: gap +- t(0.975, n-1) s / sqrt(n) (Student t, two-sided);
* verdict: "within noise at this size" when the interval holds 0, else "worse by" /
  "better by" the gap;
* seeds to resolve a gap of ``target`` percent: the smallest m >= 2 with
  (t(0.975, m-1) + t(0.80, m-1)) s / sqrt(m) <= target, the paired t-test's sample size
  for a two-sided 5% test with 80% power, at the measured spread s.

The number of steps is not predicted: a longer run changes the gap itself (the variants
may converge or drift apart), not only its noise, so no rule from one run length holds.

Student t quantiles come from the regularised incomplete beta function (continued
fraction, Numerical Recipes' ``betacf``), inverted by bisection; no scipy needed.
"""
from __future__ import annotations

import dataclasses
import math

__all__ = ["t_cdf", "t_quantile", "Gap", "paired_gap", "seeds_needed", "TARGET_PCT"]

TARGET_PCT = 0.25  # the gap (percent of the float32 loss) the report says how to resolve
MAX_SEEDS = 100_000


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b) for 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: df must be > 0, got {df}")
    tail = 0.5 * _betainc(0.5 * df, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1), by bisection on t_cdf."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile: p must be in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def seeds_needed(sd: float, target: float = TARGET_PCT) -> int | None:
    """Seeds for a two-sided 5% paired t-test with 80% power to detect a gap of `target`
    at spread `sd` (both in percent); None when more than MAX_SEEDS would be needed."""
    if not (math.isfinite(sd) and sd >= 0 and target > 0):
        return None
    if sd == 0:
        return 2
    m = 2
    while m <= MAX_SEEDS:
        if (t_quantile(0.975, m - 1) + t_quantile(0.80, m - 1)) * sd / math.sqrt(m) <= target:
            return m
        # below the answer, jump close to the normal-approximation estimate (never past it)
        est = int(((1.959963984540054 + 0.8416212335729143) * sd / target) ** 2)
        m = max(m + 1, min(est, MAX_SEEDS + 1))
    return None


@dataclasses.dataclass(frozen=True)
class Gap:
    """Paired gap of one variant to float32 over seeds (percent of the float32 loss)."""

    variant: str
    diffs: tuple  # d_i per seed, percent
    mean: float
    sd: float  # nan for fewer than 2 seeds
    half95: float  # half-width of the 95% interval; nan for fewer than 2 seeds
    seeds_for_target: int | None
    excluded: int  # seeds where this variant or float32 diverged

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def verdict(self) -> str:
        """A plain sentence: within noise, worse by, better by."""
        if self.n == 0:
            return "no seed with finite losses of both runs"
        if self.n == 1:
            return f"{self.mean:+.2f} % from 1 seed: no interval (--seeds 3 or more gives one)"
        if self.mean - self.half95 <= 0.0 <= self.mean + self.half95:
            return f"within noise at this size ({self.mean:+.2f} +- {self.half95:.2f} %)"
        word = "worse" if self.mean > 0 else "better"
        return f"{word} by {abs(self.mean):.2f} +- {self.half95:.2f} %"

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(n=self.n, verdict=self.verdict, target_pct=TARGET_PCT, diffs=list(self.diffs))
        return d


def paired_gap(variant: str, ref: list, other: list) -> Gap:
    """Gap of `other` to `ref` (validation losses per seed, same order; None or non-finite
    where a run diverged, and such seeds are left out)."""
    if len(ref) != len(other):
        raise ValueError(f"paired_gap: {len(ref)} reference losses but {len(other)} for {variant}")
    pairs = [(r, o) for r, o in zip(ref, other) if _finite(r) and _finite(o) and r > 0]
    d = tuple(100.0 * (o - r) / r for r, o in pairs)
    n = len(d)
    mean = math.fsum(d) / n if n else math.nan
    if n >= 2:
        sd = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / (n - 1))
        half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
        need = seeds_needed(sd)
    else:
        sd, half, need = math.nan, math.nan, None
    return Gap(variant, d, mean, sd, half, need, len(ref) - n)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)
