"""The table of paths (tiny_llm/pipeline/layout.py): every artifact one pattern, written once, used by rules
and plan alike; nothing else in the workflow or the library spells out results/."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from pipeline_helpers import REPO, plan_of, shipped

from tiny_llm import campaign as campaign_lib
from tiny_llm.pipeline import layout
from tiny_llm.pipeline.layout import CAMPAIGN, RUN_RESULT, TUNING_CANDIDATE, fill, patterns, wildcards

LAYOUT_FILE = REPO / "tiny_llm/pipeline/layout.py"
RULE_FILES = [REPO / "Snakefile", *sorted((REPO / "rules").glob("*.smk"))]


def pattern_regex(pattern: str) -> re.Pattern[str]:
    """A pattern as a regex: a wildcard is one path part, the campaign root any path, a horizon study's
    directory `horizons[-<variant>]` and maybe a size below it."""
    parts = re.split(r"(\{\w+\})", pattern)
    wide = {"{campaign}": ".+", "{horizon_study}": "horizons[^/]*(/[^/]+)?"}
    regex = "".join(
        wide.get(part, "[^/]+") if re.fullmatch(r"\{\w+\}", part) else re.escape(part) for part in parts
    )
    return re.compile(f"^{regex}$")


def test_every_pattern_is_written_once_under_results_or_the_campaign_root() -> None:
    table = patterns()
    values = list(table.values())
    assert len(values) == len(set(values)), sorted(v for v in values if values.count(v) > 1)
    for name, pattern in table.items():
        assert pattern.startswith(("results/", "{campaign}/")), name
        assert "{{" not in pattern and "//" not in pattern and not pattern.endswith("/"), name
        assert len(wildcards(pattern)) == len(set(wildcards(pattern))), name
        assert pattern.startswith("{campaign}/") == name.startswith("CAMPAIGN."), name
        assert LAYOUT_FILE.read_text(encoding="utf-8").count(f'"{pattern}"') == 1, name


def test_fill_names_some_wildcards_and_keeps_the_others() -> None:
    assert fill(RUN_RESULT, run="demo-s") == "results/runs/demo-s/result.json"
    assert fill(TUNING_CANDIDATE, profile="cpu") == "results/cpu-tuning/candidates/{slot}.json"
    assert fill(TUNING_CANDIDATE, slot="s1-m8-eager", profile="cpu") == (
        "results/cpu-tuning/candidates/s1-m8-eager.json"
    )
    under = CAMPAIGN.under("results/sweep")
    assert under.result == "results/sweep/{stage}/{run}/result.json"
    assert under.report.curves == "results/sweep/report/learning-curves.png"
    assert CAMPAIGN.result == "{campaign}/{stage}/{run}/result.json"  # the table itself is unchanged


def test_campaign_patterns_are_the_files_the_campaign_library_writes() -> None:
    """`tiny_llm campaign` (which cannot import the workflow plan) writes where the layout says."""
    config = campaign_lib.parse_campaign(
        {"stages": [{"size": "s", "lr": [0.001]}]}, {"s": {"preset": "tiny"}}, "results/c"
    )
    files = CAMPAIGN.under(config.root)
    assert campaign_lib.run_dir(config, "stage1", "r") == fill(files.run_dir, stage="stage1", run="r")
    assert campaign_lib.recipe_path(config, "stage1", "r") == fill(files.recipe, stage="stage1", run="r")
    assert campaign_lib.template_path(config, "s") == fill(files.template, size="s")
    assert campaign_lib.ranking_path(config, "stage1") == fill(files.ranking, stage="stage1")
    assert campaign_lib.tie_round_path(config, "stage1", 2) == fill(files.tie_round, stage="stage1", round=2)
    assert Path(files.record).parent == Path(files.settings).parent == Path(config.root)
    assert Path(files.record).name == "campaign.json"


@pytest.mark.parametrize("name", ["workflow_config.yaml", "config/cluster.yaml", "config/sweep-20m.yaml"])
def test_every_planned_file_is_a_layout_pattern_filled_in(name: str) -> None:
    plan = plan_of(shipped(name))
    regexes = [pattern_regex(p) for p in patterns().values()]
    cache = plan.data.cache_manifest
    planned = [path for stage in plan.stages for path in plan.targets(stage) if path != cache]
    planned += [path for path in plan.files._content]
    planned += [path for profile in plan.tuning.profiles for path in plan.tuning.candidates(profile)]
    planned += plan.packed.bench_files() + plan.campaign.templates() + plan.campaign.all_results()
    assert planned
    unmatched = [path for path in planned if not any(r.match(path) for r in regexes)]
    assert unmatched == []


def test_every_pattern_is_used_by_a_rule_or_the_plan() -> None:
    sources = "".join(path.read_text(encoding="utf-8") for path in RULE_FILES)
    for path in sorted((REPO / "tiny_llm/pipeline").glob("*.py")):
        if path != LAYOUT_FILE:
            sources += path.read_text(encoding="utf-8")
    for name in patterns():
        attribute = name.split(".")[-1]
        if name.startswith("CAMPAIGN.report_"):  # named through CampaignLayout.report, like RUNS_REPORT
            attribute = "report." + attribute.removeprefix("report_")
        assert re.search(rf"\b{re.escape(attribute)}\b", sources), name


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
        if isinstance(node, ast.ClassDef):  # attribute docstrings: a string right after a field
            for before, after in zip(node.body, node.body[1:], strict=False):
                if isinstance(before, ast.AnnAssign) and isinstance(after, ast.Expr):
                    found.add(id(after.value))
    return found


def test_no_results_path_outside_the_layout() -> None:
    """Strings that name results/ appear only in layout.py (comments and docstrings may describe it)."""
    stray = []
    for path in sorted((REPO / "tiny_llm").rglob("*.py")):
        if path == LAYOUT_FILE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and "results/" in text and id(node) not in docs:
                stray.append(f"{path.relative_to(REPO)}:{node.lineno}")
    for path in RULE_FILES:
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        for token in tokens:
            if token.type == tokenize.STRING and "results/" in token.string:
                stray.append(f"{path.relative_to(REPO)}:{token.start[0]}")
    assert stray == []


def test_rules_name_patterns_without_f_strings_or_doubled_braces() -> None:
    for path in RULE_FILES:
        text = path.read_text(encoding="utf-8")
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
        strings = [t for t in tokens if t.type == tokenize.STRING]
        assert not any("{{" in t.string for t in strings), path.name
        if path.name not in ("common.smk", "Snakefile"):  # their functions format messages, not paths
            assert not any(t.string[:2].lower() in ('f"', "f'") for t in strings), path.name


def test_layout_module_is_the_table_and_nothing_else() -> None:
    """Only constants, the campaign's pattern set and the fill helpers: no decisions hide here."""
    names = {name for name in vars(layout) if not name.startswith("_")}
    functions = {name for name in names if callable(getattr(layout, name)) and not name[0].isupper()}
    assert functions <= {"fill", "wildcards", "patterns", "dataclass", "fields", "annotations"}


def test_report_captions_name_wildcards_the_layout_has() -> None:
    """A caption's `snakemake.wildcards.X` must be a wildcard of some pattern: a renamed one renders empty."""
    known = set(re.findall(r"\{(\w+)\}", LAYOUT_FILE.read_text(encoding="utf-8")))
    report = REPO / "report"
    used = {
        (caption.name, name)
        for caption in report.glob("*.rst")
        for name in re.findall(r"snakemake\.wildcards\.(\w+)", caption.read_text(encoding="utf-8"))
    }
    assert used and all(name in known for _, name in used), sorted(used)
