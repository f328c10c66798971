"""runtime.num_gpus: K gloo ranks through torchrun train what one process accumulating K x the microbatches
trains (losses row by row, final weights), evaluate sharded, checkpoint from rank 0, stop together on SIGTERM,
fail on a dead rank, and resume at another K."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import cli_sets, metric_rows, small_recipe

from tiny_llm.config import RecipeConfig, load_recipe, recipe_identity
from tiny_llm.engines import evaluate_checkpoint, run_training
from tiny_llm.errors import ConfigError
from tiny_llm.io import read_json
from tiny_llm.train import distributed
from tiny_llm.train.engine import ModelEngine

# 14 updates of 16 blocks in 2 epochs, 4 microbatches each (2 per rank at K=2); a kept epoch-1 state.
FEW = (
    "training.tokens_per_parameter=0.1",
    "training.epoch_tokens_per_parameter=0.06",
    "training.micro_batch_size=4",
    "training.checkpoint_policy=interval",
    "training.checkpoint_every=2",
    "training.checkpoint_epochs=[1]",
)
TWO = ("runtime.num_gpus=2",)
# FP32 gradient sums in another order: a few ULPs per update, grown over 14 AdamW updates.
ROWS = {"rel": 1e-5, "abs": 1e-6}


def _recipe(cache: Path, args: Callable, run_dir: Path, *extra: str) -> RecipeConfig:
    return small_recipe(cache, args, run_dir, *FEW, *extra)


def _torchrun(argv: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return subprocess.Popen(
        [*cmd, "-m", "tiny_llm", "train", "--quiet", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_for_row(run_dir: Path, step: int, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    """Until metrics.jsonl holds a row at ``step`` or later (the run's own file is the event; polled)."""
    path, deadline = run_dir / "metrics.jsonl", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} early: {proc.stderr.read().decode()[-2000:]}")
        lines = path.read_text().splitlines()[:-1] if path.exists() else []  # the last may be half-written
        if any(json.loads(line).get("step", 0) >= step for line in lines):
            return
        time.sleep(0.02)
    raise AssertionError(f"no metrics row at step {step} within {timeout} s")


def _wait_for_status(pid: int, ready: Callable[[dict[str, str]], bool], timeout: float = 60) -> None:
    """Until /proc/PID/status satisfies ``ready`` (polled)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
        if ready(fields):
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never got there: {fields}")


def _stopped(fields: dict[str, str]) -> bool:
    return fields["State"].startswith("T")


def _term_pending(fields: dict[str, str]) -> bool:
    return bool(int(fields["ShdPnd"], 16) & (1 << (signal.SIGTERM - 1)))


def _assert_same(run_dir: Path, baseline: Path) -> None:
    """Every metrics row and every final weight of one process's run, within FP32 reduction-order noise."""
    rows, expected = metric_rows(run_dir), metric_rows(baseline)
    assert [(r["event"], r["step"]) for r in rows] == [(r["event"], r["step"]) for r in expected]
    for row, want in zip(rows, expected, strict=True):
        assert row["tokens"] == want["tokens"]
        for key in ("loss", "grad_norm"):
            if key in want:
                assert row[key] == pytest.approx(want[key], **ROWS), (row["step"], key)
    got, want = load_file(run_dir / "final.safetensors"), load_file(baseline / "final.safetensors")
    for name, tensor in want.items():  # AdamW turns a rounding of a near-zero gradient into up to a few
        # ULPs of a step of ~lr (3e-3): weights agree to 1% of one step
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=3e-5)


@pytest.fixture(scope="module")
def one_process(
    tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path, tiny_recipe_args: Callable
) -> Path:
    run_dir = tmp_path_factory.mktemp("one") / "run"
    assert run_training(_recipe(tiny_cache, tiny_recipe_args, run_dir), quiet=True) == 0
    return run_dir


@pytest.mark.slow
def test_two_ranks_equal_one_process_and_evaluate_sharded(
    one_process: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    proc = _torchrun(cli_sets(tiny_cache, tiny_recipe_args, run_dir, *FEW, *TWO))
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-3000:]
    _assert_same(run_dir, one_process)
    result, expected = read_json(run_dir / "result.json"), read_json(one_process / "result.json")
    assert result["tokens"] == expected["tokens"] and result["step"] == expected["step"]
    assert result["recipe_identity"] == expected["recipe_identity"]  # num_gpus is an execution setting
    # The final validation ran sharded over both ranks; one process evaluating the same weights agrees.
    recipe = _recipe(tiny_cache, tiny_recipe_args, run_dir)
    alone = evaluate_checkpoint(recipe, run_dir / "final.safetensors", full=True)
    final = metric_rows(run_dir)[-1]
    assert final["event"] == "final_validation" and final["evaluation_tokens"] == alone["tokens"]
    assert final["loss"] == pytest.approx(alone["loss"], rel=1e-12)
    assert final["evaluation_bytes"] == alone["bytes"]
    assert final["bpb"] == pytest.approx(alone["bpb"], rel=1e-12)
    assert not list(run_dir.glob(".*.tmp"))  # rank 0 wrote each file once, atomically


@pytest.mark.slow
def test_sigterm_stops_both_ranks_at_one_update_and_resumes_at_one(
    one_process: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    proc = _torchrun(cli_sets(tiny_cache, tiny_recipe_args, run_dir, *FEW, *TWO))
    _wait_for_row(run_dir, 4, proc)
    ranks = [_rank_pid(proc.pid, rank) for rank in (0, 1)]
    for pid in ranks:  # held (maybe at different updates) until torchrun's SIGTERM reaches both
        os.kill(pid, signal.SIGSTOP)
    for pid in ranks:  # stopped before the SIGTERM comes: it then waits, pending, for SIGCONT
        _wait_for_status(pid, _stopped)
    proc.send_signal(signal.SIGTERM)  # as Slurm signals torchrun; it passes SIGTERM on to both ranks
    for pid in ranks:
        _wait_for_status(pid, _term_pending)
    for pid in ranks:
        os.kill(pid, signal.SIGCONT)
    assert proc.wait(timeout=60) != 0
    status = read_json(run_dir / "status.json")
    # Interrupted, not failed: a rank that stopped at another update would have left rank 0 waiting in
    # that update's all-reduce, and rank 0 would have failed on its peer's exit.
    assert status["status"] == "interrupted" and 4 <= status["step"] < 14
    assert f"interrupted at step {status['step']}; state saved" in (run_dir / "run.log").read_text()
    assert run_training(_recipe(tiny_cache, tiny_recipe_args, run_dir), resume="auto", quiet=True) == 0
    _assert_same(run_dir, one_process)


def _rank_pid(torchrun: int, rank: int) -> int:
    """The pid of torchrun's worker of ``rank`` (its environment says RANK)."""
    children = Path(f"/proc/{torchrun}/task/{torchrun}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no rank {rank} among {children}")


@pytest.mark.slow
def test_a_one_process_state_resumes_at_two_ranks_and_a_dead_rank_fails_the_job(
    one_process: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(one_process / "epoch-001.pt", run_dir)  # one process's state after epoch 1
    steps = int(torch.load(run_dir / "epoch-001.pt", weights_only=True)["progress"]["step"])
    rows = (one_process / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= steps))
    proc = _torchrun([*cli_sets(tiny_cache, tiny_recipe_args, run_dir, *FEW, *TWO), "--resume", "auto"])
    _wait_for_row(run_dir, steps + 1, proc)  # both ranks resumed from it and trained on
    rank1 = _rank_pid(proc.pid, 1)
    os.kill(rank1, signal.SIGSTOP)  # rank 0 now waits for it in the next all-reduce: the run cannot end
    _wait_for_status(rank1, _stopped)
    os.kill(rank1, signal.SIGKILL)
    assert proc.wait(timeout=60) != 0
    assert "exitcode  : -9" in proc.stderr.read().decode()  # torchrun's summary names the dead rank
    log = (run_dir / "run.log").read_text()
    assert f"resumed from {run_dir / 'epoch-001.pt'} at step {steps}/14" in log
    status = read_json(run_dir / "status.json")
    if status["status"] == "failed":  # rank 0 saw its peer go before torchrun stopped it too
        assert "lost its peers" in status["error"] and "\n" not in status["error"]
    assert run_training(_recipe(tiny_cache, tiny_recipe_args, run_dir), resume="auto", quiet=True) == 0
    newest = "latest.pt" if "state saved" in log or (run_dir / "latest.pt").exists() else "epoch-001.pt"
    assert f"resumed from {run_dir / newest}" in (run_dir / "run.log").read_text()
    _assert_same(run_dir, one_process)


# Three updates of (microbatches of 4 blocks): 2 per rank; 1 (rank 0 holds none: a short epoch-end
# update); 2 per rank again, after DDP rebuilt its buckets.
UPDATES = (16, 4, 16)


def _engine_recipe() -> RecipeConfig:
    sets = ["training.micro_batch_size=4", "runtime.device=cpu", "runtime.cpu_threads=1"]
    return load_recipe(["tiny"], sets)


def _updates() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    recipe = _engine_recipe()
    length, vocab = recipe.model.context_length + 1, recipe.model.vocab_size
    return [torch.randint(0, vocab, (n, length), generator=gen) for n in UPDATES]


def _rank_updates(rank: int, init_file: str, out: str) -> None:
    """One gloo rank: the DDP engine through UPDATES; rank 0 saves losses, norms and weights to ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        engine = distributed.DistributedEngine(_engine_recipe(), torch.device("cpu"))
        assert isinstance(engine.ddp, torch.nn.parallel.DistributedDataParallel)
        stats = [engine.train_step(blocks, 1e-3, step) for step, blocks in enumerate(_updates(), 1)]
        if rank == 0:
            rows = [(s.loss, s.grad_norm) for s in stats]
            torch.save({"rows": rows, "model": engine.model.state_dict()}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_ddp_engine_sums_what_one_process_accumulates(tmp_path: Path) -> None:
    """In-process ranks (no torchrun): the DDP engine equals the ordinary one update by update, including
    an update where one rank holds no microbatch and the updates after DDP rebuilds its buckets."""
    out = tmp_path / "rank0.pt"
    torch.multiprocessing.spawn(_rank_updates, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    torch.set_num_threads(1)
    engine = ModelEngine(_engine_recipe(), torch.device("cpu"))
    want = [engine.train_step(blocks, 1e-3, step) for step, blocks in enumerate(_updates(), 1)]
    got = torch.load(out, weights_only=True)
    for (loss, norm), stats in zip(got["rows"], want, strict=True):
        assert loss == pytest.approx(stats.loss, rel=1e-6)
        assert norm == pytest.approx(stats.grad_norm, rel=1e-5)
    for name, tensor in engine.model.state_dict().items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- fast: config and pure parts


def test_num_gpus_is_outside_the_identity() -> None:
    one = load_recipe(["tiny"], ["training.micro_batch_size=4"])
    two = load_recipe(["tiny"], ["training.micro_batch_size=4", *TWO])
    assert two.runtime.num_gpus == 2 and recipe_identity(one, "c") == recipe_identity(two, "c")


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["runtime.num_gpus=3"], "the 2 microbatches of an update"),
        (["runtime.num_gpus=0"], "must be >= 1"),
        (["runtime.num_gpus=2", "decentralized.num_models=2"], "not for packed training"),
    ],
)
def test_num_gpus_refusals_are_one_line(sets: list[str], words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(["tiny"], sets)
    assert words in str(info.value)


def test_launch_must_match_num_gpus() -> None:
    recipe = load_recipe(["tiny"], list(TWO))
    with pytest.raises(ConfigError, match="torchrun --nproc-per-node 2"):
        distributed.check_launch(recipe, None)
    distributed.check_launch(recipe, distributed.RankContext(0, 2, 0))


def test_shares_are_contiguous_and_cover_everything() -> None:
    assert [list(distributed.share(4, r, 2)) for r in range(2)] == [[0, 1], [2, 3]]
    assert [list(distributed.share(1, r, 2)) for r in range(2)] == [[], [0]]  # a short epoch-end update
    assert sorted(i for r in range(3) for i in distributed.share(7, r, 3)) == list(range(7))


def test_the_benchmark_worker_refuses_several_ranks_in_one_line() -> None:
    from tiny_llm.bench.worker import WorkerOptions, run_worker

    options = WorkerOptions(data_mode="synthetic", warmup=1, steps=1, windows=1)
    with pytest.raises(ConfigError, match="the benchmark worker measures one GPU") as info:
        run_worker(load_recipe(["tiny"], ["training.micro_batch_size=4", *TWO]), options)
    assert "\n" not in str(info.value)
