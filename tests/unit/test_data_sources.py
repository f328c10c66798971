"""Corpus sources, tokenizers and the demo corpus: formats, offline failure, markup removal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tiny_llm.cli import main
from tiny_llm.config import load_recipe
from tiny_llm.data import sources
from tiny_llm.data.corpus import split_documents, strip_wiki_markup
from tiny_llm.data.prepare import prepare_cache
from tiny_llm.data.sources import resolve_source
from tiny_llm.data.tokenizer import check_tokenizer, load_tokenizer, train_tokenizer
from tiny_llm.errors import DataError

TEXT = "A literal <s> and </s> stay text. Ünïcödé and emoji 🙂 survive byte-level BPE."


def test_tiny_tokenizer_is_exact_size_byte_level_and_loads_every_way(tiny_tokenizer_dir: Path):
    by_dir = load_tokenizer(str(tiny_tokenizer_dir))
    by_file = load_tokenizer(str(tiny_tokenizer_dir / "tokenizer.json"))
    assert by_dir.vocab_size == 512 and by_dir.eos_token_id == 2
    assert by_dir.fingerprint == by_file.fingerprint
    ids = by_dir.encode_batch([TEXT])[0]
    assert max(ids) < 512 and 0 not in ids and 1 not in ids and 2 not in ids  # no <unk>, BOS or EOS
    assert by_dir.tokenizer.decode(ids) == TEXT
    check_tokenizer(by_dir, 512, "t")
    with pytest.raises(DataError, match="has 512 tokens but model.vocab_size is 500"):
        check_tokenizer(by_dir, 500, "t")


def test_train_tokenizer_cli(tiny_corpus_dir: Path, tmp_path: Path, capsys):
    from tiny_llm.cli import main

    output = tmp_path / "tok"
    assert (
        main(
            [
                "train-tokenizer",
                "--input",
                str(tiny_corpus_dir),
                "--vocab-size",
                "300",
                "--output",
                str(output),
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["vocab_size"] == 300 and summary["eos_token_id"] == 2
    assert load_tokenizer(str(output)).fingerprint == summary["fingerprint"]
    with pytest.raises(DataError, match="--vocab-size"):
        train_tokenizer(["x"], 100, tmp_path / "small")


def test_sentencepiece_model_loads_without_bos_and_keeps_literal_specials(tmp_path: Path):
    import sentencepiece

    lines = [f"Sentence number {i} talks about rivers, towns, storms and harvests." for i in range(300)]
    (tmp_path / "text.txt").write_text("\n".join(lines))
    sentencepiece.SentencePieceTrainer.train(
        input=str(tmp_path / "text.txt"),
        model_prefix=str(tmp_path / "sp"),
        vocab_size=400,
        hard_vocab_limit=False,
        model_type="bpe",
        byte_fallback=True,
        bos_id=1,
        eos_id=2,
        unk_id=0,
        minloglevel=2,
    )
    tokenizer = load_tokenizer(str(tmp_path / "sp.model"))
    assert tokenizer.backend == "sentencepiece" and tokenizer.eos_token_id == 2
    ids = tokenizer.encode_batch(["<s> rivers </s>"])[0]
    assert 1 not in ids and 2 not in ids
    assert tokenizer.processor.decode(ids) == "<s> rivers </s>"


def test_hub_sources_fail_fast_offline(tiny_recipe_args, tmp_path, monkeypatch):
    """Offline, the hub is never contacted; otherwise one TCP probe, bounded by PROBE_TIMEOUT_S, decides."""
    base = tiny_recipe_args(tmp_path / "cache")
    probes: list[float] = []
    reachable = sources.hub_reachable

    def recorded(timeout: float = sources.PROBE_TIMEOUT_S) -> bool:
        probes.append(timeout)
        return reachable(timeout)

    monkeypatch.setattr(sources, "hub_reachable", recorded)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for override, what in (
        ("data.dataset=allenai/c4", "dataset allenai/c4"),
        ("data.tokenizer=org/tok", "tokenizer"),
    ):
        recipe = load_recipe(["tiny"], [*base, override])
        with pytest.raises(DataError, match=f"{what}.* needs the Hugging Face hub but HF_HUB_OFFLINE"):
            prepare_cache(recipe, progress=False)
    assert probes == []
    # Without the offline switch a fast TCP probe decides (here: a closed local port).
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(sources, "_hub_endpoint", lambda: "http://127.0.0.1:9")
    with pytest.raises(DataError, match="not reachable"):
        prepare_cache(load_recipe(["tiny"], [*base, "data.dataset=allenai/c4"]), progress=False)
    assert probes == [sources.PROBE_TIMEOUT_S]  # one probe, its wait bounded
    assert not (tmp_path / "cache").exists()


def test_hub_dataset_streams_pinned_c4_patterns():
    source = resolve_source("allenai/c4", "1588ec454efa1a09f29cd18ddd04fe05fc8653a2")
    assert not source.is_local
    assert source.data_files("validation") == [
        "hf://datasets/allenai/c4@1588ec454efa1a09f29cd18ddd04fe05fc8653a2/en/c4-validation.*.json.gz"
    ]
    with pytest.raises(DataError, match="dataset directory not found: results/no/corpus"):
        resolve_source("results/no/corpus", None)  # two slashes: a path, never a hub id


def test_shuffle_is_seeded_and_train_only(tiny_corpus_dir: Path):
    source = resolve_source(str(tiny_corpus_dir), None)

    def first_texts(seed: int | None) -> list[str]:
        return next(iter(source.iter_texts("train", 16, shuffle_seed=seed, shuffle_buffer=64)))

    assert first_texts(1) == first_texts(1) != first_texts(2)
    assert first_texts(None) == next(iter(source.iter_texts("train", 16)))


def test_wiki_markup_is_removed():
    raw = (
        "{{Infobox person|name=X|born={{birth date|1900|1|1}}}}'''Ada''' was a [[mathematician]] "
        "and [[Writer|author]].<ref>{{cite book|title=T}}</ref> See [https://example.org the site].\n"
        "[[File:Ada.jpg|thumb|A [[portrait]]]]\n{| class=wikitable\n|-\n| cell\n|}\n"
        "* A list item &amp; more<!-- hidden -->\n[[Category:People]]\n== Life ==\nShe lived."
    )
    assert strip_wiki_markup(raw) == (
        "Ada was a mathematician and author. See the site.\n\nA list item & more\n\n== Life ==\nShe lived."
    )


def test_validation_split_is_held_out_every_kth_document():
    from tiny_llm.data.corpus import Document

    docs = [Document(str(i), "u") for i in range(100)]
    train, validation = split_documents(docs, 0.05)
    assert [d.text for d in validation] == [str(i) for i in range(19, 100, 20)]
    assert len(train) == 95 and not {d.text for d in train} & {d.text for d in validation}


def test_build_demo_corpus_cli_rejects_a_bad_fraction(tmp_path: Path, capsys):
    from tiny_llm.cli import main

    assert main(["build-demo-corpus", "--output", str(tmp_path / "c"), "--validation-fraction", "0.7"]) == 2
    assert capsys.readouterr().err.strip() == "error: --validation-fraction must be in (0, 0.5), got 0.7"
    assert not (tmp_path / "c").exists()


def test_hub_tokenizer_loads_offline_from_the_local_hub_cache(
    tiny_tokenizer_dir: Path, tmp_path, monkeypatch
):
    import shutil

    from huggingface_hub import constants

    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--org--tok" / "snapshots" / revision
    shutil.copytree(tiny_tokenizer_dir, snapshot)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = load_tokenizer("org/tok", revision)
    assert tokenizer.fingerprint == load_tokenizer(str(tiny_tokenizer_dir)).fingerprint
    with pytest.raises(DataError, match="tokenizer org/tok needs the Hugging Face hub"):
        load_tokenizer("org/tok", "f" * 40)  # another revision is not cached


def test_train_tokenizer_never_deletes_a_directory_it_did_not_write(
    tmp_path: Path, tiny_corpus_dir: Path, capsys
):
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "chapter1.tex").write_text("years of work")
    args = [
        "train-tokenizer",
        "--input",
        str(tiny_corpus_dir),
        "--vocab-size",
        "300",
        "--output",
        str(thesis),
    ]
    assert main(args) == 2
    assert "did not write" in capsys.readouterr().err
    assert main([*args, "--force"]) == 2  # --force replaces only our own outputs
    assert (thesis / "chapter1.tex").read_text() == "years of work"


def test_train_tokenizer_replaces_its_own_output_only_with_force(
    tmp_path: Path, tiny_corpus_dir: Path, capsys
):
    output = tmp_path / "tokenizer"
    args = [
        "train-tokenizer",
        "--input",
        str(tiny_corpus_dir),
        "--vocab-size",
        "300",
        "--output",
        str(output),
    ]
    assert main(args) == 0
    first = (output / "tokenizer.json").read_bytes()
    capsys.readouterr()
    assert main(args) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (output / "tokenizer.json").read_bytes() == first
    assert main([*args, "--force"]) == 0
    assert load_tokenizer(str(output)).vocab_size == 300
