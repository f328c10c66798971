"""Every shell command of README.md and docs/*.md runs as written: a reader can paste any of them.

A command is a line of a page's ```bash block (indented blocks in a list item too); a line ending in
``\\`` goes on on the next, and a here-document (``<<EOF``) belongs to the line that opens it. Comment lines
are text. Snakemake calls quoted in the pages' prose, and the commands in the comments of the shipped configs
and profiles, are parsed too.

Fast tier: each command parses as its program reads it (Snakemake's own argument parser, tiny-llm's command
parsers), and every --configfile, profile and rule it names exists: a flag that takes several values
(``--quiet``, ``--configfile``, ``--resources``) must not swallow the target after it.

Slow tier, in a scratch copy of the repository (its files that git tracks or would add), the README first,
then docs/ by name, each distinct command once:
- ``snakemake ...`` is dry-run (``-n``); commands with the same options share one process, their targets
  together (no target: the default target, ``all``). A command whose targets are all recipes
  (``.../recipe.yaml``, written by the controller in a second, nothing trained) runs as written.
- ``python -m tiny_llm train ...`` runs with ``TINY_TRAIN`` added (a few updates instead of the preset's
  budget), so the commands after it have a run to evaluate, sample and export.
- Everything else runs as written, by bash, in order (lm-evaluation-harness's only where it is installed, as
  tests/unit/test_lm_eval.py decides).
- Files a page asks the reader to write (``USER_FILES``) are written before the first command that names them.
- What a command's comment says it shows (``PROMISES``) must be in its output.

Not run here, nor listed below: the README's "Set up" commands, which install everything and run the whole
demo and test suite; tests/unit/test_docs.py checks they are CI's (.ci/run), which runs them verbatim.

A command that cannot run in a test (an interactive session, a server, a cluster submission, a program that is
not installed) says so in its own comment, ``# ...; not run in tests: <why>`` (or only
``# not run in tests: <why>``); the fast tier checks that at most ``MAX_NOT_RUN`` do.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from workflow_helpers import REPO, snakemake_env

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MAX_NOT_RUN = 6
NOT_RUN = re.compile(r"#.*\bnot run in tests: *(\S.*)$")
BASH_BLOCK = re.compile(r"^( *)```bash\n(.*?)^\1```", re.M | re.S)
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")
SETUP = "Set up"
DEFAULT_TARGET = "all"  # the Snakefile's `rule all`, default_target: True
TINY_TRAIN = [
    "--set",
    "training.tokens_per_parameter=0.05",
    "--set",
    "training.epoch_tokens_per_parameter=0.05",
]
SHELL_SYNTAX = {">", ">>", "<", "2>&1", "&", "&&", "||", "|", ";"}
DRY_RUN = {"-n", "--dry-run", "--dryrun"}
PROMISES = {
    "list each one": r"^rule train_campaign:",
    "count the jobs that would run": r"^Job stats:",
    "shows the launch command and gpu=4": r"gpu=4, .*\n.*tiny_llm launch --nproc-per-node 4 ",
    "12 runs, 0.831 GPU-h": r"0\.831 GPU-h \(12 runs\)",
    "12 train_campaign": r"^train_campaign +12$",
    "1.663 GPU-h": r"-> 1\.663 GPU-h",
}
"""What a command's comment says it shows -> what its output (the dry run's, grouped) must then hold."""


@dataclass(frozen=True)
class Command:
    """One command of a page: where it is, its text (continuations joined, a here-document included)."""

    page: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.text.splitlines()[0].split('  #')[0].rstrip()}"

    @property
    def not_run(self) -> str | None:
        """Why this command is not run in tests, as its comment says; None: it is run."""
        found = NOT_RUN.search(self.text.splitlines()[0])
        return found.group(1).strip() if found else None

    @property
    def words(self) -> list[str]:
        """The program and its arguments: no environment assignments, ``nohup``, redirections or what follows
        a pipe or ``&&``."""
        words = shlex.split(self.text.splitlines()[0], comments=True)
        while words and (re.match(r"^\w+=", words[0]) or words[0] == "nohup"):
            words.pop(0)
        end = next((i for i, w in enumerate(words) if w in SHELL_SYNTAX or w.startswith("<<")), len(words))
        return words[:end]

    @property
    def program(self) -> str:
        """``snakemake``, ``tiny_llm``, ``python -m X``'s X, else the program's name."""
        words = self.words
        if words[:2] == ["python", "-m"] and len(words) > 2:
            return words[2]
        return words[0]


def block_commands(page: str, first_line: int, lines: list[str]) -> list[Command]:
    """The commands of one bash block whose first line is the page's ``first_line``."""
    commands = []
    i = 0
    while i < len(lines):
        number, text = first_line + i, lines[i]
        i += 1
        if not text.strip() or text.lstrip().startswith("#"):
            continue
        while text.endswith("\\") and i < len(lines):
            text = text[:-1].rstrip() + " " + lines[i].strip()
            i += 1
        if heredoc := HEREDOC.search(text.split("#", 1)[0]):
            body = []
            while i < len(lines) and lines[i - 1].strip() != heredoc.group(1):
                body.append(lines[i])
                i += 1
            text = "\n".join([text, *body])
        commands.append(Command(page, number, text))
    return commands


def page_commands(path: Path) -> list[Command]:
    """Every command of the ```bash blocks of ``path``, the README's "Set up" section left out."""
    text = path.read_text(encoding="utf-8")
    if path.name == "README.md":
        setup = text.split(f"\n## {SETUP}\n", 1)[1].split("\n## ", 1)[0]
        text = text.replace(setup, re.sub(r"[^\n]", " ", setup))  # line numbers stay those of the page
    commands = []
    for block in BASH_BLOCK.finditer(text):
        indent = len(block.group(1))
        lines = [line[indent:] for line in block.group(2).splitlines()]
        commands += block_commands(path.name, text[: block.start(2)].count("\n") + 1, lines)
    return commands


COMMANDS = [command for page in PAGES for command in page_commands(page)]

INLINE_SNAKEMAKE = re.compile(r"`((?:python -m )?snakemake [^`]*)`")
CONFIG_COMMAND = re.compile(r"^#\s+((?:python -m )?(?:snakemake|tiny_llm) .*|python -m tiny_llm .*)$")
CONFIGS = [REPO / "workflow_config.yaml", *sorted((REPO / "config").glob("*.yaml"))]
CONFIGS += sorted((REPO / "profiles").glob("*/config.yaml"))


def quoted_commands() -> list[Command]:
    """Commands quoted in prose, parsed only: Snakemake calls in the pages' inline code, and the commands in
    the comments of the shipped configs and profiles (a line of its own, or inline code)."""
    quoted = []
    for path in PAGES:
        text = path.read_text(encoding="utf-8")
        for span in INLINE_SNAKEMAKE.finditer(text):
            number = text[: span.start()].count("\n") + 1
            quoted.append(Command(path.name, number, " ".join(span.group(1).split())))
    for path in CONFIGS:
        where = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            comment = line[line.index("#") :] if "#" in line else ""
            quoted += [Command(where, number, span) for span in INLINE_SNAKEMAKE.findall(comment)]
            if found := CONFIG_COMMAND.match(line):
                quoted.append(Command(where, number, found.group(1)))
    return quoted


QUOTED = quoted_commands()
PLACEHOLDER = re.compile(r"^[A-Z]+$|<|\.\.\.")


# Files a page asks its reader to write: where the page says so, and how the test writes them (in the copy).
def _my_cluster(copy: Path) -> str:
    """docs/cluster.md: config/cluster.yaml, its 500m size on 4 GPUs (4 microbatches), and a run of it."""
    config = yaml.safe_load((copy / "config" / "cluster.yaml").read_text(encoding="utf-8"))
    config["sizes"]["500m"] |= {"num_gpus": 4, "overrides": {"training": {"micro_batch_size": 8}}}
    config["runs"]["500m-reference"] = {"size": "500m"}
    return yaml.safe_dump(config, sort_keys=False)


def _eval_jsonl(copy: Path) -> str:
    """docs/export.md: text of one's own as JSON lines beside the export; two held-out documents."""
    shard = next((copy / "corpus").glob("c4-validation.*.json.gz"))
    with gzip.open(shard, "rt", encoding="utf-8") as lines:
        texts = [json.loads(next(lines))["text"][:400] for _ in range(2)]
    return "".join(json.dumps({"text": text}) + "\n" for text in texts)


USER_FILES: dict[str, Callable[[Path], str]] = {
    "my-cluster.yaml": _my_cluster,
    "exports/demo-s/eval.jsonl": _eval_jsonl,
}


# --- the fast tier: every command parses, and names what exists ---------------------------------------------


@functools.cache
def snakemake_parser():  # -> argparse.ArgumentParser
    from snakemake.cli import get_argument_parser

    return get_argument_parser()


@functools.cache
def rule_names() -> frozenset[str]:
    texts = [p.read_text(encoding="utf-8") for p in [REPO / "Snakefile", *(REPO / "rules").glob("*.smk")]]
    return frozenset(m for text in texts for m in re.findall(r"^(?:rule|checkpoint) (\w+):", text, re.M))


def parse_quietly(parse: Callable[[], object]) -> tuple[object, str]:
    """``parse()``'s result, or None and argparse's message (or the exception's) when it refuses."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            return parse(), ""
    except SystemExit as exit_:
        if exit_.code == 0:  # --help: printed and done
            return {}, ""
        return None, stderr.getvalue().strip().splitlines()[-1]
    except Exception as exc:  # a type= function's error (--resources NAME=INT) is not argparse's own
        return None, f"{type(exc).__name__}: {exc}"


def snakemake_problems(args: list[str]) -> list[str]:
    """What is wrong with a Snakemake command line: the parser's refusal, or a file or rule it names that does
    not exist (a target swallowed by a flag of several values reads as one of its values)."""
    parsed, refusal = parse_quietly(lambda: snakemake_parser().parse_args(args))
    if parsed is None:
        return [refusal]
    problems = []
    for configfile in map(str, parsed.configfile or []):
        if PLACEHOLDER.search(configfile):
            continue
        if not (
            configfile.endswith((".yaml", ".yml"))
            and (configfile in USER_FILES or (REPO / configfile).is_file())
        ):
            problems.append(f"--configfile {configfile}: no such YAML file (a target after --configfile?)")
    profiles = [
        parsed.workflow_profile,
        *([parsed.profile] if isinstance(parsed.profile, str) else parsed.profile or []),
    ]
    for profile in filter(None, profiles):
        if not (REPO / profile).is_dir():
            problems.append(f"profile {profile}: no such directory")
    for target in parsed.targets:
        if not re.search(r"[/.<]", target) and target not in rule_names():
            problems.append(f"target {target}: no such rule")
    return problems


def tiny_llm_problems(args: list[str]) -> list[str]:
    """What is wrong with a ``python -m tiny_llm`` command line: no such command, or its parser refuses."""
    from tiny_llm.cli import COMMANDS as CLI

    if not args or args[0] not in CLI:
        return [f"no tiny_llm command {args[:1]}"]
    module = importlib.import_module(CLI[args[0]][0])

    def parse() -> object:
        import argparse

        parser = argparse.ArgumentParser(prog=f"tiny-llm {args[0]}")
        module.configure_parser(parser)
        return parser.parse_args(args[1:])

    parsed, refusal = parse_quietly(parse)
    return [] if parsed is not None else [refusal]


def problems(command: Command) -> list[str]:
    words = command.words
    if command.program == "snakemake":
        return snakemake_problems(words[1:] if words[0] == "snakemake" else words[3:])
    if command.program == "tiny_llm":
        return tiny_llm_problems(words[3:])
    return []


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_every_command_parses_and_names_what_exists(command: Command) -> None:
    found = problems(command)
    assert not found, f"{command}: {'; '.join(found)}"


@pytest.mark.parametrize("command", QUOTED, ids=str)
def test_every_quoted_command_parses_and_names_what_exists(command: Command) -> None:
    found = problems(command)
    assert not found, f"{command}: {'; '.join(found)}"


def test_the_pages_hold_commands_of_every_kind() -> None:
    """The extraction sees what the pages hold: Snakemake, tiny-llm, a continued line, a here-document."""
    programs = {c.program for c in COMMANDS}
    assert {"snakemake", "tiny_llm", "lm_eval", "cat"} <= programs, programs
    assert any("\\\n" not in c.text and "--output_path" in c.text for c in COMMANDS)  # continued lines joined
    assert any(c.text.count("\n") > 5 and c.text.rstrip().endswith("EOF") for c in COMMANDS)
    assert not any(c.text.startswith("pip install") for c in COMMANDS), "the Set up commands are CI's"
    stale = [said for said in PROMISES if not any(said in c.text for c in COMMANDS)]
    assert not stale, f"PROMISES names comments no command has: {stale}"


def test_few_commands_are_not_run_and_each_says_why() -> None:
    not_run = [f"{c}  ({c.not_run})" for c in COMMANDS if c.not_run]
    assert len(not_run) <= MAX_NOT_RUN, "commands not run in tests:\n" + "\n".join(not_run)


@pytest.mark.parametrize(
    "written",
    [
        "snakemake -n --quiet host campaign",  # --quiet takes several values
        "snakemake --configfile config/cluster.yaml campaign",  # so does --configfile
        "snakemake --resources gpu=4 runs",  # and --resources
        "snakemake -n campain",  # no such rule
    ],
)
def test_the_check_refuses_a_target_that_is_not_read_as_one(written: str) -> None:
    assert problems(Command("page.md", 1, written))


# --- the slow tier: every command runs ----------------------------------------------------------------------


def scratch_copy(destination: Path) -> Path:
    """The repository's files that git tracks or would add, copied to ``destination``; a bin/ beside it holds
    `python` (this interpreter) and `snakemake` (`python -m snakemake`) for the commands' PATH."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)
    bin_dir = destination.parent / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "snakemake").write_text('#!/bin/sh\nexec python -m snakemake "$@"\n')
    (bin_dir / "snakemake").chmod(0o755)
    return destination


def run_in(copy: Path, script: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = snakemake_env()
    env["PATH"] = f"{copy.parent / 'bin'}{os.pathsep}{env['PATH']}"
    env["TINY_LLM_PROGRESS"] = "lines"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def write_user_files(copy: Path, text: str) -> None:
    for name, content in USER_FILES.items():
        if name in text and not (copy / name).exists():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            (copy / name).write_text(content(copy), encoding="utf-8")


def runnable() -> list[Command]:
    """The commands that are run, each distinct one once (its first place), in the pages' order."""
    first = {c.text: c for c in reversed(COMMANDS) if not c.not_run}
    return [c for c in COMMANDS if first.get(c.text) is c]


def writes_recipes_only(command: Command) -> bool:
    targets = snakemake_parser().parse_args(command.words[1:]).targets
    return bool(targets) and all(t.endswith("/recipe.yaml") for t in targets)


def dry_run_groups(commands: list[Command]) -> dict[tuple[str, ...], tuple[list[str], list[Command]]]:
    """Options (the command without its targets) -> (every target of the commands with them, the commands)."""
    groups: dict[tuple[str, ...], tuple[list[str], list[Command]]] = {}
    for command in commands:
        words = command.words[1:]
        targets = list(snakemake_parser().parse_args(words).targets) or [DEFAULT_TARGET]
        options = tuple(w for w in words if w not in targets and w not in DRY_RUN)
        known, members = groups.setdefault(options, ([], []))
        known += [t for t in targets if t not in known]
        members.append(command)
    return groups


def broken_promises(commands: list[Command], proc: subprocess.CompletedProcess) -> list[str]:
    """What the comments of ``commands`` say the output shows and ``proc``'s output lacks."""
    output = proc.stdout + proc.stderr
    return [
        f"{command}: its comment says {said!r}, its output lacks /{shows}/"
        for command in commands
        for said, shows in PROMISES.items()
        if said in command.text and not re.search(shows, output, re.M)
    ]


def failure(command: object, proc: subprocess.CompletedProcess) -> str:
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
    return f"{command}\n  exit {proc.returncode}:\n{tail}"


@pytest.mark.slow
def test_every_snakemake_command_dry_runs(tmp_path: Path) -> None:
    """Each distinct Snakemake command, as a dry run; those with the same options in one process."""
    commands = [c for c in runnable() if c.program == "snakemake" and not writes_recipes_only(c)]
    copy = scratch_copy(tmp_path / "repository")
    failures = []
    for options, (targets, members) in dry_run_groups(commands).items():
        write_user_files(copy, " ".join(options))
        dry_run = ["snakemake", *options, "-n", "--", *targets]
        proc = run_in(copy, shlex.join(dry_run))
        if proc.returncode != 0:
            failures.append(failure("\n".join(map(str, members)) + f"\n  as {shlex.join(dry_run)}", proc))
        failures += broken_promises(members, proc)
    assert not failures, "\n\n".join(failures)


def as_run(command: Command) -> str:
    """The script that runs ``command``: as written, or a training run of a few updates."""
    if command.program == "tiny_llm" and command.words[3] == "train":
        return shlex.join(command.words + TINY_TRAIN)
    return command.text


def lm_eval_required() -> bool:
    """As tests/unit/test_lm_eval.py: CI installs it and says so; elsewhere it may be missing."""
    return importlib.util.find_spec("lm_eval") is not None or bool(os.environ.get("TINY_LLM_REQUIRE_LM_EVAL"))


@pytest.mark.slow
def test_every_other_command_runs_in_order(tmp_path: Path) -> None:
    """Every distinct command but the Snakemake dry runs, in the pages' order, as a reader would: the README's
    steps by hand make the run that docs/export.md exports and scores."""
    copy = scratch_copy(tmp_path / "repository")
    for command in runnable():
        if command.program == "snakemake" and not writes_recipes_only(command):
            continue  # test_every_snakemake_command_dry_runs
        if command.program == "lm_eval" and not lm_eval_required():
            continue
        write_user_files(copy, command.text)
        proc = run_in(copy, as_run(command))
        assert proc.returncode == 0, failure(command, proc)
        assert not broken_promises([command], proc)
