"""Gradient accumulation with persistent gradients: the update equals the textbook one, bit for bit, and
stays correct when a compiled graph hands out its gradients in memory it overwrites (CUDA graphs)."""

from __future__ import annotations

import pytest
import torch

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.model import loss_sum
from tiny_llm.runtime.engine import build_model
from tiny_llm.runtime.optim import build_optimizer, set_lr
from tiny_llm.train.engine import ModelEngine

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def recipe(micro: int) -> RecipeConfig:
    sets = ["training.batch_tokens=512", f"training.micro_batch_size={micro}", "runtime.deterministic=true"]
    return load_recipe(["tiny"], sets)


def batches(steps: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(0, 512, (8, 65), generator=gen) for _ in range(steps)]


def reference_weights(r: RecipeConfig, data: list[torch.Tensor], lrs: list[float]) -> list[torch.Tensor]:
    """The straightforward eager update: grads set to None, microbatch backward, clip, AdamW."""
    model = build_model(r, CPU)
    optimizer = build_optimizer(model, r.optimizer, fused=False)
    params = [p for p in model.parameters() if p.requires_grad]
    for blocks, lr in zip(data, lrs, strict=True):
        optimizer.zero_grad(set_to_none=True)
        num_targets = blocks.shape[0] * (blocks.shape[1] - 1)
        for micro in blocks.split(r.training.micro_batch_size):
            (loss_sum(model, micro[:, :-1], micro[:, 1:]) / num_targets).backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        torch.nn.utils.clip_grads_with_norm_(params, r.optimizer.grad_clip, norm)
        set_lr(optimizer, lr)
        optimizer.step()
    return [p.detach().clone() for p in params]


LRS = [1e-3, 3e-3, 2e-3]


@pytest.mark.parametrize("micro", [8, 4, 2])  # 1, 2 and 4 microbatches
def test_update_is_bitwise_the_reference_update(micro: int) -> None:
    r, data = recipe(micro), batches(3)
    engine = ModelEngine(r, CPU)
    for step, (blocks, lr) in enumerate(zip(data, LRS, strict=True), 1):
        engine.train_step(blocks, lr, step)
    expected = reference_weights(r, data, LRS)
    assert all(torch.equal(p, q) for p, q in zip(engine.params, expected, strict=True))


def test_gradients_are_allocated_once_and_zeroed_in_place() -> None:
    engine = ModelEngine(recipe(2), CPU)
    data = batches(2)
    engine.train_step(data[0], 1e-3, 1)
    tensors = [p.grad for p in engine.params]
    assert all(g is not None for g in tensors)
    engine.model.zero_grad(set_to_none=True)  # e.g. an outside profiling pass: the engine re-attaches its own
    engine.train_step(data[1], 1e-3, 2)
    assert all(p.grad is g for p, g in zip(engine.params, tensors, strict=True))


class _GraphOwnedGradients(torch.autograd.Function):
    """What a CUDA-graph replay does to gradients: each call returns them as fresh tensors over the same
    static memory, which the next call's backward overwrites."""

    @staticmethod
    def forward(ctx, model, inputs, targets, static, *params):  # noqa: ANN001, ANN205
        with torch.enable_grad():
            summed = loss_sum(model, inputs, targets)
            ctx.grads = torch.autograd.grad(summed, params)
        ctx.static = static
        return summed.detach()

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        for buffer, grad in zip(ctx.static, ctx.grads, strict=True):
            buffer.copy_(grad * grad_out)
        return (None, None, None, None, *(buffer.view_as(buffer) for buffer in ctx.static))


@pytest.mark.parametrize("micro", [4, 2])
def test_accumulation_survives_gradients_in_overwritten_graph_memory(micro: int) -> None:
    r, data = recipe(micro), batches(2)
    engine = ModelEngine(r, CPU)
    static = [torch.zeros_like(p) for p in engine.params]

    def graph_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return _GraphOwnedGradients.apply(engine.model, inputs, targets, static, *engine.params)

    engine._compiled_loss = graph_loss  # type: ignore[method-assign]
    for step, (blocks, lr) in enumerate(zip(data, LRS[:2], strict=True), 1):
        engine.train_step(blocks, lr, step)
    expected = reference_weights(r, data, LRS[:2])
    for p, q in zip(engine.params, expected, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)
