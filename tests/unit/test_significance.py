"""The noise floor of seed comparisons (SPEC §12) on synthetic outcomes: Welch intervals and verdicts against
scipy's own test, the detectable difference against a power calculation by simulation, the promotion cut, and
the false-promotion rate of the tie-resolving rule."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from tiny_llm.campaign import significance as sig


def synthetic_pairs(count: int) -> list[tuple[list[float], list[float]]]:
    """Pairs of seed outcomes: 2-6 seeds a side, unequal spreads, differences from none to large."""
    rng = np.random.default_rng(7)
    pairs = []
    for _ in range(count):
        na, nb = rng.integers(2, 7, size=2)
        shift = rng.choice([0.0, 0.01, 0.05, 0.2])
        a = 3.5 + rng.normal(0, rng.choice([0.005, 0.02, 0.08]), na)
        b = 3.5 + shift + rng.normal(0, rng.choice([0.005, 0.02, 0.08]), nb)
        pairs.append(([float(x) for x in a], [float(x) for x in b]))
    return pairs


def test_welch_intervals_and_verdicts_equal_scipys_welch_test() -> None:
    verdicts = set()
    for a, b in synthetic_pairs(300):
        ours = sig.welch(a, b)
        theirs = stats.ttest_ind(a, b, equal_var=False)
        interval = theirs.confidence_interval(0.95)
        assert ours.low == pytest.approx(interval.low, rel=1e-9, abs=1e-12)
        assert ours.high == pytest.approx(interval.high, rel=1e-9, abs=1e-12)
        assert ours.p_value == pytest.approx(theirs.pvalue, rel=1e-9, abs=1e-15)
        assert ours.dof == pytest.approx(theirs.df, rel=1e-9)
        assert ours.difference == pytest.approx(statistics.fmean(a) - statistics.fmean(b), abs=1e-12)
        # the verdict is the interval's, which is the two-sided 5% test's
        expected = "within noise" if theirs.pvalue >= 0.05 else "better" if theirs.statistic < 0 else "worse"
        assert ours.verdict == expected
        verdicts.add(ours.verdict)
    assert verdicts == {"better", "worse", "within noise"}


def test_too_few_seeds_or_a_diverged_seed_is_untested() -> None:
    assert sig.welch([3.1], [3.2, 3.3]).verdict == "untested"
    assert sig.welch([3.1], [3.2, 3.3]).difference == pytest.approx(-0.15)
    assert sig.welch([3.1, math.inf], [3.2, 3.3]).difference is None
    assert sig.welch([3.1, 3.1], [3.2, 3.2]).verdict == "untested"  # no spread to test against


def test_pooled_sd_weights_each_configuration_by_its_degrees_of_freedom() -> None:
    groups = [[1.0, 3.0], [2.0, 4.0, 6.0], [5.0], [1.0, math.inf]]  # the last two are left out
    sd, dof = sig.pooled_sd(groups)
    assert dof == 1 + 2 and sd == pytest.approx(math.sqrt((1 * 2.0 + 2 * 4.0) / 3))
    assert sig.pooled_sd([[1.0], [2.0]]) == (None, 0)
    spread = sig.spread([1.0, 2.0, 3.0, 4.0])
    assert spread.se == pytest.approx(statistics.stdev([1, 2, 3, 4]) / 2)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_detectable_difference_is_found_with_80_percent_power(n: int) -> None:
    """A power calculation by simulation: two configurations of n seeds whose true means differ by the
    detectable difference are told apart by the two-sided 5% t test in 80% of 40,000 trials."""
    sd = 0.02
    delta = sig.detectable_difference(sd, n)
    assert delta is not None
    rng = np.random.default_rng(n)
    trials = 40_000
    a = rng.normal(0.0, sd, (trials, n))
    b = rng.normal(delta, sd, (trials, n))
    power = float(np.mean(stats.ttest_ind(a, b, axis=1).pvalue < 0.05))
    assert power == pytest.approx(0.8, abs=3.5 * math.sqrt(0.16 / trials))  # 3.5 standard errors
    # SPEC §12's closed form is its approximation: 5% short at two seeds, equal from about five
    nu = 2 * n - 2
    approx = (stats.t.ppf(0.975, nu) + stats.t.ppf(0.8, nu)) * sd * math.sqrt(2 / n)
    assert approx == pytest.approx(delta, rel=0.06)
    assert sig.detectable_difference(sd, 1) is None


def test_a_stage_marks_its_cut_and_compares_each_configuration_with_the_best() -> None:
    ranked = {
        "a": [3.00, 3.01, 3.02],
        "b": [3.05, 3.06, 3.04],
        "c": [3.051, 3.07, 3.045],  # inside the noise of b
        "d": [3.50, 3.52, 3.51],
    }
    noise = sig.stage_noise(ranked, promoted=2)
    assert noise.cut is not None and noise.cut.last == "b" and noise.cut.first_left == "c"
    assert noise.cut.inside_noise and noise.cut.comparison.verdict == "within noise"
    assert noise.versus_best["d"].verdict == "worse" and "a" not in noise.versus_best
    assert noise.dof == 8 and noise.seeds == 3
    assert noise.detectable == pytest.approx(sig.detectable_difference(noise.pooled_sd, 3))
    assert sig.contested(ranked, 2) == ["b", "c"]  # a is better than c, d worse than b
    close = {"a": [3.03, 3.05, 3.04], **{k: v for k, v in ranked.items() if k != "a"}}  # a near c too
    assert sig.contested(close, 2) == ["a", "b", "c"]
    assert sig.contested({"x": [3.0, 3.1], "y": [3.05, math.inf], "z": [4.0, 4.1]}, 1) == []  # y diverged
    assert not sig.stage_noise(ranked, promoted=3).cut.inside_noise  # c against d: a clear cut
    assert sig.contested(ranked, 3) == []
    assert sig.stage_noise(ranked, promoted=4).cut is None


def test_noise_shares_are_variance_ratios_with_f_intervals() -> None:
    groups = {"init": [1.0, 1.2, 0.9, 1.1], "data": [1.0, 1.5, 0.5, 1.3], "both": [1.0, 1.6, 0.6, 1.2, 1.4]}
    by = {s.name: s for s in sig.noise_sources(groups, "both")}
    v_init, v_both = statistics.variance(groups["init"]), statistics.variance(groups["both"])
    assert by["init"].share == pytest.approx(v_init / v_both)
    f = stats.f(3, 4)
    assert by["init"].share_low == pytest.approx(v_init / v_both / f.ppf(0.975))
    assert by["init"].share_high == pytest.approx(v_init / v_both / f.ppf(0.025))
    assert by["both"].share == 1.0
    chi = stats.chi2(3)
    assert by["data"].low == pytest.approx(3 * statistics.variance(groups["data"]) / chi.ppf(0.975))


# ----------------------------------------------------------------------------- the tie-resolving rule

MEANS = (0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
"""True means of six configurations in units of the seeds' SD (like the demo's stage 1)."""


def simulate_promotions(
    trials: int, seeds: int, promoted: int, extra_seeds: int, max_rounds: int, seed: int = 0
) -> tuple[float, float]:
    """(false-promotion rate, mean extra runs per trial) of promoting the top ``promoted`` by mean after the
    tie-resolving rounds (``max_rounds`` 0: the default rule). A promotion is false when a configuration
    left behind has a better true mean than one promoted."""
    rng = np.random.default_rng(seed)
    false, extra = 0, 0
    truth = set(range(promoted))
    for _ in range(trials):
        samples = {i: list(rng.normal(m, 1.0, seeds)) for i, m in enumerate(MEANS)}
        for _round in range(max_rounds):
            ranked = {i: samples[i] for i in sorted(samples, key=lambda i: statistics.fmean(samples[i]))}
            tied = sig.contested(ranked, promoted)
            if not tied:
                break
            for i in tied:
                samples[i] += list(rng.normal(MEANS[i], 1.0, extra_seeds))
                extra += extra_seeds
        chosen = sorted(samples, key=lambda i: statistics.fmean(samples[i]))[:promoted]
        false += set(chosen) != truth
    return false / trials, extra / trials


@pytest.mark.slow  # about 3 s: 1,000 simulated stages under each rule
def test_resolving_ties_lowers_the_false_promotion_rate() -> None:
    """Measured (printed; docs/studies.md and benchmarks/README.md quote it): six configurations half an SD
    apart, two seeds, two promoted. The default rule promotes a wrong pair in about half the stages; two
    rounds of two extra seeds for the contested configurations cut that substantially."""
    trials = 1000
    default, _ = simulate_promotions(trials, seeds=2, promoted=2, extra_seeds=2, max_rounds=0)
    resolved, cost = simulate_promotions(trials, seeds=2, promoted=2, extra_seeds=2, max_rounds=2)
    print(
        f"false promotions: default {default:.3f}, resolve_ties(2, 2) {resolved:.3f}; {cost:.1f} extra runs"
    )
    assert 0.35 < default < 0.65
    assert resolved < default - 0.1
    assert 0 < cost < 2 * 2 * len(MEANS)
