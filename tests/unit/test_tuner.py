"""Staged tuner with a fake worker: ranks, reuse, timeouts, budget, selection, the CUDA graph stage."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from pipeline_helpers import plan_of, shipped

from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError, RunStateError, TinyLLMError
from tiny_llm.recorded import without_record
from tiny_llm.tuning import tuner
from tiny_llm.tuning.candidates import (
    apply_overrides,
    make_plan,
    make_slots,
    plan_from_dict,
    profile_from_dict,
    rank_results,
    rank_with_decisions,
    stage_specs,
    window_noise,
)

# Throughput = micro x (3 if compiled) x attention factor x thread factor, or {"rates": {label: tps}} (label
# m8-compile, plus -max-autotune for a compile mode other than default and -graph for runtime.cuda_graph);
# three windows around it, {"spread": fraction} apart end to end; behaviour knobs come from FAKE_WORKER
# (JSON): {"hang": [labels], "sleep": s, "fail": [labels], "exit2": bool}.
FAKE_WORKER = textwrap.dedent(
    """
    import argparse, json, os, subprocess, sys, time
    import yaml
    p = argparse.ArgumentParser()
    for a in ("config", "output", "data-mode", "warmup", "steps", "windows", "require-gpu-name"):
        p.add_argument("--" + a)
    args = p.parse_args()
    knobs = json.loads(os.environ.get("FAKE_WORKER", "{}"))
    r = yaml.safe_load(open(args.config))
    micro, comp = r["training"]["micro_batch_size"], r["runtime"]["compile"]
    label = f"m{micro}-{'compile' if comp else 'eager'}"
    mode, graph = r["runtime"]["compile_mode"], r["runtime"]["cuda_graph"]
    label += ("" if mode == "default" else f"-{mode}") + ("-graph" if graph else "")
    with open(knobs["calls"], "a") as f:
        f.write(json.dumps({"label": label, "sdpa": r["runtime"]["sdpa_backend"],
                            "threads": r["runtime"]["cpu_threads"], "cuda_graph": graph}) + "\\n")
    if knobs.get("exit2"):
        print("error: tuning profile gh200 expects a GH200 GPU", file=sys.stderr)
        sys.exit(2)
    if label in knobs.get("hang", []):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open(knobs["child_pid"], "w").write(str(child.pid))
        if "FAKE_HANGING_FD" in os.environ:
            os.write(int(os.environ["FAKE_HANGING_FD"]), b"hanging")
        time.sleep(120)
    time.sleep(knobs.get("sleep", 0))
    tps = micro * (3 if comp else 1)
    tps *= {"flash": 1.5, "cudnn": 1.2}.get(r["runtime"]["sdpa_backend"], 1.0)
    tps *= {1: 0.5, 4: 1.01}.get(r["runtime"]["cpu_threads"], 1.0)
    tps = knobs.get("rates", {}).get(label, tps)
    spread = knobs.get("spread", 0.0)  # the windows' tokens/s: the median one, then -/+ spread/2 of it
    windows = [{"tokens_per_second": tps * f} for f in (1 - spread / 2, 1.0, 1 + spread / 2)]
    status = "failed" if label in knobs.get("fail", []) else "ok"
    json.dump({"status": status, "tokens_per_second": tps if status == "ok" else None,
               "measurements": windows if status == "ok" else None,
               "error": None if status == "ok" else "boom"}, open(args.output, "w"))
    """
)


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)

    def configure(**knobs):
        knobs = {"calls": str(tmp_path / "calls.jsonl"), "child_pid": str(tmp_path / "child.pid"), **knobs}
        monkeypatch.setenv("FAKE_WORKER", json.dumps(knobs))
        monkeypatch.setattr(tuner, "WORKER", [sys.executable, str(script)])

    return configure


def run_all(plan, results_dir: Path) -> dict:
    """The whole tuning in one process, as `tune run` does it: every slot in turn, then the selection."""
    tuner.run_slots(plan, results_dir)
    return tuner.select(plan, results_dir)


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def gone(pid: int, within: float = 60.0) -> bool:
    """Whether ``pid`` ends within ``within`` seconds: waits on its pidfd, which becomes readable when the
    process terminates (a SIGKILL to its group is delivered asynchronously)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], within)
    finally:
        os.close(fd)
    return bool(readable) or not alive(pid)


def alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (an orphan whose reaper has not run yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


def gpu_profile(**extra):
    data = {
        "configs": ["tiny"],
        "overrides": {"training": {"batch_tokens": 2048}},  # 32 sequences of 64
        "space": "gpu",
        "stage1": [[8, False], [8, True], [16, True], [4, False]],
        "threads": [1, 4, 8],
        **extra,
    }
    return profile_from_dict("fakegpu", data)


def test_reference_stage1_runs_compiled_first_and_skips_micro_above_batch():
    profile = profile_from_dict("g", {"configs": ["tiny"], "space": "gpu"})  # tiny: 16 sequences per update
    names = [s.name for s in make_slots(profile, load_recipe(["tiny"]))]
    assert names[:6] == [  # the reference's order within each group, compiled settings first
        "s1-m8-compile",
        "s1-m16-compile",
        "s1-m4-compile",
        "s1-m8-eager",
        "s1-m4-eager",
        "s1-m16-eager",
    ]
    assert not any("m32" in n for n in names)
    assert names[6:] == [  # no threads stage on a GPU; the CUDA graph last, for the best
        "s2-r0-flash",
        "s2-r0-cudnn",
        "s2-r1-flash",
        "s2-r1-cudnn",
        "s3-r0-reduce-overhead",
        "s3-r0-max-autotune",
        "s4-r0-cuda-graph",
    ]


@pytest.mark.parametrize("space", ["gpu", "cpu"])
def test_stage_lists_per_space(space):
    """Compiled first in stage 1 in both spaces (a given list keeps its order within each group); the threads
    stage only in the cpu space, even when a GPU profile names thread counts."""
    stage1 = [[16, False], [32, False], [8, False], [16, True], [8, True]]
    profile = profile_from_dict(
        "p", {"configs": ["tiny"], "space": space, "stage1": stage1, "threads": [1, 2]}
    )
    specs = stage_specs(profile, batch_sequences=32)
    labels = [v.label for v in specs[0].variants]
    assert labels == ["m16-compile", "m8-compile", "m16-eager", "m32-eager", "m8-eager"]
    names = [spec.name for spec in specs]
    if space == "gpu":
        assert names == ["micro_compile", "attention", "compile_mode", "cuda_graph"]
        assert specs[3].top_k == 1 and [v.overrides for v in specs[3].variants] == [
            {"runtime.cuda_graph": True}
        ]
    else:
        assert names == ["micro_compile", "attention", "precision", "threads"]
        assert [v.overrides for v in specs[3].variants] == [{"runtime.cpu_threads": n} for n in (1, 2)]


def test_stage1_measures_the_20m_production_setting_at_its_batch():
    """20m trains at 131,072 tokens with micro 128 (the reference's setting): stage 1 must measure it there;
    at 32,768 tokens (50m, 90m) micro batches above 32 sequences are skipped."""
    profile = profile_from_dict("g", {"configs": ["20m"], "space": "gpu"})
    names = [s.name for s in make_slots(profile, load_recipe(["20m"])) if s.stage == 1]
    assert names[4:6] == ["s1-m64-compile", "s1-m128-compile"] and len(names) == 10
    assert all(n.endswith("-compile") for n in names[:6]) and all(n.endswith("-eager") for n in names[6:])
    small = [s.name for s in make_slots(profile, load_recipe(["50m"])) if s.stage == 1]
    assert small[3] == "s1-m32-compile" and small[-1] == "s1-m32-eager" and len(small) == 8


def test_cpu_space_varies_attention_precision_threads():
    profile = profile_from_dict(
        "c", {"configs": ["tiny"], "space": "cpu", "stage1": [[4, False]], "threads": [1, 2]}
    )
    slots = make_slots(profile, load_recipe(["tiny"]))
    assert [s.name for s in slots] == [
        "s1-m4-eager",
        "s2-r0-math",
        "s2-r0-reference",
        "s2-r1-math",
        "s2-r1-reference",
        "s3-r0-bf16",
        "s3-r0-fp32",
        "s4-r0-t1",
        "s4-r0-t2",
    ]
    assert slots[2].overrides == {"runtime.attention_backend": "reference"}
    assert slots[5].overrides == {"runtime.cpu_amp": True}


def test_stages_follow_ranks_reuse_and_selection(tmp_path: Path, fake):
    fake()
    plan = make_plan(gpu_profile())
    summary = run_all(plan, tmp_path / "out")
    results = {r["name"]: r for r in tuner.collect_results(plan, tmp_path / "out")}
    # stage 1: m16-compile (48) > m8-compile (24) > m8-eager (8) > m4-eager (4)
    assert results["s2-r0-flash"]["parent"] == "s1-m16-compile"
    assert results["s2-r1-cudnn"]["parent"] == "s1-m8-compile"
    assert results["s2-r0-flash"]["tokens_per_second"] == pytest.approx(72.0)
    assert results["s3-r0-max-autotune"]["parent"] == "s2-r0-flash"
    # compile modes do not change the fake's speed: the flash candidate stays best (no threads stage)
    assert summary["selected"]["name"] == "s2-r0-flash"
    # the tiny preset's CPU device and unfused optimizer cannot take the CUDA graph: skipped, nothing measured
    graph = results["s4-r0-cuda-graph"]
    assert graph["status"] == "skipped" and graph["parent"] == "s2-r0-flash" and graph["identity"] is None
    assert graph["error"] == (
        "not applicable to s2-r0-flash: invalid recipe: runtime.cuda_graph: needs a CUDA device "
        "(runtime.device is cpu); set it false"
    )
    assert summary["budget_exhausted"] is False
    selected = load_recipe([str(tmp_path / "out" / "selected.yaml")])
    assert selected.training.micro_batch_size == 16 and selected.runtime.compile is True
    assert selected.runtime.sdpa_backend == "flash" and selected.runtime.cpu_threads is None
    assert summary["selected"]["settings"]["runtime.sdpa_backend"] == "flash"
    progress = json.loads((tmp_path / "out" / "progress.json").read_text())
    assert progress["done"] == progress["total"] == len(plan.slots)
    assert len(calls(tmp_path)) == len(plan.slots) - 1  # all but the CUDA graph


def test_identical_candidate_is_reused_not_rerun(tmp_path: Path, fake):
    fake()
    overrides = {"training": {"batch_tokens": 2048}, "runtime": {"cpu_threads": 8}}
    plan = make_plan(gpu_profile(space="cpu", overrides=overrides, cpu_amp_variants=[True]))
    run_all(plan, tmp_path / "out")
    t8 = json.loads((tmp_path / "out" / "candidates" / "s4-r0-t8.json").read_text())
    # the fake's speed ignores math/reference attention and BF16: stage 1's best stays best
    assert t8["reused_from"] == "s1-m16-compile" and t8["wall_seconds"] == 0.0
    assert t8["tokens_per_second"] == pytest.approx(48.0)
    assert len(calls(tmp_path)) == len(plan.slots) - 1
    assert [r["name"] for r in rank_results(tuner.collect_results(plan, tmp_path / "out"))].count(
        "s4-r0-t8"
    ) == 0


def timeouts_count_from_the_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner's wait on a worker starts once the worker says it hangs (its child started, its pid
    written) or has exited: a slow start on a busy machine cannot use up the candidate timeout."""

    class Popen(subprocess.Popen):
        def __init__(self, *args, **kwargs) -> None:
            self.hanging, write = os.pipe()
            env = {**os.environ, "FAKE_HANGING_FD": str(write)}
            super().__init__(*args, **kwargs, env=env, pass_fds=(write,))
            os.close(write)

        def wait(self, timeout: float | None = None) -> int:
            if self.hanging is not None:
                os.read(self.hanging, 7)  # b"hanging", or b"" when the worker ended without
                os.close(self.hanging)
                self.hanging = None
            return super().wait(timeout)

    monkeypatch.setattr(tuner, "subprocess", SimpleNamespace(**{**vars(subprocess), "Popen": Popen}))


def test_hanging_candidate_killed_with_its_group_and_tuner_goes_on(tmp_path: Path, fake, monkeypatch):
    profile = gpu_profile(stage1=[[16, True], [8, False], [4, False]], candidate_timeout_seconds=2.0)
    fake(hang=["m8-eager"])
    timeouts_count_from_the_hang(monkeypatch)
    plan = make_plan(profile)
    assert tuner.run_candidate(plan, "s1-m16-compile", tmp_path / "out")["status"] == "ok"
    tuner.run_candidate(plan, "s1-m8-eager", tmp_path / "out")
    hung = json.loads((tmp_path / "out" / "candidates" / "s1-m8-eager.json").read_text())
    # Killed at its 2 s timeout, long before the 120 s the worker would have hung.
    assert hung["status"] == "timeout" and 2.0 <= hung["wall_seconds"] < 60
    child = int((tmp_path / "child.pid").read_text())
    assert gone(child)  # the worker's own child died with its process group
    result = tuner.run_candidate(plan, "s1-m4-eager", tmp_path / "out")
    assert result["status"] == "ok"


def each_candidate_takes(seconds: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Give the tuner a clock on which every measured candidate takes ``seconds``, however long its worker
    really runs: the budget's arithmetic is then the same on an idle and on a busy machine."""
    clock = [0.0]
    measure = tuner.run_process_group

    def run_process_group(cmd: list[str], log_path: Path, timeout: float) -> tuple[int, bool]:
        outcome = measure(cmd, log_path, timeout)
        clock[0] += seconds
        return outcome

    monkeypatch.setattr(tuner, "run_process_group", run_process_group)
    monkeypatch.setattr(tuner, "time", SimpleNamespace(**{**vars(time), "monotonic": lambda: clock[0]}))


def test_budget_exhaustion_skips_remaining_candidates(tmp_path: Path, fake, monkeypatch):
    # 100 s of budget, 40 s per candidate, none started with less than 30 s left: two measured, then skips
    profile = gpu_profile(budget_minutes=100 / 60, min_start_seconds=30.0, threads=[1])
    fake()
    each_candidate_takes(40.0, monkeypatch)
    plan = make_plan(profile)
    summary = run_all(plan, tmp_path / "out")
    statuses = [c["status"] for c in summary["candidates"]]
    assert statuses[0] == "ok" and "skipped_budget" in statuses
    first_skip = statuses.index("skipped_budget")
    measured = [c["wall_seconds"] for c in summary["candidates"][:first_skip] if "wall_seconds" in c]
    assert measured == [40.0, 40.0]
    assert all(s in ("skipped_budget", "skipped") for s in statuses[first_skip:])
    assert summary["budget_exhausted"] is True
    assert summary["selected"]["name"] in [c["name"] for c in summary["candidates"][:first_skip]]


def test_timeout_is_capped_by_budget_left(tmp_path: Path, fake):
    profile = gpu_profile(budget_minutes=1.5 / 60, min_start_seconds=0.0, stage1=[[8, False]])
    fake(hang=["m8-eager"])
    plan = make_plan(profile)
    result = tuner.run_candidate(plan, "s1-m8-eager", tmp_path / "out")
    assert result["status"] == "timeout" and result["timeout_seconds"] == pytest.approx(1.5)


def test_no_success_fails_clearly_and_user_error_stops(tmp_path: Path, fake):
    profile = gpu_profile(stage1=[[8, False]], threads=[1], compile_modes=[], attention_variants=["flash"])
    fake(fail=["m8-eager", "m8-compile"])
    plan = make_plan(profile)
    with pytest.raises(RunStateError, match="no tuning candidate of profile fakegpu succeeded"):
        run_all(plan, tmp_path / "a")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["selected"] is None
    assert {c["status"] for c in summary["candidates"]} == {"failed", "skipped"}
    fake(exit2=True)
    plan = make_plan(profile)
    with pytest.raises(TinyLLMError, match="expects a GH200 GPU"):
        tuner.run_candidate(plan, "s1-m8-eager", tmp_path / "b")


def test_later_slot_needs_earlier_results(tmp_path: Path, fake):
    fake()
    plan = make_plan(gpu_profile())
    with pytest.raises(RunStateError, match="s1-m8-compile"):
        tuner.run_candidate(plan, "s2-r0-flash", tmp_path / "out")


def test_throughput_plot_has_a_legend_for_each_kind_of_candidate():
    import matplotlib.pyplot as plt

    def candidate(name, stage, status, rate=None, reused=None):
        return {
            "name": name,
            "stage": stage,
            "stage_name": f"stage {stage}",
            "status": status,
            "tokens_per_second": rate,
            "reused_from": reused,
        }

    candidates = [
        candidate("s1-a", 1, "ok", 45_000.0),
        candidate("s1-b", 1, "ok", 61_000.0),
        candidate("s2-a", 2, "ok", 61_000.0, reused="s1-b"),
        candidate("s2-b", 2, "skipped_budget"),
    ]
    summary = {"profile": "demo", "candidates": candidates, "selected": {"name": "s1-b"}}
    assert tuner.candidate_kinds(candidates[2], "s1-b") == ["measured", "reused (= earlier candidate)"]
    fig = tuner.draw_summary(summary)
    try:
        (legend,) = fig.legends
        assert [t.get_text() for t in legend.get_texts()] == [
            "selected",
            "measured",
            "reused (= earlier candidate)",
            "skipped (budget)",
        ]
        fig.canvas.draw()
        assert [t.get_text() for t in fig.axes[0].get_yticklabels() if t.get_text()][:2] == ["0", "20k"]
    finally:
        plt.close(fig)
    candidates.append(candidate("s2-c", 2, "timeout"))
    fig = tuner.draw_summary(summary)
    assert "timed out" in [t.get_text() for t in fig.legends[0].get_texts()]
    plt.close(fig)


def test_tune_run_command_runs_the_library_loop_and_resumes(tmp_path: Path, fake, capsys):
    from tiny_llm.cli import main
    from tiny_llm.tuning import candidates

    fake()
    profile = json.dumps({"configs": ["tiny"], "space": "cpu", "stage1": [[4, False]], "threads": [1]})
    argv = ["tune", "run", "--name", "c", "--profile", profile, "--results-dir", str(tmp_path / "out")]
    assert main(argv) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    plan = candidates.plan_from_dict(without_record(json.loads((tmp_path / "out" / "plan.json").read_text())))
    assert [x["name"] for x in lines[:-1]] == [s.name for s in plan.slots]
    assert lines[-1] == {
        "selected": tuner.summarize(plan, tmp_path / "out")["selected"]["name"],
        "budget_exhausted": False,
    }
    measured = len(calls(tmp_path))
    assert main(argv) == 0  # every slot has its result: nothing is measured again
    assert len(calls(tmp_path)) == measured
    assert [json.loads(x) for x in capsys.readouterr().out.splitlines()] == lines[-1:]


def test_tune_plan_takes_a_profile_of_overrides(tmp_path: Path) -> None:
    from tiny_llm.cli import main

    base = {"configs": ["tiny"], "space": "cpu", "stage1": [[4, False]], "threads": [1]}
    overrides = {"training": {"batch_tokens": 2048, "micro_batch_size": 8}, "optimizer": {"lr": 1e-05}}
    output = tmp_path / "plan.json"
    argv = ["tune", "plan", "--name", "c", "--profile", json.dumps({**base, "overrides": overrides})]
    assert main([*argv, "--output", str(output)]) == 0
    recipe = json.loads(output.read_text())["base_recipe"]
    assert recipe["training"]["batch_tokens"] == 2048 and recipe["optimizer"]["lr"] == 1e-05
    with pytest.raises(ConfigError, match=r"tuning.profiles.c.sets: unknown key"):
        profile_from_dict("c", {**base, "sets": ["optimizer.lr=0.003"]})
    with pytest.raises(ConfigError, match=r"tuning.profiles.c.overrides: expected a mapping"):
        profile_from_dict("c", {**base, "overrides": ["training.batch_tokens=2048"]})


def test_a_plan_file_holds_no_command_and_one_given_is_refused(tmp_path: Path) -> None:
    """Whoever can write plan.json must not choose what the tuner runs: the file holds settings only, and a
    key the schedule lacks (a command, or anything another version wrote) is refused in one line."""
    plan = make_plan(gpu_profile())
    command = tuner.candidate_command(plan, {"recipe": tmp_path / "r", "worker": tmp_path / "w"})
    assert command[:4] == [sys.executable, "-m", "tiny_llm", "benchmark-worker"]
    assert plan_from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    planted = {**plan.to_dict(), "command": ["sh", "-c", f"touch {tmp_path / 'PWNED'}"]}
    refusal = r"^tuning plan: unknown key 'command'; a plan written by another version\? delete it"
    with pytest.raises(ConfigError, match=refusal):
        plan_from_dict(planted)
    with pytest.raises(ConfigError, match=r"'s9-r0-none' is not in the plan of profile .*; a plan written"):
        plan.slot("s9-r0-none")


def measured(name: str, rate: float, windows: list[float] | None = None, identity: str | None = None) -> dict:
    return {
        "name": name,
        "status": "ok",
        "identity": identity or name,
        "tokens_per_second": rate,
        "noise_tokens_per_second": window_noise(windows),
    }


def test_a_candidate_wins_only_by_more_than_its_window_noise():
    baseline = measured("s1-m8-compile", 1000.0, [990.0, 1000.0, 1010.0])
    # 0.5% faster, but its windows spread over 1%: the baseline (earlier) keeps first place
    within = measured("s1-m8-eager", 1005.0, [1000.0, 1005.0, 1010.0])
    ranked, decisions = rank_with_decisions([baseline, within])
    assert [r["name"] for r in ranked] == ["s1-m8-compile", "s1-m8-eager"]
    assert decisions[1]["kept_above"] == "s1-m8-compile" and decisions[1]["rank_when_measured"] == 1
    assert decisions[1]["margin_tokens_per_second"] == pytest.approx(5.0)
    assert decisions[1]["noise_tokens_per_second"] == pytest.approx(10.0)
    assert decisions[1]["decision"].startswith("kept below s1-m8-compile: faster by 5 tokens/s, within")
    # 5% faster with the same spread wins, and is placed above the one it beats
    clear = measured("s1-m16-compile", 1050.0, [1045.0, 1050.0, 1055.0])
    ranked, decisions = rank_with_decisions([baseline, within, clear])
    assert [r["name"] for r in ranked] == ["s1-m16-compile", "s1-m8-compile", "s1-m8-eager"]
    assert decisions[2]["beat"] == "s1-m8-compile" and decisions[2]["kept_above"] is None
    assert decisions[2]["decision"].startswith("ranks first: faster than s1-m8-compile by 50 tokens/s")
    # a tight candidate beats the baseline by less than 1% (more than its own small noise)
    tight = measured("s1-m4-compile", 1004.0, [1003.5, 1004.0, 1004.2])
    assert [r["name"] for r in rank_results([baseline, within, tight])] == [
        "s1-m4-compile",
        "s1-m8-compile",
        "s1-m8-eager",
    ]
    # without window data (one window, older results): fastest first, ties keep run order
    assert window_noise([1000.0]) == window_noise(None) == 0.0
    plain = [measured("a", 1.0), measured("b", 2.0), measured("c", 2.0)]
    assert [r["name"] for r in rank_results(plain)] == ["b", "c", "a"]
    twin = measured("d", 3.0, identity="a")  # an identical candidate counts once
    assert [r["name"] for r in rank_results([*plain, twin])] == ["b", "c", "a"]


@pytest.mark.parametrize(("eager_rate", "selected"), [(1005.0, "s1-m8-compile"), (1100.0, "s1-m8-eager")])
def test_tuning_keeps_the_compiled_baseline_unless_clearly_beaten(tmp_path: Path, fake, eager_rate, selected):
    fake(rates={"m8-compile": 1000.0, "m8-eager": eager_rate}, spread=0.02)
    profile = gpu_profile(
        stage1=[[8, False], [8, True]], attention_variants=[], compile_modes=[], cuda_graph=False
    )
    plan = make_plan(profile)
    assert [s.name for s in plan.slots] == ["s1-m8-compile", "s1-m8-eager"]
    summary = run_all(plan, tmp_path / "out")
    assert summary["selected"]["name"] == selected
    assert summary["selected"]["noise_tokens_per_second"] == pytest.approx(
        0.02 * {"s1-m8-compile": 1000.0, "s1-m8-eager": eager_rate}[selected]
    )
    eager = json.loads((tmp_path / "out" / "candidates" / "s1-m8-eager.json").read_text())
    assert eager["window_tokens_per_second"] == pytest.approx(
        [eager_rate * 0.99, eager_rate, eager_rate * 1.01]
    )
    selection = summary["selection"]
    assert selection["fastest_measured"] == "s1-m8-eager" and "spread" in selection["rule"]
    assert [d["name"] for d in selection["decisions"]] == ["s1-m8-compile", "s1-m8-eager"]
    header = (tmp_path / "out" / "selected.yaml").read_text().splitlines()[1]  # under the writer's record
    assert f"selected candidate {selected}" in header
    assert ("s1-m8-eager measured faster, within its window noise" in header) == (selected == "s1-m8-compile")
    recipe = load_recipe([str(tmp_path / "out" / "selected.yaml")])
    assert recipe.runtime.compile is (selected == "s1-m8-compile")


# ----------------------------------------------------------------------------- the CUDA graph stage


def test_the_gh200_profile_plans_a_cuda_graph_candidate_for_the_best() -> None:
    """The shipped gh200 profile (20m, fused AdamW, compile_mode default) ends with the whole-update CUDA
    graph applied to the best of stages 1-3; on the compiled default setting it is a valid recipe."""
    cluster = plan_of(shipped("config/cluster.yaml")).tuning
    plan = make_plan(profile_from_dict("gh200", cluster.profile_mapping("gh200")))
    graph = plan.slots[-1]
    assert (graph.name, graph.stage, graph.stage_name, graph.parent_rank) == (
        "s4-r0-cuda-graph",
        4,
        "cuda_graph",
        0,
    )
    assert graph.overrides == {"runtime.cuda_graph": True}
    assert [s.name for s in plan.slots if s.stage_name == "cuda_graph"] == ["s4-r0-cuda-graph"]
    assert cluster.slot_names("gh200")[-1] == "s4-r0-cuda-graph"  # and the workflow's DAG has its job
    compiled = apply_overrides(plan.base_recipe, plan.slot("s1-m128-compile").overrides)
    runtime = apply_overrides(compiled, graph.overrides)["runtime"]
    assert (
        runtime["cuda_graph"] is True and runtime["compile"] is True and runtime["compile_mode"] == "default"
    )
    assert runtime["fused_optimizer"] is True and runtime["deterministic"] is False
    off = make_plan(profile_from_dict("g", {**cluster.profile_mapping("gh200"), "cuda_graph": False}))
    assert [s.name for s in off.slots] == [s.name for s in plan.slots[:-1]]
    with pytest.raises(
        ConfigError, match=r"^tuning.profiles.g.cuda_graph: expected true or false, got str 'yes'$"
    ):
        profile_from_dict("g", {"configs": ["20m"], "cuda_graph": "yes"})


def test_a_cpu_profile_has_no_cuda_graph_stage() -> None:
    """A CPU cannot capture a CUDA graph: the demo's profile, and any cpu profile, plan no such slot."""
    demo = plan_of(shipped("workflow_config.yaml")).tuning
    slots = make_plan(profile_from_dict("cpu", demo.profile_mapping("cpu"))).slots
    assert [s.stage_name for s in slots if s.stage > 2][-1] == "precision"  # the demo leaves out threads
    assert not any(s.stage_name == "cuda_graph" or "cuda_graph" in str(s.overrides) for s in slots)
    explicit = profile_from_dict("c", {"configs": ["tiny"], "space": "cpu", "cuda_graph": True})
    assert [spec.name for spec in stage_specs(explicit, 16)] == [
        "micro_compile",
        "attention",
        "precision",
        "threads",
    ]


def graph_profile(**extra):
    """A GPU profile whose recipe can take the CUDA graph (the fake worker measures it on the CPU)."""
    overrides = {"training": {"batch_tokens": 2048}, "runtime": {"device": "cuda", "fused_optimizer": True}}
    return gpu_profile(overrides=overrides, stage1=[[8, True]], attention_variants=[], **extra)


@pytest.mark.parametrize(
    ("graph_rate", "selected"), [(1005.0, "s1-m8-compile"), (1100.0, "s4-r0-cuda-graph")]
)
def test_the_cuda_graph_stays_only_if_clearly_faster_than_its_parent(
    tmp_path: Path, fake, graph_rate: float, selected: str
) -> None:
    fake(rates={"m8-compile": 1000.0, "m8-compile-graph": graph_rate}, spread=0.02)
    plan = make_plan(graph_profile(compile_modes=[]))
    assert [s.name for s in plan.slots] == ["s1-m8-compile", "s4-r0-cuda-graph"]
    summary = run_all(plan, tmp_path / "out")
    assert [c["cuda_graph"] for c in calls(tmp_path)] == [False, True]  # the worker got the graph's recipe
    graph = json.loads((tmp_path / "out" / "candidates" / "s4-r0-cuda-graph.json").read_text())
    assert graph["parent"] == "s1-m8-compile" and graph["status"] == "ok"
    assert graph["recipe"]["runtime"]["cuda_graph"] is True
    assert summary["selected"]["name"] == selected
    assert summary["selection"]["fastest_measured"] == "s4-r0-cuda-graph"
    decision = summary["selection"]["decisions"][1]
    if selected == "s1-m8-compile":  # 0.5% faster, its windows 2% apart: the parent is kept
        assert decision["kept_above"] == "s1-m8-compile" and decision["rank_when_measured"] == 1
        header = (tmp_path / "out" / "selected.yaml").read_text().splitlines()[1]
        assert "s4-r0-cuda-graph measured faster, within its window noise" in header
    else:
        assert decision["beat"] == "s1-m8-compile" and decision["rank_when_measured"] == 0
    recipe = load_recipe([str(tmp_path / "out" / "selected.yaml")])
    assert recipe.runtime.cuda_graph is (selected == "s4-r0-cuda-graph") and recipe.runtime.compile is True


def test_the_cuda_graph_is_skipped_on_a_parent_that_cannot_take_it(tmp_path: Path, fake) -> None:
    """max-autotune makes CUDA graphs of its own: its winner gets no graph candidate and stays selected."""
    fake(rates={"m8-compile": 1000.0, "m8-compile-max-autotune": 1100.0}, spread=0.02)
    plan = make_plan(graph_profile(compile_modes=["max-autotune"]))
    assert [s.name for s in plan.slots] == ["s1-m8-compile", "s3-r0-max-autotune", "s4-r0-cuda-graph"]
    summary = run_all(plan, tmp_path / "out")
    assert [c["label"] for c in calls(tmp_path)] == ["m8-compile", "m8-compile-max-autotune"]
    assert summary["selected"]["name"] == "s3-r0-max-autotune"
    graph = summary["candidates"][-1]
    assert graph["status"] == "skipped" and graph["parent"] == "s3-r0-max-autotune"
    assert graph["error"].startswith(
        "not applicable to s3-r0-max-autotune: invalid recipe: runtime.cuda_graph: compile_mode max-autotune "
        "makes CUDA graphs of its own"
    )
    assert "\n" not in graph["error"] and graph["wall_seconds"] == 0.0
    assert tuner.candidate_kinds(graph, "s3-r0-max-autotune") == ["skipped (not applicable)"]
    import matplotlib.pyplot as plt

    fig = tuner.draw_summary(summary)
    try:
        assert "skipped (not applicable)" in [t.get_text() for t in fig.legends[0].get_texts()]
    finally:
        plt.close(fig)
