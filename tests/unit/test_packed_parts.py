"""Packed building blocks: arena layout, mixing matrices, per-worker clipping, packed AdamW, config rules."""

from __future__ import annotations

import pytest
import torch

from tiny_llm.budget import make_budget
from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError
from tiny_llm.packed.layout import PAD, ArenaLayout
from tiny_llm.packed.mixing import (
    consensus_schedule,
    mix_,
    mix_tensor_lists_,
    peers,
)
from tiny_llm.packed.optim import PackedAdamW, clip_per_worker_

TOPOLOGIES = ("complete", "one_peer_ring", "one_peer_exponential")


# The matrix mix_ applies, written out densely (the reference the in-place mixing is checked against).
def mixing_matrix(topology: str, num_models: int, step: int, gamma: float = 1.0) -> torch.Tensor:
    """``W' = gamma W + (1 - gamma) I`` in float64; row i holds worker i's weights over all workers."""
    n = num_models
    if topology == "complete":
        w = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    else:
        w = 0.5 * torch.eye(n, dtype=torch.float64)
        for i, j in enumerate(peers(topology, n, step)):
            w[i, j] += 0.5
    return gamma * w + (1.0 - gamma) * torch.eye(n, dtype=torch.float64)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_layout_pads_entries_to_64_and_views_alias_the_arena():
    layout = ArenaLayout.from_shapes([("a", (3, 5)), ("b", (7,)), ("c", (64,))])
    assert [e.start for e in layout.entries] == [0, 64, 128]
    assert layout.width == 192 and layout.numel == 15 + 7 + 64
    assert all(e.start % PAD == 0 for e in layout.entries)
    arena = torch.zeros(2, layout.width)
    layout.views(arena)["a"][1, 2, 4] = 5.0
    assert arena[1, 14] == 5.0
    mask = layout.decay_mask()
    assert mask[:15].all() and not mask[15:].any()  # only the 2-D entry decays; padding never


def test_hand_computed_peers():
    # worker i averages with worker (i - offset) mod N
    assert peers("one_peer_ring", 4, 0) == [3, 0, 1, 2]  # offset +1
    assert peers("one_peer_ring", 4, 1) == [1, 2, 3, 0]  # offset -1: the direction alternates
    assert peers("one_peer_ring", 4, 2) == [3, 0, 1, 2]
    assert [peers("one_peer_exponential", 8, t)[0] for t in range(4)] == [7, 6, 4, 7]  # offsets 1, 2, 4, 1
    assert [peers("one_peer_exponential", 4, t)[0] for t in range(3)] == [3, 2, 3]  # offsets 1, 2, 1
    w = mixing_matrix("one_peer_exponential", 4, 1)
    expected = torch.tensor(
        [[0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5]], dtype=torch.float64
    )
    assert torch.equal(w, expected)
    assert torch.equal(mixing_matrix("complete", 4, 7), torch.full((4, 4), 0.25, dtype=torch.float64))


@pytest.mark.parametrize("topology", TOPOLOGIES)
@pytest.mark.parametrize("n", [2, 4, 8])
def test_mixing_matrices_are_doubly_stochastic(topology, n):
    for step in range(5):
        for gamma in (1.0, 0.3):
            w = mixing_matrix(topology, n, step, gamma)
            ones = torch.ones(n, dtype=torch.float64)
            assert torch.allclose(w.sum(0), ones) and torch.allclose(w.sum(1), ones)
            assert (w >= 0).all()


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_in_place_mixing_applies_the_matrix(topology):
    torch.manual_seed(0)
    n, d = 8, 130
    for step in range(4):
        for gamma in (1.0, 0.25):
            arena = torch.randn(n, d)
            expected = (mixing_matrix(topology, n, step, gamma) @ arena.double()).float()
            lists = [[row.clone()] for row in arena]
            mix_(arena, topology, step, gamma, torch.empty_like(arena))
            torch.testing.assert_close(arena, expected, rtol=0, atol=1e-6)
            mix_tensor_lists_(lists, topology, step, gamma)  # the sequential baseline agrees
            torch.testing.assert_close(torch.stack([t[0] for t in lists]), arena, rtol=0, atol=1e-6)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_masked_mixing_keeps_the_arena_on_a_skip_and_mixes_the_same_bits_otherwise(topology):
    torch.manual_seed(1)
    n, d = 8, 130
    for step in range(4):  # one-peer offsets 1, 2, 4 (exponential) and both ring directions
        for gamma in (1.0, 0.25):
            arena = torch.randn(n, d)
            plain, kept, skipped = arena.clone(), arena.clone(), arena.clone()
            mix_(plain, topology, step, gamma, torch.empty_like(arena))
            mix_(kept, topology, step, gamma, torch.empty_like(arena), keep=torch.zeros(()))
            mix_(skipped, topology, step, gamma, torch.empty_like(arena), keep=torch.ones(()))
            assert torch.equal(kept, plain) and torch.equal(skipped, arena)


def test_adaptive_consensus_gamma():
    lrs = [0.1, 0.2, 0.4, 0.3, 0.2, 0.1]
    sched = consensus_schedule(start_frac=0.5, p=2.0, step_lrs=lrs)
    assert sched.start_step == 3 and sched.lr_max == 0.3  # max over the active steps only
    assert sched.gamma(2, 0.4) == 1.0
    assert sched.gamma(3, 0.3) == 1.0
    assert sched.gamma(5, 0.1) == pytest.approx((0.1 / 0.3) ** 2)
    flat = consensus_schedule(start_frac=0.5, p=0.0, step_lrs=[*lrs, 0.0])  # p = 0: full mixing (gamma 1)
    assert [flat.gamma(s, lr) for s, lr in enumerate([*lrs, 0.0])] == [1.0] * 7
    assert load_recipe(["packed4-tiny"], ["decentralized.adaptive_consensus={start_frac: 0.5, p: 0}"])


def test_per_worker_clipping_matches_clip_grad_norm():
    torch.manual_seed(1)
    grads = torch.randn(3, 100) * torch.tensor([[0.01], [1.0], [5.0]])
    expected = []
    for row in grads:
        param = torch.nn.Parameter(torch.zeros(100))
        param.grad = row.clone()
        norm = torch.nn.utils.clip_grad_norm_([param], 1.0)
        expected.append((norm, param.grad))
    norms = clip_per_worker_(grads, 1.0)
    for i, (norm, grad) in enumerate(expected):
        torch.testing.assert_close(norms[i], norm)
        torch.testing.assert_close(grads[i], grad)
    assert norms[0] < 1 and torch.linalg.vector_norm(grads[2]) == pytest.approx(1.0, rel=1e-5)
    unclipped = torch.randn(2, 10) * 5
    before = unclipped.clone()
    norms = clip_per_worker_(unclipped, None)  # null clip: norms logged, gradients untouched
    assert torch.equal(unclipped, before) and torch.allclose(norms, before.norm(dim=1))


@pytest.mark.parametrize("fused", [False, True])
def test_packed_adamw_matches_torch_adamw_per_worker(fused):
    torch.manual_seed(2)
    recipe = load_recipe(["tiny"], ["optimizer.weight_decay=0.1", "optimizer.beta1=0.8"])
    layout = ArenaLayout.from_shapes([("w", (4, 6)), ("scale", (6,))])
    n = 3
    params = torch.zeros(n, layout.width)
    for view in layout.views(params).values():
        view.copy_(torch.randn(view.shape))
    grads = torch.zeros_like(params)
    opt = PackedAdamW(params, grads, layout.decay_mask(), recipe.optimizer, fused=fused)
    refs = []
    for i in range(n):
        w = torch.nn.Parameter(layout.views(params)["w"][i].clone())
        s = torch.nn.Parameter(layout.views(params)["scale"][i].clone())
        o = recipe.optimizer
        refs.append(
            (
                w,
                s,
                torch.optim.AdamW(
                    [{"params": [w], "weight_decay": o.weight_decay}, {"params": [s], "weight_decay": 0.0}],
                    lr=o.lr,
                    betas=(o.beta1, o.beta2),
                    eps=o.eps,
                ),
            )
        )
    for step, lr in enumerate([1e-2, 3e-3, 5e-3]):
        for view in layout.views(grads).values():
            view.copy_(torch.randn(view.shape))
        opt.step(lr)
        for i, (w, s, ref) in enumerate(refs):
            w.grad, s.grad = layout.views(grads)["w"][i].clone(), layout.views(grads)["scale"][i].clone()
            for group in ref.param_groups:
                group["lr"] = lr
            ref.step()
            atol = 1e-6 if fused else 1e-7  # the fused kernel rounds in another order
            torch.testing.assert_close(layout.views(params)["w"][i], w.detach(), rtol=0, atol=atol)
            torch.testing.assert_close(layout.views(params)["scale"][i], s.detach(), rtol=0, atol=atol)
        assert opt.steps_taken() == step + 1
    assert not params[:, 24:64].any()  # padding stays zero


def test_packed_budget_epochs_are_multiples_of_num_models():
    for preset, n in (("packed4-tiny", 4), ("packed4-20m-awc", 4), ("packed8-20m-awc", 8)):
        budget = make_budget(load_recipe([preset]))
        assert all(b % n == 0 for b in budget.epoch_boundaries)
        assert all(sum(budget.epoch_updates(e)) % n == 0 for e in range(budget.num_epochs))
    assert make_budget(load_recipe(["packed4-20m-awc"])).num_updates == 3120


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["training.batch_tokens=2048"], "num_models x micro_batch_size x context_length = 1024"),
        (["decentralized.num_models=3"], "= 768, got 1024"),
        (["training.epoch_tokens_per_parameter=0.0001"], "positive multiple of decentralized.num_models=4"),
        (
            [
                "decentralized.num_models=3",
                "decentralized.topology=one_peer_ring",
                "training.batch_tokens=768",
            ],
            "one_peer_ring needs an even num_models",
        ),
        (["decentralized.topology=star"], "decentralized.topology: expected one of"),
        (["decentralized.adaptive_consensus={start_frac: 2, p: 1}"], "adaptive_consensus"),
        (
            ["decentralized.adaptive_consensus={start_frac: 0.5, p: -1}"],
            "adaptive_consensus.p: must be >= 0, got -1",
        ),
    ],
)
def test_packed_config_errors(sets, needle):
    with pytest.raises(ConfigError) as info:
        load_recipe(["packed4-tiny"], sets)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_packed_presets_are_valid():
    for name in ("packed4-20m-awc", "packed4-20m-atc", "packed8-20m-awc", "packed4-tiny", "packed4-demo"):
        recipe = load_recipe([name])
        assert recipe.decentralized is not None
    awc, atc, p8 = (load_recipe([n]) for n in ("packed4-20m-awc", "packed4-20m-atc", "packed8-20m-awc"))
    assert (awc.optimizer.lr, awc.optimizer.beta1, awc.optimizer.beta2) == (0.008, 0.95, 0.99)
    assert (atc.optimizer.lr, atc.decentralized.scheme) == (0.0056, "atc")
    assert (p8.decentralized.num_models, p8.training.micro_batch_size, p8.optimizer.beta2) == (8, 16, 0.999)
