"""Inputs a user gets wrong get one line naming the key or file and what to do: a leading ``~``, a missing
local corpus, corpus shards that are not UTF-8 or empty, a templated config YAML cannot read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from pipeline_helpers import plan_of, tiny

from tiny_llm.config import load_recipe
from tiny_llm.data.corpus import demo_documents, split_documents, write_c4_dir
from tiny_llm.data.sources import resolve_source
from tiny_llm.errors import ConfigError, DataError

# ------------------------------------------------------------------ ~ is the home directory


def test_a_tilde_in_the_run_and_cache_directories_is_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    recipe = load_recipe(["tiny"], ["runtime.output_dir=~/runs/a", "data.cache_dir=~/cache"])
    assert recipe.runtime.output_dir == str(tmp_path / "home" / "runs" / "a")
    assert recipe.data.cache_dir == str(tmp_path / "home" / "cache")


def test_the_workflow_expands_a_tilde_in_its_corpus_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    train, validation = split_documents(demo_documents(20_000), 0.1)
    write_c4_dir(home / "corpus", train, validation)
    plan = plan_of(tiny(data={"corpus": "~/corpus", "tokenizer": "train", "cache_dir": "~/cache"}))
    assert plan.data.cache_manifest == f"{home}/cache/manifest.json"
    assert plan.book.is_local_corpus() and plan.book.corpus_dataset() == str(home / "corpus")
    recipe = plan.book.size_recipe("tiny")
    assert recipe.data.dataset == str(home / "corpus") and recipe.data.cache_dir == str(home / "cache")


def test_a_missing_local_corpus_is_a_corpus_problem_not_a_tokenizer_one(tmp_path: Path) -> None:
    missing = tmp_path / "my-c4"
    with pytest.raises(ConfigError) as err:
        plan_of(tiny(data={"corpus": str(missing), "tokenizer": "train"}))
    assert str(err.value) == (
        f"data.corpus: directory {missing} not found (a local corpus is a directory in C4's layout; a hub "
        "corpus is named owner/name); fix the path"
    )


# ------------------------------------------------------------------ corpus shards


def corpus_with_train_shard(root: Path, content: bytes | None) -> tuple[Path, Path]:
    """A C4-format corpus whose train shard holds ``content`` gzipped (None: a file of zero bytes)."""
    train, validation = split_documents(demo_documents(20_000), 0.1)
    write_c4_dir(root, train, validation)
    shard = next(root.glob("c4-train.*.json.gz"))
    if content is None:
        shard.write_bytes(b"")
    else:
        with gzip.open(shard, "wb") as handle:
            handle.write(content)
    return root, shard


def train_split_error(corpus: Path) -> str:
    with pytest.raises(DataError) as err:
        for _ in resolve_source(str(corpus), None).iter_texts("train", 16):
            pass
    return str(err.value)


def test_a_latin1_train_shard_is_named_as_not_utf8_not_as_corrupt_gzip(tmp_path: Path) -> None:
    good = json.dumps({"text": "Tea time"}) + "\n"
    latin = (json.dumps({"text": "Caf\u00e9 au lait"}, ensure_ascii=False) + "\n").encode("latin-1")
    corpus, shard = corpus_with_train_shard(tmp_path / "c4", good.encode() + latin)
    assert train_split_error(corpus) == (
        f"{shard}: line 2 is not UTF-8 text (byte 0xe9 at column 14); C4 JSON lines are UTF-8: convert the "
        "file (iconv -f latin1 -t utf-8, say) and compress it again"
    )


@pytest.mark.parametrize("content", [b"", None], ids=["empty-gzip", "zero-bytes"])
def test_an_empty_train_shard_is_named(tmp_path: Path, content: bytes | None) -> None:
    corpus, shard = corpus_with_train_shard(tmp_path / "c4", content)
    assert train_split_error(corpus) == (
        f"{shard}: holds no documents (an empty file); remove it, or write its documents into it"
    )


# ------------------------------------------------------------------ templates


@pytest.mark.parametrize(
    "body",
    [
        "sizes: {}\n",
        "?if False:\n  sizes: !!python/tuple [1, 2]\n?else:\n  sizes: {}\n",  # safe_load cannot read the tag
        "?if False:\n  runs: !!python/object/apply:os.system ['true']\n",
    ],
    ids=["plain", "python-tuple-under-a-false-if", "python-object"],
)
def test_a_template_is_refused_whatever_tags_it_holds(tmp_path: Path, body: str) -> None:
    from tiny_llm.pipeline.schema import refuse_templates

    config = tmp_path / "templated.yaml"
    config.write_text("__use_yte__: true\n" + body, encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        refuse_templates([config])
    assert str(err.value) == (
        f"{config}: __use_yte__ (Snakemake's YAML templates, which run Python) is not allowed in a workflow "
        "config; remove the key and write the values out"
    )
    plain = tmp_path / "plain.yaml"
    plain.write_text("sizes: {}\nnote: __use_yte__\n", encoding="utf-8")
    refuse_templates([plain])  # the text alone, as a value, is no template


def test_a_recipe_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_bytes("data: {cache_dir: caf\u00e9}\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_recipe(["tiny", str(path)])
    assert str(err.value) == f"{path}: not UTF-8 text (byte 0xe9 at offset 21); save it as UTF-8"


# ------------------------------------------------------------------ the table of bad inputs


def bad_inputs_script():
    import importlib.util
    import sys

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    if str(benchmarks) not in sys.path:
        sys.path.insert(0, str(benchmarks))
    spec = importlib.util.spec_from_file_location("bad_inputs_benchmark", benchmarks / "bad_inputs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def table_rows(script) -> dict[str, list[str]]:
    """The bad-input table of benchmarks/README.md: input -> its cells."""
    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "README.md").read_text(encoding="utf-8")
    section = text[text.index(script.BEGIN) : text.index(script.END)]
    rows = [
        line.strip("|").split(" | ")
        for line in section.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    return {cells[1].strip(): [c.strip() for c in cells] for cells in rows[1:]}


def test_the_table_holds_at_least_45_handled_inputs_each_as_the_script_ran_it() -> None:
    script = bad_inputs_script()
    rows = table_rows(script)
    assert len(rows) >= 45 and len(rows) == len(script.CASES)
    assert {case.what for case in script.CASES} == set(rows)
    for what, cells in rows.items():
        assert "traceback" not in cells[3].lower() and (
            cells[2] != "0" or cells[3].startswith("(accepted")
        ), what


@pytest.mark.parametrize("name", ["batch-tokens-1e30", "set-5000-digits", "recipe-latin1"])
def test_a_row_of_the_table_is_what_its_case_prints_today(tmp_path: Path, name: str) -> None:
    script = bad_inputs_script()
    case = next(c for c in script.CASES if c.name == name)
    result = script.run_case(case, tmp_path, tmp_path / "unused")
    assert result["handled"]
    printed = script.table([result], tmp_path).splitlines()[-1].split(" | ", 3)[3].rstrip(" |")
    assert table_rows(script)[case.what][3] == printed
