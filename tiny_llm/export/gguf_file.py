"""``model.gguf``: an export for llama.cpp (and ollama, LM Studio), written with the ``gguf`` package.

llama.cpp's ``llama`` architecture is ours: pre-norm blocks, RMSNorm, SwiGLU, RoPE, tied embedding (no
``output.weight``: llama.cpp then uses ``token_embd.weight`` as the head). Two things differ from the
Hugging Face files:

- RoPE: ggml's Llama rotates adjacent pairs (2i, 2i+1), ours and transformers' rotate halves (i, i + d/2),
  so the rows of every head's q and k projections are permuted (``interleave_heads``), as llama.cpp's
  converter does; attention scores, and so the outputs, are unchanged.
- The tokenizer is written into the file, in the form llama.cpp tokenizes with:

  - a SentencePiece ``tokenizer.model`` (TinyLlama's family): ``llama`` model, its pieces, scores and types;
  - a Llama-style ``tokenizer.json`` (BPE with byte fallback, ``▁`` for spaces; what the hub serves for
    TinyLlama): ``llama`` model, with each piece scored by its earliest merge, so that llama.cpp's
    highest-score-first merging merges in the BPE's order;
  - the demo's byte-level BPE: ``gpt2`` model with its merges and the ``gpt-2`` pre-tokenizer, the GPT-2 split
    rule that ``tokenizers``' ByteLevel pre-tokenizer applies. (llama.cpp's own converter recognises BPE
    pre-tokenizers by hashing their output on a fixed text, so it refuses every tokenizer trained here.)

No BOS or EOS is added when encoding, as in the token cache; EOS ends a document.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny_llm.config import ModelConfig
from tiny_llm.errors import DataError
from tiny_llm.export.tokenizer import TokenizerFacts

GGUF_FILE = "model.gguf"
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass(frozen=True)
class GGUFVocab:
    """The tokenizer as llama.cpp reads it."""

    model: str
    """tokenizer.ggml.model: ``llama`` (SentencePiece-style) or ``gpt2`` (byte-level BPE)."""
    pre: str
    """tokenizer.ggml.pre: the pre-tokenizer llama.cpp applies before the model."""
    tokens: list[str]
    scores: list[float]
    types: list[int]
    merges: list[str]
    add_space_prefix: bool | None
    """SentencePiece's dummy prefix (a ``▁`` before the text); None for byte-level BPE."""


def gguf_module():
    """The ``gguf`` package, or a one-line error saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise DataError("--gguf needs the gguf package: pip install gguf") from None
    return gguf


# ------------------------------------------------------------------------------------------- weights


def interleave_heads(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """q/k projection rows from rotate-half order to ggml's adjacent-pair RoPE order, head by head."""
    rows, cols = weight.shape
    half = rows // num_heads // 2
    return weight.reshape(num_heads, 2, half, cols).transpose(1, 2).reshape(rows, cols)


def gguf_tensors(
    hf_tensors: dict[str, torch.Tensor], model: ModelConfig, n_blocks: int
) -> dict[str, torch.Tensor]:
    """transformers' Llama tensors under llama.cpp's names, q and k permuted for its RoPE."""
    gguf = gguf_module()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    out = {}
    for name, tensor in hf_tensors.items():
        new = names.get_name(name, try_suffixes=(".weight",))
        if new is None:
            raise DataError(f"GGUF export: no llama.cpp name for tensor {name}")
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            tensor = interleave_heads(tensor, model.num_heads)
        out[new] = tensor
    return out


# ------------------------------------------------------------------------------------------- tokenizer


def gguf_vocab(directory: Path, facts: TokenizerFacts, vocab_size: int) -> GGUFVocab:
    """The exported tokenizer in ``directory`` (tokenizer.model or tokenizer.json) as llama.cpp reads it."""
    if (directory / "tokenizer.model").is_file():
        vocab = _sentencepiece_vocab(directory)
    else:
        data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        model = data.get("model") or {}
        if model.get("type") != "BPE":
            raise DataError(f"GGUF export: a {model.get('type')} tokenizer.json has no llama.cpp form")
        if model.get("byte_fallback"):
            vocab = _llama_bpe_vocab(data, facts)
        else:
            vocab = _byte_level_vocab(directory, data, facts)
    if len(vocab.tokens) != vocab_size:
        raise DataError(
            f"GGUF export: the tokenizer has {len(vocab.tokens)} tokens, model.vocab_size is {vocab_size}"
        )
    return vocab


def _sentencepiece_vocab(directory: Path) -> GGUFVocab:
    gguf_module()  # a one-line error where it is missing
    from gguf.vocab import SentencePieceVocab

    vocab = SentencePieceVocab(directory)
    tokens, scores, types = [], [], []
    for text, score, kind in vocab.all_tokens():
        tokens.append(text.decode("utf-8"))
        scores.append(score)
        types.append(int(kind))
    processor = vocab.sentencepiece_tokenizer
    # The dummy prefix lives in the model's normalizer spec; its effect shows on any text.
    prefixed = processor.encode("a", out_type=str)[0].startswith("\u2581")
    return GGUFVocab("llama", "default", tokens, scores, types, [], prefixed)


def _id_ordered(data: dict[str, Any]) -> dict[int, str]:
    """Every token of a tokenizer.json by id: the model's vocabulary and the added tokens."""
    by_id = {index: token for token, index in data["model"]["vocab"].items()}
    for added in data.get("added_tokens") or []:
        by_id[added["id"]] = added["content"]
    if sorted(by_id) != list(range(len(by_id))):
        raise DataError("GGUF export: tokenizer.json token ids are not contiguous from 0")
    return by_id


def _merge_pairs(merges: list[Any]) -> list[tuple[str, str]]:
    """tokenizer.json merges, old ("a b") or new (["a", "b"]) format."""
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    return [(pair[0], pair[1]) for pair in pairs]


def _special_ids(facts: TokenizerFacts, data: dict[str, Any]) -> set[int]:
    ids = {added["id"] for added in data.get("added_tokens") or [] if added.get("special")}
    return ids | {i for i in (facts.bos_token_id, facts.eos_token_id) if i is not None}


def _llama_bpe_vocab(data: dict[str, Any], facts: TokenizerFacts) -> GGUFVocab:
    """A Llama-style tokenizer.json (SentencePiece BPE converted: byte fallback, ``▁`` for spaces)."""
    gguf = gguf_module()
    by_id = _id_ordered(data)
    rank: dict[str, int] = {}
    for index, (left, right) in enumerate(_merge_pairs(data["model"].get("merges") or [])):
        rank.setdefault(left + right, index)
    specials = _special_ids(facts, data)
    unk = data["model"].get("unk_token")
    tokens, scores, types = [], [], []
    for index in range(len(by_id)):
        token = by_id[index]
        if token == unk:
            kind = gguf.TokenType.UNKNOWN
        elif index in specials:
            kind = gguf.TokenType.CONTROL
        elif _BYTE_PIECE.fullmatch(token):
            kind = gguf.TokenType.BYTE
        else:
            kind = gguf.TokenType.NORMAL
        tokens.append(token)
        # llama.cpp merges the pair whose result scores highest: the earliest merge, as the BPE does.
        scores.append(-float(rank[token]) if token in rank else 0.0)
        types.append(int(kind))
    return GGUFVocab("llama", "default", tokens, scores, types, [], _prepends_space(data))


def _prepends_space(data: dict[str, Any]) -> bool:
    """Whether the tokenizer puts ``▁`` before the text (a Prepend normalizer or a Metaspace prefix)."""
    text = json.dumps([data.get("normalizer"), data.get("pre_tokenizer")])
    return '"Prepend"' in text or ('"Metaspace"' in text and '"prepend_scheme": "never"' not in text)


def _byte_level_vocab(directory: Path, data: dict[str, Any], facts: TokenizerFacts) -> GGUFVocab:
    """A byte-level BPE (the demo's): GPT-2's split rule, byte-to-unicode tokens, ranked merges."""
    gguf = gguf_module()
    from gguf.vocab import SpecialVocab

    pre = data.get("pre_tokenizer") or {}
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        raise DataError(
            f"GGUF export: pre-tokenizer {json.dumps(pre)[:80]} has no llama.cpp equivalent "
            "(byte-level BPE with GPT-2's split rule is supported)"
        )
    by_id = _id_ordered(data)
    specials = _special_ids(facts, data)
    control, normal = int(gguf.TokenType.CONTROL), int(gguf.TokenType.NORMAL)
    types = [control if index in specials else normal for index in range(len(by_id))]
    merges = SpecialVocab(directory, load_merges=True).merges
    tokens = [by_id[index] for index in range(len(by_id))]
    return GGUFVocab("gpt2", "gpt-2", tokens, [0.0] * len(tokens), types, merges, None)


# ------------------------------------------------------------------------------------------- file


def write_gguf(
    path: Path,
    *,
    name: str,
    model: ModelConfig,
    hf_tensors: dict[str, torch.Tensor],
    tokenizer_dir: Path,
    facts: TokenizerFacts,
) -> GGUFVocab:
    """Write ``path``: llama-architecture metadata, the tokenizer, the weights (F32, or BF16 matrices)."""
    gguf = gguf_module()
    vocab = gguf_vocab(tokenizer_dir, facts, model.vocab_size)
    bf16 = any(t.dtype == torch.bfloat16 for t in hf_tensors.values())
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_name(name)
    writer.add_context_length(model.context_length)
    writer.add_embedding_length(model.width)
    writer.add_block_count(model.num_layers)
    writer.add_feed_forward_length(model.ffn_width)
    writer.add_head_count(model.num_heads)
    writer.add_head_count_kv(model.num_heads)
    writer.add_rope_dimension_count(model.width // model.num_heads)
    writer.add_rope_freq_base(model.rope_theta)
    writer.add_layer_norm_rms_eps(model.norm_eps)
    writer.add_vocab_size(model.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16 if bf16 else gguf.LlamaFileType.ALL_F32)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_vocab(writer, vocab, facts)
    for tensor_name, tensor in gguf_tensors(hf_tensors, model, model.num_layers).items():
        data = tensor.float().numpy()
        if bf16 and data.ndim == 2:  # norms stay F32, as llama.cpp's converter keeps them
            kind = gguf.GGMLQuantizationType.BF16
            writer.add_tensor(tensor_name, gguf.quants.quantize(data, kind), raw_dtype=kind)
        else:
            writer.add_tensor(tensor_name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return vocab


def _add_vocab(writer: Any, vocab: GGUFVocab, facts: TokenizerFacts) -> None:
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_scores(vocab.scores)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    writer.add_eos_token_id(facts.eos_token_id)
    if facts.bos_token_id is not None:
        writer.add_bos_token_id(facts.bos_token_id)
    unk = [i for i, t in enumerate(vocab.tokens) if t == "<unk>"]
    if unk:
        writer.add_unk_token_id(unk[0])
    writer.add_pad_token_id(facts.eos_token_id)  # as generation_config.json: batch 1 never pads
    writer.add_add_bos_token(False)  # the cache encodes without special tokens
    writer.add_add_eos_token(False)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
