"""Tokenizers for the token cache: load (hub, tokenizer.json, tokenizer.model, saved dir), train, fingerprint.

Every backend encodes without special tokens (no BOS) and treats literal ``<s>``/``</s>`` in the text as
text; the cache writer appends EOS after every document.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tiny_llm.errors import DataError
from tiny_llm.io import canonical_json
from tiny_llm.output_dirs import replacing_directory

MAX_UINT16_VOCAB = 65536
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "<|end_of_text|>")
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # Llama's order, so EOS is id 2 as in the reference tokenizer
SPACE_MARKER = "\u2581"  # SentencePiece's "▁": one space of the text
BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback piece: one byte of the text


def piece_bytes(piece: str) -> int:
    """UTF-8 bytes of the text a SentencePiece-style piece stands for: ``▁`` is one space, ``<0xNN>`` one
    byte."""
    if BYTE_PIECE.fullmatch(piece):
        return 1
    return len(piece.replace(SPACE_MARKER, " ").encode("utf-8"))


class TextTokenizer:
    """Common interface of the tokenizer backends."""

    backend: str
    vocab_size: int
    eos_token_id: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, no special tokens added."""
        raise NotImplementedError

    def id_to_token(self) -> list[str]:
        """The vocabulary in id order."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """The text of token ids (special tokens written as their text)."""
        raise NotImplementedError

    def save(self, directory: Path) -> None:
        """Write files that `load_tokenizer(directory)` reads back."""
        raise NotImplementedError

    def token_bytes(self) -> list[int]:
        """UTF-8 bytes of the text each id stands for, in id order (bits per byte, SPEC §12); special ids
        (EOS, BOS, unknown, control) have 0, so the sum over a text's ids is its UTF-8 length (SentencePiece:
        plus its dummy-prefix space)."""
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        """sha256 of the vocabulary, the EOS id and the backend."""
        payload = {"vocab": self.id_to_token(), "eos_token_id": self.eos_token_id, "backend": self.backend}
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


class HFTokenizer(TextTokenizer):
    """A `tokenizers` fast tokenizer (tokenizer.json)."""

    backend = "tokenizers"

    def __init__(self, tokenizer: Any, eos_token: str, source: str) -> None:
        self.tokenizer = tokenizer
        # Special tokens in the input stay ordinary text: a document containing "</s>" is not split there.
        tokenizer.encode_special_tokens = True
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        eos = tokenizer.token_to_id(eos_token)
        if eos is None:
            raise DataError(f"tokenizer {source}: EOS token {eos_token!r} is not in its vocabulary")
        self.eos_token = eos_token
        self.eos_token_id = eos
        self._encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self._encode(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def id_to_token(self) -> list[str]:
        vocab = self.tokenizer.get_vocab(with_added_tokens=True)
        tokens = [""] * self.vocab_size
        for token, index in vocab.items():
            if index < self.vocab_size:
                tokens[index] = token
        return tokens

    def save(self, directory: Path) -> None:
        self.tokenizer.encode_special_tokens = False  # a plain saved file, like the one we loaded
        try:
            self.tokenizer.save(str(directory / "tokenizer.json"))
        finally:
            self.tokenizer.encode_special_tokens = True
        config = {"eos_token": self.eos_token, "add_bos_token": False, "add_eos_token": False}
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    def token_bytes(self) -> list[int]:
        """Byte-level BPE: one byte per character of the token (the GPT-2 byte alphabet); any other model
        (Metaspace with byte fallback, as Llama's tokenizer.json): ``piece_bytes``. Special added tokens: 0;
        other added tokens: their text's UTF-8 length."""
        from tokenizers import pre_tokenizers

        added = self.tokenizer.get_added_tokens_decoder()
        byte_level = _has_byte_level_decoder(json.loads(self.tokenizer.to_str()).get("decoder"))
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        sizes = []
        for index, token in enumerate(self.id_to_token()):
            if index in added:
                sizes.append(0 if added[index].special else len(token.encode("utf-8")))
            elif byte_level and alphabet.issuperset(token):
                sizes.append(len(token))
            else:
                sizes.append(piece_bytes(token))
        return sizes


class SentencePieceTokenizer(TextTokenizer):
    """A SentencePiece model (tokenizer.model)."""

    backend = "sentencepiece"

    def __init__(self, model_file: Path) -> None:
        import sentencepiece

        self.model_file = model_file
        try:
            self.processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        except (OSError, RuntimeError) as exc:
            raise DataError(f"tokenizer {model_file}: not a SentencePiece model ({exc})") from None
        self.vocab_size = self.processor.get_piece_size()
        self.eos_token_id = self.processor.eos_id()
        if self.eos_token_id < 0:
            raise DataError(f"tokenizer {model_file}: the SentencePiece model defines no EOS piece")
        self.num_threads = len(os.sched_getaffinity(0))  # the CPUs this job may use, not the whole node

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # Control pieces such as <s> are never matched in input text by SentencePiece.
        return self.processor.encode(texts, num_threads=self.num_threads)

    def decode(self, ids: list[int]) -> str:
        return self.processor.decode(ids)

    def id_to_token(self) -> list[str]:
        return [self.processor.id_to_piece(i) for i in range(self.vocab_size)]

    def save(self, directory: Path) -> None:
        shutil.copyfile(self.model_file, directory / "tokenizer.model")

    def token_bytes(self) -> list[int]:
        return [self._piece_bytes(i) for i in range(self.vocab_size)]

    def _piece_bytes(self, index: int) -> int:
        """0 for control, unknown and unused pieces; 1 for a byte piece; else ``piece_bytes``."""
        p = self.processor
        if p.is_control(index) or p.is_unknown(index) or p.is_unused(index):
            return 0
        return 1 if p.is_byte(index) else piece_bytes(p.id_to_piece(index))


def _has_byte_level_decoder(decoder: Any) -> bool:
    """Whether a tokenizer.json decoder (or a Sequence of them) maps tokens through the byte alphabet."""
    if not isinstance(decoder, dict):
        return False
    return decoder.get("type") == "ByteLevel" or any(
        _has_byte_level_decoder(d) for d in decoder.get("decoders") or []
    )


# ----------------------------------------------------------------------------- loading


def is_local_reference(name: str) -> bool:
    """A path on disk (existing, or spelled like a path) rather than a hub id ("owner/name")."""
    return (
        Path(name).expanduser().exists()
        or name.startswith(("/", "./", "../", "~"))
        or name.endswith((".json", ".model"))
        or name.count("/") != 1
    )


def load_tokenizer(name: str, revision: str | None = None) -> TextTokenizer:
    """A local tokenizer.json / tokenizer.model / directory, or a hub id at ``revision``."""
    if is_local_reference(name):
        return _load_local(Path(name).expanduser(), name)
    return _load_local(_fetch_hub_tokenizer(name, revision), name)


def _load_local(path: Path, source: str) -> TextTokenizer:
    if path.is_dir():
        if (path / "tokenizer.json").is_file():
            return _load_json(path / "tokenizer.json", source)
        if (path / "tokenizer.model").is_file():
            return SentencePieceTokenizer(path / "tokenizer.model")
        raise DataError(f"tokenizer directory {source} holds neither tokenizer.json nor tokenizer.model")
    if not path.is_file():
        raise DataError(
            f"tokenizer not found: {source} (give a tokenizer.json, tokenizer.model or directory)"
        )
    if path.suffix == ".json":
        return _load_json(path, source)
    return SentencePieceTokenizer(path)


def _load_json(path: Path, source: str) -> HFTokenizer:
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust parser raises a bare Exception
        raise DataError(
            f"tokenizer {source}: cannot parse {path.name} ({str(exc).splitlines()[0]})"
        ) from None
    return HFTokenizer(tokenizer, _eos_token(path.parent, tokenizer, source), source)


def _eos_token(directory: Path, tokenizer: Any, source: str) -> str:
    """EOS from tokenizer_config.json / special_tokens_map.json, else a well-known EOS spelling."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = directory / name
        if file.is_file():
            eos = json.loads(file.read_text(encoding="utf-8")).get("eos_token")
            if isinstance(eos, dict):
                eos = eos.get("content")
            if isinstance(eos, str) and eos:
                return eos
    for candidate in EOS_CANDIDATES:
        if tokenizer.token_to_id(candidate) is not None:
            return candidate
    raise DataError(
        f"tokenizer {source}: cannot tell its EOS token; add a tokenizer_config.json with an eos_token entry"
    )


def _fetch_hub_tokenizer(repo_id: str, revision: str | None) -> Path:
    """Directory holding the hub tokenizer's files, from the local hub cache or (when reachable) the hub."""
    from tiny_llm.data.sources import hub_offline, require_hub

    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError:  # pragma: no cover - datasets depends on huggingface_hub
        raise DataError("loading a hub tokenizer needs the huggingface_hub package") from None

    def fetch(filename: str, local_only: bool) -> Path | None:
        try:
            return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=local_only))
        except (EntryNotFoundError, FileNotFoundError):
            return None
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise DataError(
                f"tokenizer {repo_id}@{revision}: not found on the hub ({type(exc).__name__})"
            ) from None
        except Exception as exc:  # network and HTTP errors of the download
            if local_only:
                return None
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataError(
                f"tokenizer {repo_id}@{revision}: download of {filename} failed ({detail})"
            ) from None

    # The local hub cache first: a pinned tokenizer downloaded once works offline afterwards.
    local_only = True
    main = fetch("tokenizer.json", True) or fetch("tokenizer.model", True)
    if main is None:
        require_hub(f"tokenizer {repo_id}")
        local_only = False
        main = fetch("tokenizer.json", False) or fetch("tokenizer.model", False)
        if main is None:
            raise DataError(
                f"tokenizer {repo_id}@{revision}: the repository has no tokenizer.json or tokenizer.model"
            )
    for extra in ("tokenizer_config.json", "special_tokens_map.json"):
        if fetch(extra, True) is None and not local_only and not hub_offline():
            fetch(extra, False)
    return main.parent


def check_tokenizer(tokenizer: TextTokenizer, vocab_size: int, source: str) -> None:
    """len(tokenizer) must equal model.vocab_size and every id must fit the uint16 cache."""
    if tokenizer.vocab_size > MAX_UINT16_VOCAB:
        raise DataError(
            f"tokenizer {source} has {tokenizer.vocab_size} tokens; uint16 allows {MAX_UINT16_VOCAB}"
        )
    if tokenizer.vocab_size != vocab_size:
        raise DataError(
            f"tokenizer {source} has {tokenizer.vocab_size} tokens but model.vocab_size is {vocab_size}; "
            "set model.vocab_size to match or use another tokenizer"
        )


# ----------------------------------------------------------------------------- training


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, output: Path, *, force: bool = False
) -> HFTokenizer:
    """Train a byte-level BPE (every byte representable, nothing is ever unknown); save it atomically."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    minimum = len(SPECIAL_TOKENS) + 256
    if not minimum < vocab_size <= MAX_UINT16_VOCAB:
        raise DataError(f"--vocab-size must be in ({minimum}, {MAX_UINT16_VOCAB}], got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(_non_empty(texts), trainer=trainer)
    got = tokenizer.get_vocab_size(with_added_tokens=True)
    if got != vocab_size:
        raise DataError(
            f"the training text allows only {got} tokens, not --vocab-size {vocab_size}; use more text or a "
            "smaller vocabulary"
        )
    result = HFTokenizer(tokenizer, "</s>", str(output))
    save_tokenizer_dir(result, output, force=force)
    return result


def _non_empty(texts: Iterable[str]) -> Iterator[str]:
    count = 0
    for text in texts:
        count += 1
        yield text
    if not count:
        raise DataError("no training text for the tokenizer")


def save_tokenizer_dir(tokenizer: TextTokenizer, output: Path, *, force: bool = False) -> None:
    """Write the tokenizer into a fresh directory and rename it into place (an older one of ours only with
    ``force``; never a directory tiny-llm did not write)."""
    with replacing_directory(output, force=force) as tmp:
        tokenizer.save(tmp)
        for file in tmp.iterdir():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
