"""Live tracking: TensorBoard event files and W&B offline runs read back; failures never stop a run."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import small_recipe

from tiny_llm.config import load_recipe, recipe_identity
from tiny_llm.data.cache import open_cache
from tiny_llm.engines import run_training
from tiny_llm.errors import ConfigError
from tiny_llm.train.tracking import TRACKING_ENV, Tracker, run_name_and_group, tracking_settings

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def rows(run_dir: Path, event: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if row["event"] == event]


def wandb_records(path: Path) -> list:
    """The records of a .wandb file (LevelDB log framing: 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, records, parts = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # too little room for a header: the block is padded
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST part of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
            parts = b""
    return records


def test_tensorboard_event_files_hold_every_row(tiny_cache, tiny_recipe_args, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "results" / "runs" / "tb"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "tracking.tensorboard=true")
    assert run_training(recipe, quiet=True) == 0
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    train = rows(run_dir, "train")
    logged = events.Scalars("train/loss")
    assert [e.step for e in logged] == [r["step"] for r in train]
    assert [e.value for e in logged] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    validation = rows(run_dir, "validation")
    assert [e.value for e in events.Scalars("validation/loss")] == pytest.approx(
        [r["loss"] for r in validation], rel=1e-6
    )
    (final,) = rows(run_dir, "final_validation")
    assert events.Scalars("final_validation/perplexity")[0].value == pytest.approx(final["perplexity"])
    identity = recipe_identity(recipe, open_cache(tiny_cache, verify=False).identity)
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert identity in text and '"tensorboard": true' in text
    assert json.loads((run_dir / "result.json").read_text())["recipe_identity"] == identity


@pytest.mark.slow
def test_wandb_offline_run_files_hold_rows_config_name_and_group(
    tiny_cache, tiny_recipe_args, tmp_path, monkeypatch
):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "results" / "campaign" / "stage1" / "tiny-lr0.003-s43"
    extra = ["tracking.wandb.project=tests", "tracking.wandb.mode=offline"]
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, *extra)
    assert run_training(recipe, quiet=True) == 0
    (file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    records = wandb_records(file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.project) == (
        "tiny-lr0.003-s43",
        "stage1/tiny-lr0.003",
        "tests",
    )
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    identity = recipe_identity(recipe, open_cache(tiny_cache, verify=False).identity)
    assert config["recipe_identity"] == identity and config["recipe"]["optimizer"]["lr"] == 0.003
    history: dict[str, list[tuple[int, float]]] = {}
    for record in records:
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key = item.key or "/".join(item.nested_key)
                history.setdefault(key, []).append((record.history.step.num, json.loads(item.value_json)))
    train = rows(run_dir, "train")
    assert [step for step, _ in history["train/loss"]] == [r["step"] for r in train]
    assert [v for _, v in history["train/loss"]] == pytest.approx([r["loss"] for r in train])
    assert len(history["validation/loss"]) == len(rows(run_dir, "validation"))
    assert "final_validation/loss" in history


def test_campaign_names_and_groups_put_seeds_together(tmp_path):
    settings = load_recipe(["tiny"], ["tracking.tensorboard=true"]).tracking
    for seed in (42, 43):
        path = tmp_path / "campaign" / "stage2" / f"20m-parent0-beta2-0.99-s{seed}"
        assert run_name_and_group(settings, path) == (path.name, "stage2/20m-parent0-beta2-0.99")
    named = load_recipe(["tiny"], ["tracking.name=a", "tracking.group=b"]).tracking
    assert run_name_and_group(named, tmp_path / "x") == ("a", "b")


def test_tracking_is_not_part_of_the_identity_and_comes_from_the_environment(monkeypatch):
    plain = load_recipe(["tiny"])
    tracked = load_recipe(["tiny"], ["tracking.tensorboard=true", "tracking.wandb.entity=me"])
    assert recipe_identity(plain, "c") == recipe_identity(tracked, "c")
    assert tracking_settings(plain) is None
    monkeypatch.setenv(TRACKING_ENV, json.dumps({"tensorboard": True, "wandb": {"mode": "online"}}))
    from_env = tracking_settings(plain)
    assert from_env.tensorboard and from_env.wandb.mode == "online"
    assert tracking_settings(tracked) == tracked.tracking  # the recipe's own section wins
    monkeypatch.setenv(TRACKING_ENV, json.dumps({"wandb": {"mode": "sometimes"}}))
    with pytest.raises(ConfigError, match=r"TINY_LLM_TRACKING: .*tracking.wandb.mode"):
        tracking_settings(plain)


def test_a_failing_tracker_warns_once_and_is_dropped():
    class Broken:
        kind = "wandb"
        calls = 0

        def log(self, step, values):
            Broken.calls += 1
            raise ConnectionError("network is unreachable")

        def close(self):
            raise AssertionError("a dropped tracker is not closed")

    class Working:
        kind = "tensorboard"
        seen: list = []

        def log(self, step, values):
            self.seen.append((step, values))

        def close(self):
            pass

    warnings: list[str] = []
    tracker = Tracker([Broken(), Working()], warnings.append)
    for step in (1, 2, 3):
        tracker.log_row({"event": "train", "step": step, "loss": 1.5, "epoch": 1, "flag": True, "split": "x"})
    tracker.close()
    assert Broken.calls == 1 and len(warnings) == 1
    assert "wandb failed and is off for this run (ConnectionError: network is unreachable)" in warnings[0]
    assert Working.seen[-1] == (3, {"train/loss": 1.5, "train/epoch": 1.0})


def test_a_tracker_that_cannot_start_leaves_the_run_going(
    tiny_cache, tiny_recipe_args, tmp_path, monkeypatch
):
    import tiny_llm.train.tracking as tracking

    def refuse(*args, **kwargs):
        raise ImportError("No module named 'tensorboard'")

    monkeypatch.setattr(tracking, "TensorBoardSink", refuse)
    run_dir = tmp_path / "run"
    recipe = small_recipe(tiny_cache, tiny_recipe_args, run_dir, "tracking.tensorboard=true")
    assert run_training(recipe, quiet=True) == 0
    log = (run_dir / "run.log").read_text()
    assert log.count("tracking: tensorboard did not start") == 1 and ".[tracking]" in log
    assert json.loads((run_dir / "status.json").read_text())["status"] == "complete"


def test_unset_tracking_imports_no_tracker():
    code = (
        "import sys; from pathlib import Path; from tiny_llm.config import load_recipe; "
        "from tiny_llm.train.tracking import open_tracker; "
        "t = open_tracker(load_recipe(['tiny']), Path('.'), 'x', print); "
        "t.log_row({'step': 1, 'loss': 1.0}); "
        "t.close(); assert not {'wandb', 'tensorboard', 'torch.utils.tensorboard'} & set(sys.modules)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != TRACKING_ENV}
    assert subprocess.run([sys.executable, "-c", code], check=False, env=env).returncode == 0
