"""runtime.num_gpus: K gloo ranks (through `tiny_llm launch`, and through torchrun) train what one process
accumulating K x the microbatches trains (losses row by row, final weights), evaluate sharded, checkpoint from
rank 0, listen on the loopback interface only, stop together on a SIGTERM to one rank, fail on a dead rank in
one line and leave no scratch directory, and resume at another K."""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import cli_sets, metric_rows, small_recipe

from tiny_llm.budget import flops_per_token
from tiny_llm.config import RecipeConfig, load_recipe, recipe_identity
from tiny_llm.engines import evaluate_checkpoint, run_training
from tiny_llm.errors import ConfigError
from tiny_llm.io import read_json
from tiny_llm.train import distributed, launch
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


def _torchrun(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return _ranks(cmd, argv, env)


def _launch(argv: list[str], **env: str) -> subprocess.Popen[bytes]:
    """The workflow's way: `python -m tiny_llm launch` (FileStore, loopback sockets)."""
    return _ranks([sys.executable, "-m", "tiny_llm", "launch", "--nproc-per-node", "2"], argv, env)


def _ranks(launcher: list[str], argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}
    return subprocess.Popen(
        [*launcher, "-m", "tiny_llm", "train", "--quiet", *argv],
        env=environ,
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
    # torchrun's own rendezvous (env://) still works; a known peak makes the rows carry an MFU
    proc = _torchrun(cli_sets(tiny_cache, tiny_recipe_args, run_dir, *FEW, *TWO), TINY_LLM_PEAK_FLOPS="1e12")
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode()[-3000:]
    _assert_same(run_dir, one_process)
    flops = flops_per_token(_recipe(tiny_cache, tiny_recipe_args, run_dir).model)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in (r for r in rows if r["event"] == "train"):
        # the row's tokens/s are both ranks': against both ranks' peak (2 x 1e12), not one's
        assert row["mfu"] == pytest.approx(row["tokens_per_second"] * flops / 2e12, rel=1e-9)
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
def test_sigterm_to_one_rank_stops_both_at_one_update_listening_on_loopback_only(
    one_process: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    proc = _launch(cli_sets(tiny_cache, tiny_recipe_args, run_dir, *FEW, *TWO))
    try:
        _wait_for_row(run_dir, 4, proc)
        listening = _listening(_process_tree(proc.pid))
        # gloo's sockets (one per peer pair) and nothing else: no rendezvous store on any address
        assert listening and all(address.is_loopback for address in listening), listening
        os.kill(_rank_pid(proc.pid, 1), signal.SIGTERM)  # one rank only: the other learns it by the vote
        assert proc.wait(timeout=60) == 130, proc.stderr.read().decode()[-3000:]
    finally:
        _end(proc)
    status = read_json(run_dir / "status.json")
    # Interrupted, not failed: had rank 1 stopped alone, rank 0 would have waited for it in that update's
    # all-reduce and failed on its peer's exit.
    assert status["status"] == "interrupted" and 4 <= status["step"] < 14
    assert f"interrupted at step {status['step']}; state saved" in (run_dir / "run.log").read_text()
    assert run_training(_recipe(tiny_cache, tiny_recipe_args, run_dir), resume="auto", quiet=True) == 0
    _assert_same(run_dir, one_process)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The launcher and its ranks gone, whatever the test did (a failed test must not leave them running)."""
    for pid in _process_tree(proc.pid) if proc.poll() is None else set():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants."""
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        with contextlib.suppress(OSError):
            todo += [int(c) for c in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
    return found


def _listening(pids: set[int]) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The local addresses of the TCP sockets in LISTEN state that the processes ``pids`` hold (/proc)."""
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        inodes.add(target[len("socket:[") : -1])
    found: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.append(_proc_address(fields[1].split(":")[0]))
    return found


def _proc_address(hexed: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp{,6}'s address: 32-bit words in host (little-endian) order; a v4-mapped v6 as v4."""
    raw = b"".join(bytes.fromhex(hexed[i : i + 8])[::-1] for i in range(0, len(hexed), 8))
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw)
    address = ipaddress.IPv6Address(raw)
    return address.ipv4_mapped or address


def test_proc_addresses_are_read_as_the_kernel_writes_them() -> None:
    assert _proc_address("0100007F") == ipaddress.IPv4Address("127.0.0.1")
    assert _proc_address("00000000") == ipaddress.IPv4Address("0.0.0.0")
    assert _proc_address("00000000000000000000000001000000") == ipaddress.IPv6Address("::1")
    assert _proc_address("0000000000000000FFFF00000100007F") == ipaddress.IPv4Address("127.0.0.1")
    assert not _proc_address("00000000000000000000000000000000").is_loopback  # every interface


def _rank_pid(torchrun: int, rank: int) -> int:
    """The pid of torchrun's worker of ``rank`` (its environment says RANK)."""
    children = Path(f"/proc/{torchrun}/task/{torchrun}/children").read_text().split()
    for pid in children:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(pid)
    raise AssertionError(f"no rank {rank} among {children}")


@pytest.mark.slow
def test_a_one_process_state_resumes_at_two_ranks_and_a_dead_rank_fails_the_job_in_one_line(
    one_process: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir, scratch = tmp_path / "run", tmp_path / "tmp"
    run_dir.mkdir()
    scratch.mkdir()
    shutil.copy(one_process / "epoch-001.pt", run_dir)  # one process's state after epoch 1
    steps = int(torch.load(run_dir / "epoch-001.pt", weights_only=True)["progress"]["step"])
    rows = (one_process / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("".join(r + "\n" for r in rows if json.loads(r)["step"] <= steps))
    argv = [*cli_sets(tiny_cache, tiny_recipe_args, run_dir, *FEW, *TWO), "--resume", "auto"]
    proc = _launch(argv, TMPDIR=str(scratch))
    try:
        _wait_for_row(run_dir, steps + 1, proc)  # both ranks resumed from it and trained on
        rank1 = _rank_pid(proc.pid, 1)
        os.kill(rank1, signal.SIGSTOP)  # rank 0 now waits for it in the next all-reduce: the run cannot end
        _wait_for_status(rank1, _stopped)
        os.kill(rank1, signal.SIGKILL)
        assert proc.wait(timeout=60) == 1
    finally:
        _end(proc)
    assert f"launch: rank 1 (pid {rank1}) was killed by SIGKILL" in proc.stderr.read().decode()
    log = (run_dir / "run.log").read_text()
    assert f"resumed from {run_dir / 'epoch-001.pt'} at step {steps}/14" in log
    status = read_json(run_dir / "status.json")  # rank 0 is given the time to see its peer go
    assert (
        status["status"] == "failed" and "lost its peers" in status["error"] and "\n" not in status["error"]
    )
    assert "Traceback" not in log
    assert not list(scratch.glob("tiny-llm-rank*"))  # the killed rank's scratch directory too
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
    """One gloo rank: the DDP engine through UPDATES; rank 0 saves losses, norms and weights to ``out``, how
    many gradient views from before DDP's bucket rebuild were alive in the next update's forward, and DDP's
    logging data."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        engine = distributed.DistributedEngine(_engine_recipe(), torch.device("cpu"))
        assert isinstance(engine.ddp, torch.nn.parallel.DistributedDataParallel)
        data = _updates()
        stats = [engine.train_step(data[0], 1e-3, 1)]
        before = [weakref.ref(p.grad) for p in engine.params]  # the first buckets' views
        pointers = [p.grad.data_ptr() for p in engine.params]
        alive: list[int] = []
        loss = engine.ddp.module.loss

        def probe(micro: torch.Tensor) -> torch.Tensor:  # inside DDP's forward, after its rebuild
            if not alive:
                gc.collect()
                alive.append(sum(ref() is not None for ref in before))
            return loss(micro)

        engine.ddp.module.loss = probe
        stats += [engine.train_step(blocks, 1e-3, step) for step, blocks in enumerate(data[1:], 2)]
        if rank == 0:
            rows = [(s.loss, s.grad_norm) for s in stats]
            rebuilt = any(p.grad.data_ptr() != old for p, old in zip(engine.params, pointers, strict=True))
            logging = engine.ddp._get_ddp_logging_data()
            facts = {"alive": alive[0], "rebuilt": rebuilt, "timed": "avg_forward_compute_time" in logging}
            torch.save({"rows": rows, "model": engine.model.state_dict(), **facts}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_ddp_engine_sums_what_one_process_accumulates(tmp_path: Path) -> None:
    """In-process ranks (no launcher): the DDP engine equals the ordinary one update by update, including
    an update where one rank holds no microbatch and the updates after DDP rebuilds its buckets; no view of
    the old buckets outlives the rebuild, and DDP's logger times nothing (on CUDA it would synchronize)."""
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
    assert got["rebuilt"] and got["alive"] == 0  # the old buckets were free before the update's activations
    assert not got["timed"]


def _rank_hands_off(rank: int, init_file: str, out: str) -> None:
    """Rank 0 writes a file in ``on_rank0`` (then fails a second one with a full disk); rank 1 records what it
    saw once each hand-off returned."""
    import torch.distributed as dist

    from tiny_llm.errors import DiskFullError

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    written = Path(out).with_suffix(".state")
    seen = []
    try:
        distributed.on_rank0(lambda: written.write_text("saved"), "save of latest.pt")
        seen.append(written.read_text() if rank == 1 else "")  # rank 1 returns only once rank 0 is done

        def full() -> None:
            raise DiskFullError("no space left on the device writing final.pt")

        try:
            distributed.on_rank0(full, "save of final.pt")
        except DiskFullError as exc:
            seen.append(f"DiskFullError: {exc}")
        if rank == 1:
            Path(out).write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_followers_wait_for_rank_0s_work_and_share_its_failure(tmp_path: Path) -> None:
    """What a save or export runs behind: the followers return only once rank 0's file is written (so none
    is in a device collective, nor gone, meanwhile), and a full disk on rank 0 fails every rank alike."""
    out = tmp_path / "seen.json"
    torch.multiprocessing.spawn(_rank_hands_off, args=(str(tmp_path / "store"), str(out)), nprocs=2)
    full = "DiskFullError: no space left on the device writing final.pt"
    assert json.loads(out.read_text()) == ["saved", full]


def _rank_loses_its_peer(rank: int, init_file: str, out: str) -> None:
    """Rank 1 dies before the evaluation's all-reduce; rank 0 writes the error it then gets to ``out``."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    dist.barrier()
    if rank == 1:
        os._exit(0)  # no goodbye: as a killed rank
    try:
        distributed.sum_over_ranks((torch.tensor(1.0, dtype=torch.float64),), (3,))
        message = "no error"
    except distributed.RankLostError as exc:
        message = str(exc)
    Path(out).write_text(message)
    os._exit(0)  # the group cannot be torn down without its peer


@pytest.mark.slow
def test_a_rank_lost_during_evaluation_is_one_line() -> None:
    """The evaluation's all-reduce, as the training's collectives: a dead peer is one line, not gloo's
    traceback (the session writes that line to run.log and status.json: test below)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "error.txt"
        torch.multiprocessing.spawn(_rank_loses_its_peer, args=(str(Path(tmp) / "store"), str(out)), nprocs=2)
        message = out.read_text()
    assert message.startswith("rank 0 lost its peers during the evaluation's all-reduce (")
    assert "\n" not in message and "resumes from the last saved state" in message


@pytest.mark.slow  # a short run, ~3 s
def test_a_lost_rank_is_one_line_in_status_json_and_run_log(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the session makes of a collective's RankLostError (here from the first evaluation): status
    failed with that line, run.log that line and no traceback."""
    from tiny_llm.train import loop

    def lost(*args: object, **kwargs: object) -> None:
        raise distributed.RankLostError("rank 0 lost its peers during the evaluation's all-reduce (gone)")

    monkeypatch.setattr(loop, "evaluate", lost)
    run_dir = tmp_path / "run"
    assert run_training(_recipe(tiny_cache, tiny_recipe_args, run_dir), quiet=True) == 1
    status = read_json(run_dir / "status.json")
    assert status["status"] == "failed" and status["error"].startswith("rank 0 lost its peers during the ev")
    log = (run_dir / "run.log").read_text()
    assert "Traceback" not in log and "failed at step" in log and "lost its peers" in log


def test_a_follower_verifies_neither_the_cache_nor_the_state_that_rank_0_verified(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank used to sha256 the whole token cache and CRC the resume state: only rank 0 does now (it
    hands the start to the others once it did)."""
    from tiny_llm.data.cache import TokenCache
    from tiny_llm.engines import build_engine
    from tiny_llm.train import checkpoint
    from tiny_llm.train.loop import Trainer
    from tiny_llm.train.metrics import RunLog

    verified: list[str] = []
    monkeypatch.setattr(TokenCache, "verify", lambda self: verified.append("cache"))
    crc = checkpoint.verify_state_file
    monkeypatch.setattr(checkpoint, "verify_state_file", lambda path: verified.append("state") or crc(path))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    state = tmp_path / "state.pt"
    checkpoint.save_state(state, {"weights": torch.zeros(2)})
    for rank0 in (True, False):
        monkeypatch.setattr(distributed, "writes_files", lambda rank0=rank0: rank0)
        log = RunLog(run_dir / "run.log", quiet=True)
        Trainer(_recipe(tiny_cache, tiny_recipe_args, run_dir), run_dir, log, build_engine)
        checkpoint.load_state(state, verify=distributed.writes_files())
    assert verified == ["cache", "state"]  # rank 0's; the follower's none


def test_remove_stale_jobs_removes_only_dead_processes_directories(tmp_path: Path) -> None:
    """Scratch of a rank (or launcher) killed before it could clean up goes; a live one's stays."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, live = tmp_path / f"tiny-llm-rank-{gone.pid}-x1", tmp_path / f"tiny-llm-rank-{os.getpid()}-x2"
    other = tmp_path / "tiny-llm-ranks-1-x3"  # the launcher's prefix: not a rank's
    for path in (dead, live, other):
        (path / "run").mkdir(parents=True)
    launch.remove_stale_jobs(tmp_path, distributed.SCRATCH_PREFIX)
    assert not dead.exists() and live.exists() and other.exists()


def _sleeper(code: int, seconds: float = 0.0) -> list[str]:
    """A rank that ends with ``code`` after ``seconds``, or on SIGTERM at once with 130 (as a trainer)."""
    script = (
        "import signal, sys, time; "
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(130)); "
        f"time.sleep({seconds}); sys.exit({code})"
    )
    return [sys.executable, "-c", script]


def test_the_launcher_waits_for_a_rank_that_ends_normally_and_stops_the_rest_after_a_failure() -> None:
    """A rank done early (exit 0 or 130) never stops another; a failed one gives the rest the shutdown
    timeout, then SIGTERM; the exit status sums the ranks up."""
    start = time.monotonic()
    slow, quick = subprocess.Popen(_sleeper(0, 1.0)), subprocess.Popen(_sleeper(130))
    assert launch.Ranks([slow, quick]).supervise(shutdown_timeout=0.1) == 130
    assert slow.returncode == 0 and time.monotonic() - start >= 1.0  # it finished its work
    hung, failing = subprocess.Popen(_sleeper(0, 600)), subprocess.Popen(_sleeper(3))
    assert launch.Ranks([hung, failing]).supervise(shutdown_timeout=0.2) == 1
    assert hung.returncode == 130  # stopped with SIGTERM once the timeout passed


def test_each_rank_gets_its_place_a_private_store_and_loopback_sockets(tmp_path: Path) -> None:
    env = launch.rank_environment({"PATH": "/bin"}, 1, 2, tmp_path, ["3", "5"])
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (
        "1",
        "1",
        "2",
        "2",
    )
    assert env[launch.STORE_ENV] == str(tmp_path / "store") and env["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "lo"
    assert int(env["TORCHINDUCTOR_COMPILE_THREADS"]) == max(2, len(os.sched_getaffinity(0)) // 2)
    assert launch.visible_gpus([1, 2], {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b,GPU-c"}) == ["GPU-b", "GPU-c"]
    assert launch.visible_gpus([0, 1], {}) == ["0", "1"]


def test_ddp_is_told_not_to_sync_buffers_in_the_words_its_torch_knows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert distributed.no_buffer_sync() == {"forward_sync_buffers": False}  # torch 2.13

    def older(
        self: object, module: object, device_ids: object = None, broadcast_buffers: bool = True
    ) -> None:
        """DistributedDataParallel.__init__ of torch 2.10-2.12 (no forward_sync_buffers)."""

    monkeypatch.setattr(torch.nn.parallel.DistributedDataParallel, "__init__", older)
    assert distributed.no_buffer_sync() == {"broadcast_buffers": False}


def test_collectives_wait_long_enough_for_rank_0_to_save_a_large_model() -> None:
    small = distributed.collective_timeout(load_recipe(["tiny"]))
    assert small.total_seconds() == 30 * 60  # gloo's default, and more than NCCL's 10 minutes
    big = load_recipe(["tiny"], ["model.width=2048", "model.num_heads=16", "model.ffn_width=8192",
                                 "model.num_layers=24"])  # fmt: skip
    assert distributed.collective_timeout(big).total_seconds() > 30 * 60


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
