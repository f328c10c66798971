"""Bits per byte (SPEC §12): each tokenizer's bytes per id, and evaluation's sums over the text targets."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tiny_llm.config import load_recipe
from tiny_llm.data.cache import open_cache
from tiny_llm.data.loader import iter_validation
from tiny_llm.data.sources import resolve_source
from tiny_llm.data.tokenizer import load_tokenizer, piece_bytes
from tiny_llm.model import Llama
from tiny_llm.train import evaluate as evaluate_module

# ASCII, runs of spaces, a newline and a tab, accents, CJK, an emoji: every UTF-8 length from 1 to 4 bytes.
TEXT = "Hello  world,\n the café served 日本 tea 🙂 to a naïve\tguest  "
LLAMA_STYLE = {  # how a Llama-style 32k SentencePiece model is trained (its normalizer is the identity)
    "model_type": "bpe",
    "byte_fallback": True,
    "split_digits": True,
    "normalization_rule_name": "identity",
    "remove_extra_whitespaces": False,
    "unk_id": 0,
    "bos_id": 1,
    "eos_id": 2,
    "minloglevel": 2,
}


def test_bits_per_byte_sums_the_nats_and_bytes_of_the_text_targets_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """By hand: ids 0 (EOS, 0 bytes), 1 ('a', 1), 2 ('é', 2), 3 ('▁the', 4); an ignored target adds
    nothing."""
    table = torch.tensor([0, 1, 2, 4])
    targets = torch.tensor([[1, 2, 0, 3, -100]])
    losses = torch.tensor([1.0, 2.0, 5.0, 3.0, 0.0])  # what token_losses gives (0 where ignored)
    monkeypatch.setattr(evaluate_module, "token_losses", lambda model, inputs, t: losses)
    batches = [(torch.zeros_like(targets), targets)]
    recipe, cpu = load_recipe(["tiny"]), torch.device("cpu")
    sums = evaluate_module.evaluate_sums(torch.nn.Identity(), batches, recipe, cpu, token_bytes=table)
    assert sums.loss == pytest.approx(11 / 4) and sums.tokens == 4  # the loss keeps EOS, as it always did
    assert sums.bytes == 7 and sums.bpb == pytest.approx((1 + 2 + 3) / (math.log(2) * 7))
    without = evaluate_module.evaluate_sums(torch.nn.Identity(), batches, recipe, cpu)
    assert (without.loss, without.bpb, without.bytes) == (sums.loss, None, None)


def test_a_piece_is_its_text_a_space_marker_and_a_byte_piece_one_byte_each() -> None:
    assert [piece_bytes(p) for p in ("▁the", "▁", "<0xE9>", "é", "日本", "<0xZZ>")] == [4, 1, 1, 2, 6, 6]


def test_the_byte_level_tokenizer_counts_the_utf8_length_of_the_text(tiny_tokenizer_dir: Path) -> None:
    """The demo's tokenizer (a byte-level BPE like `tiny`'s): one byte per character of the byte alphabet."""
    tokenizer = load_tokenizer(str(tiny_tokenizer_dir))
    sizes = tokenizer.token_bytes()
    ids = tokenizer.encode_batch([TEXT])[0]
    assert sum(sizes[i] for i in ids) == len(TEXT.encode("utf-8"))
    assert sizes[tokenizer.eos_token_id] == 0 and sizes[:3] == [0, 0, 0]  # <unk>, <s>, </s>


@pytest.fixture(scope="module")
def sentencepiece_dir(tmp_path_factory: pytest.TempPathFactory, tiny_corpus_dir: Path) -> Path:
    """A small Llama-style SentencePiece model (byte fallback, identity normalizer) trained on the corpus."""
    import sentencepiece

    directory = tmp_path_factory.mktemp("sentencepiece")
    source = resolve_source(str(tiny_corpus_dir), None)
    texts = [t for batch in source.iter_texts("train", batch_size=64) for t in batch][:200]
    (directory / "text.txt").write_text("\n".join(texts))
    sentencepiece.SentencePieceTrainer.train(
        input=str(directory / "text.txt"),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=1000,
        **LLAMA_STYLE,
    )
    return directory


def test_sentencepiece_counts_the_text_plus_its_dummy_prefix_space(sentencepiece_dir: Path) -> None:
    tokenizer = load_tokenizer(str(sentencepiece_dir / "tokenizer.model"))
    sizes = tokenizer.token_bytes()
    ids = tokenizer.encode_batch([TEXT])[0]
    pieces = [tokenizer.processor.id_to_piece(i) for i in ids]
    assert any(p.startswith("<0x") for p in pieces) and "▁" in "".join(pieces)  # both rules are exercised
    assert sum(sizes[i] for i in ids) == len(TEXT.encode("utf-8")) + 1
    assert sizes[:3] == [0, 0, 0] and set(sizes[3:259]) == {1}  # <unk>, <s>, </s>; the 256 byte pieces


def test_a_llama_tokenizer_json_counts_as_its_sentencepiece_model(
    sentencepiece_dir: Path, tmp_path: Path
) -> None:
    """The hub's Llama tokenizers come as tokenizer.json (Metaspace, byte fallback): the same ids, the same
    bytes as the SentencePiece model they were converted from."""
    transformers = pytest.importorskip("transformers")
    model_dir = tmp_path / "spm"
    model_dir.mkdir()
    (model_dir / "tokenizer.model").write_bytes((sentencepiece_dir / "tokenizer.model").read_bytes())
    converted = transformers.LlamaTokenizer.from_pretrained(str(model_dir), legacy=True)._tokenizer
    json_dir = tmp_path / "json"
    json_dir.mkdir()
    converted.save(str(json_dir / "tokenizer.json"))
    (json_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    fast, slow = load_tokenizer(str(json_dir)), load_tokenizer(str(model_dir))
    assert fast.backend == "tokenizers"
    assert fast.encode_batch([TEXT]) == slow.encode_batch([TEXT])
    assert fast.token_bytes() == slow.token_bytes()


@pytest.mark.slow  # about 2 s: the corpus's validation texts and a model over the whole split
def test_a_full_validation_counts_every_byte_of_the_split_but_the_first_token(
    tiny_cache: Path, tiny_corpus_dir: Path
) -> None:
    """Σ bytes over the full validation's targets = the split's UTF-8 length less its first token (the one
    token that is no target); bits per byte = the text targets' nats over ln 2 · bytes."""
    cache = open_cache(tiny_cache)
    table = evaluate_module.byte_table(cache)
    assert table is not None and cache.validation_complete
    source = resolve_source(str(tiny_corpus_dir), None)
    text_bytes = sum(len(t.encode("utf-8")) for b in source.iter_texts("validation", 256) for t in b)
    first = int(cache.read("validation", 0, 1)[0])
    recipe = load_recipe(
        ["tiny"], ["model.num_layers=1", "model.width=32", "model.num_heads=2", "model.ffn_width=64"]
    )
    torch.manual_seed(0)
    model, cpu = Llama(recipe.model), torch.device("cpu")
    batches = list(iter_validation(cache, recipe.model.context_length, 64))
    sums = evaluate_module.evaluate_sums(model, batches, recipe, cpu, token_bytes=table)
    assert sums.bytes == text_bytes - int(table[first])
    targets = torch.cat([t.flatten() for _, t in batches])
    with torch.no_grad():
        losses = torch.cat([evaluate_module.token_losses(model, i, t) for i, t in batches]).double()
    text = (targets >= 0) & (table[targets.clamp_min(0)] > 0)
    assert sums.bpb == pytest.approx(float(losses[text].sum()) / (math.log(2) * sums.bytes), rel=1e-9)
    assert sums.loss == pytest.approx(float(losses.sum()) / sums.tokens, rel=1e-9)
