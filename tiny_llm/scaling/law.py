"""Scaling laws fitted as Hoffmann et al. (2022) fit theirs, approach 3 (SPEC §12, "Scaling fit").

The joint law ``L(N, D) = E + A/N^α + B/D^β`` (N non-embedding parameters, D training tokens) is fitted in
log space: ``min Σ Huber_δ(LSE(a − α log N, b − β log D, e) − log L)`` with δ = 1e-3 over every run, where
A = eᵃ, B = eᵇ, E = eᵉ, by L-BFGS (scipy.optimize) from the best points of a grid of starts. One size's
``L(D) = E + B/D^β`` is the same fit with the N term left out. Everything here is numpy and scipy: no files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import logsumexp

HUBER_DELTA = 1e-3
"""Hoffmann et al.'s δ: log-loss residuals beyond it count linearly (one odd run does not pull the fit)."""

SLOPES = (0.1, 0.3, 0.5, 0.8, 1.2, 2.0)
"""Grid of starting exponents α and β."""
OFFSETS = (0.0, 5.0, 10.0, 15.0, 20.0, 25.0)
"""Grid of starting a = log A and b = log B (Hoffmann et al.'s)."""
FLOOR_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
"""Grid of starting E, as fractions of the lowest loss fitted (E is below every loss)."""
REFINED_STARTS = 10
"""Grid points of lowest objective that L-BFGS starts from (the whole grid is evaluated, vectorised)."""
SLOPE_BOUNDS = (1e-4, 5.0)
LOG_BOUNDS = (-30.0, 80.0)


@dataclass(frozen=True)
class JointLaw:
    """``L(N, D) = E + A/N^α + B/D^β``."""

    E: float
    A: float
    alpha: float
    B: float
    beta: float

    NAMES = ("E", "A", "alpha", "B", "beta")

    def loss(self, n: np.ndarray | float, d: np.ndarray | float) -> np.ndarray:
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        with np.errstate(all="ignore"):
            return self.E + self.A * n**-self.alpha + self.B * d**-self.beta

    def values(self) -> tuple[float, ...]:
        return (self.E, self.A, self.alpha, self.B, self.beta)

    @property
    def g(self) -> float:
        """G = (αA/(βB))^{1/(α+β)} of the compute-optimal split (0 or inf where a term vanishes: a law whose
        N or D term the data did not identify has no finite optimum)."""
        with np.errstate(all="ignore"):
            ratio = np.float64(self.alpha) * self.A / (np.float64(self.beta) * self.B)
            return float(ratio ** (1.0 / (self.alpha + self.beta)))

    def optimal_parameters(self, compute: np.ndarray | float) -> np.ndarray:
        """N*(C) = G·(C/6)^{β/(α+β)}: the parameters that reach the lowest loss for C ≈ 6·N·D FLOPs."""
        share = self.beta / (self.alpha + self.beta)
        with np.errstate(all="ignore"):
            return self.g * (np.asarray(compute, dtype=float) / 6.0) ** share

    def optimal_tokens(self, compute: np.ndarray | float) -> np.ndarray:
        """D*(C) = C / (6·N*(C))."""
        with np.errstate(all="ignore"):
            return np.asarray(compute, dtype=float) / (6.0 * self.optimal_parameters(compute))

    def tokens_to_reach(self, loss: float, n: float) -> float:
        """The tokens at which a model of N parameters reaches ``loss`` (inf at or below its floor)."""
        gap = loss - self.E - self.A * n**-self.alpha
        return float((self.B / gap) ** (1.0 / self.beta)) if gap > 0 else math.inf


@dataclass(frozen=True)
class DataLaw:
    """One size's ``L(D) = E + B/D^β``."""

    E: float
    B: float
    beta: float

    NAMES = ("E", "B", "beta")

    def loss(self, d: np.ndarray | float) -> np.ndarray:
        return self.E + self.B * np.asarray(d, dtype=float) ** -self.beta

    def values(self) -> tuple[float, ...]:
        return (self.E, self.B, self.beta)


# ----------------------------------------------------------------------------- the objective
#
# theta = (e, c_1, s_1, ..., c_K, s_K); a run's predicted log-loss is LSE(e, c_k − s_k·x_k) over its K
# log-variables x (log N, log D). Scaled by 1/(n·δ²), so that L-BFGS's tolerances mean the same for every
# number of runs (the minimiser is unchanged).


def _terms(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[..., n, K+1]: e and every c_k − s_k·x_k, for a batch of thetas [..., 2K+1] and x [n, K]."""
    c, s = theta[..., 1::2], theta[..., 2::2]
    power = c[..., None, :] - s[..., None, :] * x
    floor = np.broadcast_to(theta[..., 0, None, None], (*power.shape[:-1], 1))
    return np.concatenate([floor, power], axis=-1)


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def objective(
    theta: np.ndarray, x: np.ndarray, log_loss: np.ndarray, delta: float = HUBER_DELTA
) -> tuple[float, np.ndarray]:
    """The scaled Huber objective and its gradient at one theta."""
    z = _terms(theta, x)
    top = z.max(axis=-1, keepdims=True)
    weights = np.exp(z - top)
    total = weights.sum(axis=-1)
    weights /= total[:, None]
    r = np.log(total) + top[:, 0] - log_loss
    psi = np.clip(r, -delta, delta)
    scale = 1.0 / (len(r) * delta * delta)
    grad = np.empty_like(theta)
    pw = psi @ weights
    grad[0] = pw[0]
    grad[1::2] = pw[1:]
    grad[2::2] = -(psi @ (weights[:, 1:] * x))
    value = (psi * (r - 0.5 * psi)).sum()  # Huber: r²/2 inside δ, δ(|r| − δ/2) outside
    return float(value * scale), grad * scale


def grid_objective(thetas: np.ndarray, x: np.ndarray, log_loss: np.ndarray) -> np.ndarray:
    """The scaled objective at every row of ``thetas`` [G, 2K+1] at once."""
    pred = logsumexp(_terms(thetas, x), axis=-1)
    return huber(pred - log_loss).sum(axis=-1) / (len(log_loss) * HUBER_DELTA**2)


def start_grid(num_terms: int, lowest_loss: float) -> np.ndarray:
    """Every combination of the starting values: [G, 2K+1]."""
    floors = [math.log(f * lowest_loss) for f in FLOOR_FRACTIONS]
    axes = [floors] + [OFFSETS, SLOPES] * num_terms
    mesh = np.meshgrid(*axes, indexing="ij")
    return np.stack([m.ravel() for m in mesh], axis=-1)


def bounds(num_terms: int, highest_loss: float) -> list[tuple[float, float]]:
    """L-BFGS-B's box: e below log of the highest loss (+1), every c and slope in wide fixed ranges."""
    return [(LOG_BOUNDS[0], math.log(highest_loss) + 1.0)] + [LOG_BOUNDS, SLOPE_BOUNDS] * num_terms


@dataclass(frozen=True)
class Solution:
    theta: np.ndarray
    objective: float


def _shift(theta: np.ndarray, centre: np.ndarray, sign: float) -> np.ndarray:
    """theta with each c_k moved by sign·s_k·centre_k: c_k − s_k·x_k = (c_k − s_k·x̄_k) − s_k·(x_k − x̄_k)."""
    out = np.array(theta, dtype=float)
    out[..., 1::2] += sign * out[..., 2::2] * centre
    return out


def grid_starts(grid: np.ndarray, x: np.ndarray, loss: np.ndarray, count: int = REFINED_STARTS) -> np.ndarray:
    """The ``count`` grid points of lowest objective (the whole grid is evaluated at once)."""
    values = grid_objective(grid, x, np.log(loss))
    return np.asarray(grid[np.argsort(values, kind="stable")[:count]])


def solve(x: np.ndarray, loss: np.ndarray, starts: np.ndarray) -> Solution:
    """The lowest objective L-BFGS reaches from ``starts`` [S, 2K+1].

    L-BFGS runs on centred log-variables (the same objective: each c_k shifted by s_k·x̄_k), where an
    intercept and its slope are nearly uncorrelated, so it converges in far fewer steps.
    """
    log_loss = np.log(loss)
    centre = x.mean(axis=0)
    box = bounds(x.shape[1], float(loss.max()))
    lower, upper = np.array(box).T
    best: Solution | None = None
    for start in _shift(np.atleast_2d(starts), centre, -1.0):
        result = minimize(
            objective,
            np.clip(start, lower, upper),
            args=(x - centre, log_loss),
            jac=True,
            method="L-BFGS-B",
            bounds=box,
            options={"maxiter": 3000, "ftol": 1e-13, "gtol": 1e-9},
        )
        if np.all(np.isfinite(result.x)) and (best is None or result.fun < best.objective):
            best = Solution(_shift(result.x, centre, 1.0), float(result.fun))
    if best is None:
        raise ValueError("no start reached a finite fit")
    return best


def joint_law(theta: np.ndarray) -> JointLaw:
    e, a, alpha, b, beta = (float(v) for v in theta)
    return JointLaw(E=math.exp(e), A=math.exp(a), alpha=alpha, B=math.exp(b), beta=beta)


def data_law(theta: np.ndarray) -> DataLaw:
    e, b, beta = (float(v) for v in theta)
    return DataLaw(E=math.exp(e), B=math.exp(b), beta=beta)


def joint_design(n: np.ndarray, d: np.ndarray) -> np.ndarray:
    return np.stack([np.log(np.asarray(n, dtype=float)), np.log(np.asarray(d, dtype=float))], axis=-1)


def data_design(d: np.ndarray) -> np.ndarray:
    return np.log(np.asarray(d, dtype=float))[:, None]
