"""PackedEngine against ordinary models: equivalence, AWC/ATC order, averaging, state, exports."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from packed_helpers import CPU, batches, packed_recipe, straight_and_resumed
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tiny_llm.config import load_recipe
from tiny_llm.model import Llama, loss_sum
from tiny_llm.packed.engine import PackedEngine, split_workers
from tiny_llm.runtime.engine import NonFiniteError
from tiny_llm.train.engine import ModelEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_split_workers_gives_worker_i_samples_i_plus_kn():
    blocks = torch.arange(12).view(6, 2)
    workers = split_workers(blocks, 3)
    assert workers[:, :, 0].tolist() == [[0, 6], [2, 8], [4, 10]]
    with pytest.raises(ValueError):
        split_workers(torch.zeros(5, 2), 3)


def test_packed_without_mixing_equals_independent_ordinary_models():
    recipe = packed_recipe("optimizer.grad_clip=0.8")  # worker norms start near 0.78: some updates clip
    engine = PackedEngine(recipe, CPU, mix=False)
    single = load_recipe(
        ["packed4-tiny"], ["decentralized=null", "training.batch_tokens=256", "optimizer.grad_clip=0.8"]
    )
    ordinary = [ModelEngine(single, CPU) for _ in range(2)]  # same seed: same init as every worker
    data = batches(recipe, 3)
    for step, blocks in enumerate(data):
        lr = 3e-3 * (step + 1)
        stats = engine.train_step(blocks, lr, step + 1)
        for i, model in enumerate(ordinary):
            ref = model.train_step(blocks[i::2], lr, step + 1)
            assert stats.extra["local_losses"][i] == pytest.approx(ref.loss, rel=1e-6, abs=1e-6)
            assert stats.extra["local_grad_norms"][i] == pytest.approx(ref.grad_norm, rel=1e-5)
        assert stats.extra["mixing_gamma"] == 0.0 and stats.extra["mixing_step"] is None
        assert stats.tokens == 512 and stats.extra["update_tokens_per_model"] == 256
    for i, model in enumerate(ordinary):
        for name, param in model.model.named_parameters():
            packed = engine.model.layout.views(engine.model.arena)[name][i]
            torch.testing.assert_close(packed, param.detach(), rtol=0, atol=2e-6)


def test_all_workers_start_from_the_ordinary_init():
    recipe = packed_recipe()
    engine = PackedEngine(recipe, CPU)
    reference = ModelEngine(load_recipe(["tiny"]), CPU).model
    for name, param in reference.named_parameters():
        views = engine.model.layout.views(engine.model.arena)[name]
        assert torch.equal(views[0], param.detach()) and torch.equal(views[1], param.detach())


class LargeOutputs(TorchDispatchMode):
    """Records every operator that returns a tensor of at least ``numel`` elements outside ``storage``."""

    def __init__(self, numel: int, storage: torch.Tensor) -> None:
        super().__init__()
        self.numel, self.storage, self.found = numel, storage.untyped_storage().data_ptr(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            big = isinstance(t, torch.Tensor) and t.numel() >= self.numel
            if big and t.untyped_storage().data_ptr() != self.storage:
                self.found.append(f"{func} -> {tuple(t.shape)}")
        return out


def test_packed_embedding_reads_the_arena_without_copying_the_table():
    recipe = packed_recipe()
    engine = PackedEngine(recipe, CPU)
    model = engine.model
    table = model.weight("embed.weight")  # [2, 512, 64]: 65,536 elements
    blocks = torch.randint(0, recipe.model.vocab_size, (2, 9))
    inputs = split_workers(blocks, 2)[..., :-1]  # [2, 1, 8], strided as in training; activations are small
    with LargeOutputs(table.numel(), model.arena) as probe:
        logits = model(inputs)
    assert logits.numel() < table.numel() and probe.found == []


def toy_update(scheme: str) -> torch.Tensor:
    """Two workers at 1 and 3 with gradients +1 and -1; one AdamW step (lr 0.1, wd 0.1), complete mixing."""
    recipe = packed_recipe(
        f"decentralized.scheme={scheme}",
        "decentralized.topology=complete",
        "optimizer.weight_decay=0.1",
        "optimizer.eps=1.0e-12",
    )
    engine = PackedEngine(recipe, CPU)
    engine.model.arena.copy_(torch.tensor([[1.0], [3.0]]).expand_as(engine.model.arena))
    engine.model.grad_arena.copy_(torch.tensor([[1.0], [-1.0]]).expand_as(engine.model.grad_arena))
    engine.apply_update(lr=0.1, update=0, gamma=1.0)
    return engine.model.layout.views(engine.model.arena)["embed.weight"][:, 0, 0]


def test_awc_mixes_then_steps_with_pre_mix_gradients_and_atc_steps_then_mixes():
    # AWC: mix -> both 2; decay -> 1.98; Adam's first step moves by lr * sign(g): 1.88 and 2.08.
    torch.testing.assert_close(toy_update("awc"), torch.tensor([1.88, 2.08]))
    # ATC: step -> 1 * 0.99 - 0.1 = 0.89 and 3 * 0.99 + 0.1 = 3.07; mix -> 1.98 for both.
    torch.testing.assert_close(toy_update("atc"), torch.tensor([1.98, 1.98]))


def test_mixing_follows_the_topology_each_step():
    recipe = load_recipe(["packed4-tiny"])
    engine = PackedEngine(recipe, CPU)
    rows = torch.arange(4.0).view(4, 1)
    engine.model.arena.copy_(rows.expand_as(engine.model.arena))
    engine.mix_params(update=1, gamma=1.0)  # exponential, N=4, second update: offset 2
    torch.testing.assert_close(engine.model.arena[:, 0], torch.tensor([1.0, 2.0, 1.0, 2.0]))


def test_step_stats_name_the_mixing_step():
    engine = PackedEngine(load_recipe(["packed4-tiny"]), CPU)  # exponential, N=4: offsets 1, 2, 1, ...
    assert engine.mixing_facts(update=1, gamma=1.0) == {
        "mixing_step": 1,
        "mixing_peer_offset": 2,
        "consensus_active": False,
    }
    assert engine.mixing_facts(update=2, gamma=0.0)["mixing_step"] is None  # gamma 0: nothing mixed
    complete = PackedEngine(packed_recipe("decentralized.topology=complete"), CPU)
    assert complete.mixing_facts(update=3, gamma=1.0)["mixing_peer_offset"] is None
    adaptive = PackedEngine(packed_recipe("decentralized.adaptive_consensus={start_frac: 0.5, p: 1.0}"), CPU)
    start = adaptive.consensus.start_step
    assert not adaptive.mixing_facts(start - 1, 1.0)["consensus_active"]
    assert adaptive.mixing_facts(start, 0.5)["consensus_active"]
    stats = adaptive.train_step(batches(adaptive.recipe, 1)[0], 1e-3, 1)
    assert stats.extra["mixing_step"] == 0 and stats.extra["mixing_peer_offset"] == 1


def test_per_worker_clipping_in_the_engine():
    recipe = packed_recipe("optimizer.grad_clip=0.5")
    engine = PackedEngine(recipe, CPU)
    engine.forward_backward(batches(recipe, 1)[0])
    before = torch.linalg.vector_norm(engine.model.grad_arena, dim=1)
    norms = engine.clip()
    torch.testing.assert_close(norms, before)
    after = torch.linalg.vector_norm(engine.model.grad_arena, dim=1)
    torch.testing.assert_close(after, torch.minimum(before, torch.tensor(0.5)), rtol=1e-5, atol=0)


def test_averaged_evaluation_equals_the_mean_weights():
    recipe = packed_recipe("decentralized.topology=one_peer_ring")
    engine = PackedEngine(recipe, CPU, mix=False)
    for step, blocks in enumerate(batches(recipe, 2)):
        engine.train_step(blocks, 1e-2, step + 1)
    workers = [engine.model.worker_state_dict(i) for i in range(2)]
    assert not torch.equal(workers[0]["embed.weight"], workers[1]["embed.weight"])
    manual = Llama(recipe.model)
    manual.load_state_dict({k: (workers[0][k] + workers[1][k]) / 2 for k in workers[0]})
    model = engine.eval_model()
    val = batches(recipe, 1, seed=9)[0]
    with torch.no_grad():
        got = loss_sum(model, val[:, :-1], val[:, 1:])
        want = loss_sum(manual, val[:, :-1], val[:, 1:])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_packed_state_resumes_bitwise():
    recipe = packed_recipe("decentralized.adaptive_consensus={start_frac: 0.01, p: 1.0}")
    straight, resumed = straight_and_resumed(recipe, batches(recipe, 4, seed=3), lambda step: 1e-2 / step)
    assert torch.equal(resumed.model.arena, straight.model.arena)
    assert torch.equal(resumed.optimizer.exp_avg_sq, straight.optimizer.exp_avg_sq)
    other = PackedEngine(load_recipe(["packed4-tiny"]), CPU)  # four workers cannot load a two-worker state
    with pytest.raises(ValueError):
        other.load_state_dict(resumed.state_dict())


def test_short_update_and_non_finite_loss():
    recipe = packed_recipe()
    engine = PackedEngine(recipe, CPU)
    stats = engine.train_step(batches(recipe, 1)[0][:6], 1e-3, 1)  # 3 blocks per worker instead of 4
    assert stats.tokens == 6 * 64 and stats.extra["update_tokens_per_model"] == 3 * 64
    engine.model.arena.mul_(float("nan"))
    with pytest.raises(NonFiniteError):
        engine.train_step(batches(recipe, 1)[0], 1e-3, 2)


def test_export_writes_average_and_per_worker_files(tmp_path):
    recipe = packed_recipe()
    engine = PackedEngine(recipe, CPU)
    engine.train_step(batches(recipe, 1)[0], 1e-2, 1)
    engine.export_weights(tmp_path / "epoch-001.safetensors")
    root = load_file(tmp_path / "epoch-001.safetensors")
    nodes = [load_file(tmp_path / f"node-{i:03d}" / "epoch-001.safetensors") for i in range(2)]
    assert set(root) == {name for name, _ in Llama(recipe.model).named_parameters()}
    for name, value in root.items():
        torch.testing.assert_close(value, (nodes[0][name] + nodes[1][name]) / 2)


FUSED_MIXING = {
    "awc-exponential": ("decentralized.topology=one_peer_exponential",),
    "atc-ring-clipped": ("decentralized.scheme=atc", "decentralized.topology=one_peer_ring"),
    "complete-adaptive": (
        "decentralized.topology=complete",
        "decentralized.adaptive_consensus={start_frac: 0.01, p: 1.0}",
    ),
}


def fused_engine(*sets: str) -> PackedEngine:
    return PackedEngine(packed_recipe("runtime.fused_optimizer=true", "optimizer.grad_clip=0.7", *sets), CPU)


@pytest.mark.parametrize("sets", FUSED_MIXING.values(), ids=FUSED_MIXING.keys())
def test_fused_update_with_its_device_guard_equals_the_read_per_update(sets):
    """The sync-free update (device guard, clipping always applied, masked mixing) gives the same bits as the
    fused update that reads every update's values, and the same logged values."""
    guarded, plain = fused_engine(*sets), fused_engine(*sets)
    assert guarded.guard is not None and guarded.optimizer.found_inf is guarded.guard.found_inf
    plain.guard, plain.optimizer.found_inf = None, None
    clipped = False
    for step, blocks in enumerate(batches(guarded.recipe, 4, seed=5), start=1):
        lr = 3e-2 / step
        a, b = guarded.train_step(blocks, lr, step), plain.train_step(blocks, lr, step)
        assert a.values is not None and b.values is None  # nothing read yet
        assert a.loss == pytest.approx(b.loss, rel=1e-12) and a.grad_norm == b.grad_norm
        assert a.extra == b.extra
        clipped |= max(b.extra["local_grad_norms"]) > 0.7
    assert clipped  # the clipping pass ran with a coefficient below 1
    assert torch.equal(guarded.model.arena, plain.model.arena)
    for name in ("exp_avg", "exp_avg_sq", "step"):
        assert torch.equal(
            torch.as_tensor(guarded.optimizer.state_dict()[name]),
            torch.as_tensor(plain.optimizer.state_dict()[name]),
        )
    guarded.check_finite()


@pytest.mark.parametrize("sets", FUSED_MIXING.values(), ids=FUSED_MIXING.keys())
def test_fused_packed_update_skips_a_non_finite_update_on_the_device_and_every_later_one(sets):
    engine = fused_engine(*sets)
    data = batches(engine.recipe, 5, seed=7)
    for step in (1, 2):
        engine.train_step(data[step - 1], 1e-2, step)
    arena = engine.model.arena.clone()
    state = copy.deepcopy(engine.optimizer.state_dict())
    finite = engine._loss
    engine._loss = engine._compiled_loss = lambda i, t: finite(i, t) * torch.tensor([float("nan"), 1.0])
    bad = engine.train_step(data[2], 1e-2, 3)  # worker 0's loss is NaN: no host read, no exception yet
    engine._loss = engine._compiled_loss = finite
    later = engine.train_step(data[3], 1e-2, 4)  # finite, but the run already failed at step 3
    assert torch.equal(engine.model.arena, arena)
    after = engine.optimizer.state_dict()
    assert after["step"] == state["step"] == 2
    assert torch.equal(after["exp_avg"], state["exp_avg"]) and torch.equal(
        after["exp_avg_sq"], state["exp_avg_sq"]
    )
    assert math.isnan(bad.loss) and math.isfinite(later.loss)
    with pytest.raises(NonFiniteError, match=r"step 3: non-finite loss \(local losses \[nan, "):
        engine.check_finite()


def test_unfused_packed_update_reads_every_update():
    engine = PackedEngine(packed_recipe(), CPU)
    assert engine.guard is None and not engine.optimizer.fused
    stats = engine.train_step(batches(engine.recipe, 1)[0], 1e-3, 1)
    assert stats.values is None and isinstance(stats.extra["local_losses"], list)
