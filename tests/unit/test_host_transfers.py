"""Host -> device batches: pinned memory for CUDA copies, evaluation targets counted on the host."""

from __future__ import annotations

import pytest
import torch

from tiny_llm.config import load_recipe
from tiny_llm.runtime.device import pin_for, to_device
from tiny_llm.train import evaluate as evaluate_module


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
