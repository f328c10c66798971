"""End to end on the CPU with a tiny workflow config: corpus -> tokenizer -> cache -> training ->
evaluation -> report. The training job is killed with SIGKILL mid-run; rerunning the same command resumes it
from its saved state and finishes; a further rerun has nothing to do."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from faults_driver import served_job, signal_reached, wait_until
from workflow_helpers import snakemake, snakemake_command, snakemake_env, tiny_config, write_config

pytestmark = pytest.mark.slow

RUN = "tiny-a"
CHECKPOINT_EVERY = 4  # tiny_config's training.checkpoint_every


@dataclass
class Session:
    returncode: int
    output: str


@dataclass
class KilledAndResumed:
    workdir: Path
    config: Path
    killed: Session
    resumed: Session
    rows_before: list[dict]
    rows_after: list[dict]
    files_after_kill: set[str]


def metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written right now
    return rows


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def trainer_pid(snakemake_pid: int) -> int | None:
    for pid in descendants(snakemake_pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tiny_llm" in argv and b"train" in argv and b"--resume" in argv:
            return pid
    return None


def kill_trainer_after_checkpoint(proc: subprocess.Popen, run_dir: Path, timeout: float = 240) -> None:
    """Wait until the training job has saved a resumable state and logged past it, then SIGKILL it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "snakemake ended before the training job could be killed"
        steps = [row["step"] for row in metrics_rows(run_dir) if row.get("event") == "train"]
        if (run_dir / "latest.pt").exists() and steps and max(steps) > CHECKPOINT_EVERY:
            pid = trainer_pid(proc.pid)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.05)
    raise AssertionError("the training job never saved a checkpoint")


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> KilledAndResumed:
    workdir = tmp_path_factory.mktemp("workflow")
    # Twice the tiny budget: long enough (~260 updates) to be killed mid-way on a busy machine.
    overrides = {"training": {"tokens_per_parameter": 2.0}}
    runs = {RUN: {"size": "tiny", "overrides": overrides}}
    config = write_config(workdir / "tiny.yaml", tiny_config(**runs))
    run_dir = workdir / "results" / "runs" / RUN
    log = workdir / "first-session.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            snakemake_command(workdir, config, "runs", "--cores", "2"),
            cwd=workdir,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=snakemake_env(),
            start_new_session=True,
        )
        try:
            kill_trainer_after_checkpoint(proc, run_dir)
            returncode = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    killed = Session(returncode, log.read_text())
    rows_before = metrics_rows(run_dir)
    files_after_kill = {path.name for path in run_dir.iterdir()}
    second = snakemake(workdir, config, "runs", "--cores", "2", timeout=400)
    resumed = Session(second.returncode, second.stdout + second.stderr)
    rows_after = metrics_rows(run_dir)
    return KilledAndResumed(workdir, config, killed, resumed, rows_before, rows_after, files_after_kill)


def job_counts(output: str) -> dict[str, int]:
    table = output.split("Job stats:", 1)[1]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE)}


def test_killed_training_job_fails_the_first_session(killed_and_resumed: KilledAndResumed) -> None:
    state = killed_and_resumed
    assert state.killed.returncode != 0, state.killed.output
    assert "Error in rule train_run" in state.killed.output
    assert "result.json" not in state.files_after_kill
    assert "latest.pt" in state.files_after_kill  # resumable state survives: it is not a declared output
    assert f"Failed job log(s): logs/train_run/{RUN}.log" in state.killed.output
    assert "Fix the cause, then rerun the same command" in state.killed.output


def test_rerun_resumes_from_the_saved_state(killed_and_resumed: KilledAndResumed) -> None:
    state = killed_and_resumed
    assert state.resumed.returncode == 0, state.resumed.output
    # Only the unfinished work reran: no corpus, tokenizer or cache job in the second session.
    rules = set(job_counts(state.resumed.output)) - {"total"}
    assert rules == {"train_run", "evaluate_run", "plot_curves", "runs"}
    before, after = state.rows_before, state.rows_after
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    new_train = [row for row in after[common:] if row.get("event") == "train"]
    first_session = [row for row in before if row.get("event") == "train"]
    assert new_train and first_session
    # A restart would log its first update again; a resume continues past the saved state.
    assert new_train[0]["step"] > first_session[0]["step"]
    assert new_train[0]["step"] > CHECKPOINT_EVERY


def test_resumed_run_completes_with_evaluation_and_report(killed_and_resumed: KilledAndResumed) -> None:
    work = killed_and_resumed.workdir
    result = json.loads((work / "results" / "runs" / RUN / "result.json").read_text())
    evaluation = json.loads((work / "results" / "runs" / RUN / "evaluation.json").read_text())
    final = result["final_validation"]
    assert final["split"] == "full" and evaluation["split"] == "full"
    assert evaluation["loss"] == pytest.approx(final["loss"], rel=1e-5)
    comparison = json.loads((work / "results" / "report" / "runs" / "comparison.json").read_text())
    assert [row["run"] for row in comparison] == [RUN]
    assert (work / "results" / "report" / "runs" / "learning-curves.png").stat().st_size > 1000


def test_job_logs_hold_no_profiler_lines(killed_and_resumed: KilledAndResumed) -> None:
    """The attention-kernel probe profiles an update of every training job: its profiler says nothing."""
    logs = sorted((killed_and_resumed.workdir / "logs").rglob("*.log"))
    logs += sorted((killed_and_resumed.workdir / "results" / "runs").rglob("run.log"))
    assert any(log.name == f"{RUN}.log" for log in logs)
    for log in logs:
        text = log.read_text(encoding="utf-8", errors="replace")
        assert "profiler_st" not in text and "Profiler clears events" not in text, log


def test_the_fork_server_ran_the_jobs_and_the_killed_one_died_with_its_client(
    killed_and_resumed: KilledAndResumed,
) -> None:
    """A local run forks its `tiny_llm` jobs from one process that imported torch once (shared_startup): the
    training job killed in the first session (its client, the process Snakemake started) died with it, and
    the resumed one ended well, each recorded with its CPU time."""
    logs = killed_and_resumed.workdir / "logs"
    records = [json.loads(line) for line in (logs / "fork-server.jsonl").read_text().splitlines()]
    trainings = [r for r in records if "pid" in r and str(r["log"]).endswith(f"/train_run/{RUN}.log")]
    assert [r.get("exit", -r.get("signal", 0)) for r in trainings] == [-signal.SIGKILL, 0]
    assert all(r["cpu_s"] > 0 for r in trainings)
    rules = {Path(str(record["log"])).parent.name for record in records if "pid" in record}
    assert rules >= {"prepare_cache", "train_run", "evaluate_run", "plot_curves"}


def test_rerun_after_success_has_nothing_to_do(killed_and_resumed: KilledAndResumed) -> None:
    state = killed_and_resumed
    proc = snakemake(state.workdir, state.config, "runs", "-n")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_html_report_holds_the_run_table_and_curves(killed_and_resumed: KilledAndResumed) -> None:
    state = killed_and_resumed
    proc = snakemake(state.workdir, state.config, "runs", "--report", "report.html")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    html = (state.workdir / "report.html").read_text(encoding="utf-8", errors="replace")
    assert "learning-curves.png" in html and "report.md" in html  # report.md named in the table's caption
    # the run table is embedded as an HTML page (a rendered table), not as Markdown in a <pre> block
    page = re.search(r"filename=table\.html;base64,([A-Za-z0-9+/=]+)", html)
    assert page, "table.html is not in the report"
    table = base64.b64decode(page.group(1)).decode("utf-8")
    assert "<table>" in table and "<th>Run</th>" in table and "| Run |" not in table


def test_default_console_is_short_and_ends_saying_where_to_look(killed_and_resumed: KilledAndResumed) -> None:
    """What a user sees with the shipped profile: progress lines and a closing summary, no walls of text."""
    state = killed_and_resumed
    cmd = snakemake_command(state.workdir, state.config, "runs", "--cores", "2", "--forcerun", "plot_curves")
    cmd.remove("host")
    cmd.remove("--quiet")
    proc = subprocess.run(
        cmd, cwd=state.workdir, capture_output=True, text=True, timeout=300, env=snakemake_env()
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    # Snakemake's own lines name the working directory, whose length is the test's, not the workflow's
    assert max(len(line) for line in output.replace(str(state.workdir), ".").splitlines()) <= 300, output
    assert "  runs      results/report/runs/report.md, results/report/runs/learning-curves.png" in output
    assert "HTML report with every table and plot: snakemake --report report.html" in output
    # the run's time and its longest stages, from the benchmark file of its one job (plot_curves)
    assert re.search(r"^Time: \d+ (s|min \d\d s) in all\.$", output, re.M), output
    assert re.search(r"^Longest stages \(their jobs' wall time summed\): runs \d+ s in 1 job; ", output, re.M)


def test_sigterm_to_a_background_controller_acts_like_ctrl_c(tmp_path: Path) -> None:
    """`nohup snakemake … &` from a script ignores SIGINT; SIGTERM must still stop training within seconds,
    with its state saved, and the same command resumes it."""
    runs = {RUN: {"size": "tiny", "overrides": {"training": {"tokens_per_parameter": 2.0}}}}
    config = write_config(tmp_path / "tiny.yaml", tiny_config(**runs))
    run_dir = tmp_path / "results" / "runs" / RUN
    with open(tmp_path / "controller.log", "w") as out:
        proc = subprocess.Popen(
            snakemake_command(tmp_path, config, "runs", "--cores", "2"),
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=snakemake_env(),
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        try:
            deadline = time.monotonic() + 240
            while not (run_dir / "latest.pt").exists() or (client := trainer_pid(proc.pid)) is None:
                assert time.monotonic() < deadline and proc.poll() is None, "training never started"
                time.sleep(0.05)
            trainer = served_job(tmp_path, client)  # the process that trains, forked by the fork server
            assert trainer != client, "the training job was not forked by the run's fork server"
            # The trainer is frozen until the controller's SIGTERM reaches it: a busy machine that delays the
            # controller's handler must not let the run train on to its end (what this test would then see).
            os.kill(trainer, signal.SIGSTOP)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            reached = wait_until(lambda: signal_reached(trainer, signal.SIGTERM), 60)
            os.kill(trainer, signal.SIGCONT)
            assert reached, "the controller did not pass SIGTERM on to the training job"
            returncode = proc.wait(timeout=60)
            stopped_after = time.monotonic() - started
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    output = (tmp_path / "controller.log").read_text()
    assert returncode != 0 and stopped_after < 30, output
    assert "Stopped by SIGTERM" in output
    assert json.loads((run_dir / "status.json").read_text())["status"] == "interrupted"
    assert not (run_dir / "result.json").exists()
    again = snakemake(tmp_path, config, "runs", "--cores", "2", timeout=400)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "resumed from" in (run_dir / "run.log").read_text()


def test_export_stage_writes_the_model_and_its_samples(killed_and_resumed: KilledAndResumed) -> None:
    state = killed_and_resumed
    proc = snakemake(state.workdir, state.config, "export", "--cores", "2", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    export = state.workdir / "results" / "exports" / RUN
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (export / "model.safetensors").stat().st_size > 100_000
    samples = (state.workdir / "results" / "report" / "exports" / "samples.html").read_text()
    assert "The history of the city" in samples and RUN in samples
    rows = json.loads((state.workdir / "results" / "report" / "exports" / "exports.json").read_text())
    assert json.dumps(rows).count(RUN) >= 1
