"""Do tuning candidates measure the same throughput inside the busy demo as alone? Prints JSON.

    python benchmarks/tuning_isolation.py --workdir /tmp/tuning-iso

1. The embedded demo's default target from scratch (`snakemake --cores 2`): tuning candidates are scheduled
   among the training jobs of the same run, but each takes every core, so nothing runs beside it.
2. The same candidates again, alone (`--forcerun bench_candidate results/cpu-tuning/selected.yaml`).

For every slot measured both times: tokens/s of each pass and their ratio; the goal is every ratio within 15%.
The workdir keeps both passes' candidate files (`pass1/`, `pass2/`) for inspection; `--compare-only` compares
them again without running anything.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from snakemake_driver import REPO, claim_workdir, snakemake_command

from tiny_llm.io import read_json

CANDIDATES = Path("results/cpu-tuning/candidates")


def snakemake(workdir: Path, *args: str) -> float:
    cmd = snakemake_command(workdir, "--cores", "2", *args, configfile=REPO / "workflow_config.yaml")
    started = time.monotonic()
    subprocess.run(cmd, cwd=workdir, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - started


def measured(folder: Path) -> dict[str, float]:
    """Slot -> tokens/s of the candidates that were measured (not reused, not skipped)."""
    out = {}
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".worker.json"):  # the worker's own output beside the candidate's result
            continue
        result = read_json(path)
        if result.get("status") == "ok" and not result.get("reused_from"):
            out[path.stem] = float(result["tokens_per_second"])
    return out


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "--workdir", type=Path, required=True, help="scratch directory, new or an earlier one (emptied first)"
    )
    parser.add_argument(
        "--compare-only",
        action="store_true",
        help="compare pass1/ and pass2/ of the workdir again, run nothing",
    )
    args = parser.parse_args()
    if args.compare_only:
        if not all((args.workdir / name).is_dir() for name in ("pass1", "pass2")):
            sys.exit(f"error: {args.workdir} holds no pass1/ and pass2/; run without --compare-only first")
        print(json.dumps(compare(args.workdir, None, None), indent=2))
        return
    workdir = claim_workdir(args.workdir, empty=True)
    demo_seconds = snakemake(workdir)
    shutil.copytree(workdir / CANDIDATES, workdir / "pass1")
    target = "results/cpu-tuning/selected.yaml"
    alone_seconds = snakemake(workdir, "--forcerun", "bench_candidate", target)
    shutil.copytree(workdir / CANDIDATES, workdir / "pass2")
    print(json.dumps(compare(workdir, demo_seconds, alone_seconds), indent=2))


def compare(workdir: Path, demo_seconds: float | None, alone_seconds: float | None) -> dict:
    """Per slot measured in both passes: tokens/s of each and their ratio (alone over in the demo)."""
    first, second = measured(workdir / "pass1"), measured(workdir / "pass2")
    slots = sorted(set(first) & set(second))
    ratios = {slot: round(second[slot] / first[slot], 3) for slot in slots}
    worst = max((abs(r - 1.0) for r in ratios.values()), default=None)
    return {
        "benchmark": "tuning candidates in the full demo vs alone",
        "demo_seconds": None if demo_seconds is None else round(demo_seconds, 1),
        "tuning_alone_seconds": None if alone_seconds is None else round(alone_seconds, 1),
        "tokens_per_second_in_demo": {slot: round(first[slot]) for slot in slots},
        "tokens_per_second_alone": {slot: round(second[slot]) for slot in slots},
        "ratio_alone_over_demo": ratios,
        "worst_deviation": None if worst is None else round(worst, 3),
        "within_15_percent": worst is not None and worst <= 0.15,
    }


if __name__ == "__main__":
    main()
