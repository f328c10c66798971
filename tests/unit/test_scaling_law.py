"""The scaling fit's mathematics (tiny_llm.scaling): the objective, recovery of a known law, the bootstrap on
cases with a known answer, the compute-optimal split and the effective speedup."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import check_grad

from tiny_llm.scaling import law as laws
from tiny_llm.scaling.bootstrap import drawn_design, draws, interval
from tiny_llm.scaling.fit import bootstrap_joint, fit_joint, speedup
from tiny_llm.scaling.points import Point, Run

TRUE = laws.JointLaw(E=1.69, A=406.4, alpha=0.34, B=410.7, beta=0.28)  # Hoffmann et al.'s fitted law
# The cluster grid (config/scaling-c4.yaml): 20m/50m/90m/250m (non-embedding N; D = tokens per parameter x all
# parameters), 4 horizons, 2 seeds.
PARAMETERS = (20_403_520, 48_507_392, 91_605_120, 251_943_360)
EMBEDDING = (32_000 * 320, 32_000 * 512, 32_000 * 640, 32_000 * 960)
HORIZONS = (5, 10, 20, 40)
SEED_SD = 0.012  # the demo's seed SD, ~0.01-0.015 nats (benchmarks/README.md)


def grid_points(
    law: laws.JointLaw, rng: np.random.Generator | None, seeds: int = 2, sd: float = SEED_SD
) -> list[Point]:
    points = []
    for p, emb in zip(PARAMETERS, EMBEDDING, strict=True):
        for h in HORIZONS:
            n, d = p - emb, h * p
            runs = tuple(
                Run(
                    f"s{seed}",
                    n,
                    p,
                    d,
                    h,
                    seed,
                    float(law.loss(n, d)) + (rng.normal(0, sd) if rng else 0.0),
                    None,
                    None,
                )
                for seed in range(seeds)
            )
            points.append(Point(n, d, h, runs))
    return points


def test_the_objectives_gradient_is_its_derivative() -> None:
    points = grid_points(TRUE, np.random.default_rng(0))
    n = np.array([p.n for p in points for _ in p.runs], dtype=float)
    d = np.array([p.d for p in points for _ in p.runs], dtype=float)
    y = np.log(np.concatenate([p.values("loss") for p in points]))
    x = laws.joint_design(n, d) - laws.joint_design(n, d).mean(axis=0)
    for theta in ([0.4, 1.0, 0.3, 1.2, 0.3], [0.6, 0.2, 0.5, 0.9, 0.2]):
        theta = np.array(theta)
        value = lambda t: laws.objective(t, x, y)[0]  # noqa: E731
        grad = lambda t: laws.objective(t, x, y)[1]  # noqa: E731
        assert check_grad(value, grad, theta) < 1e-5 * np.linalg.norm(grad(theta)) + 1e-7
    # the Huber loss: quadratic inside δ, linear outside, continuous at δ
    r = np.array([0.0, 5e-4, 1e-3, 3e-3])
    assert np.allclose(laws.huber(r), [0, 0.5 * 25e-8, 0.5e-6, 1e-3 * (3e-3 - 0.5e-3)])


def test_a_noise_free_grid_gives_back_the_law_it_came_from() -> None:
    fit = fit_joint(grid_points(TRUE, None, seeds=1), "loss")
    for name, value in zip(TRUE.NAMES, TRUE.values(), strict=True):
        assert getattr(fit.law, name) == pytest.approx(value, rel=1e-4), name
    # the compute-optimal split: N*(C)·D*(C)·6 = C, and N* minimises the law along C = 6·N·D
    c = 1e21
    n_star, d_star = float(fit.law.optimal_parameters(c)), float(fit.law.optimal_tokens(c))
    assert 6 * n_star * d_star == pytest.approx(c)
    along = [float(fit.law.loss(n, c / (6 * n))) for n in (n_star * 0.9, n_star, n_star * 1.1)]
    assert along[1] < along[0] and along[1] < along[2]
    assert fit.law.g == pytest.approx((0.34 * 406.4 / (0.28 * 410.7)) ** (1 / 0.62), rel=1e-3)


@pytest.mark.slow  # 100 draws x 100 bootstrap refits: ~30-60 s on 2 cores
def test_synthetic_recovery_intervals_cover_the_true_law() -> None:
    """100 seeded grids from a known law with the demo's seed noise: each parameter's 95 % interval covers
    its true value in at least 90 of them; the estimates' median is within 3 % of the truth for E, α, β and
    10 % for A, B (their logs trade off against the exponents); a run at 500m, 20 tokens per parameter
    (outside the grid) is predicted within 0.03 nats in at least 95 draws."""
    covered = np.zeros(5)
    estimates, errors = [], []
    n500, d500 = 516_814_080 - 32_000 * 1280, 20 * 516_814_080
    for k in range(100):
        points = grid_points(TRUE, np.random.default_rng(1000 + k))
        fit = fit_joint(points, "loss")
        bootstrap_joint(fit, draws(points, 100, seed=k))
        for i, value in enumerate(TRUE.values()):
            low, high = interval(fit.replicates[:, i], 0.95)
            covered[i] += low <= value <= high
        estimates.append(fit.law.values())
        errors.append(float(fit.law.loss(n500, d500) - TRUE.loss(n500, d500)))
    assert np.all(covered >= 90), dict(zip(TRUE.NAMES, covered, strict=True))
    median = np.median(estimates, axis=0)
    relative = np.abs(median / np.array(TRUE.values()) - 1)
    assert np.all(relative <= [0.03, 0.10, 0.03, 0.10, 0.03]), dict(zip(TRUE.NAMES, relative, strict=True))
    assert sum(abs(e) <= 0.03 for e in errors) >= 95, sorted(errors)


def test_the_bootstrap_of_runs_and_points_has_the_textbook_spread() -> None:
    """Known answers: resampling the k runs of one point gives their mean the ideal bootstrap's SD,
    σ̂/√k with σ̂² = Σ(x − x̄)²/k; resampling the m points of a size (one run each) gives theirs σ̂_m/√m."""
    values = [3.0, 3.1, 2.8, 3.3, 2.9]
    one = [Point(1, 1, 1.0, tuple(Run("r", 1, 1, 1, 1.0, s, v, None, None) for s, v in enumerate(values)))]
    means = [drawn_design(one, "loss", c)[2].mean() for c in draws(one, 4000, seed=1)]
    expected = np.std(values) / math.sqrt(len(values))
    assert np.std(means) == pytest.approx(expected, rel=0.05)
    size = [Point(7, d, 1.0, (Run("r", 7, 7, d, 1.0, 0, v, None, None),)) for d, v in enumerate(values, 1)]
    means = [drawn_design(size, "loss", c)[2].mean() for c in draws(size, 4000, seed=2)]
    assert np.std(means) == pytest.approx(expected, rel=0.05)
    # the two levels together, and every size kept: a replicate never loses a size
    for choice in draws(grid_points(TRUE, None), 50, seed=3):
        assert len(choice.points) == 16 and {i // 4 for i in choice.points} == {0, 1, 2, 3}


def test_without_noise_every_interval_shrinks_to_the_truth() -> None:
    points = grid_points(TRUE, None)  # two identical seeds per point
    fit = fit_joint(points, "loss")
    bootstrap_joint(fit, draws(points, 30, seed=0))
    for i, value in enumerate(TRUE.values()):
        low, high = interval(fit.replicates[:, i], 0.95)
        assert low == pytest.approx(value, rel=1e-3) and high == pytest.approx(value, rel=1e-3)


def test_percentile_intervals_count_an_infinite_sample_as_the_largest() -> None:
    assert interval(np.array([1.0, 2.0, 3.0, np.nan]), 0.5) == [1.5, 2.5]
    assert interval(np.array([1.0, 2.0, np.inf, np.inf]), 0.5) == [1.75, None]
    assert interval(np.array([np.nan]), 0.95) is None


def test_a_recipe_that_needs_half_the_tokens_is_a_2x_speedup() -> None:
    """A variant whose law at D equals the baseline's at 2·D: 2x compute at every point; in wall clock,
    2x times its throughput over the baseline's (here it runs at 0.8 of the baseline's tokens/s)."""
    variant_law = laws.JointLaw(TRUE.E, TRUE.A, TRUE.alpha, TRUE.B * 2**-TRUE.beta, TRUE.beta)

    def with_rate(points: list[Point], rate: float) -> list[Point]:
        return [
            Point(
                p.n,
                p.d,
                p.tokens_per_parameter,
                tuple(Run(**{**r.__dict__, "tokens_per_second": rate}) for r in p.runs),
            )
            for p in points
        ]

    base_points = with_rate(grid_points(TRUE, None), 1000.0)
    variant_points = with_rate(grid_points(variant_law, None), 800.0)
    base, variant = fit_joint(base_points, "loss"), fit_joint(variant_points, "loss")
    bootstrap_joint(base, draws(base_points, 20, seed=0))
    bootstrap_joint(variant, draws(variant_points, 20, seed=1))
    rows = speedup(base, variant, 0.95)
    assert len(rows) == 16
    for row in rows:
        assert row["compute"]["value"] == pytest.approx(2.0, rel=1e-3)
        assert row["compute"]["interval"][0] == pytest.approx(2.0, rel=1e-2)
        assert row["wall_clock"]["value"] == pytest.approx(1.6, rel=1e-3)
        assert row["tokens_per_second"] == {"baseline": 1000.0, "variant": 800.0}
    # a loss below the baseline's floor at that N: no amount of baseline compute reaches it
    assert TRUE.tokens_to_reach(TRUE.E + TRUE.A * 1e8**-TRUE.alpha - 1e-3, 1e8) == math.inf
