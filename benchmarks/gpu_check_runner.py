"""The GPU check's runner (standard library only): a step is its commands, each with a timeout, and a check
that turns their outputs into the step's record; the runner runs the steps one after another within a global
deadline, writes ``<out>/<step>.json`` and every command's stdout/stderr under ``<out>/logs/``, and prints one
line per step. A command that runs into its timeout gets SIGTERM, then SIGKILL 5 s later; a step that cannot
start before the deadline is recorded as ``skipped_budget``; a failed step never stops the next. The steps
themselves are ``gpu_check.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3


@dataclass
class Command:
    name: str  # log file stem
    argv: list[str]
    timeout: float
    # Called with the Popen object after start; may send a signal (the SIGTERM test). Returns a note or None.
    during: Callable[[subprocess.Popen, float], str | None] | None = None
    expect_rc: tuple[int, ...] = (0,)


Check = Callable[[list[dict[str, Any]]], dict[str, Any]]
"""The commands' results (in order) -> the step's record fields (status, figures, detail, error)."""


@dataclass
class Step:
    name: str
    what: str
    commands: list[Command]
    check: Check
    min_seconds: float = 30.0  # don't start with less than this left before the deadline
    describe_during: str | None = None  # dry-run note for `during`
    # Called once every step has run: fields that need a later step's record (bench-20m runs after the
    # train and the CUDA graph it is compared with).
    compare: Callable[[], dict[str, Any]] | None = None

    @property
    def budget(self) -> float:
        """The step's time budget: its commands' timeouts added up."""
        return sum(c.timeout for c in self.commands)


class Runner:
    def __init__(self, out: Path, deadline: float, dry_run: bool):
        self.out = out
        self.logs = out / "logs"
        self.deadline = deadline
        self.dry_run = dry_run
        self.records: list[dict[str, Any]] = []
        self.started = time.time()

    def left(self) -> float:
        return self.deadline - time.time()

    def run_command(self, cmd: Command) -> dict[str, Any]:
        timeout = min(cmd.timeout, max(1.0, self.left()))
        stdout_path = self.logs / f"{cmd.name}.stdout.log"
        stderr_path = self.logs / f"{cmd.name}.stderr.log"
        info: dict[str, Any] = {
            "name": cmd.name,
            "argv": cmd.argv,
            "command": shlex.join(cmd.argv),
            "timeout_s": round(timeout, 1),
            "stdout_log": str(stdout_path),
            "stderr_log": str(stderr_path),
        }
        start = time.time()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd.argv, stdout=out, stderr=err, env=env, start_new_session=True)
            except OSError as exc:
                info.update(rc=None, seconds=0.0, timed_out=False, error=f"could not start: {exc}")
                return info
            note = None
            timed_out = False
            try:
                if cmd.during is not None:
                    note = cmd.during(proc, start + timeout)
                proc.wait(timeout=max(0.1, start + timeout - time.time()))
            except subprocess.TimeoutExpired:
                timed_out = True
                self._stop(proc)
        info.update(rc=proc.returncode, seconds=round(time.time() - start, 2), timed_out=timed_out)
        if note:
            info["note"] = note
        if timed_out:
            info["error"] = f"timed out after {timeout:.0f} s"
        elif proc.returncode not in cmd.expect_rc:
            info["error"] = last_error_line(stderr_path) or f"exit status {proc.returncode}"
        return info

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        """SIGTERM the command's own process group (it was started in a new session), SIGKILL 5 s later."""
        for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 3)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def run_step(self, step: Step) -> dict[str, Any]:
        record: dict[str, Any] = {"step": step.name, "what": step.what}
        if self.dry_run:
            print(f"# step {step.name} (budget {step.budget:.0f} s): {step.what}")
            for cmd in step.commands:
                print(f"timeout {cmd.timeout:.0f} {shlex.join(cmd.argv)}")
            if step.describe_during:
                print(f"#   {step.describe_during}")
            return record
        if self.left() < step.min_seconds:
            record.update(
                status="skipped_budget", seconds=0.0, error=f"{self.left():.0f} s left before the deadline"
            )
            self._finish(step, record)
            return record
        start = time.time()
        results = []
        for cmd in step.commands:
            if self.left() < 5:
                results.append(
                    {"name": cmd.name, "command": shlex.join(cmd.argv), "skipped": "deadline reached"}
                )
                continue
            results.append(self.run_command(cmd))
        record["commands"] = results
        record["seconds"] = round(time.time() - start, 2)
        try:
            record.update(step.check(results))
        except Exception as exc:  # an analysis bug must not cost the remaining steps
            record.update(status="failed", error=f"analysis error: {type(exc).__name__}: {exc}")
        if "status" not in record:
            record["status"] = "failed" if any(r.get("error") or r.get("skipped") for r in results) else "ok"
        self._finish(step, record)
        return record

    def _finish(self, step: Step, record: dict[str, Any]) -> None:
        write_json(self.out / f"{step.name}.json", record)
        self.records.append(record)
        print(format_line(record), flush=True)


def last_error_line(path: Path) -> str | None:
    """A failed command's line: the last 'error:'/'...Error' line of its stderr, else the last line."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    if not lines:
        return None
    for line in reversed(lines):
        if line.startswith("error:") or "Error" in line.split(":", 1)[0]:
            return line[:500]
    return lines[-1][:500]


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        for line in Path(path).read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    except OSError:
        pass
    return rows


def fmt_int(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def format_line(r: dict[str, Any]) -> str:
    """One line per step: status, tokens/s, peak GiB, MFU, attention kernel, ratio to the reference."""
    parts = [f"[{r['step']}]", r.get("status", "?")]
    if "tokens_per_second" in r:
        parts.append(f"{fmt_int(r.get('tokens_per_second'))} tok/s")
    if "peak_memory_bytes" in r:
        pm = r.get("peak_memory_bytes")
        parts.append(f"peak {fmt(pm / GIB if pm else None, '.2f')} GiB")
    if "mfu" in r:
        parts.append(f"MFU {fmt(r.get('mfu'), '.3f')}")
    if "attention_kernel" in r:
        parts.append(f"kernel {r.get('attention_kernel')}")
    if r.get("reference") is not None:
        parts.append(f"ref {r['reference']}")
    if r.get("ratio_to_reference") is not None:
        parts.append(f"ratio {r['ratio_to_reference']:.3f}x")
    if r.get("detail"):
        parts.append(r["detail"])
    if r.get("seconds") is not None:
        parts.append(f"({r['seconds']:.0f} s)")
    if r.get("error"):
        parts.append(f"ERROR: {r['error']}")
    return "  ".join(str(p) for p in parts)


def budget_lines(chosen: list[Step], install: float, limit: float) -> list[str]:
    """--dry-run's closing lines: each step's budget and the sum with the install's, against the limit."""
    steps_total = sum(step.budget for step in chosen)
    total = install + steps_total
    verdict = "within" if total <= limit else "OVER"
    return [
        "# budgets (s): install "
        + f"{install:.0f}, "
        + ", ".join(f"{st.name} {st.budget:.0f}" for st in chosen),
        f"# budget sum: install {install:.0f} s + steps {steps_total:.0f} s = {total:.0f} s, {verdict} the "
        f"{limit:.0f} s budget",
    ]
