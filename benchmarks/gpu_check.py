"""One-shot GPU check: throughput against the reference GH200 figures, packed speedup, CUDA
train/resume/evaluate, forced attention kernels and CUDA-graph compile modes with gradient accumulation.

Run through ``benchmarks/gpu_check.sh`` (it installs, checks CUDA and calls ``run``). This file uses only the
standard library: every measurement is a ``python -m tiny_llm ...`` subprocess whose JSON output is read
back, so it does not depend on the library's internal module layout. The data come from the library's own
commands (``build-demo-corpus``, ``train-tokenizer``, ``prepare``), as in the workflow.

    python benchmarks/gpu_check.py run --mode gpu --out results/gpu-check        # the real thing
    python benchmarks/gpu_check.py run --mode cpu-smoke --out /tmp/gpu-smoke       # same steps, tiny, CPU
    python benchmarks/gpu_check.py run --mode gpu --dry-run                       # print the commands only

``steps()`` lists the steps in the order of the table in benchmarks/README.md; each step is its commands
and a ``check`` that turns their outputs into the step's record. Every step writes ``<out>/<step>.json`` and
its commands' stdout/stderr under ``<out>/logs/``; ``summary.json`` collects them. Each command has its own
timeout, clipped to a global deadline; a step that cannot start before the deadline is recorded as
``skipped_budget``. A failed step never stops the next.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

GIB = 1024**3

# Reference GH200 figures (SPEC §5 and §7): 32,768-token updates, compiled, micro 32, bf16, synthetic data.
REFERENCE_TOKENS_PER_SECOND = {"20m": 1_636_281, "50m": 871_826, "90m": 508_930}
REFERENCE_PACKED_SPEEDUP_N4 = 1.51
REFERENCE_PACKED_N4 = {"sequential": 692_000, "packed": 1_040_000}  # tok/s, rounded in the reference
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


# ----------------------------------------------------------------------------- commands and steps


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


def steps(s: Setup) -> list[Step]:
    """Every step, in the order of the table in benchmarks/README.md."""
    return [
        env(s),
        data(s),
        *(bench(s, size) for size in REFERENCE_TOKENS_PER_SECOND),
        cuda_graph(s),
        packed_n4(s),
        train_resume(s),
        compile_mode(s),
        *(kernel(s, backend, compiled=False) for backend in SDPA_BACKENDS),
        # The compiled path must honour a forced kernel too; `efficient` is not what `auto` picks on Hopper,
        # so a forced kernel that silently became `auto` shows up as flash/cudnn here.
        kernel(s, "efficient", compiled=True),
    ]


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
    cmds = [Command("env.torch", [s.py, "-c", ENV_PROBE], 120)]
    if s.gpu:
        cmds.append(Command("env.nvidia-smi", NVIDIA_SMI, 30))
    return Step("env", "torch/CUDA versions and the GPU", cmds, partial(check_env, s), min_seconds=5)


def check_env(s: Setup, results: list[dict[str, Any]]) -> dict[str, Any]:
    info = {}
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        info = json.loads(Path(results[0]["stdout_log"]).read_text().strip().splitlines()[-1])
    extra = {}
    if len(results) > 1 and results[1].get("rc") == 0:
        extra["nvidia_smi"] = Path(results[1]["stdout_log"]).read_text().strip()
    ok = results[0].get("rc") == 0 and (info.get("cuda_available") or not s.gpu)
    detail = f"torch {info.get('torch')} cuda {info.get('cuda')} device {info.get('device_name') or 'cpu'}"
    return {"status": "ok" if ok else "failed", "environment": info, **extra, "detail": detail}


def data(s: Setup) -> Step:
    """The embedded demo corpus (the workflow's offline corpus), a 512-token BPE, a 400k-token cache."""
    cmds = [
        Command("data.corpus", s.tiny_llm("build-demo-corpus", "--output", str(s.corpus)), 120),
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
            180,
        ),
        Command(
            "data.prepare", s.tiny_llm("prepare", "--config", "tiny", *s.data_sets(), "--no-progress"), 180
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


def bench(s: Setup, size: str) -> Step:
    """benchmark-worker, synthetic, 32,768-token updates, micro 32, compiled, bf16, SDPA auto."""
    output = s.work / f"bench-{size}.worker.json"
    argv = s.synthetic_worker(size, output, compile_=True, extra=[])
    return Step(
        f"bench-{size}",
        f"benchmark-worker {size}, synthetic, 32,768-token updates, compiled, micro 32, bf16",
        [Command(f"bench-{size}", argv, s.on(200, 300))],
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


def cuda_graph(s: Setup) -> Step:
    """benchmark-worker 20m as bench-20m, plus runtime.cuda_graph (the whole update replayed as one CUDA
    graph): tokens/s with the graph against bench-20m's without it. The CPU smoke checks its one-line
    refusal."""
    output = s.work / "cuda-graph-20m.worker.json"
    argv = s.synthetic_worker("20m", output, compile_=True, extra=sets("runtime.cuda_graph=true"))
    command = Command("cuda-graph-20m", argv, s.on(200, 120), expect_rc=s.on((0,), (2,)))
    return Step(
        "cuda-graph-20m",
        "benchmark-worker 20m as bench-20m, with the whole update as one CUDA graph (runtime.cuda_graph)",
        [command],
        partial(check_cuda_graph, s, output),
        min_seconds=s.on(60, 10),
    )


CUDA_GRAPH_REFUSAL = "runtime.cuda_graph: needs a CUDA device"


def check_cuda_graph(s: Setup, output: Path, results: list[dict[str, Any]]) -> dict[str, Any]:
    if not s.gpu:  # the recipe names the CPU: refused at validation, exit 2, one line
        line = last_error_line(Path(results[0]["stderr_log"])) or ""
        refused = results[0].get("rc") == 2 and CUDA_GRAPH_REFUSAL in line
        out = {"status": "ok" if refused else "failed", "detail": f"refused on the CPU: {line}"}
        if not refused:
            out["error"] = f"expected exit 2 with '{CUDA_GRAPH_REFUSAL}', got {results[0].get('rc')}: {line}"
        return out
    out = worker_record(s, output, results[0])
    out["reference"] = f"GH200 {REFERENCE_TOKENS_PER_SECOND['20m']:,} tok/s"
    without = s.records.get("bench-20m", {}).get("tokens_per_second")
    if out.get("tokens_per_second"):
        out["ratio_to_reference"] = out["tokens_per_second"] / REFERENCE_TOKENS_PER_SECOND["20m"]
        if without:
            out["speedup_over_no_graph"] = out["tokens_per_second"] / without
            out["detail"] = f"{out['speedup_over_no_graph']:.3f}x bench-20m ({fmt_int(without)} tok/s)"
    return out


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


# ----------------------------------------------------------------------------- running commands


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
        """SIGTERM the command's own process group (it was started in a new session), then SIGKILL."""
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
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
            print(f"# step {step.name}: {step.what}")
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
        for label, op in (
            ("flash", "flash_attention"),
            ("efficient", "efficient_attention"),
            ("cudnn", "cudnn_attention"),
            ("math", "attention_math"),
        ):
            if op in k:
                k = label + ("(cpu)" if "for_cpu" in k else "")
                break
        if k not in names:
            names.append(k)
    return "+".join(names) or "sdpa"


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


def select(all_steps: list[Step], only: str | None) -> list[Step]:
    """The steps --only names (the data step too when a training step needs its cache); SystemExit(2) on an
    unknown name."""
    if not only:
        return all_steps
    wanted = set(only.split(","))
    unknown = wanted - {s.name for s in all_steps}
    if unknown:
        print(f"error: --only: unknown step(s) {sorted(unknown)}; steps: {[s.name for s in all_steps]}")
        raise SystemExit(2)
    if wanted & {"train-resume", "compile-mode"}:
        wanted.add("data")  # they train on the check's cache
    if "cuda-graph-20m" in wanted:
        wanted.add("bench-20m")  # its figure without the graph
    return [s for s in all_steps if s.name in wanted]


def cmd_run(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    # Run directories, caches and traces stay out of OUT (only JSON and logs are meant to be copied back).
    work = (
        Path(args.work).resolve()
        if args.work
        else Path("/tmp") / f"tiny-llm-gpu-check.{time.strftime('%Y%m%d-%H%M%S')}"
    )
    deadline = time.time() + args.budget if args.deadline is None else args.deadline
    setup = Setup(args.mode, out, work)
    chosen = select(steps(setup), args.only)
    runner = Runner(out, deadline, args.dry_run)
    if args.dry_run:
        print(
            f"# mode {args.mode}: output {out}, work {work}; {len(chosen)} steps, budget until the deadline"
        )
        for step in chosen:
            runner.run_step(step)
        return 0
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"gpu-check ({args.mode}): {len(chosen)} steps, {runner.left():.0f} s budget; JSON and logs in {out}",
        flush=True,
    )
    for step in chosen:
        setup.records[step.name] = runner.run_step(step)
    summary = {
        "mode": args.mode,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(runner.started)),
        "seconds": round(time.time() - runner.started, 1),
        "budget_deadline_missed": time.time() > deadline,
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
    run.add_argument("--budget", type=float, default=480.0, help="seconds from now for all steps")
    run.add_argument("--deadline", type=float, default=None, help="absolute deadline (epoch seconds)")
    run.add_argument("--only", default=None, help="comma-separated step names")
    run.add_argument("--dry-run", action="store_true")
    return cmd_run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
