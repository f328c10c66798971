"""The token cache's tokenizer as files ``transformers.AutoTokenizer`` loads, encoding as the cache did.

The cache encodes every document without special tokens (no BOS), keeps literal ``<s>``/``</s>`` in the
text as text, and appends EOS after each document. The exported files reproduce the first two by default
(``tokenizer(text)`` gives the cache's ids; a user appends ``eos_token_id`` after a document):

- ``tokenizer.json`` (trained byte-level BPE, hub tokenizers): copied, except that a post-processor
  template adding special tokens (a hub Llama tokenizer's ``<s> $A``) is dropped; ``tokenizer_config.json``
  names the generic fast tokenizer class, the special tokens, ``split_special_tokens: true`` and no BOS/EOS.
- ``tokenizer.model`` (SentencePiece): copied, with a Llama tokenizer config without BOS/EOS; transformers
  reads it through its own Llama tokenizer (which needs ``protobuf``), which encodes as SentencePiece does
  for Llama-style models (identity normalisation, dummy prefix) only.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_llm.data.tokenizer import HFTokenizer, SentencePieceTokenizer, load_tokenizer
from tiny_llm.errors import DataError

SPECIAL_TOKEN_TEMPLATES = ("TemplateProcessing", "BertProcessing", "RobertaProcessing")


@dataclass(frozen=True)
class TokenizerFacts:
    """What config.json and the model card say about the exported tokenizer."""

    backend: str
    eos_token: str
    eos_token_id: int
    bos_token: str | None
    bos_token_id: int | None
    files: tuple[str, ...]
    dropped_template: bool
    """True when a post-processor that added special tokens was removed from tokenizer.json."""


def without_special_token_templates(processor: dict[str, Any] | None) -> dict[str, Any] | None:
    """A tokenizer.json post-processor without the parts that add special tokens (None if nothing is left)."""
    if processor is None:
        return None
    if processor.get("type") in SPECIAL_TOKEN_TEMPLATES:
        return None
    if processor.get("type") == "Sequence":
        kept = [p for p in map(without_special_token_templates, processor.get("processors", [])) if p]
        if not kept:
            return None
        return {**processor, "processors": kept}
    return processor


def _special(tokens: dict[str, int], *candidates: str | None) -> tuple[str | None, int | None]:
    for token in candidates:
        if token and token in tokens:
            return token, tokens[token]
    return None, None


def _configured(directory: Path, key: str) -> str | None:
    """A special token named in the cache tokenizer's tokenizer_config.json / special_tokens_map.json."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = directory / name
        if file.is_file():
            value = json.loads(file.read_text(encoding="utf-8")).get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str) and value:
                return value
    return None


def export_tokenizer(
    cache_dir: Path, output: Path, *, eos_token_id: int, context_length: int
) -> TokenizerFacts:
    """Write the cache's tokenizer into the existing directory ``output``; check its EOS against the cache."""
    source = Path(cache_dir) / "tokenizer"
    if not source.is_dir():
        raise DataError(f"token cache {cache_dir} has no tokenizer/ directory to export")
    tokenizer = load_tokenizer(str(source))
    if tokenizer.eos_token_id != eos_token_id:
        raise DataError(
            f"tokenizer in {source} has EOS id {tokenizer.eos_token_id}, "
            f"the cache manifest says {eos_token_id}"
        )
    common = {
        "add_bos_token": False,
        "add_eos_token": False,
        "split_special_tokens": True,  # literal "</s>" in a text stays text, as in the cache
        "clean_up_tokenization_spaces": False,
        "model_max_length": context_length,
    }
    if isinstance(tokenizer, HFTokenizer):
        data = json.loads((source / "tokenizer.json").read_text(encoding="utf-8"))
        processor = without_special_token_templates(data.get("post_processor"))
        dropped = processor != data.get("post_processor")
        data["post_processor"] = processor
        (output / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
        vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
        bos, bos_id = _special(vocab, _configured(source, "bos_token"), "<s>", "<|begin_of_text|>")
        unk = (data.get("model") or {}).get("unk_token") or _configured(source, "unk_token")
        unk, _ = _special(vocab, unk, "<unk>")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **common}
        eos = tokenizer.eos_token
        files = ("tokenizer.json", "tokenizer_config.json")
    elif isinstance(tokenizer, SentencePieceTokenizer):
        shutil.copyfile(tokenizer.model_file, output / "tokenizer.model")
        processor_ = tokenizer.processor
        eos = processor_.id_to_piece(eos_token_id)
        bos_id = processor_.bos_id() if processor_.bos_id() >= 0 else None
        bos = processor_.id_to_piece(bos_id) if bos_id is not None else None
        unk = processor_.id_to_piece(processor_.unk_id()) if processor_.unk_id() >= 0 else None
        config = {"tokenizer_class": "LlamaTokenizer", "legacy": False, **common}
        dropped = False
        files = ("tokenizer.model", "tokenizer_config.json")
    else:  # pragma: no cover - load_tokenizer returns one of the two
        raise DataError(f"tokenizer in {source}: backend {tokenizer.backend} cannot be exported")
    specials = {"bos_token": bos, "eos_token": eos, "unk_token": unk}
    config.update({k: v for k, v in specials.items() if v is not None})
    (output / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return TokenizerFacts(tokenizer.backend, eos, eos_token_id, bos, bos_id, files, dropped)


def set_bos_token(
    directory: Path, facts: TokenizerFacts, token: str | None, token_id: int | None
) -> TokenizerFacts:
    """Declare ``token`` (None: no BOS) as BOS in the exported tokenizer_config.json; the facts to match."""
    file = directory / "tokenizer_config.json"
    config = json.loads(file.read_text(encoding="utf-8"))
    config.pop("bos_token", None)
    if token is not None:
        config["bos_token"] = token
    file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return dataclasses.replace(facts, bos_token=token, bos_token_id=token_id)
