"""Hessian-vector products, gradients, Rademacher directions and statistics of the second-order analysis."""

from __future__ import annotations

import math

import pytest
import torch

from tiny_llm.analysis.hessian import (
    FlatParameters,
    curvature_pass,
    gradient,
    hvp,
    model_loss,
    norm_squared,
    rademacher,
)
from tiny_llm.analysis.stats import summarize
from tiny_llm.config import ModelConfig
from tiny_llm.model import Llama, reference_attention

MINI = ModelConfig(vocab_size=32, num_layers=2, width=16, num_heads=2, ffn_width=24, context_length=8)


def mini_model(dtype: torch.dtype = torch.float64, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(MINI, reference_attention=True).to(dtype)
    with torch.no_grad():  # larger weights than the 0.02 init, so that second derivatives are far from zero
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(10.0)
    return model


def mini_blocks(count: int = 6, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, MINI.vocab_size, (count, MINI.context_length + 1), generator=generator)


def splits(blocks: torch.Tensor, size: int) -> list[torch.Tensor]:
    return list(blocks.split(size))


def num_targets(blocks: torch.Tensor) -> int:
    return blocks.shape[0] * (blocks.shape[1] - 1)


def random_direction(flat: FlatParameters, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(flat.size, generator=generator, dtype=flat.params[0].dtype)


def test_hvp_matches_a_central_difference_of_gradients_in_fp64() -> None:
    model, blocks = mini_model(), mini_blocks()
    flat, loss_fn, n = FlatParameters(list(model.parameters())), model_loss(model), num_targets(blocks)
    v = random_direction(flat, 2)
    v /= v.norm()
    product = hvp(loss_fn, flat, splits(blocks, 4), n, v)
    eps = 1e-4
    grads = []
    for sign in (1.0, -1.0):
        with torch.no_grad():
            for p, u in zip(flat.params, flat.split(v), strict=True):
                p.add_(sign * eps * u)
        grads.append(gradient(loss_fn, flat, splits(blocks, 4), n)[0])
        with torch.no_grad():
            for p, u in zip(flat.params, flat.split(v), strict=True):
                p.sub_(sign * eps * u)
    difference = (grads[0] - grads[1]) / (2 * eps)
    error = (product - difference).norm() / difference.norm()
    assert difference.norm() > 1e-3  # a real curvature, not two zeros
    assert error < 1e-6, f"HVP vs central difference: relative error {error:.2e}"


def test_gradgradcheck_on_the_reference_path() -> None:
    generator = torch.Generator().manual_seed(3)
    q, k, v = (
        torch.randn(1, 2, 5, 4, generator=generator, dtype=torch.float64, requires_grad=True)
        for _ in range(3)
    )
    assert torch.autograd.gradgradcheck(reference_attention, (q, k, v))

    model, blocks = mini_model(), mini_blocks(2)
    norm = model.blocks[0].attn_norm.weight  # the whole reference path lies behind this one small weight
    with torch.no_grad():
        norm.copy_(torch.randn(norm.shape, generator=generator, dtype=torch.float64))

    def loss_of(weight: torch.Tensor) -> torch.Tensor:
        logits = torch.func.functional_call(model, {"blocks.0.attn_norm.weight": weight}, (blocks[:, :-1],))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), blocks[:, 1:].flatten())

    weight = norm.detach().clone().requires_grad_(True)
    assert torch.autograd.gradgradcheck(loss_of, (weight,))


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_hvp_is_symmetric(dtype: torch.dtype, tolerance: float) -> None:
    model, blocks = mini_model(dtype), mini_blocks()
    flat, loss_fn, n = FlatParameters(list(model.parameters())), model_loss(model), num_targets(blocks)
    u, v = random_direction(flat, 4), random_direction(flat, 5)
    result = curvature_pass(loss_fn, flat, splits(blocks, 3), n, [u, v], products=True)
    hu, hv = result.products
    u_hv, v_hu = float(torch.dot(u.double(), hv.double())), float(torch.dot(v.double(), hu.double()))
    scale = math.sqrt(
        abs(float(torch.dot(u.double(), hu.double())) * float(torch.dot(v.double(), hv.double())))
    )
    assert abs(u_hv - v_hu) <= tolerance * scale, (u_hv, v_hu)


def test_quadratic_forms_match_products_and_do_not_depend_on_grouping_or_microbatches() -> None:
    model, blocks = mini_model(), mini_blocks()
    flat, loss_fn, n = FlatParameters(list(model.parameters())), model_loss(model), num_targets(blocks)
    directions = [random_direction(flat, s) for s in (6, 7, 8)]
    together = curvature_pass(loss_fn, flat, splits(blocks, 2), n, directions, gradient=True, products=True)
    for v, q, product in zip(directions, together.quadratics, together.products, strict=True):
        assert q == pytest.approx(float(torch.dot(v, product)), rel=1e-12)
        alone = curvature_pass(loss_fn, flat, splits(blocks, 2), n, [v])
        assert alone.quadratics[0] == q  # the same operations, whatever shares the pass
        other_split = curvature_pass(loss_fn, flat, splits(blocks, 5), n, [v])
        assert other_split.quadratics[0] == pytest.approx(q, rel=1e-10)
    whole, loss = gradient(loss_fn, flat, [blocks], n)
    assert torch.allclose(together.gradient, whole, rtol=1e-10, atol=1e-14)
    assert together.loss == pytest.approx(loss, rel=1e-12)
    reference = torch.nn.functional.cross_entropy(
        model(blocks[:, :-1]).flatten(0, 1), blocks[:, 1:].flatten()
    )
    assert loss == pytest.approx(float(reference.detach()), rel=1e-12)


def test_rademacher_directions_are_seeded_signs() -> None:
    a = rademacher(10_000, 42, 0, dtype=torch.float32, device=torch.device("cpu"))
    assert torch.equal(a, rademacher(10_000, 42, 0, dtype=torch.float32, device=torch.device("cpu")))
    assert set(a.unique().tolist()) == {-1.0, 1.0}
    assert abs(float(a.mean())) < 0.05
    assert not torch.equal(a, rademacher(10_000, 42, 1, dtype=torch.float32, device=torch.device("cpu")))
    assert torch.equal(a.double(), rademacher(10_000, 42, 0, dtype=torch.float64, device=torch.device("cpu")))


def test_rademacher_estimator_recovers_the_trace_of_a_known_quadratic() -> None:
    """f(x) = x^T A x / 2 has Hessian A; sum r^T A r / (D R) estimates tr(A) / D (Hutchinson)."""
    dimension, num_random = 40, 400
    generator = torch.Generator().manual_seed(9)
    m = torch.randn(dimension, dimension, generator=generator, dtype=torch.float64)
    a = m @ m.T / dimension + torch.diag(torch.linspace(0.5, 3.0, dimension, dtype=torch.float64))
    x = torch.randn(dimension, generator=generator, dtype=torch.float64).requires_grad_(True)
    flat = FlatParameters([x])

    def quadratic_loss(_batch: torch.Tensor) -> torch.Tensor:
        return 0.5 * x @ a @ x

    directions = [
        rademacher(dimension, 7, i, dtype=torch.float64, device=x.device) for i in range(num_random)
    ]
    result = curvature_pass(quadratic_loss, flat, [torch.zeros(1)], 1, directions)
    rows = [{"quadratic": q} for q in result.quadratics]
    noise = [{"quadratic": 1.0, "noise_norm_squared": 1.0, "gradient_norm": 1.0}]
    estimate = summarize(noise, rows, [], dimension=dimension, mean_gradient_norm=0.0)[
        "normalized_random_alignment"
    ]
    exact = float(torch.trace(a)) / dimension
    off_diagonal = float((a**2).sum() - (torch.diagonal(a) ** 2).sum())
    sigma = math.sqrt(2 * off_diagonal / num_random) / dimension  # the estimator's standard deviation
    assert abs(estimate - exact) < 4 * sigma, (estimate, exact, sigma)
    r = directions[0]  # each quadratic form is exact: r^T A r
    assert result.quadratics[0] == pytest.approx(float(r @ a @ r), rel=1e-12)
    diagonal = torch.diag(torch.diagonal(a))  # with no off-diagonal part every direction gives the trace
    exact_rows = [{"quadratic": float(r @ diagonal @ r)} for r in directions[:3]]
    exact_estimate = summarize(noise, exact_rows, [], dimension=dimension, mean_gradient_norm=0.0)
    assert exact_estimate["normalized_random_alignment"] == pytest.approx(exact, rel=1e-12)


def test_statistics_follow_their_definitions() -> None:
    noise = [
        {"quadratic": 2.0, "noise_norm_squared": 4.0, "gradient_norm": 3.0},
        {"quadratic": -1.0, "noise_norm_squared": 1.0, "gradient_norm": 5.0},
    ]
    random = [{"quadratic": 10.0}, {"quadratic": 30.0}]
    consensus = [{"quadratic": 1.0, "norm_squared": 9.0}, {"quadratic": 3.0, "norm_squared": 16.0}]
    stats = summarize(noise, random, consensus, dimension=10, mean_gradient_norm=0.5)
    assert stats["noise_alignment"] == 0.5
    assert stats["normalized_noise_alignment"] == pytest.approx(1.0 / 5.0)
    assert stats["average_noise_norm"] == pytest.approx(1.5)
    assert stats["average_batch_gradient_norm"] == 4.0
    assert stats["mean_gradient_norm"] == 0.5
    assert stats["normalized_random_alignment"] == pytest.approx(2.0)
    assert stats["alignment_ratio"] == pytest.approx(0.1)
    assert stats["consensus_alignment"] == 2.0
    assert stats["normalized_consensus_alignment"] == pytest.approx(4.0 / 25.0)
    assert stats["average_consensus_norm"] == pytest.approx(3.5)
    without = summarize(noise, [], [], dimension=10, mean_gradient_norm=0.5)
    assert without["normalized_random_alignment"] is None and without["alignment_ratio"] is None
    assert "consensus_alignment" not in without
    assert norm_squared(torch.tensor([3.0, 4.0])) == 25.0
