"""Run one tuning candidate in its own process, and summarise a finished tuning.

Each candidate runs the benchmark worker as a child process in its own process
group, so a timeout (min(candidate timeout, budget left)) kills the worker and
everything it started (compile workers included). The budget is accounted
deterministically: the budget used before a slot is the sum of the wall times
of the slots before it in plan order, so a rerun after an interruption sees the
same numbers. Identical candidates (same identity) are reused, not re-run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import ConfigError, RunStateError, TinyLLMError
from tiny_llm.io import atomic_write_json, atomic_write_text, read_json, read_json_mapping
from tiny_llm.recorded import write_recorded_yaml
from tiny_llm.tuning.candidates import (
    CONDITIONAL_STAGES,
    NOISE_RULE,
    REPLAN,
    Slot,
    TuningSchedule,
    apply_overrides,
    candidate_identity,
    rank_results,
    rank_with_decisions,
    tuned_settings,
    window_noise,
)

KILL_GRACE_SECONDS = 5.0
REBUILD_CANDIDATE = "delete it and rerun the same command: that candidate is measured again"
# Keys copied from the worker JSON into a candidate result.
WORKER_SUMMARY_KEYS = (
    "tokens_per_second",
    "seconds_per_step",
    "first_update_seconds",
    "warmup_seconds",
    "peak_memory_bytes",
    "total_memory_bytes",
    "mfu",
    "attention_kernels",
)
# Keys a candidate result gets from the worker's timing windows (the noise the ranking allows for).
NOISE_KEYS = ("window_tokens_per_second", "noise_tokens_per_second")


def candidate_paths(results_dir: str | Path, slot: str) -> dict[str, Path]:
    base = Path(results_dir) / "candidates"
    return {
        "result": base / f"{slot}.json",
        "recipe": base / f"{slot}.yaml",
        "worker": base / f"{slot}.worker.json",
        "log": base / f"{slot}.log",
    }


def earlier_results(plan: TuningSchedule, results_dir: str | Path, slot: str) -> list[dict[str, Any]]:
    """Results of every slot before ``slot`` in plan order (they must exist)."""
    out: list[dict[str, Any]] = []
    for other in plan.slots:
        if other.name == slot:
            return out
        path = candidate_paths(results_dir, other.name)["result"]
        if not path.is_file():
            raise RunStateError(f"tuning result {path} is missing; run candidate {other.name} first")
        out.append(read_json_mapping(path, REBUILD_CANDIDATE))
    raise ConfigError(f"tuning slot '{slot}' is not in the plan of profile {plan.profile}; {REPLAN}")


def budget_used(results: list[dict[str, Any]]) -> float:
    return sum(float(r.get("wall_seconds") or 0.0) for r in results)


def _parent(
    slot: Slot, plan: TuningSchedule, earlier: list[dict[str, Any]]
) -> tuple[dict[str, Any] | None, str]:
    """(parent result, reason if missing); stage-1 slots have the base recipe as parent."""
    if slot.parent_rank is None:
        return None, ""
    ranked = rank_results([r for r in earlier if r["stage"] < slot.stage])
    if slot.parent_rank < len(ranked):
        return ranked[slot.parent_rank], ""
    return None, f"no successful candidate of rank {slot.parent_rank} before stage {slot.stage}"


def _base_record(slot: Slot, parent: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "name": slot.name,
        "stage": slot.stage,
        "stage_name": slot.stage_name,
        "parent_rank": slot.parent_rank,
        "parent": parent["name"] if parent else None,
        "overrides": slot.overrides,
        "status": "skipped",
        "error": None,
        "tokens_per_second": None,
        "wall_seconds": 0.0,
        "reused_from": None,
        "window_tokens_per_second": None,
        "noise_tokens_per_second": None,
        "identity": None,
        "settings": None,
        "recipe": None,
    }


def run_candidate(plan: TuningSchedule, slot_name: str, results_dir: str | Path) -> dict[str, Any]:
    """Measure (or reuse, or skip) one slot and write its result JSON; returns the result."""
    slot = plan.slot(slot_name)
    paths = candidate_paths(results_dir, slot.name)
    earlier = earlier_results(plan, results_dir, slot.name)
    parent, missing = _parent(slot, plan, earlier)
    record = _base_record(slot, parent)
    if missing:
        record["error"] = missing
        return _finish(plan, results_dir, paths, record)
    start_recipe = parent["recipe"] if parent else plan.base_recipe
    try:
        recipe = apply_overrides(start_recipe, slot.overrides)
    except ConfigError as exc:
        if parent is not None and slot.stage_name in CONDITIONAL_STAGES:  # skipped: the parent stays
            record["error"] = f"not applicable to {parent['name']}: {exc}"
        else:
            record.update(status="failed", error=str(exc))
        return _finish(plan, results_dir, paths, record)
    identity = candidate_identity(recipe, plan.protocol)
    record.update(identity=identity, settings=tuned_settings(recipe), recipe=recipe)
    twin = next((r for r in earlier if r.get("identity") == identity), None)
    if twin is not None:
        return _finish(plan, results_dir, paths, _reuse(record, twin))
    left = plan.budget_seconds - budget_used(earlier)
    if left < plan.min_start_seconds:
        record.update(status="skipped_budget", error=f"{max(left, 0):.0f} s of tuning budget left")
        return _finish(plan, results_dir, paths, record)
    timeout = min(plan.candidate_timeout_seconds, left)
    atomic_write_text(paths["recipe"], yaml.safe_dump(recipe, sort_keys=False))
    record.update(_measure(plan, paths, timeout))
    return _finish(plan, results_dir, paths, record)


def _reuse(record: dict[str, Any], twin: dict[str, Any]) -> dict[str, Any]:
    keys = ("status", "error", "tokens_per_second", *WORKER_SUMMARY_KEYS, *NOISE_KEYS)
    copied = {k: twin.get(k) for k in keys}
    return {**record, **copied, "reused_from": twin.get("reused_from") or twin["name"], "wall_seconds": 0.0}


WORKER: list[str] = [sys.executable, "-m", "tiny_llm", "benchmark-worker"]
"""The benchmark worker the tuner runs; tests replace it in-process (never read from a file)."""


def candidate_command(plan: TuningSchedule, paths: dict[str, Path]) -> list[str]:
    base = list(WORKER)
    p = plan.protocol
    cmd = [
        *base,
        "--config",
        str(paths["recipe"]),
        "--output",
        str(paths["worker"]),
        "--data-mode",
        p.data_mode,
        "--warmup",
        str(p.warmup),
        "--steps",
        str(p.steps),
        "--windows",
        str(p.windows),
    ]
    if plan.require_gpu_name and not plan.allow_other_gpu:
        cmd += ["--require-gpu-name", plan.require_gpu_name]
    return cmd


def _measure(plan: TuningSchedule, paths: dict[str, Path], timeout: float) -> dict[str, Any]:
    """Run the worker with a timeout; translate its outcome into result fields."""
    with contextlib.suppress(FileNotFoundError):
        paths["worker"].unlink()  # a stale output must not pass for this run's
    cmd = candidate_command(plan, paths)
    started = time.monotonic()
    returncode, timed_out = run_process_group(cmd, paths["log"], timeout)
    wall = time.monotonic() - started
    fields: dict[str, Any] = {"wall_seconds": round(wall, 3), "timeout_seconds": round(timeout, 3)}
    if timed_out:
        return {**fields, "status": "timeout", "error": f"killed after the {timeout:.0f} s candidate timeout"}
    if paths["worker"].is_file():
        worker = read_json(paths["worker"])
        summary = {k: worker.get(k) for k in WORKER_SUMMARY_KEYS}
        rates = [m["tokens_per_second"] for m in worker.get("measurements") or []]
        noise = {
            "window_tokens_per_second": rates or None,
            "noise_tokens_per_second": window_noise(rates) if rates else None,
        }
        return {**fields, **summary, **noise, "status": worker["status"], "error": worker.get("error")}
    tail = _log_tail(paths["log"])
    if returncode == 2:
        # A user error (bad config, missing cache, wrong hardware) would hit every candidate: stop here.
        raise TinyLLMError(f"benchmark worker refused candidate: {tail} (log {paths['log']})")
    return {**fields, "status": "failed", "error": f"worker exited with code {returncode}: {tail}"}


def _log_tail(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except FileNotFoundError:
        return "no output"
    if not lines:
        return "no output"
    line = lines[-1]
    return line[len("error: ") :] if line.startswith("error: ") else line


def run_process_group(cmd: list[str], log_path: Path, timeout: float) -> tuple[int, bool]:
    """Run ``cmd`` in a new session; on timeout or on our own interruption kill its whole group."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log, _terminate_raises():
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            return proc.returncode, True
        except BaseException:
            kill_group(proc)
            raise


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            if sig == signal.SIGTERM:
                # The leader exited; children it started may linger in the group.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """Turn SIGTERM (scancel, Snakemake stopping) into KeyboardInterrupt so the worker group is killed."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _finish(plan: TuningSchedule, results_dir: str | Path, paths: dict[str, Path], record: dict[str, Any]):
    atomic_write_json(paths["result"], record)
    write_progress(plan, results_dir)
    return record


# ----------------------------------------------------------------------------- progress and summary


def collect_results(plan: TuningSchedule, results_dir: str | Path) -> list[dict[str, Any]]:
    """Results that exist so far, in plan order."""
    out = []
    for slot in plan.slots:
        path = candidate_paths(results_dir, slot.name)["result"]
        if path.is_file():
            out.append(read_json_mapping(path, REBUILD_CANDIDATE))
    return out


def _compact(result: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "name",
        "stage",
        "stage_name",
        "parent",
        "status",
        "tokens_per_second",
        "noise_tokens_per_second",
        "mfu",
        "peak_memory_bytes",
        "wall_seconds",
        "reused_from",
        "error",
        "settings",
    )
    return {k: result.get(k) for k in keys}


def write_progress(plan: TuningSchedule, results_dir: str | Path) -> dict[str, Any]:
    results = collect_results(plan, results_dir)
    used = budget_used(results)
    ranked = rank_results(results)
    progress = {
        "profile": plan.profile,
        "done": len(results),
        "total": len(plan.slots),
        "budget_seconds": plan.budget_seconds,
        "budget_used_seconds": round(used, 3),
        "budget_left_seconds": round(max(plan.budget_seconds - used, 0.0), 3),
        "best": ranked[0]["name"] if ranked else None,
        "candidates": [_compact(r) for r in results],
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(Path(results_dir) / "progress.json", progress)
    return progress


def summarize(plan: TuningSchedule, results_dir: str | Path) -> dict[str, Any]:
    """summary.json content: {selected, candidates, budget_minutes, budget_exhausted, ...}."""
    results = collect_results(plan, results_dir)
    missing = [s.name for s in plan.slots if s.name not in {r["name"] for r in results}]
    if missing:
        raise RunStateError(f"tuning of profile {plan.profile} is incomplete: {', '.join(missing)} not run")
    ranked, decisions = rank_with_decisions(results)
    best = ranked[0] if ranked else None
    fastest = max(ranked, key=lambda r: float(r["tokens_per_second"]), default=None)
    return {
        "profile": plan.profile,
        "selected": None if best is None else _compact(best),
        "selection": {
            "rule": NOISE_RULE,
            "fastest_measured": None if fastest is None else fastest["name"],
            "decisions": decisions,
        },
        "candidates": [_compact(r) for r in results],
        "budget_minutes": plan.budget_seconds / 60.0,
        "budget_used_seconds": round(budget_used(results), 3),
        "budget_exhausted": any(r["status"] == "skipped_budget" for r in results),
        "protocol": {
            "warmup": plan.protocol.warmup,
            "steps": plan.protocol.steps,
            "windows": plan.protocol.windows,
            "data_mode": plan.protocol.data_mode,
        },
    }


def select(
    plan: TuningSchedule, results_dir: str | Path, output_dir: str | Path | None = None
) -> dict[str, Any]:
    """Write summary.json, progress.json and selected.yaml (the recipe of the best successful candidate under
    the noise rule: the fastest, unless it beat an earlier one only within its window noise)."""
    out = Path(output_dir or results_dir)
    summary = summarize(plan, results_dir)
    atomic_write_json(out / "summary.json", summary)
    write_progress(plan, results_dir)
    if summary["selected"] is None:
        raise RunStateError(
            f"no tuning candidate of profile {plan.profile} succeeded; see {out / 'summary.json'} "
            "and the logs in candidates/"
        )
    best_name = summary["selected"]["name"]
    best = read_json_mapping(candidate_paths(results_dir, best_name)["result"], REBUILD_CANDIDATE)
    fastest = summary["selection"]["fastest_measured"]
    kept = "" if fastest == best_name else f"; {fastest} measured faster, within its window noise"
    header = (
        f"# Tuning profile {plan.profile}: selected candidate {best_name} "
        f"({best['tokens_per_second']:.1f} tokens/s, window noise "
        f"{float(best.get('noise_tokens_per_second') or 0.0):.1f}){kept} (summary.json: selection)\n"
    )
    write_recorded_yaml(out / "selected.yaml", best["recipe"], "tune select", comment=header)
    return summary


def run_slots(
    plan: TuningSchedule, results_dir: str | Path, on_result: Callable[[dict[str, Any]], None] | None = None
) -> None:
    """Run every slot without a result yet, in plan order; ``on_result`` sees each new result."""
    for slot in plan.slots:
        if candidate_paths(results_dir, slot.name)["result"].is_file():
            continue  # finished by an earlier, interrupted invocation
        result = run_candidate(plan, slot.name, results_dir)
        if on_result is not None:
            on_result(result)


# How plot_summary draws each kind of candidate; a candidate that measured nothing gets a marker at zero.
CANDIDATE_KINDS: dict[str, dict[str, Any]] = {
    "selected": {"bar": "tab:green"},
    "measured": {"bar": "tab:blue"},
    "reused (= earlier candidate)": {"bar": "tab:blue", "hatch": "//"},
    "skipped (budget)": {"marker": "x", "color": "0.45"},
    "skipped (no parent)": {"marker": "o", "color": "0.45"},
    "skipped (not applicable)": {"marker": "s", "color": "0.45"},
    "failed": {"marker": "X", "color": "tab:red"},
    "timed out": {"marker": "v", "color": "tab:red"},
}
_STATUS_KINDS = {
    "skipped_budget": "skipped (budget)",
    "skipped": "skipped (no parent)",
    "timeout": "timed out",
}


def candidate_kinds(candidate: dict[str, Any], selected: str | None) -> list[str]:
    """The CANDIDATE_KINDS a candidate shows as: its bar or zero marker, plus the reuse hatch."""
    if candidate["status"] == "skipped" and candidate.get("parent"):  # a parent its variant cannot apply to
        kinds = ["skipped (not applicable)"]
    elif candidate["status"] != "ok":
        kinds = [_STATUS_KINDS.get(candidate["status"], "failed")]
    else:
        kinds = ["selected" if candidate["name"] == selected else "measured"]
    if candidate.get("reused_from"):
        kinds.append("reused (= earlier candidate)")
    return kinds


def draw_summary(summary: dict[str, Any]) -> Any:
    """The tuning figure: candidate throughput per stage, with a legend of the kinds of candidate shown."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.artist import Artist
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    from tiny_llm.plotting import compact_axis

    candidates = summary["candidates"]
    stages = sorted({c["stage"] for c in candidates})
    fig, axes = plt.subplots(
        1,
        len(stages),
        figsize=(3.2 * len(stages) + 1, 4.6),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    selected = (summary.get("selected") or {}).get("name")
    shown: set[str] = set()
    for ax, stage in zip(axes[0], stages, strict=True):
        rows = [c for c in candidates if c["stage"] == stage]
        for x, c in enumerate(rows):
            kinds = candidate_kinds(c, selected)
            shown.update(kinds)
            style = CANDIDATE_KINDS[kinds[0]]
            reused = len(kinds) > 1
            if "bar" in style:
                ax.bar(x, c["tokens_per_second"] or 0.0, color=style["bar"], hatch="//" if reused else None)
            else:
                ax.plot(
                    x, 0, linestyle="none", marker=style["marker"], color=style["color"], ms=9, clip_on=False
                )
            note = kinds[0] if "marker" in style else f"= {c['reused_from']}" if reused else ""
            if note:
                ax.annotate(
                    note,
                    (x, 0),
                    xytext=(0, 8),
                    textcoords="offset points",
                    rotation=90,
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    bbox={
                        "boxstyle": "round,pad=0.2",
                        "facecolor": "white",
                        "edgecolor": "none",
                        "alpha": 0.85,
                    },
                )
        ax.set_xticks(range(len(rows)), [c["name"].split("-", 1)[1] for c in rows], rotation=60, ha="right")
        ax.set_title(f"stage {stage}: {rows[0]['stage_name']}")
        ax.set_xlim(-0.6, len(rows) - 0.4)
        compact_axis(ax.yaxis)
    axes[0][0].set_ylabel("tokens/s (median window)")
    fig.suptitle(f"tuning {summary['profile']} (selected: {selected})")
    handles: list[Artist] = []
    for kind, style in CANDIDATE_KINDS.items():
        if kind not in shown:
            continue
        if "bar" in style:
            hatch = style.get("hatch")
            handles.append(
                Patch(facecolor=style["bar"], hatch=hatch, edgecolor="white" if hatch else None, label=kind)
            )
        else:
            handles.append(
                Line2D([], [], linestyle="none", marker=style["marker"], color=style["color"], label=kind)
            )
    fig.legend(
        handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=8, frameon=False
    )
    return fig


def plot_summary(summary: dict[str, Any], path: str | Path) -> None:
    """Write draw_summary's figure to ``path`` (PNG)."""
    from tiny_llm.plotting import save_png

    save_png(draw_summary(summary), path, dpi=100)
