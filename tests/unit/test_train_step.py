"""One optimizer update: accumulation, AdamW groups, clipping, non-finite stops, compiled/eager dispatch."""

from __future__ import annotations

import copy

import pytest
import torch

from tiny_llm import model as model_module
from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError
from tiny_llm.runtime import signals
from tiny_llm.runtime.device import check_sdpa_backend, compute_context
from tiny_llm.runtime.engine import NonFiniteError, UpdateAborted
from tiny_llm.runtime.optim import parameter_groups
from tiny_llm.train.engine import ModelEngine

CPU = torch.device("cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def engine(*sets: str) -> ModelEngine:
    return ModelEngine(load_recipe(["tiny"], ["training.batch_tokens=512", *sets]), CPU)


def blocks(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 512, (n, 65), generator=torch.Generator().manual_seed(seed))


def test_uneven_microbatches_match_one_full_batch() -> None:
    data = blocks(8)
    whole = engine("training.micro_batch_size=8")
    split = engine("training.micro_batch_size=3")  # 3 + 3 + 2
    grads_whole, grads_split = _recorded_grads(whole), _recorded_grads(split)
    a, b = whole.train_step(data, 1e-3, 1), split.train_step(data, 1e-3, 1)
    assert a.tokens == b.tokens == 8 * 64
    assert a.loss == pytest.approx(b.loss, rel=1e-6)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-5)
    for g, h in zip(grads_whole, grads_split, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-4, atol=1e-8)


def _recorded_grads(eng: ModelEngine) -> list[torch.Tensor]:
    """Gradients as the optimizer sees them (after accumulation and clipping)."""
    seen: list[torch.Tensor] = []
    step = eng.optimizer.step

    def recording_step() -> None:
        seen.extend(p.grad.clone() for p in eng.params)
        step()

    eng.optimizer.step = recording_step  # type: ignore[method-assign]
    return seen


def test_loss_is_the_token_mean_of_the_update() -> None:
    eng = engine("training.micro_batch_size=3")
    data = blocks(5)
    with torch.no_grad():
        expected = model_module.loss_sum(eng.model, data[:, :-1], data[:, 1:]).item() / (5 * 64)
    assert eng.train_step(data, 1e-3, 1).loss == pytest.approx(expected, rel=1e-6)


def test_adamw_groups_decay_matrices_and_embedding_only() -> None:
    eng = engine()
    decay, no_decay = eng.optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in eng.model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert "embed.weight" in decayed and "blocks.0.attn.q_proj.weight" in decayed
    assert {names[id(p)] for p in no_decay["params"]} == {
        "blocks.0.attn_norm.weight",
        "blocks.0.ffn_norm.weight",
        "blocks.1.attn_norm.weight",
        "blocks.1.ffn_norm.weight",
        "norm.weight",
    }
    assert len(parameter_groups(eng.model, 0.1)[0]["params"]) == len(decayed)


def _post_clip_norm(eng: ModelEngine) -> list[float]:
    seen: list[float] = []
    step = eng.optimizer.step

    def recording_step() -> None:
        grads = [p.grad for p in eng.params]
        seen.append(torch.nn.utils.get_total_norm(grads).item())
        step()

    eng.optimizer.step = recording_step  # type: ignore[method-assign]
    return seen


def test_clipping_logs_the_pre_clip_norm() -> None:
    eng = engine("optimizer.grad_clip=0.01")
    seen = _post_clip_norm(eng)
    stats = eng.train_step(blocks(8), 1e-3, 1)
    assert stats.grad_norm > 0.05
    assert seen[0] == pytest.approx(0.01, rel=1e-4)


def test_no_clipping_when_grad_clip_is_null() -> None:
    eng = engine("optimizer.grad_clip=null")
    seen = _post_clip_norm(eng)
    stats = eng.train_step(blocks(8), 1e-3, 1)
    assert seen[0] == pytest.approx(stats.grad_norm, rel=1e-6)


def test_non_finite_loss_stops_with_step_and_reason() -> None:
    eng = engine()
    before = [p.detach().clone() for p in eng.params]
    with torch.no_grad():
        eng.model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="step 7: non-finite loss"):
        eng.train_step(blocks(8), 1e-3, 7)
    assert torch.equal(eng.params[1], before[1])  # no optimizer step taken
    assert all(not p.grad.any() for p in eng.params)  # the gradients are discarded (zeroed in place)


def test_fused_update_skips_a_non_finite_update_on_the_device_and_every_later_one() -> None:
    eng = engine("runtime.fused_optimizer=true")
    assert eng.deferred_check and eng.optimizer.found_inf is eng.guard.found_inf
    for step in (1, 2):
        eng.train_step(blocks(8, step), 1e-3, step)
    weights = [p.detach().clone() for p in eng.params]
    state = copy.deepcopy(eng.optimizer.state_dict()["state"])
    finite = eng._compiled_loss
    eng._compiled_loss = lambda i, t: finite(i, t) * float("nan")  # type: ignore[method-assign]
    bad = eng.train_step(blocks(8, 3), 1e-3, 3)  # no host read, no exception yet
    eng._compiled_loss = finite  # type: ignore[method-assign]
    later = eng.train_step(blocks(8, 4), 1e-3, 4)  # finite, but the run already failed at step 3
    assert all(torch.equal(p, q) for p, q in zip(eng.params, weights, strict=True))
    for index, values in eng.optimizer.state_dict()["state"].items():
        assert all(torch.equal(values[k], state[index][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert bad.values is not None and torch.isnan(bad.values[0]) and later.loss == later.loss
    with pytest.raises(NonFiniteError, match=r"step 3: non-finite loss \(loss nan, grad_norm nan\)"):
        eng.check_finite()


def test_fused_update_flags_a_non_finite_first_update_numbered_0() -> None:
    eng = engine("runtime.fused_optimizer=true")  # the benchmark worker numbers its updates from 0
    weights = [p.detach().clone() for p in eng.params]
    finite = eng._compiled_loss
    eng._compiled_loss = lambda i, t: finite(i, t) * float("inf")  # type: ignore[method-assign]
    eng.train_step(blocks(8), 1e-3, 0)
    assert all(torch.equal(p, q) for p, q in zip(eng.params, weights, strict=True))
    with pytest.raises(NonFiniteError, match="step 0: non-finite loss"):
        eng.check_finite()


def test_fused_update_with_its_device_guard_equals_the_plain_fused_update() -> None:
    guarded, plain = engine("runtime.fused_optimizer=true"), engine("runtime.fused_optimizer=true")
    del plain.optimizer.found_inf
    for step in (1, 2, 3):
        a = guarded.train_step(blocks(8, step), 1e-3, step)
        b = plain.train_step(blocks(8, step), 1e-3, step)
        assert a.loss == b.loss and a.grad_norm == b.grad_norm
    assert all(torch.equal(p, q) for p, q in zip(guarded.params, plain.params, strict=True))
    guarded.check_finite()


def test_full_microbatches_compiled_short_ones_eager() -> None:
    eng = engine("training.micro_batch_size=3")
    calls: list[tuple[str, int]] = []
    eager = eng._loss
    eng._compiled_loss = lambda i, t: calls.append(("compiled", i.shape[0])) or eager(i, t)  # type: ignore[method-assign]
    eng._loss = lambda i, t: calls.append(("eager", i.shape[0])) or eager(i, t)  # type: ignore[method-assign]
    eng.train_step(blocks(8), 1e-3, 1)
    assert calls == [("compiled", 3), ("compiled", 3), ("eager", 2)]


def test_stop_between_microbatches_discards_the_update() -> None:
    eng = engine("training.micro_batch_size=2")
    before = [p.detach().clone() for p in eng.params]
    with signals.stop_on_signals():
        signals.request_stop()
        with pytest.raises(UpdateAborted):
            eng.train_step(blocks(8), 1e-3, 1)
    assert all(torch.equal(p, q) for p, q in zip(eng.params, before, strict=True))
    assert eng.optimizer.state == {} or all(not s for s in eng.optimizer.state.values())


def test_state_round_trip_continues_identically() -> None:
    a = engine()
    a.train_step(blocks(8, 1), 1e-3, 1)
    b = engine("runtime.seed=7")
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # a real resume loads fresh tensors
    sa, sb = a.train_step(blocks(8, 2), 1e-3, 2), b.train_step(blocks(8, 2), 1e-3, 2)
    assert sa.loss == sb.loss and sa.grad_norm == sb.grad_norm
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))


def test_gpu_only_sdpa_kernel_is_refused_on_cpu() -> None:
    with pytest.raises(ConfigError, match="runtime.sdpa_backend: 'cudnn' is a GPU-only kernel.*CPU"):
        check_sdpa_backend(load_recipe(["tiny"], ["runtime.sdpa_backend=cudnn"]), CPU)
    with pytest.raises(ConfigError, match="runtime.sdpa_backend: 'flash' is a GPU-only kernel.*CPU"):
        check_sdpa_backend(load_recipe(["tiny"], ["runtime.sdpa_backend=flash"]), CPU)
    check_sdpa_backend(load_recipe(["tiny"], ["runtime.sdpa_backend=math"]), CPU)


def test_forced_math_kernel_is_used() -> None:
    from tiny_llm.runtime.device import dispatched_attention_kernels

    recipe = load_recipe(["tiny"], ["runtime.sdpa_backend=math"])
    eng = ModelEngine(recipe, CPU)
    x = blocks(1)

    def run() -> None:
        with compute_context(recipe, CPU):
            model_module.loss_sum(eng.model, x[:, :-1], x[:, 1:]).backward()

    kernels = dispatched_attention_kernels(run)
    assert any("math" in k for k in kernels) and not any("flash" in k for k in kernels)


@pytest.mark.slow  # torch.compile
def test_compiled_update_matches_eager_and_honours_a_forced_kernel() -> None:
    from torch.profiler import profile

    compiled = engine("runtime.compile=true", "runtime.sdpa_backend=math")
    eager = engine("runtime.sdpa_backend=math")
    data = blocks(8)
    a, b = compiled.train_step(data, 1e-3, 1), eager.train_step(data, 1e-3, 1)
    assert a.loss == pytest.approx(b.loss, rel=1e-5) and a.grad_norm == pytest.approx(b.grad_norm, rel=1e-4)
    with profile() as prof:
        compiled.train_step(blocks(8, 1), 1e-3, 2)
    names = {e.key for e in prof.key_averages()}
    assert "aten::bmm" in names and not any("flash" in n for n in names)
