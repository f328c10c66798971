"""Damaged files are recovered or named, never fatal in a loop: training states, metrics.jsonl, the JSON and
YAML files other steps read, and a disk that fills up while a checkpoint or a cache shard is written."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from train_helpers import metric_rows, small_recipe

from tiny_llm import campaign
from tiny_llm.cli import main
from tiny_llm.engines import run_training
from tiny_llm.errors import DamagedFileError, DiskFullError, RunStateError
from tiny_llm.io import atomic_write_text, read_json, read_yaml
from tiny_llm.runtime import signals
from tiny_llm.train import checkpoint, loop

INTERVAL = ("training.checkpoint_policy=interval", "training.checkpoint_every=3")


# ----------------------------------------------------------------------------- a disk that fills up


class FillingFile:
    """A writable file that takes ``room`` more bytes, then fails like a full disk (ENOSPC)."""

    def __init__(self, handle: Any, room: int) -> None:
        self.handle, self.room = handle, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.handle.write(bytes(data[: self.room]))
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)

    def __enter__(self) -> FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


@pytest.fixture
def fill_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[str], bool], int], None]:
    """``fill_disk(which, room)``: atomic writes whose temp file name ``which`` accepts run out of space
    after ``room`` bytes (the temp file is ``.<name>.<random>.tmp``)."""
    import tiny_llm.io as io_module

    real_fdopen = io_module.os.fdopen

    def arm(which: Callable[[str], bool], room: int) -> None:
        def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
            handle = real_fdopen(fd, *args, **kwargs)
            name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
            return FillingFile(handle, room) if which(name) else handle

        monkeypatch.setattr(io_module.os, "fdopen", fdopen)

    return arm


def test_full_disk_leaves_the_previous_file_and_says_where(tmp_path: Path, fill_disk: Callable) -> None:
    target = tmp_path / "status.json"
    atomic_write_text(target, "old\n")
    fill_disk(lambda name: name.startswith(".status.json."), 3)
    with pytest.raises(DiskFullError) as err:
        atomic_write_text(target, "a much longer new content\n")
    assert str(err.value) == (
        f"disk full: no space left on the device holding {tmp_path} while writing status.json; the previous "
        "status.json is unchanged; free space there and rerun the same command"
    )
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]  # no temp file left behind


def test_full_disk_inside_torch_save_is_named_too(tmp_path: Path, fill_disk: Callable) -> None:
    """torch.save wraps its writer's OSError in a RuntimeError; the disk-full check follows the chain."""
    fill_disk(lambda name: name.startswith(".latest.pt."), 1000)
    with pytest.raises(DiskFullError, match=r"while writing latest.pt; nothing was written"):
        checkpoint.save_state(tmp_path / "latest.pt", {"w": torch.zeros(10_000)})
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- JSON and YAML other steps read


def test_damaged_json_and_yaml_name_the_file_and_how_to_rebuild_it(tmp_path: Path) -> None:
    torn = tmp_path / "result.json"
    torn.write_text('{"final_validation": {"loss": 3.1')
    with pytest.raises(DamagedFileError) as err:
        read_json(torn)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and isinstance(err.value, ValueError)
    assert message.startswith(f"{torn} is damaged (not valid JSON: ")
    assert message.endswith("; delete it and rerun the command that wrote it")
    garbage = tmp_path / "selected.yaml"
    garbage.write_bytes(b"model: {num_layers: 2\n\xff\xfe")
    with pytest.raises(DamagedFileError, match=r"selected.yaml is damaged \(not valid YAML: .*\); rebuild"):
        read_yaml(garbage, "rebuild it")


def tiny_campaign(tmp_path: Path, **extra: Any) -> campaign.CampaignConfig:
    cache = tmp_path / "cache"
    cache.mkdir(exist_ok=True)
    (cache / "manifest.json").write_text(json.dumps({"identity": "cache-abc"}))
    sizes = {"s": {"preset": "tiny", "overrides": {"data": {"cache_dir": str(cache)}}}}
    section = {"stages": [{"size": "s", "lr": [1e-3, 3e-3], "weight_decay": [0.1]}], **extra}
    return campaign.parse_campaign(section, sizes, str(tmp_path / "campaign"))


def test_a_damaged_result_json_stops_ranking_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = tiny_campaign(tmp_path)
    settings = json.dumps(campaign.settings_dict(config))
    assert main(["campaign", "plan", "--settings", settings]) == 0
    runs = sorted(Path(config.root, "stage1").iterdir())
    (runs[0] / "result.json").write_text(json.dumps({"final_validation": {"loss": 3.0}}))
    (runs[1] / "result.json").write_text('{"final_validation": {"lo')  # torn by a crash elsewhere
    capsys.readouterr()
    assert main(["campaign", "rank", "--settings", settings, "--stage", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"error: {runs[1] / 'result.json'} is damaged (not valid JSON: ")
    assert "delete it and rerun the same command: training that run again with --resume auto" in err
    # the report of those runs says the same
    assert main(["report", "--runs", str(Path(config.root)), "--output-dir", str(tmp_path / "rep")]) == 2
    assert f"{runs[1] / 'result.json'} is damaged" in capsys.readouterr().err


def test_a_damaged_tuning_result_is_named_with_the_command_that_rebuilds_it(tmp_path: Path) -> None:
    tuned = tmp_path / "cpu-tuning" / "selected.yaml"
    tuned.parent.mkdir()
    tuned.write_text("")  # emptied
    with pytest.raises(DamagedFileError) as err:
        campaign.load_templates(tiny_campaign(tmp_path, tuning={"s": str(tuned)}))
    assert str(err.value) == (
        f"{tuned} is damaged (empty); delete it and rerun the same command: `tiny-llm tune select` writes it "
        "again from the candidates' results"
    )
    tuned.write_text(yaml.safe_dump(campaign.size_base({"preset": "tiny"}, "s")))
    (tuned.parent / "summary.json").write_text('{"selected": {"tokens_per_sec')
    with pytest.raises(DamagedFileError, match=r"summary.json is damaged .*`tiny-llm tune select`"):
        campaign.tuned_throughput(tuned)


# ----------------------------------------------------------------------------- training states


def fake_state(path: Path, step: int) -> None:
    checkpoint.save_state(path, {"progress": {"step": step}, "weights": torch.arange(50_000.0)})


def truncate(path: Path, fraction: float = 0.5) -> None:
    os.truncate(path, int(path.stat().st_size * fraction))


def flip_bytes(path: Path) -> None:
    """Alter bytes in the middle of the tensor data; the header and every zip record stay in place."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [truncate, flip_bytes, lambda p: p.write_bytes(b"")])
def test_a_damaged_latest_state_is_set_aside_for_the_newest_valid_one(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    fake_state(tmp_path / "latest.pt", 9)
    fake_state(tmp_path / "epoch-001.pt", 4)
    fake_state(tmp_path / "epoch-002.pt", 8)
    damage(tmp_path / "latest.pt")
    lines: list[str] = []
    path, state = checkpoint.newest_usable_state(tmp_path, lines.append)
    assert path == tmp_path / "epoch-002.pt" and state["progress"]["step"] == 8
    assert len(lines) == 1
    assert lines[0].startswith(f"warning: {tmp_path / 'latest.pt'} is damaged (")
    assert lines[0].endswith("); kept as latest.pt.corrupt; resuming from epoch-002.pt (step 8) instead")
    assert not (tmp_path / "latest.pt").exists() and (tmp_path / "latest.pt.corrupt").is_file()
    assert checkpoint.state_candidates(tmp_path) == [tmp_path / "epoch-001.pt", tmp_path / "epoch-002.pt"]


def test_with_no_valid_state_left_the_run_starts_afresh(tmp_path: Path) -> None:
    fake_state(tmp_path / "latest.pt", 9)
    truncate(tmp_path / "latest.pt", 0.9)
    lines: list[str] = []
    assert checkpoint.newest_usable_state(tmp_path, lines.append) == (None, None)
    assert len(lines) == 1 and lines[0].endswith(
        "; kept as latest.pt.corrupt; no other valid state: starting the run afresh"
    )


def test_an_explicitly_named_damaged_state_is_one_line(tmp_path: Path) -> None:
    fake_state(tmp_path / "final.pt", 3)
    flip_bytes(tmp_path / "final.pt")
    with pytest.raises(RunStateError) as err:
        checkpoint.load_state(tmp_path / "final.pt")
    assert str(err.value) == (
        f"{tmp_path / 'final.pt'}: damaged training state (checksum mismatch in record archive/data/0); pass "
        "another state or --resume auto"
    )


WEIGHTS_ONLY_REFUSAL = pickle.UnpicklingError("Weights only load failed. This file can still be loaded...")


@pytest.mark.parametrize(
    "error",
    [
        PermissionError(errno.EACCES, "Permission denied"),
        OSError(errno.EIO, "Input/output error"),
        MemoryError(),
        WEIGHTS_ONLY_REFUSAL,
    ],
    ids=["permission", "io", "memory", "weights_only"],
)
@pytest.mark.parametrize("where", ["zip", "load"])
def test_a_read_error_is_not_damage_it_stops_in_one_line_and_touches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, where: str
) -> None:
    fake_state(tmp_path / "latest.pt", 9)
    fake_state(tmp_path / "epoch-001.pt", 4)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    if where == "zip" and isinstance(error, pickle.UnpicklingError):
        pytest.skip("torch.load alone refuses a pickle")
    target = zipfile if where == "zip" else torch
    real = target.ZipFile if where == "zip" else torch.load
    name = "ZipFile" if where == "zip" else "load"

    def failing(path: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(path).name == "latest.pt":
            raise error
        return real(path, *args, **kwargs)

    monkeypatch.setattr(target, name, failing)
    lines: list[str] = []
    with pytest.raises(RunStateError) as err:
        checkpoint.newest_usable_state(tmp_path, lines.append)
    message = str(err.value)
    assert "latest.pt" in message and "\n" not in message and "damaged" not in message
    assert lines == []
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing renamed or restarted


def test_set_aside_states_never_overwrite_each_other(tmp_path: Path) -> None:
    for step in (3, 5, 7):
        fake_state(tmp_path / "latest.pt", step)
        truncate(tmp_path / "latest.pt", 0.4 + step / 100)
        assert checkpoint.newest_usable_state(tmp_path, lambda line: None) == (None, None)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["latest.pt.corrupt", "latest.pt.corrupt-2", "latest.pt.corrupt-3"]
    assert len({(tmp_path / name).stat().st_size for name in kept}) == 3


def test_one_bad_line_in_the_middle_of_metrics_drops_only_that_line(tmp_path: Path) -> None:
    from tiny_llm.train.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    rows = [{"event": "train", "step": step, "loss": 1.0 / step} for step in range(1, 6)]
    lines = [json.dumps(row) for row in rows]
    lines[2] = '{"event": "train", "st\x00\xff'  # damaged in place
    path.write_text(
        "\n".join([*lines[:3], "[1, 2]", *lines[3:]]) + "\n", encoding="utf-8", errors="surrogateescape"
    )
    log = MetricsLog(path)
    assert [row["step"] for row in log.rows()] == [1, 2, 4, 5]
    log.truncate_to_step(4)
    assert [row["step"] for row in log.rows()] == [1, 2, 4]


# ----------------------------------------------------------------------------- training runs (slow)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, tiny_cache: Path, tiny_recipe_args: Callable) -> Path:
    run_dir = tmp_path_factory.mktemp("baseline") / "run"
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, *INTERVAL), quiet=True) == 0
    return run_dir


def assert_same_run(run_dir: Path, baseline: Path) -> None:
    assert metric_rows(run_dir) == metric_rows(baseline)
    assert (run_dir / "final.safetensors").read_bytes() == (baseline / "final.safetensors").read_bytes()
    ours, theirs = read_json(run_dir / "result.json"), read_json(baseline / "result.json")
    for key in ("tokens", "step", "epochs", "best_subset_loss", "best_epoch"):
        assert ours[key] == theirs[key], key
    assert ours["final_validation"]["loss"] == theirs["final_validation"]["loss"]


@pytest.fixture
def stop_after(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[int], None]]:
    """``stop_after(step)``: the next run stops (as on SIGTERM) once that update is done."""
    account = loop.Trainer._account
    stop_at: list[int] = []

    def account_then_stop(self: loop.Trainer, *args: object) -> None:
        account(self, *args)
        if stop_at and self.progress.step == stop_at[0]:
            stop_at.clear()
            signals.request_stop()

    monkeypatch.setattr(loop.Trainer, "_account", account_then_stop)
    yield stop_at.append


@pytest.mark.slow
def test_a_truncated_latest_state_resumes_from_an_epoch_state_bitwise(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, stop_after: Callable
) -> None:
    run_dir = tmp_path / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *INTERVAL, "training.checkpoint_policy=all")
    stop_after(20)  # epoch 1 ends at update 11: epoch-001.pt holds step 11, latest.pt step 20
    assert run_training(recipe, resume="auto", quiet=True) == 130
    truncate(run_dir / "latest.pt")
    with open(run_dir / "metrics.jsonl", "a") as metrics:  # and a row torn by the kill
        metrics.write('{"event": "train", "step": 22, "lo')
    assert run_training(recipe, resume="auto", quiet=True) == 0
    log = (run_dir / "run.log").read_text()
    assert f"warning: {run_dir / 'latest.pt'} is damaged (truncated or not a state file: " in log
    assert "kept as latest.pt.corrupt; resuming from epoch-001.pt (step 11) instead" in log
    assert_same_run(run_dir, baseline)
    assert (run_dir / "latest.pt.corrupt").is_file()


@pytest.mark.slow
def test_a_damaged_only_state_starts_the_run_afresh_and_a_torn_row_is_rewritten(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, stop_after: Callable
) -> None:
    run_dir = tmp_path / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *INTERVAL)
    stop_after(7)
    assert run_training(recipe, resume="auto", quiet=True) == 130
    flip_bytes(run_dir / "latest.pt")
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert "no other valid state: starting the run afresh" in (run_dir / "run.log").read_text()
    assert_same_run(run_dir, baseline)
    # killed while writing a row after the state at step 7: resuming cuts it and writes it again
    stop_after(7)
    shutil.rmtree(run_dir)
    assert run_training(recipe, resume="auto", quiet=True) == 130
    with open(run_dir / "metrics.jsonl", "a") as metrics:
        metrics.write('{"event": "train", "step": 8, "epoch": 1, "tok')
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert_same_run(run_dir, baseline)


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_state(
    baseline: Path,
    tmp_path: Path,
    tiny_cache: Path,
    tiny_recipe_args: Callable,
    fill_disk: Callable,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir = tmp_path / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *INTERVAL)
    saves: list[str] = []
    save_state = checkpoint.save_state

    def counting_save(path: Path, state: dict[str, Any]) -> None:
        saves.append(path.name)
        if len(saves) == 3:  # the third rolling state (step 9) finds the disk full
            fill_disk(lambda name: name.startswith(".latest.pt."), 4096)
        save_state(path, state)

    monkeypatch.setattr(checkpoint, "save_state", counting_save)
    assert run_training(recipe, resume="auto", quiet=True) == 1
    status = read_json(run_dir / "status.json")
    assert status["status"] == "failed" and status["step"] == 9
    assert status["error"] == (
        f"disk full: no space left on the device holding {run_dir} while writing latest.pt; the previous "
        "latest.pt is unchanged; free space there and rerun the same command"
    )
    assert checkpoint.load_state(run_dir / "latest.pt")["progress"]["step"] == 6
    assert not list(run_dir.glob(".*.tmp"))
    monkeypatch.undo()
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert_same_run(run_dir, baseline)


@pytest.mark.slow
def test_a_damaged_result_of_a_finished_run_is_rewritten_from_its_final_state(
    baseline: Path, tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(baseline, run_dir)
    (run_dir / "result.json").write_text('{"parameters": 12')
    (run_dir / ".latest.pt.x1y2z3w4.tmp").write_bytes(b"half a state")  # its writer was killed
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *INTERVAL)
    assert run_training(recipe, resume="auto", quiet=True) == 0
    assert "resumed from" in (run_dir / "run.log").read_text()
    assert_same_run(run_dir, baseline)
    assert not list(run_dir.glob(".*.tmp"))


@pytest.mark.slow
def test_a_full_disk_while_writing_a_cache_shard_publishes_nothing(
    tmp_path: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tiny_llm.config import load_recipe
    from tiny_llm.data import prepare

    cache_dir = tmp_path / "cache"
    real_open = open

    def filling_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        return FillingFile(handle, 100_000) if Path(file).name == "train-00001.bin" else handle

    monkeypatch.setattr(prepare, "open", filling_open, raising=False)
    recipe = load_recipe(["tiny"], tiny_recipe_args(cache_dir))
    with pytest.raises(DiskFullError) as err:
        prepare.prepare_cache(recipe, progress=False)
    message = str(err.value)
    assert message.startswith(
        f"disk full: no space left on the device holding {tmp_path} while writing the token cache into "
        f"{tmp_path / 'cache.partial'} (its train split alone takes 0.4 MiB); the partial cache was removed"
    )
    assert message.endswith(
        f"nothing was published at {cache_dir}; free space there and rerun the same command"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.lock"]


@pytest.mark.slow
def test_a_non_finite_validation_stops_the_run_as_diverged(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Weights can blow up while the training losses stay finite: the epoch's validation then says so. A huge
    but finite loss is kept (its perplexity, which overflows, is null)."""
    from tiny_llm.commands.train import record_divergence

    evaluate = loop.evaluate
    losses = iter([1e6, float("nan")])

    def blowing_up(*args: object, **kwargs: object) -> object:
        return dataclasses.replace(evaluate(*args, **kwargs), loss=next(losses))

    monkeypatch.setattr(loop, "evaluate", blowing_up)
    run_dir = tmp_path / "run"
    assert run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir, *INTERVAL), quiet=True) == 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["event"] == "validation")
    assert first["loss"] == 1e6 and first["perplexity"] is None
    status = read_json(run_dir / "status.json")
    assert status["error"] == "step 22: non-finite subset validation loss (nan)"
    assert record_divergence(run_dir, 1) == 0
    result = read_json(run_dir / "result.json")
    assert result["status"] == "diverged" and result["step"] == 22 and result["final_validation"] is None


def test_every_metrics_reader_drops_a_torn_last_line_the_same_way(tmp_path: Path) -> None:
    from tiny_llm.analysis.summary import training_norms
    from tiny_llm.train.metrics import MetricsLog, read_metrics

    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []
    rows = [{"event": "train", "step": s, "tokens": 64 * s, "loss": 3.0, "grad_norm": 0.5} for s in (1, 2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "train", "st')
    assert read_metrics(path) == rows == MetricsLog(path).rows()
    assert training_norms(path) == [(1, 0.5), (2, 0.5)]
    path.write_text(json.dumps(rows[0]) + "\n7\n")  # a torn row that happens to parse is not a row either
    assert read_metrics(path) == rows[:1]


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_row_with_a_non_finite_number_is_dropped_like_a_damaged_line_on_resume(
    tmp_path: Path, bad: str
) -> None:
    """The writer refuses NaN, so no run wrote a row holding one: resuming drops it and never fails."""
    from tiny_llm.train.metrics import MetricsLog, read_metrics

    path = tmp_path / "metrics.jsonl"
    rows = [{"event": "train", "step": step, "loss": 1.0 / step} for step in range(1, 5)]
    lines = [json.dumps(row) for row in rows]
    lines[1] = f'{{"event": "train", "step": 2, "loss": {bad}}}'
    path.write_text("\n".join(lines) + "\n")
    assert [row["step"] for row in read_metrics(path)] == [1, 3, 4]
    log = MetricsLog(path)
    log.truncate_to_step(3)
    assert path.read_text() == "".join(json.dumps(row) + "\n" for row in (rows[0], rows[2]))


@pytest.mark.parametrize("kib", [4, 5, 8, 16, 32, 48, 63, 64])
def test_a_state_truncated_to_a_few_kib_is_damage_not_a_read_error(tmp_path: Path, kib: int) -> None:
    """Memory-mapping a state cut to 4-64 KiB fails with EINVAL, which was taken for a read error ("fix the
    cause and rerun"), so every `--resume auto` stopped on it; it is damage, set aside like a longer cut."""
    fake_state(tmp_path / "latest.pt", 9)
    fake_state(tmp_path / "epoch-001.pt", 4)
    os.truncate(tmp_path / "latest.pt", kib * 1024)
    cut = (tmp_path / "latest.pt").read_bytes()
    with pytest.raises(checkpoint.DamagedStateError, match=r"latest.pt: damaged training state \(truncated"):
        checkpoint.load_state(tmp_path / "latest.pt", lazy=True)
    lines: list[str] = []
    path, state = checkpoint.newest_usable_state(tmp_path, lines.append)
    assert path == tmp_path / "epoch-001.pt" and state is not None and state["progress"]["step"] == 4
    assert len(lines) == 1 and lines[0].endswith(
        "; kept as latest.pt.corrupt; resuming from epoch-001.pt (step 4) instead"
    )
    assert (tmp_path / "latest.pt.corrupt").read_bytes() == cut
