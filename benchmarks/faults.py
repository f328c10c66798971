"""Fault injection: a campaign interrupted at random points, rerun after each fault, ends bitwise where an
uninterrupted one does.

    python benchmarks/faults.py --workdir DIR [--seed 1 ...] [--faults 6] [--shape full|short] [--cores 2]
    python benchmarks/faults.py --executor slurm --workdir DIR --shape short --seeds 1 2 3 4 --faults 8

With ``--executor slurm`` every campaign job goes through profiles/slurm (account and partition of the
cluster `sbatch` talks to, e.g. ../shared/slurm-local; as a Slurm operator, e.g. root there) and the faults
are Slurm's (SLURM_KINDS below); each fault also reports its recovery time, from the fault until every run it
hit trains again. A requeued job is released at once instead of after Slurm's ~120-s hold, except after a
node-down fault. ``--kinds ... kill_slurmd`` adds kill -9 of this machine's slurmd (restarted 20 s
later). The uninterrupted reference is kept in DIR/reference-<executor>.json: more seeds later on the same DIR
compare with the same reference.

A demo-like campaign on the CPU in deterministic mode (toy sizes, one stage-1 learning rate absurd enough to
diverge) is run once without faults (the reference) and once per seed with ``--faults`` faults injected at
random times (seeded). After every session a dry run says how many jobs are left; the same ``snakemake``
command is run again until a session exits 0 *and* its dry run has nothing to do (a session that exits 0 with
jobs left is counted: ``exit_0_with_jobs_left``, goal 0). The faults, drawn in turn from a seeded shuffle of
the kinds:

- ``kill_job``: kill -9 of a random running training process;
- ``sigterm_controller`` / ``sigint_controller``: SIGTERM / SIGINT to the Snakemake controller alone;
- ``kill_controller``: kill -9 of the controller (its jobs are orphaned and run on), then
  `snakemake --unlock`;
- ``truncate_latest``: the ``latest.pt`` of a random interrupted run (unfinished, no trainer on it) cut to a
  random length, during a session or between two;
- ``kill_controller_in_local_job``: kill -9 of the controller while one of its local jobs (``campaign plan``,
  ``select``, ``rank``, the report) runs, once the next one starts; the job is left to finish as an orphan,
  then `snakemake --unlock`.

Then every run's final weights (sha256 of final.safetensors), result.json, metrics.jsonl and best.json, every
stage ranking, the report's comparison.json and selected recipes are compared with the reference's: they
must be identical, except the fields that measure time and memory (which no two runs share). Prints one JSON
object: per seed the faults injected (with their recovery times), the reruns needed and the differences found
(goal 0).

The data stage (corpus, tokenizer, token cache) is built once and copied into every campaign directory, so
only the campaign is interrupted. Scratch directories live under --workdir; the repository's results/ are
untouched.

This file holds the campaign and the command line; ``faults_driver`` runs Snakemake and finds the trainers,
``faults_slurm`` controls Slurm, ``faults_inject`` injects the faults and ``faults_fingerprint`` compares.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its modules, also when a test loads this file

from faults_driver import kill_leftovers, run_snakemake  # noqa: E402
from faults_fingerprint import differences, fingerprint  # noqa: E402
from faults_inject import KINDS, Fault, recovery_seconds, run_with_faults  # noqa: E402
from faults_slurm import SLURM_KINDS, SLURMD_KIND, cancel_slurm_jobs, slurm_profile  # noqa: E402
from report_out import emit  # noqa: E402
from snakemake_driver import claim_workdir  # noqa: E402

from tiny_llm.io import read_json  # noqa: E402

__all__ = ["KINDS", "SLURM_KINDS", "Fault", "claim_workdir", "recovery_seconds", "run", "run_snakemake"]

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


# ----------------------------------------------------------------------------- the benchmark


def prepare_base(workdir: Path, shape: str, cores: int) -> Path:
    """The data stage (corpus, tokenizer, token cache) once, copied into every campaign directory."""
    base = workdir / "base"
    if not (base / "results/data/cache/manifest.json").is_file():
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        (base / "config.yaml").write_text(yaml.safe_dump(campaign_config(shape), sort_keys=False))
        if run_snakemake(base, ["--cores", str(cores)], "data", log="data.log"):
            sys.exit(f"data stage failed; see {base / 'data.log'}")
    return base


def fresh_copy(base: Path, dest: Path) -> Path:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest, symlinks=True)
    return dest


def reference(workdir: Path, base: Path, launch: list[str]) -> tuple[dict[str, Any], float]:
    """The uninterrupted campaign's fingerprint and length; kept in reference.json and reused (a later
    invocation on the same --workdir, e.g. more seeds, compares with the same reference)."""
    saved = workdir / f"reference-{'slurm' if '--workflow-profile' in launch else 'local'}.json"
    if saved.is_file():
        kept = read_json(saved)
        return kept["fingerprint"], kept["seconds"]
    ref = fresh_copy(base, workdir / "reference")
    started = time.monotonic()
    if run_snakemake(ref, launch, "campaign", log="controller.log"):
        sys.exit(f"the uninterrupted campaign failed; see {ref / 'controller.log'}")
    seconds = time.monotonic() - started
    saved.write_text(json.dumps({"fingerprint": fingerprint(ref), "seconds": seconds}))
    return fingerprint(ref), seconds


def run(
    workdir: Path,
    seeds: list[int],
    num_faults: int,
    shape: str = "full",
    cores: int = 2,
    kinds: list[str] | None = None,
    executor: str = "local",
) -> dict[str, Any]:
    """``executor`` "slurm": every Snakemake job through profiles/slurm on the cluster `sbatch` talks to
    (the data stage stays local), with the Slurm fault kinds by default."""
    workdir = claim_workdir(workdir)  # reused: its data stage and reference are kept
    base = prepare_base(workdir, shape, cores)
    slurm = executor == "slurm"
    launch = ["--workflow-profile", str(slurm_profile(workdir))] if slurm else ["--cores", str(cores)]
    all_kinds = SLURM_KINDS if slurm else KINDS
    drawn = dict.fromkeys([*all_kinds, *(kinds or [])])
    expected, ref_seconds = reference(workdir, base, launch)
    # every fault falls well inside the uninterrupted campaign's length (the clock stops between sessions,
    # while the orphans of a killed controller may still finish work)
    span = (0.1 * ref_seconds, 0.7 * ref_seconds)
    results = []
    for seed in seeds:
        target = fresh_copy(base, workdir / f"faults-seed{seed}")
        try:
            record = run_with_faults(target, seed, num_faults, span, launch, list(kinds or all_kinds))
        finally:
            if slurm:
                cancel_slurm_jobs(target)
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
                "faults_by_kind": {k: sum(f.kind == k for f in record.faults) for k in drawn},
                "faults": [
                    {**asdict(f), "recovery_seconds": recovery_seconds(target, f)} for f in record.faults
                ],
                "sessions": [asdict(x) for x in record.sessions],
                "exit_0_with_jobs_left": sum(
                    1 for x in record.sessions if x.returncode == 0 and x.jobs_left != 0
                ),
                "damaged_states_set_aside": corrupt,
                "runs_compared": sum(key.endswith("/final.safetensors") for key in expected),
                "differences": diff,
            }
        )
    return {
        "shape": shape,
        "executor": executor,
        "cores": cores,
        "reference_seconds": round(ref_seconds, 1),
        "fault_span_seconds": [round(s, 1) for s in span],
        "seeds": results,
        "total_faults": sum(r["faults_injected"] for r in results),
        "total_reruns": sum(r["reruns"] for r in results),
        "total_differences": sum(len(r["differences"]) for r in results),
        "total_exit_0_with_jobs_left": sum(r["exit_0_with_jobs_left"] for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workdir",
        type=Path,
        required=True,
        help="scratch directory, new or one of an earlier run (reused for the data)",
    )
    parser.add_argument(
        "--seed", type=int, action="append", help="seed of the faults (repeatable; default 1)"
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[], help="several seeds at once")
    parser.add_argument("--faults", type=int, default=6, help="faults per seed")
    parser.add_argument("--shape", choices=("full", "short"), default="full")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--executor", choices=("local", "slurm"), default="local")
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=sorted({*KINDS, *SLURM_KINDS, SLURMD_KIND}),
        help="fault kinds to draw from (default: all of the executor's)",
    )
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    seeds = [*(args.seed or []), *args.seeds] or [1]
    report = run(
        args.workdir, seeds, args.faults, args.shape, args.cores, kinds=args.kinds, executor=args.executor
    )
    emit(report, args.output)
    return 0 if report["total_differences"] == 0 and report["total_exit_0_with_jobs_left"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
