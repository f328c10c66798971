"""Packed Muon: one batched Newton-Schulz chain per matrix shape for all workers, AdamW on the rest; against
N ordinary Muon runs, with mixing, its device-side skip of a non-finite update and its state."""

from __future__ import annotations

import copy

import packed_helpers as packed
import pytest
import torch
from host_reads import HostReads
from packed_helpers import CPU, batches, straight_and_resumed
from torch.optim._muon import _zeropower_via_newtonschulz

from tiny_llm.bench.packed import SequentialRunner
from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.packed.muon import PackedMuon, batched_newton_schulz, shape_groups
from tiny_llm.runtime.engine import NonFiniteError
from tiny_llm.runtime.optim import hidden_matrices

MUON = ["optimizer.name=muon", "optimizer.grad_clip=0.5"]  # worker norms start near 0.78: updates clip
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def packed_recipe(*sets: str) -> RecipeConfig:
    return packed.packed_recipe(*MUON, *sets)


@pytest.mark.parametrize("shape", [(64, 64), (172, 64), (64, 172)], ids=["square", "tall", "wide"])
def test_batched_newton_schulz_is_torchs_per_matrix(shape: tuple[int, int]) -> None:
    grads = torch.randn(3, *shape, generator=torch.Generator().manual_seed(1))
    want = torch.stack([_zeropower_via_newtonschulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7) for g in grads])
    assert torch.equal(batched_newton_schulz(grads, 5), want)


def test_the_layout_groups_the_hidden_matrices_by_shape_after_the_rest() -> None:
    engine = PackedEngine(packed_recipe(), CPU)
    assert isinstance(engine.optimizer, PackedMuon)
    layout = engine.model.layout
    split, groups = shape_groups(layout)
    names = [e.name for e in layout.entries]
    assert names[:2] == ["embed.weight", "blocks.0.attn_norm.weight"] and split == layout.entries[6].start
    assert [(g.shape, g.count) for g in groups] == [((64, 64), 8), ((172, 64), 4), ((64, 172), 2)]
    views = layout.views(engine.model.arena)
    q1 = groups[0].view(engine.model.arena)[:, 4]  # the second block's q_proj
    assert q1.data_ptr() == views["blocks.1.attn.q_proj.weight"].data_ptr()


def follow(
    engine: PackedEngine, sequential: SequentialRunner, blocks: torch.Tensor, lr: float, step: int
) -> None:
    """One packed update, and the same update of N ordinary models (torch's Muon and AdamW) given each
    worker's clipped gradients, mixed as the packed benchmark's sequential baseline mixes them."""
    engine.forward_backward(blocks)
    engine.clip()
    grads = engine.model.layout.views(engine.model.grad_arena)
    for i, model in enumerate(sequential.models):
        for name, param in model.named_parameters():
            param.grad = grads[name][i].clone()
    gamma = engine.gamma(lr, step - 1)
    engine.apply_update(lr, step - 1, gamma)
    if engine.scheme == "atc":
        sequential.optimize(lr)
    if gamma:
        sequential.mix(step - 1)
    if engine.scheme == "awc":
        sequential.optimize(lr)


MIXING = {
    "independent": (),
    "awc-ring": ("decentralized.topology=one_peer_ring",),
    "atc-complete": ("decentralized.scheme=atc", "decentralized.topology=complete"),
}


@pytest.mark.parametrize("sets", MIXING.values(), ids=MIXING.keys())
def test_packed_muon_equals_n_ordinary_muon_runs(sets: tuple[str, ...]) -> None:
    """From the same initial weights and the same gradients, packed Muon (with or without AWC/ATC mixing)
    gives what torch.optim.Muon and AdamW give N ordinary models, within FP32 rounding. (The full updates
    differ more: the batched forward and backward round their FP32 gradients differently, and
    Newton-Schulz in BF16 turns a last-bit difference into a BF16 one.)"""
    recipe = packed_recipe(*sets)
    engine = PackedEngine(recipe, CPU, mix=bool(sets))
    sequential = SequentialRunner(recipe, CPU)  # same seed: same init as every worker
    assert len(hidden_matrices(sequential.models[0])) == 14
    for step, blocks in enumerate(batches(recipe, 3), start=1):
        follow(engine, sequential, blocks, 3e-3 * step, step)
    for i, model in enumerate(sequential.models):
        for name, param in model.named_parameters():
            packed = engine.model.layout.views(engine.model.arena)[name][i]
            torch.testing.assert_close(packed, param.detach(), rtol=0, atol=2e-6)


def fused_engine(*sets: str) -> PackedEngine:
    return PackedEngine(packed_recipe("runtime.fused_optimizer=true", *sets), CPU)


def test_the_guarded_update_is_the_plain_one_and_reads_nothing_on_the_host() -> None:
    guarded, plain = fused_engine(), fused_engine()
    assert guarded.guard is not None and guarded.optimizer.found_inf is guarded.guard.found_inf
    assert guarded.optimizer.adamw.found_inf is guarded.guard.found_inf
    plain.guard, plain.optimizer.found_inf = None, None
    for step, blocks in enumerate(batches(guarded.recipe, 3, seed=5), start=1):
        with HostReads() as reads:
            guarded.train_step(blocks, 3e-3, step)
        assert reads.count == 0, reads.what
        plain.train_step(blocks, 3e-3, step)
    assert torch.equal(guarded.model.arena, plain.model.arena)
    guarded.check_finite()


def assert_same_state(a: dict, b: dict) -> None:
    assert a["adamw"]["step"] == b["adamw"]["step"]
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(a["adamw"][key], b["adamw"][key])
    assert all(torch.equal(x, y) for x, y in zip(a["muon"]["momentum"], b["muon"]["momentum"], strict=True))


def test_a_non_finite_update_is_skipped_on_the_device_and_names_its_step() -> None:
    """A NaN in worker 0's loss at update 3 leaves every weight and state as after update 2."""
    engine = fused_engine()
    data = batches(engine.recipe, 4, seed=7)
    for step in (1, 2):
        engine.train_step(data[step - 1], 3e-3, step)
    arena, state = engine.model.arena.clone(), copy.deepcopy(engine.optimizer.state_dict())
    finite = engine._loss
    engine._loss = engine._compiled_loss = lambda i, t: finite(i, t) * torch.tensor([float("nan"), 1.0])
    with HostReads() as reads:
        engine.train_step(data[2], 3e-3, 3)
    assert reads.count == 0
    engine._loss = engine._compiled_loss = finite
    engine.train_step(data[3], 3e-3, 4)  # finite, but the run failed at step 3: skipped too
    assert torch.equal(engine.model.arena, arena)
    assert_same_state(engine.optimizer.state_dict(), state)
    with pytest.raises(NonFiniteError, match=r"step 3: non-finite loss \(local losses \[nan, "):
        engine.check_finite()


def test_packed_muon_state_resumes_bitwise_and_refuses_an_adamw_state() -> None:
    recipe = packed_recipe()
    straight, resumed = straight_and_resumed(recipe, batches(recipe, 4, seed=3), lambda step: 3e-3)
    assert torch.equal(resumed.model.arena, straight.model.arena)
    assert_same_state(resumed.optimizer.state_dict(), straight.optimizer.state_dict())
    adamw = PackedEngine(
        load_recipe(["packed4-tiny"], ["decentralized.num_models=2", "training.batch_tokens=512"]), CPU
    )
    with pytest.raises(ValueError, match="not a packed Muon\\+AdamW optimizer state"):
        resumed.optimizer.load_state_dict(adamw.optimizer.state_dict())
