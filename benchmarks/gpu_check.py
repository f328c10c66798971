"""One-shot GPU check that fits a short slot of GPU time (540 s, torch's and the package's probes included):
the CUDA tests, a real 20m train, the CUDA graph, Muon, a pair of throughput-map points under a memory cap, a
short workflow rehearsal, throughput against the reference GH200 figures and the peers, in that order (least
known first).

Run through ``benchmarks/gpu_check.sh`` (it probes torch, which it never installs, checks CUDA and calls
``run``). This file uses only the
standard library: every measurement is a subprocess (``python -m tiny_llm ...``, ``pytest``, or a script of
benchmarks/) whose JSON output is read back, so it does not depend on the library's internal module layout.
The data come from the library's own commands (``build-demo-corpus``, ``train-tokenizer``, ``prepare``), as
in the workflow.

    python benchmarks/gpu_check.py run --mode gpu --out results/gpu-check        # the real thing
    python benchmarks/gpu_check.py run --mode cpu-smoke --out /tmp/gpu-smoke       # same steps, tiny, CPU
    python benchmarks/gpu_check.py run --mode gpu --dry-run                       # print the commands only

``steps()`` lists the default steps in the order of the table in benchmarks/README.md, ``more_steps()`` the
ones only ``--only`` runs, and the steps follow in that order below; each step is its commands and a
``check`` that turns their outputs into the step's record (and a ``compare`` that adds figures of steps run
after it, at the end). ``gpu_check_runner.py`` runs them: every step writes ``<out>/<step>.json`` and its
commands' stdout/stderr under ``<out>/logs/``; ``summary.json`` collects them. Each command has its own
timeout (a step's budget is the sum of its commands'), clipped to a global deadline; a step that cannot start
before the deadline is recorded as ``skipped_budget``. A failed step never stops the next. ``--dry-run``
prints every step with its budget and the sum. The reference's figures are ``reference.py``'s.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from gpu_check_runner import (
    GIB,
    Command,
    Runner,
    Step,
    budget_lines,
    fmt,
    fmt_int,
    format_line,
    last_error_line,
    read_json,
    read_jsonl,
    write_json,
)
from reference import REFERENCE_PACKED_N4, REFERENCE_PACKED_SPEEDUP_N4, REFERENCE_TOKENS_PER_SECOND

REPO = Path(__file__).resolve().parents[1]
DEFAULT_BUDGET = 540.0  # seconds from the start, the probes included (gpu_check.sh --budget)


def torch_pin() -> str | None:
    """The torch version envs/torch.yaml pins (the tested one)."""
    with contextlib.suppress(OSError):
        found = re.search(r"torch==([\d.]+)", (REPO / "envs" / "torch.yaml").read_text())
        return found[1] if found else None
    return None


SDPA_BACKENDS = ("math", "efficient", "flash", "cudnn")
# Substring of the aten op each forced kernel dispatches (as recorded by the worker's profiled update).
KERNEL_OP = {
    "flash": "flash_attention",
    "efficient": "efficient_attention",
    "cudnn": "cudnn_attention",
    "math": "attention_math",
}

# The train/resume and compile-mode checks: the `tiny` preset's shape on a 512-token tokenizer.
TOKENIZER_VOCAB = 512
CACHE_TRAIN_TOKENS = 400_000
EXECUTIONS = ("packed", "sequential")
COMPILE_MODES = ("default", "reduce-overhead")
RUN_FILES = (
    "status.json",
    "result.json",
    "environment.json",
    "environment-resume.json",
    "resolved.yaml",
    "metrics.jsonl",
    "run.log",
    "best.json",
)


# ----------------------------------------------------------------------------- what every step is given


@dataclass
class Setup:
    """One mode's machine (gpu | cpu-smoke): where things go and the arguments every step shares. Paths:
    ``out`` for the JSON and logs to keep, ``work`` for run directories, traces and data."""

    mode: str
    out: Path
    work: Path
    py: str = sys.executable
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Records of the steps run so far, by name (packed-n4 takes bench-20m's FLOPs and peak)."""

    @property
    def gpu(self) -> bool:
        return self.mode == "gpu"

    @property
    def corpus(self) -> Path:
        return self.work / "corpus"

    @property
    def tokenizer(self) -> Path:
        return self.work / "tokenizer"

    @property
    def cache(self) -> Path:
        return self.work / "cache"

    def on(self, gpu: Any, cpu: Any) -> Any:
        """The GPU mode's value or the CPU smoke's."""
        return gpu if self.gpu else cpu

    def tiny_llm(self, *args: str) -> list[str]:
        return [self.py, "-m", "tiny_llm", *args]

    def data_sets(self) -> list[str]:
        return sets(
            f"data.dataset={self.corpus}",
            f"data.tokenizer={self.tokenizer}",
            f"data.cache_dir={self.cache}",
            f"data.prepare_train_tokens={CACHE_TRAIN_TOKENS}",
        )

    def runtime_sets(self, compile_: bool) -> list[str]:
        if self.gpu:
            return sets(
                "runtime.device=cuda:0",
                f"runtime.compile={'true' if compile_ else 'false'}",
                "runtime.amp=true",
                "runtime.fused_optimizer=true",
            )
        return sets("runtime.device=cpu", "runtime.compile=false", "runtime.cpu_threads=2")

    def worker_protocol(self) -> list[str]:
        return self.on(
            ["--warmup", "10", "--steps", "30", "--windows", "3"],
            ["--warmup", "1", "--steps", "1", "--windows", "1"],
        )

    def worker_shape_sets(self) -> list[str]:
        """GPU: the reference settings (32,768-token updates, micro 32). CPU smoke: context 64, 256 tokens."""
        if self.gpu:
            return sets("training.batch_tokens=32768", "training.micro_batch_size=32")
        return sets("model.context_length=64", "training.batch_tokens=256", "training.micro_batch_size=4")

    def synthetic_worker(
        self, size: str, output: Path, compile_: bool, extra: list[str], protocol: list[str] | None = None
    ) -> list[str]:
        """benchmark-worker on synthetic data at the worker shape, ``extra`` --set pairs on top."""
        return self.tiny_llm(
            "benchmark-worker",
            "--config",
            size,
            *self.worker_shape_sets(),
            *self.runtime_sets(compile_=compile_),
            *extra,
            "--data-mode",
            "synthetic",
            *(protocol if protocol is not None else self.worker_protocol()),
            "--output",
            str(output),
        )

    def train_recipe(self, output_dir: Path, compile_: bool, extra: list[str]) -> list[str]:
        """`tiny` shape on the check's cache; GPU: bf16 autocast, fused AdamW."""
        return [
            "--config",
            "tiny",
            *self.data_sets(),
            *self.runtime_sets(compile_),
            *sets(f"runtime.output_dir={output_dir}", "training.log_every=1"),
            *sets(*extra),
        ]


def sets(*pairs: str) -> list[str]:
    return [a for p in pairs for a in ("--set", p)]


# ----------------------------------------------------------------------------- the steps (README's table)


# The default benchmark sizes: 50m (measured at 978,772 tok/s on the H200, 30 Nov 2026) runs with --only.
DEFAULT_BENCH_SIZES = ("20m", "90m")


def steps(s: Setup) -> list[Step]:
    """The default steps, least known first (the order of the table in benchmarks/README.md): the environment,
    the CUDA tests, one real default-recipe 20m train (data first), the CUDA graph, Muon, two throughput-map
    points, the workflow rehearsal, the benchmarks at 20m and 90m, the peers. Their budgets and the probes'
    add up to at most 540 s."""
    return [
        env(s),
        pytest_cuda(s),
        data(s),
        train_20m(s),
        cuda_graph(s),
        muon(s),
        map_points(s),
        workflow(s),
        *(bench(s, size) for size in DEFAULT_BENCH_SIZES),
        peers(s),
    ]


def more_steps(s: Setup) -> list[Step]:
    """Steps only ``--only`` runs (they do not fit the default budget)."""
    return [
        *(bench(s, size) for size in REFERENCE_TOKENS_PER_SECOND if size not in DEFAULT_BENCH_SIZES),
        packed_n4(s),
        train_resume(s),
        compile_mode(s),
        *(kernel(s, backend, compiled=False) for backend in SDPA_BACKENDS),
        # The compiled path must honour a forced kernel too; `efficient` is not what `auto` picks on Hopper,
        # so a forced kernel that silently became `auto` shows up as flash/cudnn here.
        kernel(s, "efficient", compiled=True),
    ]


# --- env

ENV_PROBE = (
    "import json, torch; c = torch.cuda.is_available(); "
    "p = torch.cuda.get_device_properties(0) if c else None; "
    "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'cuda_available': c, "
    "'device_name': torch.cuda.get_device_name(0) if c else None, "
    "'capability': list(torch.cuda.get_device_capability(0)) if c else None, "
    "'total_memory_bytes': p.total_memory if c else None, "
    "'cudnn': torch.backends.cudnn.version() if c else None, "
    "'device_count': torch.cuda.device_count()}))"
)
NVIDIA_SMI = [
    "nvidia-smi",
    "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
    "--format=csv",
]


def env(s: Setup) -> Step:
    """torch/CUDA versions, device name, nvidia-smi."""
    cmds = [Command("env.torch", [s.py, "-c", ENV_PROBE], s.on(6, 120))]  # H200: 3.8 s
    if s.gpu:
        cmds.append(Command("env.nvidia-smi", NVIDIA_SMI, 2))  # 0.03 s
    return Step("env", "torch/CUDA versions and the GPU", cmds, partial(check_env, s), min_seconds=5)


def check_env(s: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    info = {}
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        info = json.loads(Path(results[0]["stdout_log"]).read_text().strip().splitlines()[-1])
    extra = {}
    if len(results) > 1 and results[1].get("rc") == 0:
        extra["nvidia_smi"] = Path(results[1]["stdout_log"]).read_text().strip()
    ok = results[0].get("rc") == 0 and (info.get("cuda_available") or not s.gpu)
    found, pin = info.get("torch"), torch_pin()
    matches = bool(found and pin) and str(found).split("+")[0] == pin
    relation = "the pin" if matches else "differs; the library runs on 2.10 and later"
    detail = (
        f"torch {found} (pin {pin}: {relation}) "
        f"cuda {info.get('cuda')} device {info.get('device_name') or 'cpu'} x{info.get('device_count')}"
    )
    out = {"status": "ok" if ok else "failed", "environment": info, **extra, "detail": detail}
    return {**out, "torch_pin": pin, "torch_matches_pin": matches}


# --- pytest-cuda


def pytest_cuda(s: Setup) -> Step:
    """``pytest -m cuda`` over the modules of tests/unit that mark CUDA tests (on the CPU they skip).
    Counts from pytest's last line; the outcome of each test from its JUnit XML (the CUDA-graph step reads
    the graph tests' outcomes). A module that fails to import is counted as an error, and the CUDA tests
    still run."""
    junit = s.out / "pytest-cuda.xml"
    argv = [s.py, "-m", "pytest", "-q", "-m", "cuda", *cuda_test_files()]
    argv += ["--continue-on-collection-errors", f"--junitxml={junit}"]
    return Step(
        "pytest-cuda",
        "python -m pytest -q -m cuda (the tests/unit modules that mark tests cuda)",
        # estimate: a pytest start, four tiny compiles on the device (~10 s each; 20m's took 19 s), a tiny
        # train, two in-process benchmark workers; on two GPUs the DDP test too. Not measured yet.
        [Command("pytest-cuda", argv, s.on(100, 600), expect_rc=(0,))],
        partial(check_pytest, s, junit),
        min_seconds=s.on(15, 30),
    )


def cuda_test_files() -> list[str]:
    """The tests/unit modules that mark tests ``cuda`` (collecting the whole suite was most of the step's
    time); tests/unit itself when none does."""
    unit = REPO / "tests" / "unit"
    files = [str(p) for p in sorted(unit.glob("test_*.py")) if "mark.cuda" in p.read_text(encoding="utf-8")]
    return files or [str(unit)]


PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?|warnings?)\b")


def pytest_counts(stdout: Path) -> tuple[dict[str, int], str | None]:
    """pytest's summary (its last line with counts, e.g. '3 passed, 1 skipped, 9 deselected in 4.2s') as
    {outcome: count} ('error' and 'warning' singular), and the line."""
    try:
        lines = [ln.strip().strip("=").strip() for ln in stdout.read_text(errors="replace").splitlines()]
    except OSError:
        return {}, None
    for line in reversed([ln for ln in lines if ln]):
        found = PYTEST_COUNT.findall(line)
        if found and re.search(r"\bin [\d.]+s\b", line):
            return {kind.rstrip("s") if kind.startswith(("error", "warning")) else kind: int(n)
                    for n, kind in found}, line  # fmt: skip
    return {}, None


def junit_outcomes(path: Path) -> dict[str, str]:
    """{classname::name: passed | failed | error | skipped} from pytest's JUnit XML ({} without one)."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return {}
    outcomes = {}
    for case in root.iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        outcomes[name] = next((t for t in ("failure", "error", "skipped") if t in tags), "passed")
        outcomes[name] = outcomes[name].replace("failure", "failed")
    return outcomes


def check_pytest(s: Setup, junit: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    result = results[0]
    counts, line = pytest_counts(Path(result.get("stdout_log") or "/nonexistent"))
    tests = junit_outcomes(junit)
    out: dict[str, Any] = {"counts": counts, "summary_line": line, "tests": tests}
    rc = result.get("rc")
    ran = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    if result.get("timed_out") or result.get("skipped"):
        out.update(status="timeout" if result.get("timed_out") else "skipped_budget")
        out["error"] = result.get("error") or result.get("skipped")
    elif rc == 5 or not (ran or counts.get("skipped")):
        out.update(status="no_tests", error=f"no test carries the cuda marker (pytest exit {rc}): {line}")
    elif rc != 0:
        out.update(status="failed", error=f"pytest exit {rc}: {line or result.get('error')}")
    elif s.gpu and not counts.get("passed"):
        out.update(status="failed", error=f"every cuda test skipped on the GPU: {line}")
    else:
        out["status"] = "ok"
    out["detail"] = ", ".join(f"{n} {k}" for k, n in counts.items()) or "no pytest summary line"
    out["ddp"] = ddp_outcome(tests)
    out["detail"] += f"; DDP on two GPUs: {out['ddp']}"
    return out


DDP_TEST = "test_two_ranks_on_two_gpus_train_through_the_launcher"


def ddp_outcome(tests: dict[str, str]) -> str:
    """The two-GPU DDP test's outcome: passed, failed, or skipped (one GPU); 'not run' without it."""
    found = [outcome for name, outcome in tests.items() if name.endswith(DDP_TEST)]
    if not found:
        return "not run"
    return "skipped (one GPU)" if found[0] == "skipped" else found[0]


GRAPH_TEST_WORDS = ("graph", "captur")  # tests/unit/test_cuda.py: test_the_captured_update_trains_...


def graph_correctness(s: Setup) -> dict[str, Any]:
    """The CUDA-graph tests' outcomes in the pytest-cuda step (the tests named for a graph or a capture)."""
    record = s.records.get("pytest-cuda")
    if record is None:
        return {"verdict": "not run", "source": "pytest-cuda (not run)"}
    tests = (record.get("tests") or {}).items()
    graph = {k: v for k, v in tests if any(w in k.lower() for w in GRAPH_TEST_WORDS)}
    if not graph:
        return {"verdict": f"no graph test ({record.get('status')})", "source": "pytest-cuda", "tests": {}}
    outcomes = set(graph.values())
    verdict = "failed" if outcomes & {"failed", "error"} else "passed" if "passed" in outcomes else "skipped"
    return {"verdict": verdict, "source": "pytest-cuda", "tests": graph}


# --- data


def data(s: Setup) -> Step:
    """The embedded demo corpus (the workflow's offline corpus), a 512-token BPE, a 400k-token cache."""
    cmds = [
        Command(
            "data.corpus", s.tiny_llm("build-demo-corpus", "--output", str(s.corpus), "--force"), s.on(5, 120)
        ),
        Command(
            "data.tokenizer",
            s.tiny_llm(
                "train-tokenizer",
                "--input",
                str(s.corpus),
                "--vocab-size",
                str(TOKENIZER_VOCAB),
                "--output",
                str(s.tokenizer),
            ),
            s.on(7, 180),  # H200: 6.0 s
        ),
        Command(
            "data.prepare",
            s.tiny_llm("prepare", "--config", "tiny", *s.data_sets(), "--no-progress"),
            s.on(8, 180),  # H200: 6.1 s
        ),
    ]
    what = "the embedded demo corpus (build-demo-corpus), 512-token BPE, token cache"
    return Step("data", what, cmds, partial(check_data, s), min_seconds=20)


def check_data(s: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    manifest = read_json(s.cache / "manifest.json") or {}
    splits = manifest.get("splits", {})
    ok = all(r.get("rc") == 0 for r in results) and bool(splits)
    detail = ", ".join(f"{k} {v.get('tokens', 0):,} tokens" for k, v in splits.items())
    out = {"status": "ok" if ok else "failed", "detail": f"cache: {detail or 'missing'}"}
    if not ok:
        out["error"] = next((r.get("error") for r in results if r.get("error")), "no manifest")
    return out


# --- train-20m

# The 20m train: the preset's recipe (131,072-token updates, micro 128, compiled update and evaluation,
# fused AdamW without a host read per update, bf16), on the check's 512-token cache: vocabulary 512 and the
# cache's shuffle buffer, 1 token per parameter (79 updates, one epoch), its ~390 blocks read 30 times.
TRAIN_20M_SETS = (
    "model.vocab_size=512",
    "data.shuffle_buffer=64",
    "training.tokens_per_parameter=1.0",
    "training.epoch_tokens_per_parameter=1.0",
    "training.data_passes=30",
)
TRAIN_TINY_SETS = ("training.tokens_per_parameter=0.25", "training.epoch_tokens_per_parameter=0.25")


def train_20m(s: Setup) -> Step:
    """One real default-recipe `train` at 20m; its train rows' tokens/s against the wall-clock rate of its
    updates (the rows' appearance in metrics.jsonl, timed by this check) and against benchmark-worker
    (bench-20m). The CPU smoke trains the `tiny` recipe."""
    run_dir = s.work / "train-20m"
    if s.gpu:
        recipe = ["--config", "20m", *s.data_sets(), *sets(*TRAIN_20M_SETS, f"runtime.output_dir={run_dir}")]
    else:
        recipe = s.train_recipe(run_dir, compile_=False, extra=[*TRAIN_TINY_SETS, "training.log_every=2"])
    seen: dict[int, float] = {}
    command = Command(
        "train-20m",
        s.tiny_llm("train", *recipe, "--quiet"),
        s.on(45, 300),  # estimate (compile ~19 s, compiled evaluation, ~6 s of updates); not measured yet
        during=partial(watch_train_rows, run_dir / "metrics.jsonl", seen),
    )
    return Step(
        "train-20m",
        "one real default-recipe train at 20m (compiled update and evaluation, sync-free fused AdamW): "
        "train rows' tokens/s vs the updates' wall-clock rate and vs bench-20m",
        [command],
        partial(check_train_20m, s, run_dir, seen),
        min_seconds=s.on(30, 30),
        describe_during="metrics.jsonl is polled every 10 ms: each train row's step and the time it appeared",
        compare=partial(compare_train_20m, s),
    )


def watch_train_rows(
    metrics: Path, seen: dict[int, float], proc: subprocess.Popen, deadline: float
) -> str | None:
    """Until the trainer exits: the time each train row (by step) first appears in ``metrics``."""
    size = -1
    while time.time() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            now_size = metrics.stat().st_size
            if now_size != size:
                size, now = now_size, time.time()
                for row in read_jsonl(metrics):
                    if row.get("event") == "train" and row.get("step") not in seen:
                        seen[row["step"]] = now
        time.sleep(0.01)
    return f"{len(seen)} train rows seen"


def row_rates(rows: list[dict[str, Any]], seen: dict[int, float]) -> dict[str, Any]:
    """Over consecutive train rows with nothing else (an evaluation) between them in metrics.jsonl: their
    tokens over the wall-clock time between their appearance, and over the rows' own training seconds."""
    tokens = wall = row_seconds = 0.0
    rates = []
    for a, b in zip(rows, rows[1:], strict=False):
        if a.get("event") != "train" or b.get("event") != "train":
            continue
        ta, tb = seen.get(a.get("step")), seen.get(b.get("step"))
        if ta is None or tb is None or tb <= ta:
            continue
        tokens += b["tokens"] - a["tokens"]
        wall += tb - ta
        row_seconds += b.get("training_seconds") or 0.0
        rates.append(b.get("tokens_per_second"))
    out: dict[str, Any] = {"row_pairs": len(rates), "row_tokens_per_second": rates}
    if wall > 0 and row_seconds > 0:
        out["wall_clock_tokens_per_second"] = tokens / wall
        out["rows_tokens_per_second"] = tokens / row_seconds
        out["ratio_rows_to_wall_clock"] = out["rows_tokens_per_second"] / out["wall_clock_tokens_per_second"]
    return out


def check_train_20m(
    s: Setup, run_dir: Path, seen: dict[int, float], results: list[dict[str, Any]]
) -> dict[str, Any]:
    result = read_json(run_dir / "result.json") or {}
    status_json = read_json(run_dir / "status.json") or {}
    environment = read_json(run_dir / "environment.json") or {}
    copy_run_files(run_dir, s.out / "train-20m")
    rows = read_jsonl(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if r.get("event") == "train"]
    rates = row_rates(rows, seen)
    training, elapsed = result.get("training_tokens_per_second"), result.get("elapsed_tokens_per_second")
    mfus = [r["mfu"] for r in train_rows[1:] if r.get("mfu") is not None]
    out: dict[str, Any] = {
        "run_status": status_json.get("status"),
        "result_step": result.get("step"),
        "train_rows": len(train_rows),
        **rates,
        "training_tokens_per_second": training,
        "elapsed_tokens_per_second": elapsed,
        "ratio_training_to_elapsed": training / elapsed if training and elapsed else None,
        "tokens_per_second": rates.get("rows_tokens_per_second") or training,
        "peak_memory_bytes": result.get("peak_memory_bytes"),
        "mfu": (sorted(mfus)[len(mfus) // 2] if mfus else None),
        "attention_kernel": short_kernels(environment.get("attention_kernels")),
        "final_validation_loss": (result.get("final_validation") or {}).get("loss"),
    }
    ok = results[0].get("rc") == 0 and status_json.get("status") == "complete" and bool(train_rows)
    out["status"] = "ok" if ok else "timeout" if results[0].get("timed_out") else "failed"
    if not ok:
        out["error"] = results[0].get("error") or f"run status {status_json.get('status')}"
    rows_tps, wall_tps = rates.get("rows_tokens_per_second"), rates.get("wall_clock_tokens_per_second")
    out["detail"] = (
        f"{len(train_rows)} train rows; rows {fmt_int(rows_tps)} tok/s vs wall clock {fmt_int(wall_tps)} "
        f"({fmt(rates.get('ratio_rows_to_wall_clock'), '.3f')}x over {rates['row_pairs']} row pairs); "
        f"result.json training/elapsed {fmt(out['ratio_training_to_elapsed'], '.3f')}x"
    )
    return out


def compare_train_20m(s: Setup) -> dict[str, Any]:
    """The train's rate against benchmark-worker's (bench-20m: the 20m preset at the reference's 32,768-token
    updates, micro 32 and vocabulary 32,000; this train: 131,072-token updates, micro 128, vocabulary 512)."""
    record, bench_tps = (
        s.records.get("train-20m", {}),
        s.records.get("bench-20m", {}).get("tokens_per_second"),
    )
    if not bench_tps:
        return {}
    out: dict[str, Any] = {"bench_20m_tokens_per_second": bench_tps}
    for key, name in (("rows_tokens_per_second", "rows"), ("wall_clock_tokens_per_second", "wall_clock")):
        if record.get(key):
            out[f"ratio_{name}_to_bench_20m"] = record[key] / bench_tps
    if record.get("training_tokens_per_second"):
        out["ratio_training_to_bench_20m"] = record["training_tokens_per_second"] / bench_tps
    ratio = out.get("ratio_rows_to_bench_20m", out.get("ratio_training_to_bench_20m"))
    out["detail"] = f"{record.get('detail', '')}; {fmt(ratio, '.3f')}x bench-20m ({fmt_int(bench_tps)} tok/s)"
    return out


# --- cuda-graph-20m


def cuda_graph(s: Setup) -> Step:
    """Correctness first, then speed: the graph tests' outcomes from the pytest-cuda step, then
    benchmark-worker 20m as bench-20m plus runtime.cuda_graph (the whole update replayed as one CUDA graph):
    tokens/s with the graph, against bench-20m's without it once that has run. The CPU smoke checks its
    one-line refusal."""
    output = s.work / "cuda-graph-20m.worker.json"
    argv = s.synthetic_worker("20m", output, compile_=True, extra=sets("runtime.cuda_graph=true"))
    # H200 estimate: bench-20m took 35.8 s (a capture and 3 eager updates more here); not measured yet
    command = Command("cuda-graph-20m", argv, s.on(40, 120), expect_rc=s.on((0,), (2,)))
    return Step(
        "cuda-graph-20m",
        "the pytest-cuda graph tests, then benchmark-worker 20m as bench-20m with the whole update as one "
        "CUDA graph (runtime.cuda_graph)",
        [command],
        partial(check_cuda_graph, s, output),
        min_seconds=s.on(30, 10),
        compare=partial(compare_cuda_graph, s),
    )


CUDA_GRAPH_REFUSAL = "runtime.cuda_graph: needs a CUDA device"


def check_cuda_graph(s: Setup, output: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    correctness = graph_correctness(s)
    if not s.gpu:  # the recipe names the CPU: refused at validation, exit 2, one line
        line = last_error_line(Path(results[0]["stderr_log"])) or ""
        refused = results[0].get("rc") == 2 and CUDA_GRAPH_REFUSAL in line
        out = {"status": "ok" if refused else "failed", "correctness": correctness}
        out["detail"] = f"graph tests {correctness['verdict']}; refused on the CPU: {line}"
        if not refused:
            out["error"] = f"expected exit 2 with '{CUDA_GRAPH_REFUSAL}', got {results[0].get('rc')}: {line}"
        return out
    out = worker_record(s, output, results[0])
    out["correctness"] = correctness
    out["reference"] = f"GH200 {REFERENCE_TOKENS_PER_SECOND['20m']:,} tok/s"
    if out.get("tokens_per_second"):
        out["ratio_to_reference"] = out["tokens_per_second"] / REFERENCE_TOKENS_PER_SECOND["20m"]
    out["detail"] = f"graph tests {correctness['verdict']}; " + out.get("detail", "")
    if correctness["verdict"] == "failed":
        out["status"] = "failed"
        out["error"] = f"CUDA-graph tests failed in pytest-cuda: {sorted(correctness['tests'].items())}"
    return out


def compare_cuda_graph(s: Setup) -> dict[str, Any]:
    """Tokens/s with the graph against bench-20m's (the same settings without it), once bench-20m has run."""
    record, without = (
        s.records.get("cuda-graph-20m", {}),
        s.records.get("bench-20m", {}).get("tokens_per_second"),
    )
    if not (record.get("tokens_per_second") and without):
        return {}
    speedup = record["tokens_per_second"] / without
    detail = f"{record.get('detail', '')}; {speedup:.3f}x bench-20m ({fmt_int(without)} tok/s)"
    return {"speedup_over_no_graph": speedup, "detail": detail}


# --- muon


def muon(s: Setup) -> Step:
    """Muon on the device: a short `train` of the tiny shape under optimizer.name muon on the check's cache
    (the batched Newton-Schulz step, its device-side non-finite skip, a loss that falls), then Muon's
    optimizer step against AdamW's at the 20m shape (benchmarks/optimizer_cost.py, eager: the optimizer
    does not depend on compile)."""
    run_dir = s.work / "muon-train"
    recipe = s.train_recipe(run_dir, compile_=False, extra=["optimizer.name=muon", *TRAIN_TINY_SETS])
    cost = [s.py, str(REPO / "benchmarks" / "optimizer_cost.py"), "--device", s.on("cuda", "cpu")]
    cost += ["--shapes", s.on("20m", "tiny"), "--threads", s.on("8", "2"), "--set", "runtime.compile=false"]
    cmds = [
        # estimates from the CPU smoke's and the H200's process starts (~4 s); not measured on a GPU yet
        Command("muon.train", s.tiny_llm("train", *recipe, "--quiet"), s.on(15, 300)),
        Command("muon.optimizer-cost", cost, s.on(20, 600)),
    ]
    return Step(
        "muon",
        "a short Muon train (tiny shape), then the optimizer step of Muon against AdamW at 20m "
        "(benchmarks/optimizer_cost.py)",
        cmds,
        partial(check_muon, s, run_dir),
        min_seconds=s.on(20, 20),
    )


def check_muon(s: Setup, run_dir: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    status_json = read_json(run_dir / "status.json") or {}
    copy_run_files(run_dir, s.out / "muon-train")
    losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("event") == "train"]
    cost: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError):
        cost = json.loads(Path(results[1]["stdout_log"]).read_text())["cases"]
    shape = next(iter(cost.values()), {})
    ratio = (shape.get("muon_over_adamw") or {}).get("optimizer_ms")
    trained = status_json.get("status") == "complete" and len(losses) > 1 and losses[-1] < losses[0]
    out: dict[str, Any] = {
        "run_status": status_json.get("status"),
        "train_losses": losses,
        "optimizer_cost": cost,
        "muon_over_adamw_optimizer": ratio,
        "muon_optimizer_ms": (shape.get("muon") or {}).get("optimizer_ms"),
        "adamw_optimizer_ms": (shape.get("adamw") or {}).get("optimizer_ms"),
    }
    out["status"] = "ok" if trained and ratio else "failed"
    if out["status"] != "ok":
        errors = [r.get("error") for r in results if r.get("error")]
        out["error"] = (
            "; ".join(errors) or f"run {status_json.get('status')}, losses {losses[:1]}..{losses[-1:]}"
        )
    first, last = (losses[0], losses[-1]) if losses else (None, None)
    muon_ms, adamw_ms = out["muon_optimizer_ms"], out["adamw_optimizer_ms"]
    out["detail"] = (
        f"train {status_json.get('status')} (loss {fmt(first, '.3f')} -> {fmt(last, '.3f')}); optimizer step "
        f"Muon {fmt(muon_ms, '.1f')} ms vs AdamW {fmt(adamw_ms, '.1f')} ms ({fmt(ratio, '.1f')}x)"
    )
    return out


# --- map-points

# A throughput-map point pair under runtime.memory_limit_mb: (size, context, cap MiB, micro that fits, micro
# that does not). GPU: 20m eager at 1,024 tokens (the H200's eager micro-32 update peaked at 16.6 GiB, so
# about 0.5 GiB a sequence: micro 2 ~1.1 GiB, a quarter of the cap; micro 32 four times the cap). CPU
# smoke: tiny at vocabulary 32,000 (micro 1 used 95 MiB beyond the built engine, its Adam moments and fresh
# mappings included; micro 16's logits alone are 131 MB, and their gradient as much again).
MAP_POINTS = {"gpu": ("20m", 1024, 4096, 2, 32), "cpu-smoke": ("tiny", 64, 256, 1, 16)}


def map_points(s: Setup) -> Step:
    """Two points of the throughput map (`throughput point`, each its own benchmark-worker process) under a
    memory cap: one that fits, one a real out-of-memory of the CUDA caching allocator (status memory_limit);
    runtime.memory_limit_mb on the device too. The recipe is `resolve`'s output."""
    size, context, cap, fits, too_big = MAP_POINTS[s.mode]
    recipe_cmd = Command(
        "map-points.recipe",
        s.tiny_llm(
            "resolve",
            "--config",
            size,
            *s.runtime_sets(compile_=False),
            *sets("model.vocab_size=32000", f"runtime.memory_limit_mb={cap}"),
        ),  # fmt: skip
        s.on(5, 60),
    )
    recipe = s.out / "logs" / "map-points.recipe.stdout.log"  # resolve prints the recipe
    protocol = ["--data-mode", "synthetic", "--warmup", "2", "--steps", s.on("3", "1"), "--windows", "1"]
    outputs = {micro: s.work / f"map-point-m{micro}.json" for micro in (fits, too_big)}
    cmds = [recipe_cmd] + [
        Command(
            f"map-points.m{micro}",
            s.tiny_llm(
                "throughput",
                "point",
                "--recipe",
                str(recipe),
                "--context",
                str(context),
                "--micro",
                str(micro),
                *protocol,
                "--timeout-seconds",
                str(s.on(14, 300)),
                "--output",
                str(output),
            ),  # fmt: skip
            s.on(15, 300),  # estimate: a process start and a few eager 20m updates; not measured yet
        )
        for micro, output in outputs.items()
    ]
    return Step(
        "map-points",
        f"throughput-map points of {size} at {context} tokens under runtime.memory_limit_mb {cap}: "
        f"micro {fits} fits, micro {too_big} is a real out-of-memory",
        cmds,
        partial(check_map_points, s, outputs, (fits, too_big)),
        min_seconds=s.on(20, 20),
    )


def check_map_points(
    s: Setup, outputs: dict[int, Path], micros: tuple[int, int], results: list[dict[str, Any]]
) -> dict[str, Any]:
    points = {micro: read_json(path) or {} for micro, path in outputs.items()}
    for micro, point in points.items():
        write_json(s.out / f"map-point-m{micro}.json", point)
    fits, too_big = (points[m] for m in micros)
    ok = fits.get("status") == "ok" and bool(fits.get("tokens_per_second"))
    ok = ok and too_big.get("status") == "memory_limit"
    out: dict[str, Any] = {
        "status": "ok" if ok else "failed",
        "points": points,
        "tokens_per_second": fits.get("tokens_per_second"),
        "peak_memory_bytes": fits.get("peak_memory_bytes"),
        "detail": (
            f"micro {micros[0]}: {fits.get('status')} ({fmt_int(fits.get('tokens_per_second'))} tok/s); "
            f"micro {micros[1]}: {too_big.get('status')} ({str(too_big.get('error'))[:80]})"
        ),
    }
    if not ok:
        errors = [r.get("error") for r in results if r.get("error")]
        out["error"] = "; ".join(errors) or f"points: {fits.get('status')}, {too_big.get('status')}"
    return out


# --- workflow


def workflow(s: Setup) -> Step:
    """The short workflow rehearsal (benchmarks/gpu_workflow.py): tuning to selected.yaml, campaign stage 1
    with 2 seeds, SIGTERM to the controller, the rerun. Its own timeout; it writes its JSON before it."""
    budget = s.on(70, 1500)  # estimate (~3 s per snakemake start, ~5 s per job, 2 eager 2M-token runs)
    output = s.work / "gpu-workflow.json"
    argv = [
        s.py,
        str(REPO / "benchmarks" / "gpu_workflow.py"),
        "--workdir",
        str(s.work / "workflow"),
        "--output",
        str(output),
        "--timeout",
        str(budget - 6),  # its calls stop (SIGTERM, SIGKILL 5 s later) before this step's timeout
        "--cores",
        str(s.on(16, 2)),
        *([] if s.gpu else ["--cpu-smoke"]),
    ]
    return Step(
        "workflow",
        "workflow rehearsal: tuning to selected.yaml, campaign stage 1 (2 seeds), SIGTERM to the controller, "
        "the rerun (benchmarks/gpu_workflow.py)",
        [Command("workflow", argv, budget)],
        partial(check_workflow, s, output),
        min_seconds=s.on(40, 60),
    )


def check_workflow(s: Setup, output: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    summary = read_json(output)
    logs = s.work / "workflow" / "logs"
    for log in sorted(logs.glob("rehearsal-*.log")) if logs.is_dir() else []:
        (s.out / "logs" / f"workflow.{log.name}").write_bytes(log.read_bytes())
    if summary is None:
        status = "timeout" if results[0].get("timed_out") else "failed"
        return {"status": status, "error": results[0].get("error") or "no rehearsal JSON written"}
    write_json(s.out / "workflow.rehearsal.json", summary)
    rows = summary.get("steps") or []
    out: dict[str, Any] = {
        "status": "ok" if summary.get("ok") and results[0].get("rc") == 0 else "failed",
        "rehearsal": rows,
        "rehearsal_seconds": summary.get("seconds"),
    }
    out["detail"] = "; ".join(
        f"{r['step']} {rehearsal_state(r)} {r.get('seconds')} s"
        + (f" ({r.get('signals')} SIGTERM)" if r["step"] == "interrupt" else "")
        for r in rows
    )
    if out["status"] != "ok":
        bad = [r["step"] for r in rows if rehearsal_state(r) != "ok"]
        out["error"] = results[0].get("error") or f"rehearsal steps failed: {bad}"
    return out


def rehearsal_state(row: dict[str, Any]) -> str:
    if row.get("timed_out"):
        return "TIMEOUT"
    return "ok" if row.get("ok", row.get("returncode") == 0) else "FAILED"


# --- bench-20m, bench-90m (bench-50m: --only)

BENCH_SECONDS = {"20m": 40, "50m": 42, "90m": 50}  # H200 (30 Nov 2026): 35.8, 37.4, 46.2 s


def bench(s: Setup, size: str) -> Step:
    """benchmark-worker, synthetic, 32,768-token updates, micro 32, compiled, bf16, SDPA auto."""
    output = s.work / f"bench-{size}.worker.json"
    argv = s.synthetic_worker(size, output, compile_=True, extra=[])
    return Step(
        f"bench-{size}",
        f"benchmark-worker {size}, synthetic, 32,768-token updates, compiled, micro 32, bf16",
        [Command(f"bench-{size}", argv, s.on(BENCH_SECONDS[size], 300))],
        partial(check_bench, s, output, REFERENCE_TOKENS_PER_SECOND[size]),
        min_seconds=s.on(60, 20),
    )


def check_bench(s: Setup, output: Path, reference: int, results: list[dict[str, Any]]) -> dict[str, Any]:
    out = worker_record(s, output, results[0])
    out["reference"] = f"GH200 {reference:,} tok/s"
    if out.get("tokens_per_second"):
        out["ratio_to_reference"] = out["tokens_per_second"] / reference
    return out


def worker_record(s: Setup, output: Path, result: dict[str, Any]) -> dict[str, Any]:
    """Fields of a benchmark-worker JSON for the step record (status from the JSON, else the process)."""
    data = read_json(output)
    if data is None:
        return {
            "status": "timeout" if result.get("timed_out") else "failed",
            "error": result.get("error") or "no worker JSON written",
            "tokens_per_second": None,
            "peak_memory_bytes": None,
            "mfu": None,
            "attention_kernel": "n/a",
        }
    copy = s.out / f"{output.stem}.json"
    write_json(copy, data)
    rec = {
        "status": data.get("status"),
        "worker_json": str(copy),
        "tokens_per_second": data.get("tokens_per_second"),
        "seconds_per_step": data.get("seconds_per_step"),
        "peak_memory_bytes": data.get("peak_memory_bytes"),
        "mfu": data.get("mfu"),
        "peak_flops_per_second": data.get("peak_flops_per_second"),
        "peak_source": data.get("peak_source"),
        "flops_per_token": data.get("flops_per_token"),
        "attention_kernel": short_kernels(data.get("attention_kernels")),
        "attention_kernels": data.get("attention_kernels"),
        "first_update_seconds": data.get("first_update_seconds"),
        "window_tokens_per_second": [m.get("tokens_per_second") for m in data.get("measurements") or []],
    }
    if data.get("error"):
        rec["error"] = str(data["error"])
    if rec["first_update_seconds"] is not None:
        rec["detail"] = f"first update {rec['first_update_seconds']:.1f} s"
        if rec["peak_source"]:
            rec["detail"] += f"; MFU peak: {rec['peak_source']}"
    return rec


# --- peers

# The peers at 20m, the reference shape (32,768-token updates, micro 32): the library against transformers
# compiled (goal >= 1.3x); the CPU smoke compares transformers eager at the tiny shape. All four peers:
# benchmarks/peers.py without --peers.
PEERS = {"gpu": ("library", "transformers-compiled"), "cpu-smoke": ("library", "transformers")}


def peers(s: Setup) -> Step:
    """benchmarks/peers.py, one process per peer (each its own timeout): same weights, batches, protocol."""
    if s.gpu:
        shape = ["--config", "20m", *sets("runtime.device=cuda", "training.batch_tokens=32768"),
                 *sets("training.micro_batch_size=32"), "--threads", "8"]  # fmt: skip
        protocol = ["--warmup", "3", "--steps", "10", "--windows", "3"]
    else:
        shape = ["--config", "tiny", *sets("runtime.device=cpu"), "--threads", "2"]
        protocol = ["--warmup", "1", "--steps", "1", "--windows", "1"]
    script = str(REPO / "benchmarks" / "peers.py")
    cmds = [
        # estimate: a process start and a 20m compile (~19 s) each; not measured yet
        Command(f"peers.{name}", [s.py, script, *shape, *protocol, "--peers", name], s.on(30, 300))
        for name in PEERS[s.mode]
    ]
    return Step(
        "peers",
        f"benchmarks/peers.py at 20m, 32,768-token updates: {' vs '.join(PEERS[s.mode])}",
        cmds,
        partial(check_peers, s),
        min_seconds=s.on(30, 20),
    )


def check_peers(s: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    per: dict[str, Any] = {}
    errors = []
    for name, result in zip(PEERS[s.mode], results, strict=False):
        data = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            data = json.loads(Path(result["stdout_log"]).read_text())["peers"][name]
        if data is None:
            errors.append(f"{name}: {result.get('error') or result.get('skipped') or 'no JSON'}")
        per[name] = data
    library = (per.get("library") or {}).get("tokens_per_second")
    for data in per.values():
        if data and library:
            data["library_speedup"] = library / data["tokens_per_second"]
    other = PEERS[s.mode][1]
    speedup = (per.get(other) or {}).get("library_speedup")
    out: dict[str, Any] = {
        "status": "failed" if errors else "ok",
        "peers": per,
        "tokens_per_second": library,
        "goal": "library >= 1.3x transformers compiled",
        "library_speedup": speedup,
        "detail": f"library {fmt(speedup, '.2f')}x {other} "
        f"({fmt_int((per.get(other) or {}).get('tokens_per_second'))} tok/s)",
    }
    if errors:
        out["error"] = "; ".join(errors)
    return out


# --- packed-n4 (--only)


def packed_n4(s: Setup) -> Step:
    """benchmark-packed-worker packed and sequential, N=4, 20m shape, complete mixing, compiled."""
    if s.gpu:
        shape = sets("training.batch_tokens=32768", "training.micro_batch_size=8")
        protocol = ["--warmup", "5", "--steps", "20", "--component-steps", "3"]
    else:
        shape = sets("model.context_length=64", "training.batch_tokens=512", "training.micro_batch_size=2")
        protocol = ["--warmup", "1", "--steps", "2", "--component-steps", "1"]
    common = sets("decentralized.num_models=4", "decentralized.topology=complete")
    outputs = {e: s.work / f"packed-n4-{e}.worker.json" for e in EXECUTIONS}
    cmds = [
        Command(
            f"packed-n4-{e}",
            s.tiny_llm(
                "benchmark-packed-worker",
                "--config",
                "packed4-20m-awc",
                *common,
                *shape,
                *s.runtime_sets(compile_=True),
                "--execution",
                e,
                *protocol,
                "--output",
                str(outputs[e]),
            ),
            s.on(200, 300),
        )
        for e in EXECUTIONS
    ]
    return Step(
        "packed-n4",
        "packed vs sequential N=4, 20m shape, 32,768-token global batch, complete mixing, compiled",
        cmds,
        partial(check_packed, s, outputs),
        min_seconds=s.on(90, 20),
    )


PACKED_KEYS = (
    "status",
    "error",
    "tokens_per_second",
    "seconds_per_step",
    "peak_memory_bytes",
    "first_update_seconds",
    "components",
    "loss",
)


def packed_execution(s: Setup, execution: str, output: Path, result: dict[str, Any]) -> dict[str, Any]:
    """One execution's fields, its attention kernel taken from the worker's trace."""
    data = read_json(output)
    if data is None:
        return {"status": "timeout" if result.get("timed_out") else "failed", "error": result.get("error")}
    write_json(s.out / f"packed-n4-{execution}.worker.json", data)
    record = {k: data.get(k) for k in PACKED_KEYS}
    record["attention_kernel"] = short_kernels(trace_attention_kernels(output))
    record["reference_tokens_per_second"] = REFERENCE_PACKED_N4[execution]
    return record


def check_packed(s: Setup, outputs: dict[str, Path], results: list[dict[str, Any]]) -> dict[str, Any]:
    per = {e: packed_execution(s, e, outputs[e], res) for e, res in zip(EXECUTIONS, results, strict=False)}
    out: dict[str, Any] = {
        "executions": per,
        "reference": f"GH200 compiled N=4 {REFERENCE_PACKED_SPEEDUP_N4}x",
    }
    if not (all(p.get("status") == "ok" for p in per.values()) and len(per) == 2):
        out["status"] = "failed"
        out["error"] = "; ".join(f"{e}: {p.get('error')}" for e, p in per.items() if p.get("status") != "ok")
    p, q = per.get("packed", {}), per.get("sequential", {})
    if p.get("seconds_per_step") and q.get("seconds_per_step"):
        speedup = q["seconds_per_step"] / p["seconds_per_step"]
        out["speedup"] = speedup
        out["ratio_to_reference"] = speedup / REFERENCE_PACKED_SPEEDUP_N4
        out["detail"] = f"speedup {speedup:.2f}x"
    out["tokens_per_second"] = p.get("tokens_per_second")
    out["peak_memory_bytes"] = p.get("peak_memory_bytes")
    out["attention_kernel"] = p.get("attention_kernel", "n/a")
    out.update(packed_mfu(s, p.get("tokens_per_second")))
    if q.get("tokens_per_second") is not None:
        seq_peak = q.get("peak_memory_bytes")
        out["detail"] = (
            out.get("detail", "") + f"; sequential {fmt_int(q.get('tokens_per_second'))} tok/s, "
            f"peak {fmt(seq_peak / GIB if seq_peak else None, '.2f')} GiB (ref 692k -> 1.04M tok/s)"
        )
    return out


def packed_mfu(s: Setup, tokens_per_second: float | None) -> dict[str, Any]:
    """The packed worker reports no MFU: it comes from the bench-20m worker's FLOPs/token and peak (same
    shape, device and precision). Packed tokens/s counts all N workers' tokens."""
    b20 = s.records.get("bench-20m", {})
    if tokens_per_second and b20.get("flops_per_token") and b20.get("peak_flops_per_second"):
        mfu = tokens_per_second * b20["flops_per_token"] / b20["peak_flops_per_second"]
        return {"mfu": mfu, "mfu_source": "FLOPs/token and peak of the bench-20m worker"}
    return {"mfu": None}


# --- train-resume (--only)


def train_resume(s: Setup) -> Step:
    """A short `train` (tiny shape, eager) sent SIGTERM after its third update, rerun with --resume auto to
    completion, then `evaluate --full` on final.pt against result.json's final_validation."""
    run_dir = s.work / "train-resume"
    recipe = s.train_recipe(
        run_dir,
        compile_=False,  # interruption, resume and evaluation on the device; compile-mode runs compiled
        extra=[
            "training.batch_tokens=2048",
            "training.micro_batch_size=16",
            f"training.tokens_per_parameter={s.on(2.4, 0.8)}",  # ~155 (GPU) / ~52 updates
            f"training.epoch_tokens_per_parameter={s.on(0.8, 0.4)}",
            "training.checkpoint_policy=interval",
            "training.checkpoint_every=50",
        ],
    )
    eval_json = s.work / "train-resume.evaluate.json"
    signalled: dict[str, Any] = {}
    evaluate = s.tiny_llm(
        "evaluate",
        "--config",
        str(run_dir / "resolved.yaml"),
        "--checkpoint",
        str(run_dir / "final.pt"),
        "--full",
        "--output",
        str(eval_json),
    )
    cmds = [
        Command(
            "train-resume.1-train",
            s.tiny_llm("train", *recipe, "--quiet"),
            120,
            during=partial(sigterm_after_update_3, run_dir / "metrics.jsonl", signalled),
            expect_rc=(130,),
        ),
        Command(
            "train-resume.2-resume",
            s.tiny_llm("train", *recipe, "--resume", "auto", "--quiet"),
            s.on(150, 300),
        ),
        Command("train-resume.3-evaluate", evaluate, s.on(90, 120)),
    ]
    return Step(
        "train-resume",
        "short CUDA train (tiny shape, eager), SIGTERM mid-run, --resume auto, "
        "evaluate --full vs result.json",
        cmds,
        partial(check_train_resume, s, run_dir, eval_json, signalled),
        min_seconds=s.on(60, 30),
        describe_during="the first train is sent SIGTERM (by pid) once metrics.jsonl has a train row "
        "at step >= 3; exit status 130 expected",
    )


def sigterm_after_update_3(
    metrics: Path, signalled: dict[str, Any], proc: subprocess.Popen, deadline: float
) -> str | None:
    """SIGTERM the trainer (only it, by pid) once ``metrics`` has a train row at step >= 3."""
    while time.time() < deadline and proc.poll() is None:
        rows = [r for r in read_jsonl(metrics) if r.get("event") == "train"]
        if rows and rows[-1].get("step", 0) >= 3:
            signalled.update(step=rows[-1]["step"], time=time.time())
            os.kill(proc.pid, signal.SIGTERM)
            return f"SIGTERM sent after train row step {rows[-1]['step']}"
        time.sleep(0.05)
    return "run ended before it could be interrupted" if proc.poll() is not None else None


def check_train_resume(
    s: Setup, run_dir: Path, eval_json: Path, signalled: dict[str, Any], results: list[dict[str, Any]]
) -> dict[str, Any]:
    first = results[0]
    status_json = read_json(run_dir / "status.json") or {}
    result = read_json(run_dir / "result.json") or {}
    # the resumed session's environment (environment.json is the first session's)
    environment = read_json(run_dir / "environment-resume.json") or read_json(run_dir / "environment.json")
    environment = environment or {}
    evaluated = read_json(eval_json) or {}
    copy_run_files(run_dir, s.out / "train-resume")
    if eval_json.exists():
        write_json(s.out / "train-resume" / "evaluate.json", evaluated)
    train_rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("event") == "train"]
    steps_logged = [r.get("step") for r in train_rows]
    interrupted = first.get("rc") == 130
    final_loss = (result.get("final_validation") or {}).get("loss")
    eval_loss = evaluated.get("loss")
    diff = abs(final_loss - eval_loss) if final_loss is not None and eval_loss is not None else None
    errors = [r["error"] for r in results if r.get("error")]
    if not interrupted:
        errors.insert(0, f"first run was not interrupted (rc {first.get('rc')}; {first.get('note')})")
    complete = status_json.get("status") == "complete"
    match = diff is not None and diff <= 1e-4
    ok = interrupted and complete and match and not any(r.get("error") for r in results[1:])
    mfus = [r["mfu"] for r in train_rows if r.get("mfu") is not None]
    out = {
        "status": "ok" if ok else "failed",
        "interrupted_at_step": signalled.get("step"),
        "first_exit_status": first.get("rc"),
        "run_status": status_json.get("status"),
        "result_step": result.get("step"),
        "train_row_steps_duplicated": len(steps_logged) != len(set(steps_logged)),
        "final_validation_loss": final_loss,
        "evaluate_full_loss": eval_loss,
        "loss_difference": diff,
        "tokens_per_second": result.get("training_tokens_per_second"),
        "peak_memory_bytes": result.get("peak_memory_bytes"),
        "mfu": (sorted(mfus)[len(mfus) // 2] if mfus else None),
        "attention_kernel": short_kernels(environment.get("attention_kernels")),
        "result": result,
        "detail": (
            f"SIGTERM at step {signalled.get('step')} -> rc {first.get('rc')}, resumed to step "
            f"{result.get('step')} ({status_json.get('status')}); final_validation {fmt(final_loss, '.6f')} "
            f"vs evaluate --full {fmt(eval_loss, '.6f')}, diff {fmt(diff, '.2e')}"
        ),
    }
    if errors:
        out["error"] = " | ".join(errors)
    elif not match:
        out["error"] = "evaluate --full does not match final_validation (tolerance 1e-4)"
    return out


# --- compile-mode (--only)


def compile_mode(s: Setup) -> Step:
    """Two 13-update compiled trains with 4 microbatches per update, compile_mode default and reduce-overhead,
    same seed: per-update loss and grad norm must agree."""
    dirs = {m: s.work / f"compile-{m}" for m in COMPILE_MODES}
    extra = [
        "training.batch_tokens=4096",  # 64 sequences of 64 tokens
        "training.micro_batch_size=16",  # -> 4 microbatches per update
        "training.tokens_per_parameter=0.4",  # 12 updates
        "training.epoch_tokens_per_parameter=0.4",
        "training.checkpoint_policy=none",
        "runtime.seed=42",
    ]
    cmds = [
        Command(
            f"compile-mode.{m}",
            s.tiny_llm(
                "train", *s.train_recipe(dirs[m], True, [*extra, f"runtime.compile_mode={m}"]), "--quiet"
            ),
            s.on(180, 120),
        )
        for m in COMPILE_MODES
    ]
    return Step(
        "compile-mode",
        "compile_mode reduce-overhead vs default, 4 microbatches per update, same seed, losses compared",
        cmds,
        partial(check_compile_mode, s, dirs),
        min_seconds=s.on(60, 20),
    )


def check_compile_mode(s: Setup, dirs: dict[str, Path], results: list[dict[str, Any]]) -> dict[str, Any]:
    rows = {}
    for m in COMPILE_MODES:
        rows[m] = {r["step"]: r for r in read_jsonl(dirs[m] / "metrics.jsonl") if r.get("event") == "train"}
        copy_run_files(dirs[m], s.out / f"compile-{m}")
    default, graphs = rows["default"], rows["reduce-overhead"]
    common = sorted(set(default) & set(graphs))
    loss_diffs = [abs(default[i]["loss"] - graphs[i]["loss"]) for i in common]
    gn_diffs = []
    for i in common:
        a, b = default[i].get("grad_norm"), graphs[i].get("grad_norm")
        if a is not None and b is not None:
            gn_diffs.append(abs(a - b) / max(abs(a), 1e-12))
    modes = list(zip(COMPILE_MODES, results, strict=False))
    per_mode = {m: {"rc": r.get("rc"), "error": r.get("error"), "updates": len(rows[m])} for m, r in modes}
    rejected = [m for m, r in modes if r.get("rc") == 2 and not rows[m]]
    out: dict[str, Any] = {
        "modes": per_mode,
        "steps_compared": len(common),
        "max_abs_loss_difference": max(loss_diffs) if loss_diffs else None,
        "max_rel_grad_norm_difference": max(gn_diffs) if gn_diffs else None,
        "first_step_grad_norm": {m: rows[m].get(1, {}).get("grad_norm") for m in COMPILE_MODES},
        "tolerance": {"loss_abs": 1e-3, "grad_norm_rel": 1e-2},
        "losses": {m: [rows[m][i]["loss"] for i in common] for m in COMPILE_MODES},
    }
    failed = [m for m, r in modes if r.get("error")]
    if rejected == ["reduce-overhead"] and not results[0].get("error"):
        out.update(status="ok", verdict="rejected at validation")
        out["detail"] = f"reduce-overhead + accumulation rejected: {results[1].get('error')}"
        return out
    if failed or not common:
        out.update(status="failed", verdict="fail")
        out["error"] = "; ".join(f"{m}: {per_mode[m]['error']}" for m in failed) or "no comparable train rows"
        return out
    passed = max(loss_diffs) <= 1e-3 and (not gn_diffs or max(gn_diffs) <= 1e-2)
    out.update(status="ok" if passed else "failed", verdict="pass" if passed else "fail")
    out["detail"] = (
        f"{out['verdict'].upper()}: {len(common)} updates of 4 microbatches, "
        f"max |dloss| {max(loss_diffs):.3e}, "
        f"max rel |dgrad_norm| {fmt(out['max_rel_grad_norm_difference'], '.3e')}"
    )
    if not passed:
        out["error"] = "reduce-overhead with accumulation differs from default"
    return out


# --- kernel-<backend>[-compiled] (--only)


def kernel(s: Setup, backend: str, compiled: bool) -> Step:
    """benchmark-worker 20m with runtime.sdpa_backend forced: the kernel of the profiled update must be the
    forced one, or the run must fail with a one-line error (unsupported)."""
    name = f"kernel-{backend}" + ("-compiled" if compiled else "")
    output = s.work / f"{name}.worker.json"
    protocol = ["--warmup", "2", "--steps", "5", "--windows", "1"] if s.gpu else s.worker_protocol()
    argv = s.synthetic_worker("20m", output, compiled, sets(f"runtime.sdpa_backend={backend}"), protocol)
    mode = "compiled" if compiled else "eager"
    return Step(
        name,
        f"benchmark-worker 20m with runtime.sdpa_backend={backend} ({mode}): the kernel that ran",
        [Command(name, argv, s.on(180 if compiled else 90, 120))],
        partial(check_kernel, s, output, backend),
        min_seconds=s.on(60 if compiled else 20, 10),
    )


def check_kernel(s: Setup, output: Path, backend: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    out = worker_record(s, output, results[0])
    out["forced"] = backend
    kernels = out.get("attention_kernels") or []
    if out.get("status") == "ok":
        matches = any(KERNEL_OP[backend] in k for k in kernels)
        out["kernel_matches_forced"] = matches
        out["detail"] = f"forced {backend}: ran {out['attention_kernel']}" + (
            "" if matches else " (MISMATCH)"
        )
        if not matches:
            out["status"] = "failed"
            out["error"] = f"forced {backend} but the profiled update dispatched {kernels}"
        return out
    err = str(out.get("error") or "")
    out["one_line_error"] = bool(err) and "\n" not in err.strip()
    out["detail"] = f"forced {backend}: failed (unsupported?), one-line error: {out['one_line_error']}"
    # A forced kernel the device can't run is expected to fail cleanly: report it, not a crash.
    out["status"] = "unsupported" if out["one_line_error"] and not results[0].get("timed_out") else "failed"
    return out


# ----------------------------------------------------------------------------- what the steps share


def short_kernels(kernels: list[str] | None) -> str:
    """aten::_scaled_dot_product_flash_attention(_backward) -> flash; several -> joined; none -> n/a."""
    if not kernels:
        return "n/a"
    names = []
    for k in kernels:
        k = k.split("::")[-1]
        # Forward attention ops only (lists may also hold backward/autograd nodes and unrelated ops).
        if "attention" not in k.lower() or "backward" in k.lower() or k == "scaled_dot_product_attention":
            continue
        for label, op in KERNEL_OP.items():
            if op in k:
                k = label + ("(cpu)" if "for_cpu" in k else "")
                break
        if k not in names:
            names.append(k)
    return "+".join(names) or "sdpa"


def copy_run_files(run_dir: Path, dest: Path) -> None:
    """The small files of a run directory (not its checkpoints) into OUT."""
    for name in RUN_FILES:
        src = run_dir / name
        if src.is_file():
            dest.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(src.read_bytes())


def trace_attention_kernels(worker_json: Path) -> list[str] | None:
    """Attention ops in the packed worker's Chrome trace (OUTPUT.trace.json), which its JSON doesn't list."""
    candidates = [worker_json.with_suffix(".trace.json"), Path(str(worker_json) + ".trace.json")]
    for path in candidates:
        data = read_json(path)
        if data is None:
            continue
        events = data.get("traceEvents", data) if isinstance(data, dict) else data
        names = sorted(
            {
                e.get("name", "")
                for e in events
                if isinstance(e, dict) and "scaled_dot_product" in e.get("name", "")
            }
        )
        return names
    return None


# ----------------------------------------------------------------------------- main


def select(default: list[Step], more: list[Step], only: str | None) -> list[Step]:
    """The default steps, or those --only names in the default order, then --only's other steps (the data
    step too when a training step needs its cache); SystemExit(2) on an unknown name."""
    if not only:
        return default
    every = default + more
    wanted = set(only.split(","))
    unknown = wanted - {s.name for s in every}
    if unknown:
        print(f"error: --only: unknown step(s) {sorted(unknown)}; steps: {[s.name for s in every]}")
        raise SystemExit(2)
    if wanted & {"train-20m", "train-resume", "compile-mode", "muon"}:
        wanted.add("data")  # they train on the check's cache
    if "cuda-graph-20m" in wanted:
        wanted |= {"pytest-cuda", "bench-20m"}  # its correctness, then its figure without the graph
    return [s for s in every if s.name in wanted]


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    # Run directories, caches and traces stay out of OUT (only JSON and logs are meant to be copied back).
    # A fresh private directory (mkdtemp: an unpredictable name, 0700), never a guessable path under /tmp; a
    # dry run only names where it would be.
    if args.work:
        work = Path(args.work).resolve()
    elif args.dry_run:
        work = Path(tempfile.gettempdir()) / "tiny-llm-gpu-check.XXXXXXXX"
    else:
        work = Path(tempfile.mkdtemp(prefix="tiny-llm-gpu-check."))
    deadline = time.time() + args.budget if args.deadline is None else args.deadline
    setup = Setup(args.mode, out, work)
    chosen = select(steps(setup), more_steps(setup), args.only)
    runner = Runner(out, deadline, args.dry_run)
    if args.dry_run:
        print(f"# mode {args.mode}: output {out}, work {work}; {len(chosen)} steps, each with its budget")
        for step in chosen:
            runner.run_step(step)
        for line in budget_lines(chosen, args.install_seconds, args.budget):
            print(line)
        return 0
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"gpu-check ({args.mode}): {len(chosen)} steps, {runner.left():.0f} s budget; JSON and logs in {out}",
        flush=True,
    )
    for step in chosen:
        setup.records[step.name] = runner.run_step(step)
    for step in chosen:  # figures of steps that ran after it (bench-20m for the train and the CUDA graph)
        record = setup.records[step.name]
        if step.compare is None or record.get("status") == "skipped_budget":
            continue
        try:
            record.update(step.compare())
        except Exception as exc:  # as for a check: recorded, the summary still written
            record["compare_error"] = f"{type(exc).__name__}: {exc}"
        write_json(out / f"{step.name}.json", record)
    summary = {
        "mode": args.mode,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(runner.started)),
        "seconds": round(time.time() - runner.started, 1),
        "budget_deadline_missed": time.time() > deadline,
        "budget": {
            "limit_s": args.budget,
            "install_s": args.install_seconds,
            "steps_s": {step.name: step.budget for step in chosen},
            "sum_s": args.install_seconds + sum(step.budget for step in chosen),
        },
        "reference": {
            "tokens_per_second_gh200": REFERENCE_TOKENS_PER_SECOND,
            "packed_speedup_n4_compiled": REFERENCE_PACKED_SPEEDUP_N4,
        },
        "lines": [format_line(r) for r in runner.records],
        "steps": runner.records,
    }
    write_json(out / "summary.json", summary)
    counts: dict[str, int] = {}
    for r in runner.records:
        counts[r.get("status", "?")] = counts.get(r.get("status", "?"), 0) + 1
    print("\nsummary (one line per step):")
    for line in summary["lines"]:
        print("  " + line)
    print(
        f"gpu-check done in {summary['seconds']:.0f} s: {counts}; summary {out / 'summary.json'}", flush=True
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or print, --dry-run) the checks")
    run.add_argument("--mode", choices=("gpu", "cpu-smoke"), default="gpu")
    run.add_argument("--out", default=os.environ.get("OUT") or "results/gpu-check")
    run.add_argument("--work", default=None, help="run directories, traces, data (default a new /tmp dir)")
    run.add_argument(
        "--budget", type=float, default=DEFAULT_BUDGET, help="seconds from the start, install included"
    )
    run.add_argument(
        "--install-seconds", type=float, default=0.0, help="the install's budget (for the sum; gpu_check.sh)"
    )
    run.add_argument("--deadline", type=float, default=None, help="absolute deadline (epoch seconds)")
    run.add_argument("--only", default=None, help="comma-separated step names")
    run.add_argument("--dry-run", action="store_true")
    return cmd_run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
