"""What only a CUDA device shows (the `cuda` marker; skipped with a reason elsewhere, run by the GPU check,
benchmarks/gpu_check.sh): the captured update (compiled or not) trains the ordinary engine's model, a real
run's train rows report the rate its updates really ran at, the finite guard skips inside a replayed graph,
compiled evaluation, Muon on the device, the memory cap, and the peak floor of compiled CUDA graphs."""

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


def test_the_compiled_and_captured_update_trains_the_compiled_ordinary_engines_model() -> None:
    """runtime.compile with runtime.cuda_graph: the compiled loss inside the captured update, against the
    ordinary engine's compiled update (6 full updates: warm-up, capture, replays)."""
    r = recipe("training.micro_batch_size=4", "runtime.compile=true")
    device = torch.device("cuda")
    data = batches([8] * 6)
    ordinary, graph = ModelEngine(r, device), GraphEngine(r, device)
    sa, sb = run(ordinary, data), run(graph, data)
    assert graph.replay is not None
    losses_a = torch.tensor([s.read() for s in sa])
    losses_b = torch.tensor([s.read() for s in sb])
    torch.testing.assert_close(losses_b, losses_a, rtol=1e-3, atol=1e-5)
    for p, q in zip(ordinary.params, graph.params, strict=True):
        torch.testing.assert_close(q, p, rtol=1e-3, atol=1e-5)
    graph.check_finite()


def test_the_finite_guard_skips_a_non_finite_update_inside_a_replayed_graph() -> None:
    """The NaN arises in a replay of the one capture, not in an eager update: a weight the graph reads turns
    NaN in place, so the captured finite flag and fused AdamW's skip act inside the graph. The weights and
    AdamW's state stay the last finite update's, a finite update after it is skipped too, and the run's
    check names the step."""
    engine = GraphEngine(recipe("training.micro_batch_size=8"), torch.device("cuda"))
    data = batches([8] * (WARMUP_UPDATES + 3))
    k = WARMUP_UPDATES + 2  # the capture was update WARMUP_UPDATES + 1: update k replays it
    run(engine, data[: k - 1])
    captured = engine.replay
    assert captured is not None
    weights = [p.detach().clone() for p in engine.params]
    state = copy.deepcopy(engine.optimizer.state_dict()["state"])
    norm = engine.model.norm.weight
    kept = float(norm[0])
    with torch.no_grad():
        norm[0] = float("nan")  # in place: the memory the captured kernels read
    engine.train_step(data[k - 1], 1e-3, k)
    with torch.no_grad():
        norm[0] = kept
    engine.train_step(data[k], 1e-3, k + 1)  # finite, but the run failed at step k: skipped too
    assert engine.replay is captured  # both were replays, no new capture
    assert all(torch.equal(p, q) for p, q in zip(engine.params, weights, strict=True))
    for index, values in engine.optimizer.state_dict()["state"].items():
        assert all(torch.equal(values[key], state[index][key]) for key in ("step", "exp_avg", "exp_avg_sq"))
    with pytest.raises(NonFiniteError, match=rf"step {k}: non-finite loss"):
        engine.check_finite()


def test_muon_on_the_device_is_torchs_muon_and_reads_nothing_on_the_host() -> None:
    """The batched Muon step on CUDA against torch.optim.Muon per matrix (BF16 Newton-Schulz in other
    kernels: BF16-sized differences), and the guarded update makes no host read."""
    from host_reads import HostReads

    from tiny_llm.runtime.optim import BatchedMuon, hidden_matrices

    device = torch.device("cuda")
    engine = ModelEngine(recipe("optimizer.name=muon", "training.micro_batch_size=4"), device)
    hidden = hidden_matrices(engine.model)
    start = [p.detach().clone() for p in hidden]
    ours = [p.detach().clone().requires_grad_() for p in hidden]
    settings = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.1, "adjust_lr_fn": "match_rms_adamw"}
    reference, batched = torch.optim.Muon(hidden, **settings), BatchedMuon(ours, **settings)
    gen = torch.Generator(device=device).manual_seed(3)
    for _ in range(3):
        for p, q in zip(hidden, ours, strict=True):
            p.grad = torch.randn(p.shape, generator=gen, device=device)
            q.grad = p.grad.clone()
        reference.step()
        batched.step()
    for p, q, p0 in zip(hidden, ours, start, strict=True):  # the updates agree to BF16 rounding
        assert float((q - p).norm() / (p - p0).norm()) < 0.02
    engine.train_step(batches([8])[0], 1e-3, 1)  # the optimizer's lazy state
    with HostReads() as reads:
        engine.train_step(batches([8], seed=6)[0], 1e-3, 2)
    assert reads.count == 0, reads.what
    engine.check_finite()


def test_the_memory_cap_on_cuda_counts_beyond_the_built_engine_and_is_lifted() -> None:
    """runtime.memory_limit_mb on CUDA: a cap too small for an update's activations is an out-of-memory
    (status memory_limit, CUDA's own error), a roomy one measures with the cap and its baseline recorded and
    the peak beyond that baseline under 90% of it; after either, the device's whole memory is usable again."""
    from tiny_llm.bench.worker import WorkerOptions, run_worker

    options = WorkerOptions(data_mode="synthetic", warmup=1, steps=2, windows=1)
    shape = ("model.vocab_size=32000", "training.batch_tokens=2048", "training.micro_batch_size=32")
    small = run_worker(recipe(*shape, "runtime.memory_limit_mb=8"), options)
    assert small["status"] == "memory_limit" and small["error"].startswith("out of memory")
    roomy = run_worker(recipe(*shape, "runtime.memory_limit_mb=4096"), options)
    assert roomy["status"] == "ok", roomy["error"]
    assert roomy["memory_limit_bytes"] == 4096 * 2**20 and roomy["memory_baseline_bytes"] > 0
    assert roomy["peak_memory_bytes"] - roomy["memory_baseline_bytes"] < 0.9 * roomy["memory_limit_bytes"]
    big = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda")  # beyond both caps: lifted
    del big


def test_compiled_cuda_graphs_keep_their_recording_peak_as_the_floor() -> None:
    """compile_mode reduce-overhead: once the graphs are recorded, a window of replays alone shows little in
    the allocator's peak; the engine's floor (the recording updates' peak) is at least one eager update's."""
    device = torch.device("cuda")
    eager = ModelEngine(recipe("training.micro_batch_size=4"), device)
    run(eager, batches([8] * 2))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    run(eager, batches([8], seed=7))
    torch.cuda.synchronize()
    eager_peak = torch.cuda.max_memory_allocated(device)
    del eager
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)  # the floor below is the graph engine's own
    graphs = ModelEngine(recipe("training.micro_batch_size=4", "runtime.compile=true",
                                "runtime.compile_mode=reduce-overhead"), device)  # fmt: skip
    run(graphs, batches([8] * 5))
    torch.cuda.synchronize()
    assert graphs.replay_peak_bytes() >= 0.9 * eager_peak


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (one GPU: DDP skipped)")
def test_two_ranks_on_two_gpus_train_through_the_launcher(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    """`tiny_llm launch` with NCCL on two GPUs: a complete run whose rows carry both ranks' tokens."""
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    sets = [*tiny_recipe_args(tiny_cache), "runtime.device=cuda", "runtime.num_gpus=2",
            "training.micro_batch_size=4", "training.tokens_per_parameter=0.1",
            "training.epoch_tokens_per_parameter=0.05", f"runtime.output_dir={run_dir}"]  # fmt: skip
    command = [
        sys.executable,
        "-m",
        "tiny_llm",
        "launch",
        "-m",
        "tiny_llm",
        "train",
        "--quiet",
        "--config",
        "tiny",
    ]
    command += [a for s in sets for a in ("--set", s)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert read_json(run_dir / "status.json")["status"] == "complete"
    assert read_json(run_dir / "environment.json")["device"].startswith("cuda")


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
