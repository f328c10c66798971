"""Sampling settings and prompt files (torch-free, so a workflow plan may validate them too).

A prompt file is YAML: either a list of prompts, or a mapping with ``prompts`` and any of the
``SamplingConfig`` fields::

    prompts: ["The history of the city", "In 1905, the"]
    max_new_tokens: 48
    temperature: 0.8
    seed: 0
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tiny_llm.errors import ConfigError
from tiny_llm.io import parse_yaml
from tiny_llm.typed import NON_NEGATIVE, typed_from_dict

MAX_NEW_TOKENS = 2**20
"""More new tokens than any context here holds (generation stops when the context is full): a typo."""


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How new tokens are chosen (the semantics of transformers' temperature, top-k and top-p warpers)."""

    max_new_tokens: int = field(default=64, metadata={"minimum": 0, "maximum": MAX_NEW_TOKENS})
    """Tokens to generate at most (fewer at EOS or when the context is full); at most 2**20."""
    temperature: float = field(default=0.8, metadata=NON_NEGATIVE)
    """Softmax temperature; 0 = greedy (argmax)."""
    top_k: int | None = field(default=50, metadata={"minimum": 1})
    """Keep the k most likely tokens; null = all."""
    top_p: float = field(default=0.95, metadata={"exclusiveMinimum": 0, "maximum": 1})
    """Then keep the smallest most-likely set holding this probability mass; 1 = all."""
    seed: int = field(default=0, metadata=NON_NEGATIVE)
    """Seed of the sampling generator (on the host, so a seed means the same draws on every device)."""
    stop_at_eos: bool = True
    """Stop after the model writes EOS (the EOS token is part of the output)."""
    document_start: bool = True
    """Put EOS before the prompt: in training every document starts right after an EOS."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PromptSet:
    """Prompts sampled for every exported model, with their settings."""

    prompts: tuple[str, ...]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


def sampling_from_dict(data: dict[str, Any], where: str) -> SamplingConfig:
    """A checked SamplingConfig (``where``: the section's dotted key, or "" at a file's top level)."""
    return typed_from_dict(SamplingConfig, data, where)


def load_prompts(path: str | Path) -> PromptSet:
    """Read a prompt file (see the module doc)."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"prompt file not found: {path}") from None
    except UnicodeDecodeError as exc:
        byte = exc.object[exc.start]
        raise ConfigError(
            f"prompt file {path}: not UTF-8 text (byte 0x{byte:02x} at offset {exc.start}); save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"prompt file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if isinstance(data, list):
        data = {"prompts": data}
    if not isinstance(data, dict) or "prompts" not in data:
        raise ConfigError(f"prompt file {path}: expected a list of prompts or a mapping with 'prompts'")
    prompts = data.pop("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ConfigError(f"prompt file {path}: 'prompts' must be a non-empty list of strings")
    try:
        return PromptSet(tuple(prompts), sampling_from_dict(data, ""))
    except ConfigError as exc:
        raise ConfigError(f"prompt file {path}: {exc}") from None
