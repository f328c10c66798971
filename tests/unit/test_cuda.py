"""What only a CUDA device shows (the `cuda` marker; skipped with a reason elsewhere, run by the GPU check,
benchmarks/gpu_check.sh): the captured update trains the ordinary engine's model, a real run's train rows
report the rate its updates really ran at, the finite guard on the device, and compiled evaluation."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.engines import run_training
from tiny_llm.io import read_json
from tiny_llm.runtime.engine import NonFiniteError, StepStats
from tiny_llm.train import loop
from tiny_llm.train.engine import ModelEngine
from tiny_llm.train.evaluate import evaluate, subset_batches
from tiny_llm.train.graph import WARMUP_UPDATES, GraphEngine
from tiny_llm.train.metrics import read_metrics

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu_check.sh)"),
]
# 8 blocks of 64 tokens per update on the GPU, the sync-free fused update, a clip active in every update.
SETS = [
    "runtime.device=cuda",
    "runtime.amp=true",
    "training.batch_tokens=512",
    "runtime.fused_optimizer=true",
    "optimizer.grad_clip=0.05",
]
LRS = [1e-3, 3e-3, 2e-3, 2.5e-3, 1.5e-3, 5e-4, 1e-3, 2e-3]


@pytest.fixture(autouse=True)
def not_deterministic() -> Iterator[None]:
    torch.use_deterministic_algorithms(False)  # the fused update (conftest restores the setting)
    yield


def recipe(*extra: str) -> RecipeConfig:
    return load_recipe(["tiny"], [*SETS, *extra])


def batches(sizes: list[int], seed: int = 5) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n, 65), generator=gen) for n in sizes]


def run(engine: ModelEngine, data: list[torch.Tensor]) -> list[StepStats]:
    return [engine.train_step(b, lr, step) for step, (b, lr) in enumerate(zip(data, LRS, strict=False), 1)]


def test_the_captured_update_trains_the_ordinary_engines_model() -> None:
    """Six full updates and a short one between: warm-up, capture, replays, the eager short shape."""
    r = recipe("training.micro_batch_size=4")
    device = torch.device("cuda")
    data = batches([8, 8, 8, 5, 8, 8, 8])
    ordinary, graph = ModelEngine(r, device), GraphEngine(r, device)
    sa, sb = run(ordinary, data), run(graph, data)
    assert graph.replay is not None  # the graph was captured and replayed
    # The graph's lr is FP32 (relative 6e-8), the ordinary update's a double; BF16 autocast amplifies that.
    losses_a = torch.tensor([s.read() for s in sa])
    losses_b = torch.tensor([s.read() for s in sb])
    torch.testing.assert_close(losses_b, losses_a, rtol=1e-3, atol=1e-5)
    for p, q in zip(ordinary.params, graph.params, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-5)
    graph.check_finite()


def test_the_finite_guard_on_the_device_keeps_the_last_finite_weights_and_names_the_step() -> None:
    engine = GraphEngine(recipe("training.micro_batch_size=8"), torch.device("cuda"))
    data = batches([8] * (WARMUP_UPDATES + 3))
    k = WARMUP_UPDATES + 2  # a replayed update
    run(engine, data[: k - 1])
    weights = [p.detach().clone() for p in engine.params]
    state = copy.deepcopy(engine.optimizer.state_dict()["state"])
    finite = engine._compiled_loss
    engine.replay, engine.warm_updates = None, 0  # capture again with the NaN-producing loss
    engine._compiled_loss = lambda i, t: finite(i, t) * float("nan")  # type: ignore[method-assign]
    engine.train_step(data[k - 1], 1e-3, k)
    engine._compiled_loss = finite  # type: ignore[method-assign]
    engine.train_step(data[k], 1e-3, k + 1)  # finite, but the run failed at step k: skipped too
    assert all(torch.equal(p, q) for p, q in zip(engine.params, weights, strict=True))
    for index, values in engine.optimizer.state_dict()["state"].items():
        assert all(torch.equal(values[key], state[index][key]) for key in ("step", "exp_avg", "exp_avg_sq"))
    with pytest.raises(NonFiniteError, match=rf"step {k}: non-finite loss"):
        engine.check_finite()


def test_a_real_runs_train_rows_report_the_rate_its_updates_ran_at(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One epoch, rows every 8 updates, no save between: the rows' tokens/s against the wall clock."""
    stamps: list[float] = []
    log_row = loop.Trainer.log_train_row

    def stamped(self: loop.Trainer, *args: object) -> None:
        log_row(self, *args)  # type: ignore[arg-type]
        stamps.append(time.perf_counter())

    monkeypatch.setattr(loop.Trainer, "log_train_row", stamped)
    run_dir = tmp_path / "run"
    sets = [
        *tiny_recipe_args(tiny_cache),
        "runtime.device=cuda",
        "runtime.amp=true",
        "runtime.fused_optimizer=true",
        "training.batch_tokens=4096",
        "training.micro_batch_size=64",
        "training.tokens_per_parameter=1.4",
        "training.epoch_tokens_per_parameter=1.4",
        "training.log_every=8",
        "training.checkpoint_policy=final",
        f"runtime.output_dir={run_dir}",
    ]
    assert run_training(load_recipe(["tiny"], sets), quiet=True) == 0
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["event"] == "train"]
    assert len(train) >= 4
    later = train[1:-1]  # whole windows after the first (compile and warm-up), before the epoch's end
    rows_rate = sum(r["tokens_per_second"] * r["training_seconds"] for r in later) / sum(
        r["training_seconds"] for r in later
    )
    wall_rate = (later[-1]["tokens"] - train[0]["tokens"]) / (stamps[len(later)] - stamps[0])
    assert rows_rate == pytest.approx(wall_rate, rel=0.10)
    assert read_json(run_dir / "result.json")["training_tokens_per_second"] > 0


def test_compiled_evaluation_equals_eager_within_bf16_noise() -> None:
    device = torch.device("cuda")
    eager, compiled = recipe("runtime.compile=false"), recipe("runtime.compile=true")
    engine = ModelEngine(eager, device)
    run(engine, batches([8] * 3))
    blocks = torch.cat(batches([16, 16], seed=9))
    sizes = torch.arange(eager.model.vocab_size) % 3  # 0, 1 or 2 bytes: a third of the ids are "special"
    a, b = (
        evaluate(
            engine.model,
            subset_batches(blocks, 8),
            r,
            device,
            split="subset",
            validation_complete=True,
            token_bytes=sizes,
        )
        for r in (eager, compiled)
    )
    assert a.tokens == b.tokens and a.bytes == b.bytes == int(sizes[blocks[:, 1:]].sum())
    assert b.loss == pytest.approx(a.loss, rel=1e-2)
    assert a.bpb is not None and b.bpb == pytest.approx(a.bpb, rel=1e-2)
