"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Toy shapes run fastest, and steadiest on a shared CI box, on one thread; restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def restore_torch_globals() -> Iterator[None]:
    """setup_runtime sets process-wide torch state (threads, determinism); keep other tests unaffected."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    yield
    torch.set_num_threads(threads)
    if torch.are_deterministic_algorithms_enabled() != deterministic:  # the call imports torch._inductor
        torch.use_deterministic_algorithms(deterministic)
