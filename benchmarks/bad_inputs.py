"""Malformed inputs, each run through the real command a user types, and the lines the user gets.

Every case runs in its own process (``python -m tiny_llm ...``, ``python -m snakemake -n ...`` or a benchmark
script) in a scratch directory; the table records the command's exit code and what it wrote to stderr (for
Snakemake, its ``error:`` line and the indented problem lines after it). A case is handled when it ends with
a non-zero exit code and no traceback, in as many lines as it names problems (one, but for a workflow
config's list of schema problems); ``accepted`` cases are inputs that now work as meant (``~`` expanded).

    python benchmarks/bad_inputs.py --workdir /tmp/bad-inputs [--only NAME ...] [--write benchmarks/README.md]

``--write`` replaces the table between the ``bad-inputs`` markers of that file; the script exits 1 when any
case is not handled.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from snakemake_driver import REPO, claim_workdir, snakemake_command

LONG = "7" * 5000
SHORT_RUN = ["training.tokens_per_parameter=0.05", "training.epoch_tokens_per_parameter=0.05"]
"""A tiny run that the script's token cache holds."""
BEGIN, END = "<!-- bad-inputs:begin -->", "<!-- bad-inputs:end -->"
SNAKEMAKE_NOISE = re.compile(r"^(Using workflow specific profile|Assuming unrestricted|host:|Building DAG)")


@dataclass
class Run:
    """One command: its arguments, working directory and extra environment."""

    cmd: list[str]
    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    snakemake: bool = False
    accepted: Callable[[Path], bool] | None = None
    """For an input that is handled by working (``~``): what must hold afterwards."""


@dataclass(frozen=True)
class Case:
    name: str
    what: str
    """The bad input, as the table shows it."""
    make: Callable[[Path, Path], Run]
    """(scratch directory of the case, shared data directory) -> the command to run."""


def cli(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    return Run([sys.executable, "-m", "tiny_llm", *args], cwd, env or {})


def describe_set(assignment: str) -> Callable[[Path, Path], Run]:
    return lambda tmp, data: cli(tmp, "describe", "--config", "tiny", "--set", assignment)


def recipe_file(text: str | bytes) -> Callable[[Path, Path], Run]:
    def make(tmp: Path, data: Path) -> Run:
        path = tmp / "recipe.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return cli(tmp, "describe", "--config", "tiny", "--config", str(path))

    return make


def tiny_workflow() -> dict:
    return {
        "data": {"corpus": "embedded", "tokenizer": "train"},
        "sizes": {"tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}},
        "runs": {"tiny-a": {"size": "tiny"}},
        "tuning": {"default_profiles": []},
    }


def workflow(
    edit: Callable[[dict], None] | None = None, text: str | None = None
) -> Callable[[Path, Path], Run]:
    """``snakemake -n`` on a tiny workflow config after ``edit`` (or the config ``text`` as written)."""

    def make(tmp: Path, data: Path) -> Run:
        config = tiny_workflow()
        if edit is not None:
            edit(config)
        path = tmp / "config.yaml"
        path.write_text(
            text if text is not None else yaml.safe_dump(config, sort_keys=False), encoding="utf-8"
        )
        return Run(snakemake_command(tmp, "-n", configfile=path), tmp, snakemake=True)

    return make


def default_workflow_file(extra: str) -> Callable[[Path, Path], Run]:
    """``snakemake -n`` where the workflow's own workflow_config.yaml (no --configfile) holds ``extra``."""

    def make(tmp: Path, data: Path) -> Run:
        text = (REPO / "workflow_config.yaml").read_text(encoding="utf-8")
        (tmp / "workflow_config.yaml").write_text(text + extra, encoding="utf-8")
        return Run(snakemake_command(tmp, "-n"), tmp, snakemake=True)

    return make


def prompt_file(text: str | bytes) -> Callable[[Path, Path], Run]:
    """`export` of a finished run with a prompt file (the run: a tiny one the script trains once)."""

    def make(tmp: Path, data: Path) -> Run:
        path = tmp / "prompts.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return cli(
            tmp, "export", "--run", str(data / "run"), "--output", str(tmp / "export"), "--prompts", str(path)
        )

    return make


def corpus_data(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def prepare_with(shard: Callable[[Path], None]) -> Callable[[Path, Path], Run]:
    """`prepare` of a copy of the demo corpus whose train shard ``shard`` spoils."""

    def make(tmp: Path, data: Path) -> Run:
        from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir

        corpus = tmp / "corpus"
        train, validation = split_documents(demo_documents(40_000), 0.1)
        write_c4_dir(corpus, train, validation)
        shard(next(corpus.glob("c4-train.*.json.gz")))
        sets = [
            f"data.dataset={corpus}",
            f"data.tokenizer={data / 'tokenizer'}",
            f"data.cache_dir={tmp / 'cache'}",
        ]
        sets += ["model.vocab_size=512", "data.prepare_train_tokens=2000"]
        return cli(tmp, "prepare", "--no-progress", "--config", "tiny", *corpus_data(sets))

    return make


def gzipped(content: bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        with gzip.open(path, "wb") as handle:
            handle.write(content)

    return write


def prepare_sets(tmp: Path, data: Path, **data_keys: str) -> list[str]:
    keys = {
        "dataset": str(data / "corpus"),
        "tokenizer": str(data / "tokenizer"),
        "cache_dir": str(tmp / "cache"),
    }
    keys.update(data_keys)
    return [f"data.{k}={v}" for k, v in keys.items()] + [
        "model.vocab_size=512",
        "data.prepare_train_tokens=2000",
    ]


def compile_cache(mode: int, group: int | None = None) -> Callable[[Path, Path], Run]:
    """A training run (the compile cache is set up first) with TINY_LLM_COMPILE_CACHE in a directory of
    ``mode`` (``group``: its group, a shared one, when the script runs as root)."""

    def make(tmp: Path, data: Path) -> Run:
        named = tmp / "shared"
        named.mkdir()
        if group is not None and os.getuid() == 0:
            os.chown(named, -1, group)
        named.chmod(mode)
        sets = [*prepare_sets(tmp, data, cache_dir=str(data / "cache")), f"runtime.output_dir={tmp / 'run'}"]
        return cli(
            tmp, "train", "--config", "tiny", *corpus_data(sets), env={"TINY_LLM_COMPILE_CACHE": str(named)}
        )

    return make


def tilde_output(tmp: Path, data: Path) -> Run:
    home = tmp / "home"
    home.mkdir()
    sets = [
        *prepare_sets(tmp, data, cache_dir=str(data / "cache")),
        "runtime.output_dir=~/runs/a",
        *SHORT_RUN,
    ]
    run = cli(tmp, "train", "--quiet", "--config", "tiny", *corpus_data(sets), env={"HOME": str(home)})
    run.accepted = lambda tmp: (
        (tmp / "home" / "runs" / "a" / "result.json").is_file() and not (tmp / "~").exists()
    )
    return run


def throughput_point(prepare: Callable[[Path], list[str]]) -> Callable[[Path, Path], Run]:
    def make(tmp: Path, data: Path) -> Run:
        recipe = tmp / "recipe.yaml"
        recipe.write_text("runtime: {device: cpu, cpu_threads: 1}\n", encoding="utf-8")
        args = prepare(tmp)
        return cli(
            tmp, "throughput", "point", "--recipe", str(recipe), "--context", "32", "--micro", "1", *args
        )

    return make


def foreign_point_directory(tmp: Path) -> list[str]:
    (tmp / "m1-first.point").mkdir()
    (tmp / "m1-first.point" / "notes.txt").write_text("mine\n")
    return ["--output", str(tmp / "m1-first.json")]


def data_parallel_workdir(tmp: Path, data: Path) -> Run:
    (tmp / "runs" / "one_process").mkdir(parents=True)
    (tmp / "runs" / "one_process" / "result.json").write_text("{}")
    script = REPO / "benchmarks" / "data_parallel.py"
    return Run([sys.executable, str(script), "--workdir", str(tmp / "runs")], tmp)


def train_into(tmp: Path, data: Path) -> Run:
    (tmp / "paper").mkdir()
    (tmp / "paper" / "paper.tex").write_text("\\documentclass{article}\n")
    sets = [*prepare_sets(tmp, data, cache_dir=str(data / "cache")), f"runtime.output_dir={tmp / 'paper'}"]
    return cli(tmp, "train", "--config", "tiny", *corpus_data([*sets, *SHORT_RUN]))


def prepare_keys(**data_keys: str) -> Callable[[Path, Path], Run]:
    return lambda tmp, data: cli(
        tmp, "prepare", "--config", "tiny", *corpus_data(prepare_sets(tmp, data, **data_keys))
    )


def foreign_cache(tmp: Path, data: Path) -> Run:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("mine\n")
    return prepare_keys(cache_dir=str(tmp / "mine"))(tmp, data)


def tracking_not_json(tmp: Path, data: Path) -> Run:
    sets = [*prepare_sets(tmp, data, cache_dir=str(data / "cache")), f"runtime.output_dir={tmp / 'run'}"]
    sets += SHORT_RUN
    return cli(
        tmp, "train", "--config", "tiny", *corpus_data(sets), env={"TINY_LLM_TRACKING": "{tensorboard: yes"}
    )


def settings_file(text: str) -> Callable[[Path, Path], Run]:
    def make(tmp: Path, data: Path) -> Run:
        (tmp / "settings.json").write_text(text, encoding="utf-8")
        return cli(tmp, "campaign", "plan", "--settings", str(tmp / "settings.json"))

    return make


def missing_local_corpus(config: dict) -> None:
    config["data"] = {"corpus": "./my-c4", "tokenizer": "train"}


def sized(key: str, value: object) -> Callable[[dict], None]:
    return lambda config: config["sizes"]["tiny"].update({key: value})


def overrides(section: str, key: str, value: object) -> Callable[[dict], None]:
    return lambda config: (
        config["sizes"]["tiny"].setdefault("overrides", {}).setdefault(section, {}).update({key: value})
    )


def throughput(**keys: object) -> Callable[[dict], None]:
    base = {"sizes": ["tiny"], "contexts": [32], "max_micro_batch": 2, "data_mode": "synthetic"}
    return lambda config: config.update(throughput={**base, **keys})


TEMPLATE = "__use_yte__: true\n?if False:\n  sizes: !!python/tuple [1, 2]\n"

CASES = [
    # ---------------------------------------------------------------- recipe values (--set)
    Case("batch-tokens-1e30", "`training.batch_tokens=1e30`", describe_set("training.batch_tokens=1e30")),
    Case("prepare-workers", "`data.prepare_workers=100000`", describe_set("data.prepare_workers=100000")),
    Case("memory-limit-1e14", "`runtime.memory_limit_mb=1e14`", describe_set("runtime.memory_limit_mb=1e14")),
    Case(
        "set-5000-digits",
        "`training.log_every=` a 5,000-digit integer",
        describe_set(f"training.log_every={LONG}"),
    ),
    Case("int-1e30", "`training.log_every=1e30`", describe_set("training.log_every=1e30")),
    Case("float-nan", "`model.width=.nan`", describe_set("model.width=.nan")),
    Case("lr-inf", "`optimizer.lr=.inf`", describe_set("optimizer.lr=.inf")),
    Case(
        "budget-1e300",
        "`training.tokens_per_parameter=1e300`",
        describe_set("training.tokens_per_parameter=1e300"),
    ),
    Case(
        "epochs-1e-8",
        "`training.epoch_tokens_per_parameter=1e-8`",
        describe_set("training.epoch_tokens_per_parameter=1e-8"),
    ),
    Case("heads", "`model.num_heads=7` (width 64)", describe_set("model.num_heads=7")),
    Case("vocab", "`model.vocab_size=100000`", describe_set("model.vocab_size=100000")),
    Case("micro-0", "`training.micro_batch_size=0`", describe_set("training.micro_batch_size=0")),
    Case("beta1", "`optimizer.beta1=1.5`", describe_set("optimizer.beta1=1.5")),
    Case("device", "`runtime.device=tpu`", describe_set("runtime.device=tpu")),
    Case("choice", "`runtime.compile_mode=fast`", describe_set("runtime.compile_mode=fast")),
    Case("typo-key", "`model.widht=320`", describe_set("model.widht=320")),
    Case("bool", "`runtime.deterministic=2`", describe_set("runtime.deterministic=2")),
    Case("empty-string", "`data.cache_dir=''`", describe_set("data.cache_dir=''")),
    Case("set-no-equals", "`--set training.batch_tokens`", describe_set("training.batch_tokens")),
    Case(
        "epochs-list",
        "`training.checkpoint_epochs=[0, 0]`",
        describe_set("training.checkpoint_epochs=[0, 0]"),
    ),
    Case("muon-key", "`optimizer.muon.lr=0.01` under adamw", describe_set("optimizer.muon.lr=0.01")),
    Case("graph-cpu", "`runtime.cuda_graph=true` on a CPU recipe", describe_set("runtime.cuda_graph=true")),
    Case("ranks", "`runtime.num_gpus=3` (2 microbatches)", describe_set("runtime.num_gpus=3")),
    # ---------------------------------------------------------------- recipe files
    Case("recipe-list", "a recipe file holding a list", recipe_file("- 1\n- 2\n")),
    Case("recipe-yaml", "a recipe file that is not YAML", recipe_file("model: {width: [\n")),
    Case(
        "recipe-5000",
        "a recipe file with a 5,000-digit integer",
        recipe_file(f"training:\n  log_every: {LONG}\n"),
    ),
    Case(
        "recipe-latin1",
        "a recipe file in Latin-1",
        recipe_file("data: {cache_dir: caf\u00e9}\n".encode("latin-1")),
    ),
    Case(
        "recipe-missing",
        "`--config missing.yaml`",
        lambda tmp, data: cli(tmp, "describe", "--config", "missing.yaml"),
    ),
    Case(
        "preset",
        "`--config tinyy` (no such preset)",
        lambda tmp, data: cli(tmp, "describe", "--config", "tinyy"),
    ),
    # ---------------------------------------------------------------- prompt files (export)
    Case(
        "prompt-max-new",
        "`max_new_tokens: 1e30` in a prompt file",
        prompt_file("prompts: [a]\nmax_new_tokens: 1e30\n"),
    ),
    Case(
        "prompt-seed", "a 5,000-digit `seed` in a prompt file", prompt_file(f"prompts: [a]\nseed: {LONG}\n")
    ),
    Case(
        "prompt-latin1", "a prompt file in Latin-1", prompt_file("prompts: [Caf\u00e9]\n".encode("latin-1"))
    ),
    Case("prompt-empty", "`prompts: []`", prompt_file("prompts: []\n")),
    Case(
        "prompt-nan", "`temperature: .nan` in a prompt file", prompt_file("prompts: [a]\ntemperature: .nan\n")
    ),
    # ---------------------------------------------------------------- workflow configs (snakemake -n)
    Case(
        "corpus-missing",
        "`data.corpus: ./my-c4` (missing) with `tokenizer: train`",
        workflow(missing_local_corpus),
    ),
    Case(
        "wf-huge-int",
        "`sizes.tiny.threads:` a 4,000-digit integer",
        workflow(sized("threads", int("9" * 4000))),
    ),
    Case(
        "wf-5000",
        "a 5,000-digit integer in the workflow's own workflow_config.yaml",
        default_workflow_file(f"\nextra: {LONG}\n"),
    ),
    Case("wf-template", "`__use_yte__` with `!!python/tuple` under a false `?if`", workflow(text=TEMPLATE)),
    Case(
        "wf-nan",
        "`data.validation_fraction: .nan`",
        workflow(lambda c: c["data"].update(validation_fraction=float("nan"))),
    ),
    Case("wf-unknown", "`runz:` (unknown top-level key)", workflow(lambda c: c.update(runz={}))),
    Case(
        "wf-size",
        "`runs.tiny-a.size: huge` (no such size)",
        workflow(lambda c: c["runs"]["tiny-a"].update(size="huge")),
    ),
    Case(
        "wf-batch",
        "`training.batch_tokens: 1e30` in a size's overrides",
        workflow(overrides("training", "batch_tokens", "1e30")),
    ),
    Case(
        "wf-windows",
        "`throughput.max_windows: 1` below `windows: 3`",
        workflow(throughput(max_windows=1, windows=3)),
    ),
    Case(
        "wf-memory",
        "`runtime.memory_limit_mb: 1e14` in the map's overrides",
        workflow(throughput(overrides={"runtime": {"memory_limit_mb": 1e14}})),
    ),
    Case(
        "wf-timeout",
        "`throughput.timeout_flops_per_second: 0`",
        workflow(throughput(timeout_flops_per_second=0)),
    ),
    # ---------------------------------------------------------------- corpus files and caches (prepare)
    Case(
        "shard-latin1",
        "a Latin-1 train shard",
        prepare_with(gzipped('{"text": "Caf\u00e9"}\n'.encode("latin-1"))),
    ),
    Case("shard-empty", "an empty (gzipped) train shard", prepare_with(gzipped(b""))),
    Case(
        "shard-truncated",
        "a truncated train shard",
        prepare_with(lambda p: p.write_bytes(p.read_bytes()[:40])),
    ),
    Case("shard-no-text", "a train shard line without `text`", prepare_with(gzipped(b'{"body": "x"}\n'))),
    Case("corpus-dir", "`data.dataset=./nowhere`", prepare_keys(dataset="./nowhere")),
    Case("cache-foreign", "`data.cache_dir` a folder of someone's", foreign_cache),
    # ---------------------------------------------------------------- shared hosts and outputs
    Case(
        "cache-2775",
        "`TINY_LLM_COMPILE_CACHE` a setgid 2775 directory of a shared group",
        compile_cache(0o2775, group=4242),
    ),
    Case("cache-0777", "`TINY_LLM_COMPILE_CACHE` a 0777 directory", compile_cache(0o777)),
    Case("tilde", "`runtime.output_dir=~/runs/a`", tilde_output),
    Case("tracking", "`$TINY_LLM_TRACKING` not JSON", tracking_not_json),
    Case("train-foreign", "`runtime.output_dir` a folder of someone's", train_into),
    Case(
        "point-foreign",
        "`throughput point --output X.json` beside someone's `X.point/`",
        throughput_point(foreign_point_directory),
    ),
    Case(
        "point-timeout",
        "`throughput point --timeout-seconds 0`",
        throughput_point(lambda tmp: ["--output", str(tmp / "p.json"), "--timeout-seconds", "0"]),
    ),
    Case(
        "dp-workdir",
        "`benchmarks/data_parallel.py --workdir` with someone's `one_process/result.json`",
        data_parallel_workdir,
    ),
    Case(
        "settings-5000",
        "a 5,000-digit integer in `campaign plan --settings`",
        settings_file(f'{{"root": "x", "stages": [], "sizes": {{"a": {LONG}}}}}'),
    ),
    Case(
        "export-cwd",
        "`export --output .`",
        lambda tmp, data: cli(tmp, "export", "--run", str(data / "run"), "--output", "."),
    ),
]


def prepare_data(data: Path) -> None:
    """A corpus, a 512-token tokenizer, a token cache and a finished tiny run, made once."""
    from tiny_llm.config import load_recipe
    from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir
    from tiny_llm.data.prepare import prepare_cache
    from tiny_llm.data.sources import resolve_source
    from tiny_llm.data.tokenizer import train_tokenizer
    from tiny_llm.engines import run_training

    if (data / "run" / "result.json").is_file():
        return
    train, validation = split_documents(demo_documents(200_000), 0.1)
    write_c4_dir(data / "corpus", train, validation)
    texts = resolve_source(str(data / "corpus"), None).iter_texts("train", batch_size=256)
    train_tokenizer((t for batch in texts for t in batch), 512, data / "tokenizer")
    sets = [*prepare_sets(data, data, cache_dir=str(data / "cache")), f"runtime.output_dir={data / 'run'}"]
    sets += [*SHORT_RUN, "data.prepare_train_tokens=null"]
    recipe = load_recipe(["tiny"], sets)
    prepare_cache(recipe, progress=False)
    run_training(recipe, quiet=True)


def reported_lines(run: Run, stderr: str) -> list[str]:
    """What the user reads: a tiny-llm command's stderr; Snakemake's error line and the problems under it."""
    lines = [line.rstrip() for line in stderr.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in stderr:
        return [f"a traceback ending: {lines[-1]}"]
    if not run.snakemake:
        return lines
    start = next(
        (i for i, line in enumerate(lines) if line.startswith(("error:", "Error", "Traceback"))), None
    )
    if start is None:
        return [line for line in lines if not SNAKEMAKE_NOISE.match(line)][-3:]
    tail = [lines[start]]
    tail += [line for line in lines[start + 1 :] if line.startswith("  ") and not line.startswith("  File")]
    return tail


def run_case(case: Case, root: Path, data: Path) -> dict:
    tmp = root / case.name
    tmp.mkdir()
    run = case.make(tmp, data)
    started = time.perf_counter()
    proc = subprocess.run(
        run.cmd, cwd=run.cwd, env={**os.environ, **run.env}, capture_output=True, text=True, timeout=600
    )
    lines = reported_lines(run, proc.stderr)
    if run.accepted is not None:
        handled = proc.returncode == 0 and run.accepted(tmp)
        lines = (
            ["(accepted: the home directory's runs/a/result.json was written, no ./~ tree)"]
            if handled
            else lines
        )
    else:
        handled = proc.returncode != 0 and bool(lines) and "Traceback" not in proc.stderr
    return {
        "name": case.name,
        "input": case.what,
        "exit": proc.returncode,
        "lines": lines,
        "handled": handled,
        "seconds": round(time.perf_counter() - started, 1),
    }


def shown(text: str, root: Path) -> str:
    """A line as the table shows it: scratch paths shortened, pipes escaped, long lines cut."""
    text = text.replace(str(root), "…")
    text = text if len(text) <= 400 else text[:400] + " …"
    return text.replace("|", "\\|")


def table(results: list[dict], root: Path) -> str:
    head = ["| # | bad input | exit | what the user gets |", "|---:|---|---:|---|"]
    rows = [
        f"| {i} | {r['input']} | {r['exit']} | {'<br>'.join(shown(line, root) for line in r['lines'])} |"
        for i, r in enumerate(results, 1)
    ]
    return "\n".join(head + rows) + "\n"


def write_between_markers(path: Path, text: str) -> None:
    content = path.read_text(encoding="utf-8")
    begin, end = content.index(BEGIN) + len(BEGIN), content.index(END)
    path.write_text(content[:begin] + "\n" + text + content[end:], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    parser.add_argument("--write", type=Path, help="replace the table between the bad-inputs markers here")
    args = parser.parse_args()
    workdir = claim_workdir(args.workdir)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    prepare_data(data)
    root = workdir / time.strftime("cases-%Y%m%d-%H%M%S")
    root.mkdir()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    results = []
    for case in cases:
        result = run_case(case, root, data)
        results.append(result)
        mark = "ok " if result["handled"] else "BAD"
        print(f"{mark} {case.name} ({result['seconds']} s): {result['lines'][:1]}", file=sys.stderr)
    (root / "results.json").write_text(json.dumps(results, indent=2))
    print(table(results, root))
    if args.write is not None:
        write_between_markers(args.write, table(results, root))
    sys.exit(0 if all(r["handled"] for r in results) else 1)


if __name__ == "__main__":
    main()
