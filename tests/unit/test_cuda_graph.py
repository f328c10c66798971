"""runtime.cuda_graph: the static update that CUDA captures, run uncaptured on the CPU, is the ordinary fused
update bit for bit (weights, optimizer state, losses, norms); the capture's bookkeeping; the refusals."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from host_reads import HostReadError, HostReads
from train_helpers import metric_rows, small_recipe

from tiny_llm.bench.worker import WorkerOptions, run_worker
from tiny_llm.cli import main
from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.engines import build_engine
from tiny_llm.errors import ConfigError
from tiny_llm.runtime import device as device_module
from tiny_llm.runtime.device import check_cuda_graph
from tiny_llm.runtime.engine import NonFiniteError, StepStats
from tiny_llm.train import engine as engine_module
from tiny_llm.train import session
from tiny_llm.train.engine import ModelEngine
from tiny_llm.train.graph import WARMUP_UPDATES, GraphEngine
from tiny_llm.train.metrics import read_metrics

CPU = torch.device("cpu")
# 8 blocks of 64 tokens per update; a clip this low is active in every update (norms are ~1).
SETS = ["training.batch_tokens=512", "runtime.fused_optimizer=true", "optimizer.grad_clip=0.05"]
LRS = [1e-3, 3e-3, 2e-3, 2.5e-3, 1.5e-3, 5e-4]


@pytest.fixture(autouse=True)
def deterministic_one_thread(one_torch_thread: None) -> Iterator[None]:
    torch.use_deterministic_algorithms(True)  # conftest restores the setting
    yield


def recipe(micro: int, *extra: str) -> RecipeConfig:
    return load_recipe(["tiny"], [*SETS, f"training.micro_batch_size={micro}", *extra])


def batches(sizes: list[int]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 512, (n, 65), generator=gen) for n in sizes]


class EagerCapturer:
    """Stands in for CUDA: 'captures' the update as the function itself, which each replay runs under a mode
    that raises on a host read (what a real capture refuses: a value read on the host while recording), on
    the tensors the engine held at capture: a graph reads and writes the memory it was recorded on, so an
    input or output buffer the engine rebinds afterwards is one the replay never sees."""

    def __init__(self) -> None:
        self.warmed = self.captured = self.replays = 0
        self.peak_bytes = 2**50  # what a capture's peak would be: above anything the CPU reports

    def warm(self, update: Callable[[], None]) -> None:
        self.warmed += 1
        update()

    def capture(self, update: Callable[[], None]) -> Callable[[], None]:
        self.captured += 1
        engine = update.__self__  # type: ignore[attr-defined]  # the engine's bound update_inputs
        recorded = {k: v for k, v in vars(engine).items() if isinstance(v, torch.Tensor)}

        def replay() -> None:
            self.replays += 1
            now = {k: getattr(engine, k) for k in recorded}
            vars(engine).update(recorded)  # the buffers the graph was recorded on
            try:
                with HostReads(forbid=True):
                    update()
            finally:
                vars(engine).update(now)

        return replay


def rows(run_dir: Path) -> list[dict]:
    return read_metrics(run_dir / "metrics.jsonl")


def run(engine: ModelEngine, data: list[torch.Tensor], first_step: int = 1) -> list[StepStats]:
    return [
        engine.train_step(blocks, lr, step)
        for step, (blocks, lr) in enumerate(zip(data, LRS, strict=False), first_step)
    ]


def assert_same(a: ModelEngine, b: ModelEngine, sa: list[StepStats], sb: list[StepStats]) -> None:
    """Bitwise: every update's [loss, grad_norm], the weights, and AdamW's state and groups."""
    assert [s.read() for s in sa] == [s.read() for s in sb]
    assert all(torch.equal(p, q) for p, q in zip(a.params, b.params, strict=True))
    oa, ob = a.state_dict()["optimizer"], b.state_dict()["optimizer"]
    assert oa["param_groups"] == ob["param_groups"]
    for index, values in oa["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(values[key], ob["state"][index][key]), (index, key)


# 1 microbatch; 3 + 3 + 2 (a short one, eager in both); a short update (5 blocks) between full ones.
@pytest.mark.parametrize(("micro", "sizes"), [(8, [8, 8, 8, 8]), (3, [8, 8, 5, 8, 8, 8])])
@pytest.mark.parametrize("capturer", [None, "stand-in"])
def test_static_update_is_bitwise_the_ordinary_fused_update(
    micro: int, sizes: list[int], capturer: str | None
) -> None:
    r, data = recipe(micro), batches(sizes)
    ordinary = ModelEngine(r, CPU)
    static = GraphEngine(r, CPU, capturer=EagerCapturer() if capturer else None)
    sa, sb = run(ordinary, data), run(static, data)
    assert all(s.grad_norm > 0.05 for s in sa)  # clipping acted in every update
    assert_same(ordinary, static, sa, sb)
    static.check_finite()


def test_capture_once_after_the_warm_up_replay_full_updates_short_ones_eager() -> None:
    stand_in = EagerCapturer()
    engine = GraphEngine(recipe(3), CPU, capturer=stand_in)
    run(engine, batches([8, 8, 5, 8, 8, 8]))  # 5 full updates and a short one
    assert (stand_in.warmed, stand_in.captured, stand_in.replays) == (WARMUP_UPDATES, 1, 5 - WARMUP_UPDATES)
    engine.load_state_dict(copy.deepcopy(engine.state_dict()))  # new optimizer tensors: capture again
    run(engine, batches([8] * 4), first_step=7)
    assert (stand_in.warmed, stand_in.captured) == (2 * WARMUP_UPDATES, 2)


def test_the_stand_in_capture_refuses_a_host_read_in_the_update(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = GraphEngine(recipe(8), CPU, capturer=EagerCapturer())
    run(engine, batches([8] * WARMUP_UPDATES))  # warm-up updates run eagerly: a read there is not captured
    clip = ModelEngine.clip

    def clip_reading(self: ModelEngine, norm: torch.Tensor) -> None:
        self.last_norm = norm.item()
        clip(self, norm)

    monkeypatch.setattr(ModelEngine, "clip", clip_reading)
    with pytest.raises(HostReadError, match="host read"):
        engine.train_step(batches([8])[0], 1e-3, WARMUP_UPDATES + 1)


def test_a_non_finite_update_is_skipped_on_the_device_and_names_its_step() -> None:
    engine = GraphEngine(recipe(3), CPU, capturer=EagerCapturer())
    data = batches([8] * 6)
    run(engine, data[:4])  # past the warm-up: update 5 is a replay
    weights = [p.detach().clone() for p in engine.params]
    state = copy.deepcopy(engine.optimizer.state_dict()["state"])
    finite = engine._compiled_loss
    engine._compiled_loss = lambda i, t: finite(i, t) * float("nan")  # type: ignore[method-assign]
    bad = engine.train_step(data[4], 1e-3, 5)
    engine._compiled_loss = finite  # type: ignore[method-assign]
    engine.train_step(data[5], 1e-3, 6)  # finite, but the run failed at step 5: skipped too
    assert all(torch.equal(p, q) for p, q in zip(engine.params, weights, strict=True))
    for index, values in engine.optimizer.state_dict()["state"].items():
        assert all(torch.equal(values[k], state[index][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert bad.values is not None and torch.isnan(bad.values[0])
    with pytest.raises(NonFiniteError, match=r"step 5: non-finite loss \(loss nan, grad_norm nan\)"):
        engine.check_finite()


def test_states_move_between_the_ordinary_and_the_static_engine() -> None:
    r, data = recipe(3), batches([8] * 4)
    ordinary = ModelEngine(r, CPU)
    run(ordinary, data[:2])
    static = GraphEngine(r, CPU, capturer=None)
    static.load_state_dict(copy.deepcopy(ordinary.state_dict()))
    sa, sb = run(ordinary, data[2:], 3), run(static, data[2:], 3)
    assert_same(ordinary, static, sa, sb)
    groups = static.state_dict()["optimizer"]["param_groups"]
    assert all(type(g["lr"]) is float and g["capturable"] is False for g in groups)  # the ordinary format
    back = ModelEngine(r, CPU)
    back.load_state_dict(copy.deepcopy(static.state_dict()))
    assert_same(back, static, [], [])


def test_cpu_builds_the_ordinary_engine_for_evaluation_and_export() -> None:
    r = load_recipe(["tiny"], [*SETS, "runtime.device=auto", "runtime.cuda_graph=true"])
    assert type(build_engine(r, CPU)) is ModelEngine


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["runtime.device=cpu"], "runtime.cuda_graph: needs a CUDA device (runtime.device is cpu)"),
        (["runtime.deterministic=true"], "runtime.cuda_graph: needs the fused optimizer"),
        (["runtime.fused_optimizer=false"], "runtime.cuda_graph: needs the fused optimizer"),
        (
            ["runtime.compile_mode=reduce-overhead"],
            "compile_mode reduce-overhead makes CUDA graphs of its own",
        ),
        (
            ["decentralized.num_models=2", "training.micro_batch_size=4"],
            "runtime.cuda_graph: not for packed training",
        ),
    ],
)
def test_impossible_combinations_are_refused_in_one_line(sets: list[str], message: str) -> None:
    base = ["runtime.device=cuda", "runtime.compile=true", "runtime.cuda_graph=true"]
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        load_recipe(["tiny"], [*SETS, *base, *sets])
    assert "\n" not in str(caught.value)  # that problem alone, on one line


def test_training_on_a_cpu_refuses_it_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = load_recipe(["tiny"], [*SETS, "runtime.device=auto", "runtime.cuda_graph=true"])
    with pytest.raises(ConfigError, match=r"^runtime.cuda_graph: needs a CUDA device, .* cpu; set it false$"):
        check_cuda_graph(r, CPU)
    check_cuda_graph(recipe(8), CPU)  # off: nothing to refuse
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # device auto is the CPU
    sets = [*SETS, "runtime.device=auto", "runtime.cuda_graph=true", f"runtime.output_dir={tmp_path / 'run'}"]
    code = main(["train", "--config", "tiny", *[a for s in sets for a in ("--set", s)]])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "error: runtime.cuda_graph: needs a CUDA device, and this run's device is cpu; set it false"
    ]
    assert not (tmp_path / "run" / "status.json").exists()  # refused before the run started


def test_the_option_enters_the_identity_only_when_set() -> None:
    from tiny_llm.config import recipe_identity_payload

    on = load_recipe(["tiny"], [*SETS, "runtime.device=auto", "runtime.cuda_graph=true"])
    off = load_recipe(["tiny"], [*SETS, "runtime.device=auto"])
    assert "cuda_graph" not in recipe_identity_payload(off)["runtime"]
    assert recipe_identity_payload(on)["runtime"]["cuda_graph"] is True


def test_the_benchmark_worker_refuses_it_on_a_cpu_in_its_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # device auto is the CPU
    r = load_recipe(["tiny"], [*SETS, "runtime.device=auto", "runtime.cuda_graph=true"])
    out = run_worker(r, WorkerOptions(data_mode="synthetic", warmup=1, steps=1, windows=1))
    assert out["status"] == "failed" and out["tokens_per_second"] is None and out["cuda_graph"] is True
    assert (
        out["error"] == "runtime.cuda_graph: needs a CUDA device, and this run's device is cpu; set it false"
    )


def test_compiled_graph_modes_keep_the_recording_peak_as_the_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_mode reduce-overhead / max-autotune on CUDA record graphs in the first updates and replay them
    from a pool the allocator's peak no longer shows: the recording updates' peak stays the floor of every
    later window's (the clock's and the worker's), as the captured update's does. (CUDA's statistics are
    stood in for here; tests/unit/test_cuda.py measures the real ones.)"""

    def graphs(mode: str, device: torch.device) -> bool:
        compiled = recipe(8, "runtime.compile=true", f"runtime.compile_mode={mode}")
        return device_module.compiles_cuda_graphs(compiled, device)

    cuda = torch.device("cuda")
    modes = ("default", "reduce-overhead", "max-autotune")
    assert [m for m in modes if graphs(m, cuda)] == ["reduce-overhead", "max-autotune"]
    assert not graphs("reduce-overhead", CPU)
    peaks = iter([100, 700, 300])
    monkeypatch.setattr(engine_module, "compiles_cuda_graphs", lambda recipe, device: True)
    monkeypatch.setattr(engine_module, "peak_memory_bytes", lambda device: next(peaks))
    engine = ModelEngine(recipe(8), CPU)
    assert engine.replay_peak_bytes() == 0
    floors = []
    for step, blocks in enumerate(batches([8] * 5), start=1):
        engine.train_step(blocks, 1e-3, step)
        floors.append(engine.replay_peak_bytes())
    assert floors == [100, 700, 700, 700, 700]  # read during the 3 recording updates only
    assert ModelEngine(recipe(8), CPU).replay_peak_bytes() == 0  # the CPU: no graphs, no floor


@pytest.mark.slow
def test_a_training_run_through_the_static_update_is_the_ordinary_run(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    """The whole loop (epochs ending in short updates, validation, checkpoints, the deferred finite check)
    with the static update and a stand-in capture: every metric row and the final weights equal the ordinary
    run's."""
    sets = (
        "training.tokens_per_parameter=0.1",  # 15 updates in 3 epochs
        "training.epoch_tokens_per_parameter=0.04",
        "runtime.deterministic=false",
        "runtime.fused_optimizer=true",
        "training.checkpoint_policy=interval",
        "training.checkpoint_every=4",
    )
    stand_in = EagerCapturer()
    factories = {
        "ordinary": ModelEngine,
        "static": lambda r, d: GraphEngine(r, d, capturer=stand_in),
    }
    for name, factory in factories.items():
        r = small_recipe(tiny_cache, tiny_recipe_args, tmp_path / name, *sets)
        assert session.run_training(r, factory, quiet=True) == 0
    assert stand_in.captured == 1 and stand_in.replays > 0
    assert metric_rows(tmp_path / "ordinary") == metric_rows(tmp_path / "static")
    replayed = [
        r for r in rows(tmp_path / "static") if r["event"] == "train" and r["step"] > WARMUP_UPDATES + 1
    ]
    assert replayed and all(r["peak_memory_bytes"] >= stand_in.peak_bytes for r in replayed)
    weights = [(tmp_path / name / "final.safetensors").read_bytes() for name in factories]
    assert weights[0] == weights[1]
