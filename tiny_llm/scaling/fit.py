"""A scaling fit of finished runs: the laws, their bootstrap intervals and checks, as fit.json (SPEC §12).

Per metric (the final loss; bits per byte where every run has it): the joint law L(N, D) with an interval for
every parameter, for G and the exponents of the compute-optimal split and for N*(C), D*(C) and L at given
budgets; R², every run's residual and the leave-one-horizon-out error; each size's L(D). A recipe variant's
runs (e.g. the same grid under Muon) get a joint law of their own and the effective speedup against the
baseline: at each of its points (N, D_v), the tokens D_b the baseline law needs at N to reach the variant
law's loss there, over D_v (= C_b(L_v)/C_v at equal N), and in wall clock times the ratio of the runs'
measured throughputs (tokens/s of the variant over the baseline's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from tiny_llm.scaling import law as laws
from tiny_llm.scaling.bootstrap import Draw, drawn_design, draws, estimate, finite
from tiny_llm.scaling.points import Point, design, metrics_of

FORMAT = 1
BOOTSTRAP_SCHEME = (
    "points with replacement within each size (N), then runs (seeds) with replacement within each point; "
    "each size's L(D): runs within its own points"
)


@dataclass(frozen=True)
class FitSettings:
    bootstrap: int = 1000
    seed: int = 0
    confidence: float = 0.95
    budgets: tuple[float, ...] = ()
    """Compute budgets (FLOPs) of the compute-optimal split; empty: four across the fitted runs'."""


@dataclass
class JointFit:
    """One metric's joint law over a set of points, and its bootstrap replicates [B, 5] (NaN: failed)."""

    points: list[Point]
    metric: str
    law: laws.JointLaw
    theta: np.ndarray
    objective: float
    starts: np.ndarray
    replicates: np.ndarray = field(default_factory=lambda: np.empty((0, 5)))

    def replicate_laws(self) -> list[laws.JointLaw | None]:
        return [None if np.isnan(row).any() else laws.JointLaw(*map(float, row)) for row in self.replicates]


# Thousands of 5-parameter L-BFGS runs: BLAS threads (OpenBLAS's default is one per core) only add their
# wake-ups, about 50x the work itself on a busy 2-core machine; the public entry points run with one.
ONE_BLAS_THREAD = threadpool_limits.wrap(limits=1, user_api="blas")


@ONE_BLAS_THREAD
def fit_joint(points: list[Point], metric: str, grid_count: int = laws.REFINED_STARTS) -> JointFit:
    """The joint law from the best points of the whole grid of starts."""
    n, d, y = design(points, metric)
    x = laws.joint_design(n, d)
    starts = laws.grid_starts(laws.start_grid(2, float(y.min())), x, y, grid_count)
    solution = laws.solve(x, y, starts)
    return JointFit(
        points, metric, laws.joint_law(solution.theta), solution.theta, solution.objective, starts
    )


def refit(fit: JointFit, n: np.ndarray, d: np.ndarray, y: np.ndarray) -> np.ndarray:
    """A replicate's law (its 5 values; NaN if L-BFGS reaches no finite fit), from the full fit's optimum: a
    replicate's data are near the full data's, and so is its optimum."""
    try:
        solution = laws.solve(laws.joint_design(n, d), y, fit.theta[None])
    except ValueError:
        return np.full(5, np.nan)
    return np.array(laws.joint_law(solution.theta).values())


@ONE_BLAS_THREAD
def bootstrap_joint(fit: JointFit, chosen: list[Draw]) -> None:
    fit.replicates = np.array([refit(fit, *drawn_design(fit.points, fit.metric, c)) for c in chosen])


def _over(fit: JointFit, value: Callable[[laws.JointLaw], float]) -> np.ndarray:
    """``value`` of every replicate's law (NaN for a failed one)."""
    return np.array([np.nan if law is None else value(law) for law in fit.replicate_laws()])


def joint_summary(fit: JointFit, settings: FitSettings) -> dict[str, Any]:
    """Parameters, derived quantities, checks and the compute-optimal split, each with its interval."""
    c = settings.confidence
    law = fit.law
    parameters = {
        name: estimate(getattr(law, name), fit.replicates[:, i], c) for i, name in enumerate(law.NAMES)
    }

    def share(w: laws.JointLaw) -> float:
        """N* ∝ C^share, D* ∝ C^(1 − share)."""
        return w.beta / (w.alpha + w.beta)

    return {
        "law": "E + A / N^alpha + B / D^beta",
        "parameters": parameters,
        "G": estimate(law.g, _over(fit, lambda w: w.g), c),
        "n_exponent": estimate(share(law), _over(fit, share), c),
        "d_exponent": estimate(1 - share(law), _over(fit, lambda w: 1 - share(w)), c),
        "objective": fit.objective,
        "at_bound": at_bound(fit),
        **goodness(fit),
        "leave_one_horizon_out": leave_one_horizon_out(fit),
        "compute_optimal": [compute_optimal(fit, budget, c) for budget in budgets(fit.points, settings)],
        "noise_sd": noise_sd(fit),
        "bootstrap": {
            "replicates": len(fit.replicates),
            "failed": int(np.isnan(fit.replicates).any(axis=1).sum()),
            "scheme": BOOTSTRAP_SCHEME,
            "laws": [[finite(v) for v in row] for row in fit.replicates],
        },
    }


def at_bound(fit: JointFit) -> list[str]:
    """The parameters the fit left at an edge of its search box: the data did not identify them (no N effect
    between the sizes, say, drives α to its largest value or A to nothing)."""
    box = laws.bounds(2, float(design(fit.points, fit.metric)[2].max()))
    return [
        name
        for name, value, (low, high) in zip(laws.JointLaw.NAMES, fit.theta, box, strict=True)
        if min(value - low, high - value) < 1e-6
    ]


def goodness(fit: JointFit) -> dict[str, Any]:
    """R² over the runs, their RMSE, and every run's residual (observed − fitted)."""
    runs = [(point, run) for point in fit.points for run in point.runs]
    observed = np.array([run.value(fit.metric) for _, run in runs], dtype=float)
    fitted = np.array([float(fit.law.loss(point.n, point.d)) for point, _ in runs])
    residual = observed - fitted
    total = float(((observed - observed.mean()) ** 2).sum())
    return {
        "r2": 1.0 - float((residual**2).sum()) / total if total > 0 else None,
        "rmse": float(np.sqrt((residual**2).mean())),
        "residuals": [
            {"run": run.path, "n": point.n, "d": point.d, "observed": float(o), "fitted": float(f)}
            for (point, run), o, f in zip(runs, observed, fitted, strict=True)
        ],
    }


def noise_sd(fit: JointFit) -> dict[str, Any]:
    """The SD of one run around the law: pooled over the seeds of each point where points have several,
    else the residuals' (with n − 5 degrees of freedom)."""
    values = [point.values(fit.metric) for point in fit.points]
    dof = sum(len(v) - 1 for v in values)
    if dof > 0:
        pooled = sum(float(((v - v.mean()) ** 2).sum()) for v in values) / dof
        return {"value": math.sqrt(pooled), "source": "seeds (pooled within points)", "dof": dof}
    n, d, y = design(fit.points, fit.metric)
    residual = y - fit.law.loss(n, d)
    dof = len(y) - 5
    value = math.sqrt(float((residual**2).sum()) / dof) if dof > 0 else None
    return {"value": value, "source": "residuals of the fit", "dof": max(dof, 0)}


def budgets(points: list[Point], settings: FitSettings) -> list[float]:
    """The settings' budgets, else four log-spaced from the smallest to the largest run's compute."""
    if settings.budgets:
        return sorted(settings.budgets)
    computes = [point.compute for point in points]
    return [float(c) for c in np.geomspace(min(computes), max(computes), 4)]


def compute_optimal(fit: JointFit, budget: float, confidence: float) -> dict[str, Any]:
    """N*(C), D*(C) and the law's loss there."""

    def best_loss(w: laws.JointLaw) -> float:
        n = float(w.optimal_parameters(budget))
        return float(w.loss(n, budget / (6.0 * n))) if 0 < n < math.inf else math.nan

    def n_star(w: laws.JointLaw) -> float:
        return float(w.optimal_parameters(budget))

    def d_star(w: laws.JointLaw) -> float:
        return float(w.optimal_tokens(budget))

    return {
        "compute": budget,
        "n": estimate(n_star(fit.law), _over(fit, n_star), confidence),
        "d": estimate(d_star(fit.law), _over(fit, d_star), confidence),
        "value": estimate(best_loss(fit.law), _over(fit, best_loss), confidence),
    }


def leave_one_horizon_out(fit: JointFit) -> dict[str, Any]:
    """Per horizon, the error of the law fitted without it on its points' means (observed − predicted)."""
    rows = []
    errors: list[float] = []
    for horizon in sorted({p.tokens_per_parameter for p in fit.points}):
        kept = [p for p in fit.points if p.tokens_per_parameter != horizon]
        held = [p for p in fit.points if p.tokens_per_parameter == horizon]
        if len({p.n for p in kept}) < 3 or len({p.d for p in kept}) < 2:
            rows.append({"tokens_per_parameter": horizon, "error": None, "reason": "too few points left"})
            continue
        n, d, y = design(kept, fit.metric)
        starts = np.stack([fit.theta, *fit.starts[:2]])  # the full fit's optimum and its two best grid starts
        law = laws.joint_law(laws.solve(laws.joint_design(n, d), y, starts).theta)
        error = [float(p.values(fit.metric).mean() - law.loss(p.n, p.d)) for p in held]
        errors += error
        rows.append(
            {
                "tokens_per_parameter": horizon,
                "points": len(held),
                "mean_abs_error": float(np.mean(np.abs(error))),
                "max_abs_error": float(np.max(np.abs(error))),
            }
        )
    rmse = float(np.sqrt(np.mean(np.square(errors)))) if errors else None
    return {"horizons": rows, "rmse": rmse}


# ----------------------------------------------------------------------------- one size's L(D)


def fit_sizes(
    points: list[Point], metric: str, chosen: list[Draw], confidence: float
) -> list[dict[str, Any]]:
    """Each size's L(D) = E + B/D^β where it has at least three horizons; intervals where its points have
    several runs (its few horizons just identify the law, so its points are not resampled)."""
    out: list[dict[str, Any]] = []
    for size in sorted({p.n for p in points}):
        members = [i for i, p in enumerate(points) if p.n == size]
        if len(members) < 3:
            out.append({"n": size, "fit": None, "reason": f"{len(members)} horizons: L(D) needs three"})
            continue
        n, d, y = design([points[i] for i in members], metric)
        x = laws.data_design(d)
        starts = laws.grid_starts(laws.start_grid(1, float(y.min())), x, y, 5)
        solution = laws.solve(x, y, starts)
        fitted = laws.data_law(solution.theta)
        seeded = all(len(points[i].runs) > 1 for i in members)  # else its runs give nothing to resample
        replicates = np.array(
            [_refit_size(points, metric, c, members, solution.theta) for c in chosen]
            if seeded
            else [[np.nan] * 3]
        )
        residual = y - fitted.loss(d)
        total = float(((y - y.mean()) ** 2).sum())
        out.append(
            {
                "n": size,
                "law": "E + B / D^beta",
                "parameters": {
                    name: estimate(getattr(fitted, name), replicates[:, i], confidence)
                    for i, name in enumerate(fitted.NAMES)
                },
                "r2": 1.0 - float((residual**2).sum()) / total if total > 0 else None,
                "rmse": float(np.sqrt((residual**2).mean())),
                "intervals": "runs resampled within each point" if seeded else "none: one run per point",
            }
        )
    return out


def _refit_size(
    points: list[Point], metric: str, choice: Draw, members: list[int], theta: np.ndarray
) -> np.ndarray:
    _, d, y = drawn_design(points, metric, choice, members)
    try:
        return np.array(laws.data_law(laws.solve(laws.data_design(d), y, theta[None]).theta).values())
    except ValueError:
        return np.full(3, np.nan)


# ----------------------------------------------------------------------------- the whole fit


def fit_metric(
    points: list[Point], metric: str, settings: FitSettings, chosen: list[Draw]
) -> tuple[JointFit, dict[str, Any]]:
    joint = fit_joint(points, metric)
    bootstrap_joint(joint, chosen)
    summary = joint_summary(joint, settings)
    return joint, {"joint": summary, "per_size": fit_sizes(points, metric, chosen, settings.confidence)}


def speedup(base: JointFit, variant: JointFit, confidence: float) -> list[dict[str, Any]]:
    """At each of the variant's points: C_b(L_v)/C_v at equal N, and in wall clock from the throughputs."""
    pairs = list(zip(base.replicate_laws(), variant.replicate_laws(), strict=False))
    out = []
    for point in variant.points:

        def ratio(b: laws.JointLaw, v: laws.JointLaw, n: float = point.n, d: float = point.d) -> float:
            return b.tokens_to_reach(float(v.loss(n, d)), n) / d

        samples = np.array([np.nan if b is None or v is None else ratio(b, v) for b, v in pairs])
        compute = estimate(ratio(base.law, variant.law), samples, confidence)
        rates = _throughputs(base.points, point)
        wall = None
        if rates is not None:
            scale = rates[1] / rates[0]
            ends = compute["interval"]
            wall = {
                "value": None if compute["value"] is None else compute["value"] * scale,
                "interval": None if ends is None else [None if e is None else e * scale for e in ends],
            }
        out.append(
            {
                "n": point.n,
                "d": point.d,
                "tokens_per_parameter": point.tokens_per_parameter,
                "variant_loss": float(variant.law.loss(point.n, point.d)),
                "compute": compute,
                "wall_clock": wall,
                "tokens_per_second": None if rates is None else {"baseline": rates[0], "variant": rates[1]},
            }
        )
    return out


def _throughputs(base: list[Point], point: Point) -> tuple[float, float] | None:
    """Mean measured tokens/s of the baseline's runs at the point's N and of the variant point's runs."""

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return float(np.mean(known)) if known and len(known) == len(values) else None

    b = mean([r.tokens_per_second for p in base if p.n == point.n for r in p.runs])
    v = mean([r.tokens_per_second for r in point.runs])
    return (b, v) if b and v else None


def point_records(points: list[Point]) -> list[dict[str, Any]]:
    return [
        {
            "n": p.n,
            "d": p.d,
            "tokens_per_parameter": p.tokens_per_parameter,
            "compute": p.compute,
            "runs": [
                {
                    "run": r.path,
                    "seed": r.seed,
                    "parameters": r.parameters,
                    "loss": r.loss,
                    "bpb": r.bpb,
                    "tokens_per_second": r.tokens_per_second,
                    "sources": r.sources(),
                }
                for r in p.runs
            ],
        }
        for p in points
    ]


@ONE_BLAS_THREAD
def scaling_fit(
    points: list[Point], variants: dict[str, list[Point]], settings: FitSettings
) -> dict[str, Any]:
    """fit.json's content."""
    chosen = draws(points, settings.bootstrap, settings.seed)
    fits, metrics = {}, {}
    for metric in metrics_of(points):
        fits[metric], metrics[metric] = fit_metric(points, metric, settings, chosen)
    variant_out = {}
    for name, variant_points in variants.items():
        variant_chosen = draws(variant_points, settings.bootstrap, settings.seed + 1)
        joint, summary = fit_metric(variant_points, "loss", settings, variant_chosen)
        variant_out[name] = {
            "points": point_records(variant_points),
            "loss": summary,
            "speedup": speedup(fits["loss"], joint, settings.confidence),
        }
    return {
        "format": FORMAT,
        "settings": {
            "bootstrap": settings.bootstrap,
            "seed": settings.seed,
            "confidence": settings.confidence,
            "huber_delta": laws.HUBER_DELTA,
            "budgets": budgets(points, settings),
        },
        "metrics": list(metrics),
        "bpb": "fitted" if "bpb" in metrics else "not every run has final_validation.bpb",
        "points": point_records(points),
        "fits": metrics,
        "variants": variant_out,
    }
