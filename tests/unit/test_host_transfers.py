"""Host -> device batches: pinned memory for CUDA copies, evaluation targets counted on the host; the
device-side finite check of an update (no host read)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import small_recipe

from tiny_llm.config import load_recipe
from tiny_llm.engines import run_training
from tiny_llm.runtime.device import pin_for, to_device
from tiny_llm.runtime.engine import FiniteGuard
from tiny_llm.train import evaluate as evaluate_module
from tiny_llm.train import loop


def test_host_batches_are_pinned_only_for_cuda() -> None:
    batch = torch.arange(6).reshape(2, 3)
    assert pin_for(batch, torch.device("cpu")) is batch
    assert to_device(batch, torch.device("cpu")) is batch
    if torch.cuda.is_available():
        cuda = torch.device("cuda")
        assert pin_for(batch, cuda).is_pinned() and not batch.is_pinned()
        assert torch.equal(to_device(batch, cuda).cpu(), batch)


def test_evaluation_counts_targets_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Device copies (here: meta tensors, which cannot be read back) are never read on the host."""
    seen: list[torch.device] = []

    def fake_losses(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        seen.append(targets.device)
        return torch.ones(targets.shape, dtype=torch.float32)

    monkeypatch.setattr(evaluate_module, "to_device", lambda t, device: t.to("meta"))
    monkeypatch.setattr(evaluate_module, "token_losses", fake_losses)
    targets = torch.arange(12).reshape(2, 6)
    targets[1, 3:] = -100
    batches = [(torch.zeros(2, 6, dtype=torch.long), targets)] * 3
    loss, count = evaluate_module.evaluate_batches(
        torch.nn.Identity(), batches, load_recipe(["tiny"]), torch.device("cpu")
    )
    assert count == 3 * 9 and seen == [torch.device("meta")] * 3
    assert loss == pytest.approx(3 * 12 / 27)


def test_validation_subset_batches_reach_the_copy_contiguous(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA copy of a non-contiguous view (a subset block's first or last L tokens) goes through a pageable
    contiguous copy, pinned or not, and blocks the host; the subset's batches are contiguous copies."""
    blocks = torch.arange(7 * 9).reshape(7, 9)  # 7 blocks of L + 1 = 9 tokens: batches of 3, 3 and 1
    copied: list[torch.Tensor] = []
    monkeypatch.setattr(evaluate_module, "to_device", lambda t, device: copied.append(t) or t)
    monkeypatch.setattr(
        evaluate_module, "token_losses", lambda model, inputs, targets: torch.ones(targets.shape)
    )
    batches = evaluate_module.subset_batches(blocks, 3)
    _, count = evaluate_module.evaluate_batches(
        torch.nn.Identity(), batches, load_recipe(["tiny"]), torch.device("cpu")
    )
    assert count == 7 * 8 and len(copied) == 2 * 3
    assert all(t.is_contiguous() for t in copied)
    assert torch.equal(torch.cat([i for i, _ in batches]), blocks[:, :-1])
    assert torch.equal(torch.cat([t for _, t in batches]), blocks[:, 1:])


def test_validation_subset_batches_bound_for_cuda_are_pinned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Made for a CUDA device, the batches are pinned when made (contiguous first), so the copies of every
    evaluation that reuses them find them pinned. (Pinning itself needs CUDA: faked here, real below.)"""
    pinned: list[tuple[bool, torch.device]] = []
    monkeypatch.setattr(
        evaluate_module, "pin_for", lambda t, device: pinned.append((t.is_contiguous(), device)) or t
    )
    blocks = torch.arange(5 * 9).reshape(5, 9)
    cuda = torch.device("cuda")
    assert len(evaluate_module.subset_batches(blocks, 2, cuda)) == 3
    assert pinned == [(True, cuda)] * 6
    pinned.clear()
    evaluate_module.subset_batches(blocks, 2)  # no device: nothing to pin for
    assert pinned == []
    monkeypatch.undo()
    if torch.cuda.is_available():
        batches = evaluate_module.subset_batches(blocks, 2, cuda)
        assert all(i.is_pinned() and t.is_pinned() and i.is_contiguous() for i, t in batches)


@pytest.mark.slow  # a 28-update run, ~5 s
def test_a_run_pins_its_validation_batches_once_per_session(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three epochs, three subset validations: the subset's batches are made (and pinned, bound for CUDA)
    once, when the session starts, and every validation gets those same tensors."""
    pinned: list[torch.Tensor] = []
    seen: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    pin, evaluate = evaluate_module.pin_for, loop.evaluate
    monkeypatch.setattr(evaluate_module, "pin_for", lambda t, device: pinned.append(t) or pin(t, device))

    def watched(model: torch.nn.Module, batches: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("split") == "subset":
            seen.append(batches)
        return evaluate(model, batches, *args, **kwargs)

    monkeypatch.setattr(loop, "evaluate", watched)
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, tmp_path / "run"), quiet=True) == 0
    assert len(seen) == 3 and all(batches is seen[0] for batches in seen)
    assert len(pinned) == 2 * len(seen[0])  # inputs and targets of each batch, once
    assert {id(t) for batch in seen[0] for t in batch} == {id(t) for t in pinned}


def test_finite_guard_flags_are_fp32_whatever_the_default_dtype() -> None:
    """The fused Adam/AdamW CUDA kernels take only an FP32 found_inf."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        guard = FiniteGuard(torch.device("cpu"), 2)
        guard.flag(torch.tensor([1.0, float("inf")]), 3)
    finally:
        torch.set_default_dtype(previous)
    assert guard.found_inf.dtype == torch.float32 and guard.bad_values.dtype == torch.float32
    assert float(guard.found_inf) == 1.0 and guard.first_bad() == (3, [1.0, float("inf")])
