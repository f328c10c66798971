"""No folder emptied or narrowed that tiny-llm did not make: every command that writes a directory refuses a
non-empty one without the ``.tiny-llm-output`` marker in one line, before anything there changes (file
contents and modes), writes the marker into the ones it makes, and works again on its own."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest
from test_analysis_summary import fake_result
from test_report import make_run
from test_samples import fake_export
from train_helpers import small_recipe

from tiny_llm import io
from tiny_llm.analysis.summary import write_summary
from tiny_llm.cli import main
from tiny_llm.data.prepare import prepare_cache
from tiny_llm.engines import run_training
from tiny_llm.errors import ConfigError, DataError, RunStateError
from tiny_llm.io import REPLACED_INFIX, atomic_write_text
from tiny_llm.output_dirs import OUTPUT_MARKER, claim_output_dir
from tiny_llm.report import write_report
from tiny_llm.train import run_dir as run_dirs
from tiny_llm.train.run_dir import LOCK_FILE, remove_stale_temps

REPO = Path(__file__).resolve().parents[2]
FOREIGN = "is a non-empty directory that tiny-llm did not write; choose a new or empty one"


def users_folder(path: Path, files: dict[str, bytes], mode: int = 0o640) -> dict[str, tuple[bytes, int]]:
    """A folder of someone's files (mode ``mode``); returns what a check compares it with."""
    path.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
        (path / name).chmod(mode)
    return snapshot(path)


def snapshot(path: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in sorted(path.iterdir())}


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


# ------------------------------------------------------------------------- 3: build-demo-corpus


def test_build_demo_corpus_refuses_a_folder_of_real_c4_shards(tmp_path: Path, capsys) -> None:
    shards = tmp_path / "c4"
    names = ("c4-train.00000-of-00001.json.gz", "c4-validation.00000-of-00001.json.gz")
    before = users_folder(shards, {name: b"the real C4, downloaded for days" for name in names})
    assert main(["build-demo-corpus", "--output", str(shards)]) == 2
    assert one_error_line(capsys) == (
        f"error: --output {shards} is a non-empty directory that tiny-llm did not write; choose a new path"
    )
    assert main(["build-demo-corpus", "--output", str(shards), "--force"]) == 2  # --force is for ours only
    assert "did not write" in one_error_line(capsys)
    assert snapshot(shards) == before and not list(tmp_path.glob(".c4.*"))


def test_build_demo_corpus_marks_its_folder_and_replaces_it_only_with_force(tmp_path: Path, capsys) -> None:
    from tiny_llm.data.corpus import build_demo_corpus

    corpus = tmp_path / "corpus"
    build_demo_corpus(corpus, 0.1, max_chars=20_000)
    assert (corpus / OUTPUT_MARKER).is_file()
    before = snapshot(corpus)
    assert main(["build-demo-corpus", "--output", str(corpus)]) == 2
    assert one_error_line(capsys) == (
        f"error: --output {corpus} already holds an earlier output; pass --force to replace it"
    )
    assert snapshot(corpus) == before
    counts = build_demo_corpus(corpus, 0.2, max_chars=20_000, force=True)
    assert counts["validation"] > 0 and (corpus / OUTPUT_MARKER).is_file()


# ------------------------------------------------------------------------- 4: report commands


def report_commands(tmp_path: Path) -> dict[str, list[str]]:
    """command -> argv writing into --output-dir (inputs made under tmp_path / 'in')."""
    root = tmp_path / "in"
    runs = root / "runs"
    make_run(runs, "stage1", "s-lr0.001-wd0.1", loss=4.0, lr=1e-3)
    export = fake_export(root / "exports" / "a", "a", loss=3.0)
    job = fake_result(root / "analysis", "r", "final", 10, "seen")
    return {
        "report": ["report", "--runs", str(runs)],
        "samples": ["samples", "--exports", str(export)],
        "analysis-summary": ["analysis-summary", "--inputs", str(job)],
        "horizons-report": ["horizons-report", "--runs", str(runs / "stage1" / "s-lr0.001-wd0.1")],
    }


def test_report_commands_refuse_a_users_report_and_comparison(tmp_path: Path, capsys) -> None:
    mine = {"report.md": b"# my notes\n", "comparison.json": b'{"mine": true}\n', "manifest.json": b"{}\n"}
    for command, argv in report_commands(tmp_path).items():
        out = tmp_path / "users" / command
        before = users_folder(out, mine)
        assert main([*argv, "--output-dir", str(out)]) == 2, command
        assert one_error_line(capsys) == f"error: --output-dir {out} {FOREIGN}", command
        assert snapshot(out) == before, command
    with pytest.raises(ConfigError, match="did not write"):  # the library refuses too
        write_report(tmp_path / "in" / "runs", tmp_path / "users" / "report")


@pytest.mark.slow
def test_report_commands_mark_their_folders_and_write_there_again(tmp_path: Path, capsys) -> None:
    for command, argv in report_commands(tmp_path).items():
        out = tmp_path / "out" / command
        assert main([*argv, "--output-dir", str(out)]) == 0, command + capsys.readouterr().err
        assert (out / OUTPUT_MARKER).is_file(), command
        (out / "notes.txt").write_text("ours now: a rerun keeps it and writes its files again")
        for name in ("report.md", "exports.md", "summary.csv"):
            (out / name).unlink(missing_ok=True)
        assert main([*argv, "--output-dir", str(out)]) == 0, command + capsys.readouterr().err
        assert any((out / name).is_file() for name in ("report.md", "exports.md", "summary.csv")), command
        assert (out / "notes.txt").is_file()


@pytest.mark.slow
def test_an_unmarked_report_of_an_earlier_version_is_refused_and_inputs_beside_a_summary_are_fine(
    tmp_path: Path, capsys
) -> None:
    """A results tree belongs to the version that made it (docs/architecture.md): a report directory written
    before reports were marked is refused in one line like any folder tiny-llm did not write, and kept."""
    for command, argv in report_commands(tmp_path).items():  # an earlier version's results/: no marker
        out = tmp_path / "earlier" / command
        assert main([*argv, "--output-dir", str(out)]) == 0, command
        (out / OUTPUT_MARKER).unlink()
        before = snapshot(out)
        assert main([*argv, "--output-dir", str(out)]) == 2, command
        assert one_error_line(capsys) == f"error: --output-dir {out} {FOREIGN}", command
        assert snapshot(out) == before, command
    # the workflow's analysis layout: the jobs' directories, then their summary beside them
    jobs = [fake_result(tmp_path / "layout", "r", "final", 10, case) for case in ("seen", "unseen")]
    write_summary(jobs, jobs[0].parent)
    assert (jobs[0].parent / OUTPUT_MARKER).is_file() and (jobs[0].parent / "summary.csv").is_file()
    jobs = [fake_result(tmp_path / "mixed", "r", "final", 10, case) for case in ("seen", "unseen")]
    (jobs[0].parent / "mine.txt").write_text("a file of mine beside the jobs")
    with pytest.raises(ConfigError, match="did not write"):
        write_summary(jobs, jobs[0].parent)


# ------------------------------------------------------------------------- 5 and 16: train


def test_train_into_a_foreign_folder_is_refused_before_a_lock_file(
    tiny_cache, tiny_recipe_args, tmp_path: Path
) -> None:
    folder = tmp_path / "essays"
    before = users_folder(folder, {".essay.tmp": b"draft, unsaved elsewhere", "essay.md": b"# Essay\n"})
    with pytest.raises(RunStateError) as caught:
        run_training(small_recipe(tiny_cache, tiny_recipe_args, folder), quiet=True)
    assert str(caught.value) == (
        f"runtime.output_dir {folder} is a non-empty directory that holds no tiny-llm run; "
        "choose a new or empty directory"
    )
    assert snapshot(folder) == before and not (folder / LOCK_FILE).exists()


def test_only_our_temp_files_are_removed_from_a_run_directory(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    atomic_write_text(run_dir / "status.json", '{"status": "running", "step": 1, "tokens": 64}')
    ours = run_dir / ".latest.pt.k3j_9xq2.tmp"  # atomic_write_with's name: .<file>.<8 characters>.tmp
    ours.write_bytes(b"half a state")
    mine = {".essay.tmp": b"mine", ".notes.tmp": b"mine too"}
    users_folder(run_dir, mine)
    assert io.is_atomic_temp(ours.name) and not io.is_atomic_temp(".essay.tmp")
    remove_stale_temps(run_dir)
    assert not ours.exists()
    assert {k: v[0] for k, v in snapshot(run_dir).items() if k.endswith(".tmp")} == mine


def test_run_directories_of_ours_are_still_accepted(tmp_path: Path) -> None:
    # the workflow's results/<stage>/<run>/recipe.yaml, written before training
    workflow = tmp_path / "results" / "runs" / "tiny-a"
    atomic_write_text(workflow / "recipe.yaml", "model: {}\n")
    assert run_dirs.claim_run_dir(workflow, keep=[workflow / "recipe.yaml"]) == workflow
    with pytest.raises(RunStateError, match="holds no tiny-llm run"):  # without it: someone's recipe.yaml
        run_dirs.claim_run_dir(workflow)
    # a run of an earlier version: its identity, its status or its state; or one killed at its start
    for name, text in {
        "environment.json": '{"recipe_identity": "abc"}',
        "result.json": '{"recipe_identity": "abc", "status": "complete"}',
        "status.json": '{"status": "running", "step": 3, "tokens": 192}',
        "latest.pt": "state",
        LOCK_FILE: "",
    }.items():
        run_dir = tmp_path / "earlier" / name.strip(".")
        atomic_write_text(run_dir / name, text)
        atomic_write_text(run_dir / "run.log", "2026-01-01 00:00:00 start\n")
        if name != LOCK_FILE:  # with a run in it, a run directory may hold more
            (run_dir / "notes.txt").write_text("mine")
        assert run_dirs.claim_run_dir(run_dir) == run_dir, name


def test_a_run_named_like_a_set_aside_one_is_refused(tiny_cache, tiny_recipe_args, tmp_path: Path) -> None:
    run_dir = tmp_path / f"x{REPLACED_INFIX}1"
    with pytest.raises(ConfigError) as caught:
        run_training(small_recipe(tiny_cache, tiny_recipe_args, run_dir), quiet=True)
    assert str(caught.value) == (
        f"runtime.output_dir {run_dir}: a name holding '.replaced-' is kept for runs set aside, which "
        "reports leave out; choose another name"
    )
    assert not run_dir.exists()


def test_the_workflow_refuses_a_run_named_like_a_set_aside_one() -> None:
    from tiny_llm.pipeline.schema import load_schema, validate_config

    schema = load_schema(REPO / "schemas" / "workflow_config.schema.yaml")
    for section in (
        {"runs": {f"x{REPLACED_INFIX}1": {"size": "s"}}},
        {"sizes": {f"s{REPLACED_INFIX}2": {"preset": "tiny"}}},
    ):
        with pytest.raises(ConfigError) as caught:
            validate_config(section, schema, "test.yaml")
        problems = str(caught.value).splitlines()[1:]
        assert len(problems) == 1 and REPLACED_INFIX in problems[0], problems
    validate_config({"runs": {"x.replace-1": {"size": "s"}}}, schema, "test.yaml")


# ------------------------------------------------------------------------- 6: prepare's partial


def test_a_users_partial_sibling_is_refused_and_kept(tiny_recipe_args, tmp_path: Path) -> None:
    from test_data_prepare import recipe_for

    partial = tmp_path / "cache.partial"
    before = users_folder(partial, {"thesis.tex": b"\\documentclass{article}"})
    recipe = recipe_for(tiny_recipe_args, tmp_path / "cache", "data.prepare_train_tokens=5000")
    with pytest.raises(DataError) as caught:
        prepare_cache(recipe, progress=False)
    assert str(caught.value).startswith(
        f"{partial} is not a partial cache tiny-llm wrote (no {OUTPUT_MARKER})"
    )
    assert "\n" not in str(caught.value) and snapshot(partial) == before
    assert not (tmp_path / "cache").exists()
    partial.joinpath("thesis.tex").unlink()  # an empty one is nobody's loss
    result = prepare_cache(recipe, progress=False)
    assert not partial.exists() and result.train_tokens == 5000
    assert not (tmp_path / "cache" / OUTPUT_MARKER).exists()  # the cache holds what it always held


# ------------------------------------------------------------------------- 7: benchmarks' --workdir


def benchmark(name: str) -> ModuleType:
    if str(REPO / "benchmarks") not in sys.path:  # the scripts import their shared helpers by name
        sys.path.insert(0, str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def not_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("the benchmark started in a directory it should have refused")


@pytest.mark.parametrize("name", ["tuning_isolation", "slurm_load"])
def test_benchmarks_refuse_a_workdir_they_did_not_make(
    name: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    workdir = tmp_path / "paper"
    before = users_folder(workdir, {"paper.tex": b"\\documentclass{article}", "refs.bib": b"@book{x}"})
    module = benchmark(name)
    monkeypatch.setattr(module, "snakemake", not_run)
    monkeypatch.setattr(sys, "argv", [name, "--workdir", str(workdir)])
    with pytest.raises(SystemExit) as caught:
        module.main()
    assert caught.value.code == 2
    assert one_error_line(capsys) == f"error: --workdir {workdir.resolve()} {FOREIGN}"
    assert snapshot(workdir) == before


def test_the_data_parallel_benchmark_refuses_a_folder_with_same_named_runs_it_did_not_make(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Its runs are named one_process, two_ranks, ...: their result.json and states must not be someone's."""
    workdir = tmp_path / "experiments"
    run = users_folder(
        workdir / "one_process", {"result.json": b"{}", "final.pt": b"weights", "latest.pt": b"w"}
    )
    module = benchmark("data_parallel")
    monkeypatch.setattr(module, "build_data", not_run)
    monkeypatch.setattr(module, "train", not_run)
    monkeypatch.setattr(sys, "argv", ["data_parallel", "--workdir", str(workdir)])
    with pytest.raises(SystemExit) as caught:
        module.main()
    assert caught.value.code == 2
    assert one_error_line(capsys) == f"error: --workdir {workdir.resolve()} {FOREIGN}"
    assert snapshot(workdir / "one_process") == run and sorted(os.listdir(workdir)) == ["one_process"]


def test_the_fault_benchmark_refuses_a_foreign_workdir_and_marks_its_own(
    fault_benchmark: ModuleType, tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.setattr(fault_benchmark, "run_snakemake", not_run)
    workdir = tmp_path / "paper"
    before = users_folder(workdir, {"paper.tex": b"\\documentclass{article}"})
    with pytest.raises(SystemExit) as caught:
        fault_benchmark.run(workdir, [1], 1, shape="short")
    assert caught.value.code == 2 and "did not write" in one_error_line(capsys)
    assert snapshot(workdir) == before
    ours = fault_benchmark.claim_workdir(tmp_path / "scratch")
    assert (ours / OUTPUT_MARKER).is_file()
    (ours / "base").mkdir()
    assert fault_benchmark.claim_workdir(ours) == ours and (ours / "base").is_dir()  # reused
    emptied = fault_benchmark.claim_workdir(ours, empty=True)
    assert [p.name for p in emptied.iterdir()] == [OUTPUT_MARKER]


def test_file_modes_follow_the_umask(tmp_path: Path) -> None:
    """The helpers' own files (the marker) are as readable as any other."""
    out = tmp_path / "out"
    claim_output_dir(out, "--output-dir")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((out / OUTPUT_MARKER).stat().st_mode) == 0o666 & ~umask
    assert json.dumps(sorted(p.name for p in out.iterdir())) == json.dumps([OUTPUT_MARKER])
