"""Host reads counted, not assumed: the fused update of the ordinary, graph (uncaptured) and packed engines
reads no tensor value on the host, and the counter sees a read where one is added."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from host_reads import HostReadError, HostReads

from tiny_llm.config import load_recipe
from tiny_llm.packed.engine import PackedEngine
from tiny_llm.runtime.engine import StepStats
from tiny_llm.train.engine import ModelEngine
from tiny_llm.train.graph import GraphEngine

CPU = torch.device("cpu")
FUSED = ["training.batch_tokens=512", "runtime.fused_optimizer=true", "optimizer.grad_clip=0.05"]


@pytest.fixture(autouse=True)
def one_thread(one_torch_thread: None) -> Iterator[None]:
    yield


def ordinary() -> ModelEngine:
    return ModelEngine(load_recipe(["tiny"], FUSED), CPU)


def graph() -> ModelEngine:
    return GraphEngine(load_recipe(["tiny"], FUSED), CPU, capturer=None)


def packed() -> PackedEngine:
    recipe = load_recipe(["packed4-tiny"], ["decentralized.num_models=2", *FUSED])
    return PackedEngine(recipe, CPU)


ENGINES: dict[str, Callable[[], ModelEngine | PackedEngine]] = {
    "ordinary": ordinary,
    "graph-uncaptured": graph,
    "packed": packed,
}


def blocks(num: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (num, 65), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("build", ENGINES.values(), ids=ENGINES.keys())
def test_a_fused_update_reads_nothing_on_the_host(build: Callable[[], ModelEngine | PackedEngine]) -> None:
    engine = build()
    stats: list[StepStats] = []
    with HostReads() as reads:  # the first update (the optimizer's lazy state) included; a short one too
        for step, num in enumerate([8, 8, 6, 8], start=1):
            stats.append(engine.train_step(blocks(num, step), 1e-3, step))
    assert reads.count == 0, reads.what
    with HostReads() as reads:  # the values are read later, all at once (a train row)
        StepStats.read_all(stats)
        engine.check_finite()
    assert reads.count == 2, reads.what  # the window's values, and the finite guard's step


# What a careless "if norm > limit" does, in each form that makes a GPU's host wait.
READS = {
    "item": (lambda norm: float(norm) > 0, ["item"]),
    "cpu": (lambda norm: norm.cpu(), ["cpu"]),
    "to-cpu": (lambda norm: norm.to("cpu"), ["to(cpu)"]),
    "to-device-cpu": (lambda norm: norm.to(device=torch.device("cpu")), ["to(cpu)"]),
    "numpy": (lambda norm: norm.detach().numpy(), ["numpy"]),
    "nonzero": (lambda norm: torch.nonzero(norm.reshape(1) > 0), ["nonzero"]),
    "boolean-index": (lambda norm: norm.reshape(1)[norm.reshape(1) > 0], ["boolean index"]),
    "masked-select": (lambda norm: norm.masked_select(norm > 0), ["masked_select"]),
}


@pytest.mark.parametrize("read", READS.values(), ids=READS.keys())
def test_the_counter_sees_a_read_added_inside_the_update(
    read: tuple[Callable[[torch.Tensor], object], list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ordinary()
    clip = ModelEngine.clip
    reading, what = read

    def clip_reading(self: ModelEngine, norm: torch.Tensor) -> None:
        reading(norm)
        clip(self, norm)

    monkeypatch.setattr(ModelEngine, "clip", clip_reading)
    with HostReads() as reads:
        engine.train_step(blocks(8, 1), 1e-3, 1)
    assert reads.what == what
    with pytest.raises(HostReadError, match="host read"), HostReads(forbid=True):
        engine.train_step(blocks(8, 2), 1e-3, 2)


def test_copies_to_the_device_and_dtype_changes_are_no_reads() -> None:
    """The update's own host-to-device copy (non-blocking) and casts are not counted; methods are restored."""
    tensor, methods = torch.ones(3), (torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.tolist)
    with HostReads() as reads:
        tensor.to(torch.device("cpu"), non_blocking=True)
        tensor.to(torch.float64)
        tensor.to("cpu", torch.float16, True)
        tensor[torch.tensor([0, 2])]  # integer indices: no mask
    assert reads.count == 0, reads.what
    assert (torch.Tensor.cpu, torch.Tensor.to, torch.Tensor.tolist) == methods
