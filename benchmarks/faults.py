"""Fault injection: a campaign interrupted at random points, rerun after each fault, ends bitwise where an
uninterrupted one does.

    python benchmarks/faults.py --workdir DIR [--seed 1 ...] [--faults 6] [--shape full|short] [--cores 2]

A demo-like campaign on the CPU in deterministic mode (toy sizes, one stage-1 learning rate absurd enough to
diverge) is run once without faults (the reference) and once per seed with ``--faults`` faults injected at
random times (seeded). After every fault the same ``snakemake`` command is run again until it succeeds. The
faults, drawn in turn from a seeded shuffle of the kinds:

- ``kill_job``: kill -9 of a random running training process;
- ``sigterm_controller`` / ``sigint_controller``: SIGTERM / SIGINT to the Snakemake controller alone;
- ``kill_controller``: kill -9 of the controller (its jobs are orphaned and run on), then
  `snakemake --unlock`;
- ``truncate_latest``: the ``latest.pt`` of a random interrupted run (unfinished, no trainer on it) cut to a
  random length, during a session or between two.

Then every run's final weights (sha256 of final.safetensors), result.json, metrics.jsonl and best.json, every
stage ranking, the report's comparison.json and selected recipes are compared with the reference's: they
must be identical, except the fields that measure time and memory (which no two runs share). Prints one JSON
object: per seed the faults injected, the reruns needed and the differences found (goal 0).

The data stage (corpus, tokenizer, token cache) is built once and copied into every campaign directory, so
only the campaign is interrupted. Scratch directories live under --workdir; the repository's results/ are
untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
KINDS = ("kill_job", "sigterm_controller", "sigint_controller", "kill_controller", "truncate_latest")
TIMING_KEYS = {
    "tokens_per_second",
    "training_seconds",
    "cumulative_training_seconds",
    "elapsed_tokens_per_second",
    "peak_memory_bytes",
    "evaluation_peak_memory_bytes",
    "seconds",
    "mfu",
    "seconds_this_session",
    "training_elapsed_seconds",
    "training_tokens_per_second",
    "median_tokens_per_second",
}
"""Fields that measure time or memory: they differ between any two runs, interrupted or not."""
DIVERGING_LR = 100.0
"""Stage 1's absurd learning rate: its runs stop on a non-finite gradient norm mid-run and rank last."""


def campaign_config(shape: str) -> dict[str, Any]:
    """Toy sizes (the `tiny` preset, 2-4 layers), deterministic CPU training, rolling states every 4 updates.

    ``full``: 6 -> 4 -> 2 runs like the demo, two of stage 1's six diverging; ``short``: 2 -> 2, one of
    stage 1's two diverging.
    """
    size = {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}
    budget = {"tokens_per_parameter": 0.25, "epoch_tokens_per_parameter": 0.0625}
    if shape == "full":
        stages = [
            {"size": "t-s", "lr": [1e-3, 3e-3, DIVERGING_LR], "weight_decay": [0.0, 0.1]},
            {"size": "t-m", "parents": 2, "beta2": [0.95, 0.99]},
            {"size": "t-l", "parents": 2},
        ]
    else:
        stages = [
            {"size": "t-s", "lr": [3e-3, DIVERGING_LR], "weight_decay": [0.1]},
            {"size": "t-m", "parents": 1, "beta2": [0.95, 0.99]},
        ]
    sizes = {
        "t-s": {**size, "overrides": {"training": budget}},
        "t-m": {**size, "overrides": {"model": {"num_layers": 3}, "training": budget}},
        "t-l": {**size, "overrides": {"model": {"num_layers": 4}, "training": budget}},
    }
    return {
        "data": {
            "corpus": "embedded",
            "validation_fraction": 0.05,
            "tokenizer": "train",
            "prepare_validation_tokens": 8192,
        },
        "sizes": {name: sizes[name] for name in dict.fromkeys(s["size"] for s in stages)},
        "recipe_defaults": {"training": {"checkpoint_policy": "interval", "checkpoint_every": 4}},
        "runs": {},
        "campaign": {
            "stages": stages,
            "overrides": {
                "training": {"log_every": 2},
                "evaluation": {"subset_blocks": 8},
                "runtime": {"deterministic": True},
            },
            "throughput": {s["size"]: 20000.0 for s in stages},
        },
    }


# ----------------------------------------------------------------------------- running snakemake


def snakemake_command(workdir: Path, cores: int, *args: str) -> list[str]:
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile")]
    cmd += [
        "--directory",
        str(workdir),
        "--configfile",
        str(workdir / "config.yaml"),
        "--replace-workflow-config",
    ]
    return [*cmd, "--cores", str(cores), *args]


def _process_options(workdir: Path, out: Any) -> dict[str, Any]:
    """How every snakemake process here runs: in the workdir, output appended to a log, no stdin."""
    streams = {"stdout": out, "stderr": subprocess.STDOUT, "stdin": subprocess.DEVNULL}
    return {"cwd": workdir, "env": {**os.environ, "PYTHONUNBUFFERED": "1"}, **streams}


def run_snakemake(workdir: Path, cores: int, *args: str, log: str, timeout: float = 1800) -> int:
    with open(workdir / log, "a") as out:
        command = snakemake_command(workdir, cores, *args)
        return subprocess.run(command, timeout=timeout, **_process_options(workdir, out)).returncode


def start_controller(workdir: Path, cores: int) -> subprocess.Popen:
    """The campaign in its own session, so only the signals sent here reach it."""
    out = open(workdir / "controller.log", "a")  # noqa: SIM115 - closed with the process
    command = snakemake_command(workdir, cores, "campaign")
    return subprocess.Popen(command, start_new_session=True, **_process_options(workdir, out))


def trainers(workdir: Path) -> dict[int, Path]:
    """Running training processes of this workdir's campaign (orphans included): pid -> run directory."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        is_trainer = Path(argv[0]).name.startswith("python") and argv[1:4] == ["-m", "tiny_llm", "train"]
        if is_trainer and cwd == str(workdir) and "--config" in argv:
            found[int(entry.name)] = (workdir / argv[argv.index("--config") + 1]).parent
    return found


def is_idle(run_dir: Path) -> bool:
    """No trainer holds the run directory's lock."""
    try:
        fd = os.open(run_dir / ".lock", os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def wait_for_no_trainers(workdir: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while trainers(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)


def kill_leftovers(workdir: Path) -> None:
    for pid in trainers(workdir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- faults


@dataclass
class Fault:
    kind: str
    session: int
    at_seconds: float
    """Seconds into the session."""
    target: str = ""


@dataclass
class Session:
    """One run of the snakemake command."""

    faults: int
    returncode: int
    seconds: float


@dataclass
class FaultRun:
    seed: int
    planned_seconds: list[float] = field(default_factory=list)
    """When each fault is due, in seconds of the campaign's running clock."""
    faults: list[Fault] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    unlocks: int = 0
    seconds: float = 0.0

    @property
    def reruns(self) -> int:
        return len(self.sessions) - 1


def inject(kind: str, controller: subprocess.Popen | None, workdir: Path, rng: random.Random) -> str | None:
    """Inject one fault now; the target it hit, or None when there is nothing to hit yet."""
    if kind == "kill_job":
        running = trainers(workdir)
        if not running:
            return None
        pid = rng.choice(sorted(running))
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return str(running[pid].relative_to(workdir))
    if kind == "truncate_latest":  # the state an interrupted run resumes from (a running one overwrites it)
        states = sorted(workdir.glob("results/campaign/stage*/*/latest.pt"))
        idle = [p for p in states if not (p.parent / "result.json").exists() and is_idle(p.parent)]
        if not idle:
            return None
        state = rng.choice(idle)
        with contextlib.suppress(FileNotFoundError):
            fraction = rng.uniform(0.0, 0.95)
            os.truncate(state, int(state.stat().st_size * fraction))
            return f"{state.relative_to(workdir)} cut to {fraction:.0%}"
        return None
    signum = {
        "sigterm_controller": signal.SIGTERM,
        "sigint_controller": signal.SIGINT,
        "kill_controller": signal.SIGKILL,
    }[kind]
    controller.send_signal(signum)
    return f"controller {controller.pid}"


def fault_times(rng: random.Random, num_faults: int, span: tuple[float, float]) -> list[float]:
    """Seeded times on the campaign's running clock, one in each equal slice of ``span`` (seconds)."""
    low, high = span
    width = (high - low) / max(num_faults, 1)
    return [round(low + width * (i + rng.random()), 2) for i in range(num_faults)]


def run_with_faults(
    workdir: Path, seed: int, num_faults: int, span: tuple[float, float], cores: int, kinds: list[str]
) -> FaultRun:
    """The campaign with ``num_faults`` faults at seeded random times; rerun until it completes.

    The times count the seconds the campaign has run over all its sessions, not since the latest session
    started: a fault that ends a session does not push the next one past the campaign's end, so every fault
    whose time falls inside the uninterrupted campaign's length lands (a rerun redoes work: it runs longer).
    """
    rng = random.Random(seed)
    times = fault_times(rng, num_faults, span)
    ran_before = 0.0  # seconds of the sessions before this one
    plan: list[str] = []
    while len(plan) < num_faults:
        batch = list(kinds)
        rng.shuffle(batch)
        plan += batch
    plan = plan[:num_faults]
    record = FaultRun(seed, times)
    started = time.monotonic()

    def next_kind() -> str | None:
        return plan[len(record.faults)] if len(record.faults) < len(plan) else None

    while True:
        if len(record.sessions) > 3 * num_faults + 10:
            raise RuntimeError(f"seed {seed}: still not complete after {len(record.sessions)} sessions")
        injected, killed = 0, False
        if record.sessions and next_kind() == "truncate_latest":  # between two sessions: a state left behind
            target = inject("truncate_latest", None, workdir, rng)
            if target is not None:
                record.faults.append(Fault("truncate_latest", len(record.sessions) + 1, 0.0, target))
                injected += 1
        controller = start_controller(workdir, cores)
        session_start = time.monotonic()
        retry_at = session_start
        while controller.poll() is None:
            now = time.monotonic()
            kind = next_kind()
            due = kind is not None and ran_before + now - session_start >= times[len(record.faults)]
            if due and now >= retry_at:
                target = inject(kind, controller, workdir, rng)
                if target is None:  # nothing to hit yet (no trainer, no interrupted run): try again shortly,
                    index = len(record.faults)  # a truncation after the next fault, which may interrupt one
                    if kind == "truncate_latest" and index + 1 < len(plan):
                        plan.insert(index + 1, plan.pop(index))
                    retry_at = now + 0.5
                    continue
                session = len(record.sessions) + 1
                record.faults.append(Fault(kind, session, round(now - session_start, 2), target))
                injected += 1
                killed = killed or kind == "kill_controller"
            time.sleep(0.05)
        elapsed = time.monotonic() - session_start
        ran_before += elapsed
        record.sessions.append(Session(injected, controller.returncode, round(elapsed, 1)))
        if killed:  # Snakemake's lock outlives a controller killed with -9
            record.unlocks += 1
            run_snakemake(workdir, cores, "campaign", "--unlock", log="controller.log")
        if controller.returncode == 0:  # complete (faults not injected by then are left out)
            break
    wait_for_no_trainers(workdir, timeout=120)  # orphans of a killed controller finish their run
    record.seconds = round(time.monotonic() - started, 1)
    return record


# ----------------------------------------------------------------------------- comparing outcomes


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _json(path: Path) -> Any:
    return _strip(json.loads(path.read_text())) if path.is_file() else None


def _metrics(path: Path) -> Any:
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return hashlib.sha256(json.dumps(_strip(rows), sort_keys=True).encode()).hexdigest()


def fingerprint(workdir: Path) -> dict[str, Any]:
    """Everything the campaign decided, minus what measures time and memory."""
    root = workdir / "results/campaign"
    out: dict[str, Any] = {}
    for run in sorted(p.parent for p in root.glob("stage*/*/recipe.yaml")):
        name = str(run.relative_to(root))
        out[f"{name}/final.safetensors"] = _sha256(run / "final.safetensors")
        out[f"{name}/result.json"] = _json(run / "result.json")
        out[f"{name}/best.json"] = _json(run / "best.json")
        out[f"{name}/metrics.jsonl"] = _metrics(run / "metrics.jsonl")
    for ranking in sorted(root.glob("stage*/ranking.json")):
        out[str(ranking.relative_to(root))] = _json(ranking)
    out["report/comparison.json"] = _json(root / "report/comparison.json")
    for selected in sorted(root.glob("report/selected-*.yaml")):
        out[str(selected.relative_to(root))] = selected.read_text()
    return out


def differences(reference: dict[str, Any], other: dict[str, Any]) -> list[str]:
    return [key for key in sorted(set(reference) | set(other)) if reference.get(key) != other.get(key)]


# ----------------------------------------------------------------------------- the benchmark


def prepare_base(workdir: Path, shape: str, cores: int) -> Path:
    """The data stage (corpus, tokenizer, token cache) once, copied into every campaign directory."""
    base = workdir / "base"
    if not (base / "results/data/cache/manifest.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        (base / "config.yaml").write_text(yaml.safe_dump(campaign_config(shape), sort_keys=False))
        if run_snakemake(base, cores, "data", log="data.log"):
            sys.exit(f"data stage failed; see {base / 'data.log'}")
    return base


def fresh_copy(base: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest, symlinks=True)
    return dest


def reference(workdir: Path, base: Path, cores: int) -> tuple[dict[str, Any], float]:
    ref = fresh_copy(base, workdir / "reference")
    started = time.monotonic()
    if run_snakemake(ref, cores, "campaign", log="controller.log"):
        sys.exit(f"the uninterrupted campaign failed; see {ref / 'controller.log'}")
    return fingerprint(ref), time.monotonic() - started


def run(
    workdir: Path,
    seeds: list[int],
    num_faults: int,
    shape: str = "full",
    cores: int = 2,
    kinds: list[str] | None = None,
) -> dict[str, Any]:
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    base = prepare_base(workdir, shape, cores)
    expected, ref_seconds = reference(workdir, base, cores)
    # every fault falls well inside the uninterrupted campaign's length (the clock stops between sessions,
    # while the orphans of a killed controller may still finish work)
    span = (0.1 * ref_seconds, 0.7 * ref_seconds)
    results = []
    for seed in seeds:
        target = fresh_copy(base, workdir / f"faults-seed{seed}")
        try:
            record = run_with_faults(target, seed, num_faults, span, cores, list(kinds or KINDS))
        finally:
            kill_leftovers(target)
        found = fingerprint(target)
        diff = differences(expected, found)
        corrupt = sorted(str(p.relative_to(target)) for p in target.glob("results/campaign/*/*/*.corrupt"))
        results.append(
            {
                "seed": seed,
                "seconds": record.seconds,
                "reruns": record.reruns,
                "unlocks": record.unlocks,
                "failed_sessions_without_a_fault": sum(
                    1 for x in record.sessions if x.returncode != 0 and x.faults == 0
                ),
                "faults_injected": len(record.faults),
                "faults_planned_at_seconds": record.planned_seconds,
                "faults_by_kind": {k: sum(f.kind == k for f in record.faults) for k in KINDS},
                "faults": [asdict(f) for f in record.faults],
                "sessions": [asdict(x) for x in record.sessions],
                "damaged_states_set_aside": corrupt,
                "runs_compared": sum(key.endswith("/final.safetensors") for key in expected),
                "differences": diff,
            }
        )
    return {
        "shape": shape,
        "cores": cores,
        "reference_seconds": round(ref_seconds, 1),
        "fault_span_seconds": [round(s, 1) for s in span],
        "seeds": results,
        "total_faults": sum(r["faults_injected"] for r in results),
        "total_reruns": sum(r["reruns"] for r in results),
        "total_differences": sum(len(r["differences"]) for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="scratch directory (reused for the data)")
    parser.add_argument(
        "--seed", type=int, action="append", help="seed of the faults (repeatable; default 1)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[], help="several seeds at once")
    parser.add_argument("--faults", type=int, default=6, help="faults per seed")
    parser.add_argument("--shape", choices=("full", "short"), default="full")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, help="fault kinds to draw from (default: all)")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    seeds = [*(args.seed or []), *args.seeds] or [1]
    report = run(args.workdir, seeds, args.faults, args.shape, args.cores, kinds=args.kinds)
    text = json.dumps(report, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 0 if report["total_differences"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
