"""How sure a comparison of seeds is (SPEC §12): spread, pooled noise floor, Welch intervals and verdicts, the
smallest detectable difference, the promotion cut, and where the noise of one configuration comes from.

Everything works on plain final losses (lower is better); a value that is not finite (a diverged seed) makes
its configuration untestable. The t and F distributions are scipy's (``scipy.stats``), imported where they
are used: the workflow plan imports the campaign's ranking, and parsing the Snakefile stays fast.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

ALPHA = 0.05
"""Two-sided level of every interval and verdict (95% intervals)."""
POWER = 0.8
"""Power of the smallest detectable difference."""
Verdict = Literal["better", "worse", "within noise", "untested"]


@dataclass(frozen=True)
class Spread:
    """Mean, sample SD and standard error of one configuration's seeds."""

    n: int
    mean: float | None
    sd: float | None
    """Sample SD (n - 1); None below two seeds."""

    @property
    def se(self) -> float | None:
        return None if self.sd is None else self.sd / math.sqrt(self.n)

    def interval(self, alpha: float = ALPHA) -> tuple[float, float] | None:
        """The t interval of the mean (n - 1 degrees of freedom); None below two seeds."""
        if self.mean is None or self.se is None:
            return None
        from scipy import stats

        half = float(stats.t.ppf(1 - alpha / 2, self.n - 1)) * self.se
        return self.mean - half, self.mean + half

    def as_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "se": self.se}


def _testable(values: Sequence[float]) -> bool:
    return len(values) > 0 and all(math.isfinite(v) for v in values)


def spread(values: Sequence[float]) -> Spread:
    """A configuration's spread; mean and SD None when a seed has no finite value."""
    if not _testable(values):
        return Spread(len(values), None, None)
    sd = statistics.stdev(values) if len(values) > 1 else None
    return Spread(len(values), statistics.fmean(values), sd)


def pooled_sd(groups: Sequence[Sequence[float]]) -> tuple[float | None, int]:
    """(s_p, degrees of freedom): ``sqrt(sum (n_i - 1) s_i^2 / sum (n_i - 1))`` over the groups with two or
    more finite values; (None, 0) when there are none."""
    usable = [g for g in groups if len(g) > 1 and _testable(g)]
    dof = sum(len(g) - 1 for g in usable)
    if dof == 0:
        return None, 0
    return math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in usable) / dof), dof


@dataclass(frozen=True)
class Comparison:
    """``a`` against ``b``: the difference of their means with Welch's interval and its verdict."""

    difference: float | None
    """mean(a) - mean(b): negative when ``a`` has the lower (better) loss."""
    low: float | None
    high: float | None
    p_value: float | None
    dof: float | None
    """Welch-Satterthwaite degrees of freedom."""
    verdict: Verdict
    """better / worse when the interval excludes 0, else within noise; untested below two seeds a side."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "difference": self.difference,
            "low": self.low,
            "high": self.high,
            "p_value": self.p_value,
            "dof": self.dof,
            "verdict": self.verdict,
        }


def welch(a: Sequence[float], b: Sequence[float], alpha: float = ALPHA) -> Comparison:
    """Welch's two-sample comparison of ``a`` against ``b`` (unequal variances), by its formulas and the t
    distribution: what ``scipy.stats.ttest_ind(a, b, equal_var=False)`` and its ``confidence_interval``
    give (tests/unit/test_significance.py holds the two side by side)."""
    if not (_testable(a) and _testable(b)):
        return Comparison(None, None, None, None, None, "untested")
    difference = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return Comparison(difference, None, None, None, None, "untested")
    from scipy import stats

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:  # no spread on either side: nothing to test the difference against
        return Comparison(difference, None, None, None, None, "untested")
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(stats.t.ppf(1 - alpha / 2, dof)) * se
    p_value = float(2 * stats.t.sf(abs(difference) / se, dof))
    low, high = difference - half, difference + half
    verdict: Verdict = "better" if high < 0 else "worse" if low > 0 else "within noise"
    return Comparison(difference, low, high, p_value, dof, verdict)


def detectable_difference(
    sd: float | None, n: int, alpha: float = ALPHA, power: float = POWER
) -> float | None:
    """The smallest true difference between two configurations of ``n`` seeds each that a two-sided t test
    at level ``alpha`` finds with probability ``power``, when each seed's SD is ``sd`` (the pooled SD).

    Exact, by the noncentral t distribution with 2n - 2 degrees of freedom (SPEC §12's
    ``(t_{1-α/2} + t_{power}) · sd · sqrt(2/n)`` is its normal-shaped approximation); None below two seeds.
    """
    if sd is None or n < 2:
        return None
    from scipy import optimize, stats

    dof = 2 * n - 2
    critical = float(stats.t.ppf(1 - alpha / 2, dof))

    def shortfall(shift: float) -> float:
        reach = stats.nct.sf(critical, dof, shift) + stats.nct.cdf(-critical, dof, shift)
        return float(reach) - power

    high = 1.0
    while shortfall(high) < 0:  # power grows with the shift: widen the bracket until it is reached
        high *= 2
    shift = optimize.brentq(shortfall, 0.0, high, xtol=1e-12)
    return float(shift) * sd * math.sqrt(2 / n)


# ----------------------------------------------------------------------------- a stage and its cut


@dataclass(frozen=True)
class Cut:
    """Where promotion splits a ranked stage: the last configuration promoted against the first left
    behind."""

    promoted: int
    """How many configurations are promoted (the next stage's parents; 1 for the last stage's selection)."""
    last: str
    first_left: str
    comparison: Comparison

    @property
    def inside_noise(self) -> bool:
        """The cut does not separate the two sides: their difference is within noise (or untested)."""
        return self.comparison.verdict != "better"

    def as_dict(self) -> dict[str, Any]:
        return {
            "promoted": self.promoted,
            "last_promoted": self.last,
            "first_left_behind": self.first_left,
            **self.comparison.as_dict(),
            "inside_noise": self.inside_noise,
        }


@dataclass(frozen=True)
class StageNoise:
    """The noise floor and the comparisons of one ranked stage."""

    spreads: dict[str, Spread]
    """Configuration -> its spread, best first."""
    pooled_sd: float | None
    dof: int
    seeds: int
    """Seeds per configuration the detectable difference assumes (the stage's smallest)."""
    detectable: float | None
    versus_best: dict[str, Comparison]
    """Configuration -> it against the stage's best (the best itself not included)."""
    cut: Cut | None
    """None when every configuration is promoted."""
    promoted: int | None = None
    """How many configurations go on (None: not a promotion, e.g. plain runs)."""

    def summary(self) -> dict[str, Any]:
        return {
            "pooled_sd": self.pooled_sd,
            "dof": self.dof,
            "seeds": self.seeds,
            "detectable_difference": self.detectable,
            "cut": None if self.cut is None else self.cut.as_dict(),
        }


def stage_noise(ranked: Mapping[str, Sequence[float]], promoted: int | None) -> StageNoise:
    """``ranked``: configuration -> its seeds' final losses, best first; ``promoted``: how many go on."""
    names = list(ranked)
    sd, dof = pooled_sd(list(ranked.values()))
    seeds = min((len(v) for v in ranked.values()), default=0)
    best = names[0] if names else None
    versus = {c: welch(ranked[c], ranked[best]) for c in names[1:]} if best else {}
    cut = None
    if promoted is not None and 0 < promoted < len(names):
        last, first_left = names[promoted - 1], names[promoted]
        cut = Cut(promoted, last, first_left, welch(ranked[last], ranked[first_left]))
    spreads = {c: spread(v) for c, v in ranked.items()}
    return StageNoise(spreads, sd, dof, seeds, detectable_difference(sd, seeds), versus, cut, promoted)


def place_fields(noise: StageNoise, configuration: str, rank: int) -> dict[str, Any]:
    """A configuration's place in its stage as JSON fields: ``loss_se``, ``versus_best`` (its difference to
    the best with Welch's interval and verdict; null for the best), ``promoted`` (null when the stage is no
    promotion) and, on the two configurations at the cut, ``cut`` (its side and the cut's test)."""
    versus = noise.versus_best.get(configuration)
    fields: dict[str, Any] = {
        "loss_se": noise.spreads[configuration].se,
        "versus_best": None if versus is None else versus.as_dict(),
        "promoted": None if noise.promoted is None else rank < noise.promoted,
    }
    cut = noise.cut
    if cut is not None and configuration in (cut.last, cut.first_left):
        side = "last promoted" if configuration == cut.last else "first left behind"
        fields["cut"] = {"side": side, **cut.as_dict()}
    return fields


def contested(ranked: Mapping[str, Sequence[float]], promoted: int) -> list[str]:
    """The configurations on either side of a cut inside the noise, best first: each promoted one that is not
    better than the first left behind, and each one left behind that is not worse than the last promoted
    (configurations with a diverged seed are never contested: they rank last). Empty when the cut holds."""
    names = [c for c in ranked if _testable(ranked[c])]
    if not 0 < promoted < len(names):
        return []
    last, first_left = names[promoted - 1], names[promoted]
    if welch(ranked[last], ranked[first_left]).verdict == "better":
        return []
    above = [c for c in names[:promoted] if welch(ranked[c], ranked[first_left]).verdict != "better"]
    below = [c for c in names[promoted:] if welch(ranked[c], ranked[last]).verdict != "worse"]
    return above + below


# ----------------------------------------------------------------------------- where the noise comes from


@dataclass(frozen=True)
class Source:
    """One group of a noise study: the variance of one configuration's final losses when only this source
    varies, with its chi-square interval, and its share of the variance when every source varies (with its
    F interval)."""

    name: str
    spread: Spread
    variance: float | None
    low: float | None
    high: float | None
    share: float | None
    share_low: float | None
    share_high: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.name,
            **self.spread.as_dict(),
            "variance": self.variance,
            "variance_low": self.low,
            "variance_high": self.high,
            "share": self.share,
            "share_low": self.share_low,
            "share_high": self.share_high,
        }


def variance_interval(values: Sequence[float], alpha: float = ALPHA) -> tuple[float | None, ...]:
    """(sample variance, its chi-square 1 - alpha interval) of normal values; Nones below two values."""
    if len(values) < 2 or not _testable(values):
        return None, None, None
    from scipy import stats

    dof = len(values) - 1
    variance = statistics.variance(values)
    low = dof * variance / float(stats.chi2.ppf(1 - alpha / 2, dof))
    high = dof * variance / float(stats.chi2.ppf(alpha / 2, dof))
    return variance, low, high


def noise_sources(groups: Mapping[str, Sequence[float]], total: str, alpha: float = ALPHA) -> list[Source]:
    """Each group's variance and its share of the ``total`` group's (where every source varies): the ratio
    of two independent sample variances, whose interval is the F distribution's (SPEC §12)."""
    from scipy import stats

    total_variance = variance_interval(groups[total], alpha)[0]
    sources = []
    for name, values in groups.items():
        variance, low, high = variance_interval(values, alpha)
        share = share_low = share_high = None
        if variance is not None and total_variance and name != total:
            share = variance / total_variance
            f = stats.f(len(values) - 1, len(groups[total]) - 1)
            share_low, share_high = share / float(f.ppf(1 - alpha / 2)), share / float(f.ppf(alpha / 2))
        elif name == total and variance is not None:
            share = share_low = share_high = 1.0
        sources.append(Source(name, spread(values), variance, low, high, share, share_low, share_high))
    return sources
