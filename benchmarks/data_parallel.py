"""runtime.num_gpus on the CPU: 2 gloo ranks (torchrun, one thread each) against 1 process with twice the
accumulation (two threads, and one), same recipe, same cores. Prints one JSON document: each run's training
seconds, tokens/s and wall time, the time ratio, and the largest loss difference over every train row.

    python benchmarks/data_parallel.py --workdir /tmp/dp-bench [--preset tiny] [--set KEY=VALUE ...]

--workdir is new, empty or one this benchmark made (it carries tiny-llm's output marker); its runs' results
and states are replaced on every call, so a folder of anyone else's is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from snakemake_driver import claim_workdir

from tiny_llm.config import load_recipe
from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir
from tiny_llm.data.prepare import prepare_cache
from tiny_llm.data.sources import resolve_source
from tiny_llm.data.tokenizer import train_tokenizer


def build_data(workdir: Path, preset: str) -> list[str]:
    """The embedded demo corpus, a 512-token BPE and a token cache for ``preset``: the --set data keys."""
    corpus, tokenizer, cache = workdir / "corpus", workdir / "tokenizer", workdir / "cache"
    sets = [f"data.dataset={corpus}", f"data.tokenizer={tokenizer}", f"data.cache_dir={cache}"]
    sets.append("data.prepare_train_tokens=220000")  # all the demo corpus has
    if not (cache / "manifest.json").exists():
        train, validation = split_documents(demo_documents(600_000), 0.1)
        write_c4_dir(corpus, train, validation)
        texts = resolve_source(str(corpus), None).iter_texts("train", batch_size=256)
        train_tokenizer((t for batch in texts for t in batch), 512, tokenizer)
        prepare_cache(load_recipe([preset], [*sets, "model.vocab_size=512"]), progress=False)
    return sets


def train(argv: list[str], ranks: int, run_dir: Path) -> tuple[float, dict]:
    """Run one training command into ``run_dir``; (wall seconds, its result.json)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "tiny_llm"]
    if ranks > 1:
        launch = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
        ]
        launch += ["-m", "tiny_llm"]
    start = time.perf_counter()
    subprocess.run([*launch, "train", "--quiet", *argv], env=env, check=True)
    wall = time.perf_counter() - start
    return wall, json.loads((run_dir / "result.json").read_text())


def losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row.get("event") == "train"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    args.workdir = claim_workdir(args.workdir)  # a folder of someone else's is refused, nothing in it touched
    common = [*build_data(args.workdir, args.preset), "model.vocab_size=512", "runtime.deterministic=true"]
    common += args.sets
    report: dict = {"preset": args.preset, "sets": args.sets}
    # The same 2 cores each time: one process on 2 threads, 2 ranks on 1 each; one process on 1 thread says
    # how much of the difference is the intra-op threading of small matmuls.
    runs = (("one_process", 1, 2), ("two_ranks", 2, 2), ("one_process_one_thread", 1, 1))
    for name, ranks, threads in runs:
        run_dir = args.workdir / name
        sets = [*common, f"runtime.num_gpus={ranks}", f"runtime.cpu_threads={threads}"]
        argv = ["--config", args.preset, *[a for s in sets for a in ("--set", s)]]
        argv += ["--set-aside-changed", "--set", f"runtime.output_dir={run_dir}"]
        for stale in ("result.json", "final.pt", "latest.pt"):
            (run_dir / stale).unlink(missing_ok=True)
        wall, result = train(argv, ranks, run_dir)
        report[name] = {
            "ranks": ranks,
            "threads_per_rank": threads // ranks,
            "wall_seconds": round(wall, 2),
            "training_seconds": round(result["training_seconds"], 3),
            "training_tokens_per_second": round(result["training_tokens_per_second"], 1),
            "final_validation_loss": result["final_validation"]["loss"],
        }
    one, two = losses(args.workdir / "one_process"), losses(args.workdir / "two_ranks")
    report["train_rows"] = len(one)
    report["max_loss_difference"] = max(abs(a - b) for a, b in zip(one, two, strict=True))
    report["time_ratio_two_ranks_over_one"] = round(
        report["two_ranks"]["training_seconds"] / report["one_process"]["training_seconds"], 3
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
