"""Export a checkpoint as a Hugging Face model directory (``LlamaForCausalLM`` + its tokenizer).

``export_model`` writes, atomically (a temporary sibling renamed into place):

- ``config.json``: a LlamaConfig (tied embeddings, the run's sizes, context, RoPE θ, RMSNorm ε, BOS/EOS ids);
- ``model.safetensors``: the weights under transformers' Llama names (no ``lm_head``: it is tied);
- ``generation_config.json``: EOS, BOS, pad = EOS, and our default sampling settings;
- the token cache's tokenizer (``tiny_llm.export.tokenizer``);
- ``README.md``: a model card; ``tiny_llm_export.json``: the same facts for machines (the report reads it),
  with the sample continuations of the prompt file when one is given.

Only torch, safetensors and tokenizers are needed here; transformers itself is not.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny_llm.budget import parameter_count
from tiny_llm.config import RecipeConfig, recipe_identity
from tiny_llm.data.cache import TokenCache, open_cache
from tiny_llm.data.tokenizer import is_local_reference, load_tokenizer
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.export.card import EXPORT_FILE, EXPORT_FORMAT, EXPORT_VERSION, model_card
from tiny_llm.export.generate import generate, prompt_ids
from tiny_llm.export.settings import PromptSet, SamplingConfig
from tiny_llm.export.tokenizer import TokenizerFacts, export_tokenizer, set_bos_token
from tiny_llm.export.weights import checkpoint_state_dict, to_hf_state_dict
from tiny_llm.io import read_json
from tiny_llm.model import Llama
from tiny_llm.output_dirs import check_replaceable, replacing_directory
from tiny_llm.runtime.engine import write_safetensors
from tiny_llm.terminal import counted

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BOS_SCAN_TOKENS = 16_777_216
"""Training tokens searched for the BOS token (one full cache shard at most: 32 MiB)."""


def llama_config(recipe: RecipeConfig, tokenizer: TokenizerFacts, dtype: str) -> dict[str, Any]:
    """config.json of transformers' LlamaForCausalLM for the recipe's model."""
    m = recipe.model
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": m.vocab_size,
        "hidden_size": m.width,
        "intermediate_size": m.ffn_width,
        "num_hidden_layers": m.num_layers,
        "num_attention_heads": m.num_heads,
        "num_key_value_heads": m.num_heads,
        "head_dim": m.width // m.num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": m.context_length,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,  # transformers 4.x and converters (llama.cpp) read this key
        "rope_parameters": {"rope_type": "default", "rope_theta": m.rope_theta},  # transformers 5.x
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": m.init_std,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": None,
        "use_cache": True,
        "pretraining_tp": 1,
        "dtype": dtype,  # transformers 5
        "torch_dtype": dtype,  # older transformers and vLLM read only this one (bfloat16 would load as FP32)
    }


def generation_config(tokenizer: TokenizerFacts, sampling: SamplingConfig, vocab_size: int) -> dict[str, Any]:
    """generation_config.json: our default sampling settings; pad = EOS (batch 1 never pads).

    top_k "off" is written as the vocabulary size: 0 is rejected by some vLLM releases, and a missing top_k
    means 50 to transformers.
    """
    config: dict[str, Any] = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.eos_token_id,
        "do_sample": sampling.temperature > 0,
        "max_new_tokens": sampling.max_new_tokens,
    }
    if sampling.temperature > 0:
        top_k = sampling.top_k or vocab_size
        config.update(temperature=sampling.temperature, top_k=top_k, top_p=sampling.top_p)
    return config


def find_result(checkpoint: Path, recipe: RecipeConfig) -> dict[str, Any] | None:
    """The run's result.json: beside the checkpoint (or above a packed node-KKK/ file), else in output_dir."""
    here = checkpoint.resolve().parent
    candidates = [here, here.parent] if here.name.startswith("node-") else [here]
    candidates.append(Path(recipe.runtime.output_dir))
    for directory in candidates:
        file = directory / "result.json"
        if file.is_file():
            return read_json(file)
    return None


def training_facts(result: dict[str, Any] | None) -> dict[str, Any] | None:
    if result is None:
        return None
    final = result.get("final_validation") or {}
    return {
        "tokens": result.get("tokens"),
        "tokens_per_model": result.get("tokens_per_model"),
        "final_validation_loss": final.get("loss"),
        "validation_tokens": final.get("tokens"),
        "validation_complete": final.get("validation_complete"),
        "status": result.get("status", "complete"),
    }


def document_start(cache: TokenCache, facts: TokenizerFacts, trained: int | None) -> dict[str, Any]:
    """The BOS the export declares: EOS, which the cache put before every document after the first.

    Counted in the first training tokens (the model's, where result.json says how many it trained on). The
    tokenizer's own BOS (``<s>``) is counted too: encoding never adds it, so the model has not seen it.
    """
    available = cache.num_tokens("train")
    checked = min(available, trained or available, BOS_SCAN_TOKENS)
    tokens = cache.read("train", 0, checked)
    seen = int(np.count_nonzero(tokens == facts.eos_token_id))
    own = facts.bos_token_id
    return {
        "token": facts.eos_token if seen else None,
        "id": facts.eos_token_id if seen else None,
        "occurrences": seen,
        "tokens_checked": checked,
        "tokenizer_bos": facts.bos_token,
        "tokenizer_bos_id": own,
        "tokenizer_bos_occurrences": None if own is None else int(np.count_nonzero(tokens == own)),
    }


def portable_reference(name: str | None) -> str | None:
    """A hub id as it is; a local file or directory by its name only: an export leaves the machine, and its
    files name nothing of the local file system."""
    if name is None or not is_local_reference(name):
        return name
    return f"local {Path(name).expanduser().name or name}"


def recipe_facts(recipe: RecipeConfig) -> dict[str, Any]:
    opt, dec = recipe.optimizer, recipe.decentralized
    return {
        "lr": opt.lr,
        "beta1": opt.beta1,
        "beta2": opt.beta2,
        "weight_decay": opt.weight_decay,
        "lr_schedule": opt.lr_schedule,
        "warmup_fraction": opt.warmup_fraction,
        "batch_tokens": recipe.training.batch_tokens,
        "tokens_per_parameter": recipe.training.tokens_per_parameter,
        "seed": recipe.runtime.seed,
        "packed": None
        if dec is None
        else {"num_models": dec.num_models, "topology": dec.topology, "scheme": dec.scheme},
    }


def sample_continuations(
    recipe: RecipeConfig, state: dict[str, torch.Tensor], prompts: PromptSet, tokenizer_dir: Path, eos: int
) -> dict[str, Any]:
    """Continue every prompt with the exported weights (on the CPU); prompt i draws with seed + i."""
    tokenizer = load_tokenizer(str(tokenizer_dir))
    model = Llama(recipe.model)
    model.load_state_dict(state)
    model.eval()
    items = []
    numbered = enumerate(prompts.prompts)
    for index, text in counted(numbered, total=len(prompts.prompts), desc="samples", unit="prompt"):
        settings = dataclasses.replace(prompts.sampling, seed=prompts.sampling.seed + index)
        ids = prompt_ids(tokenizer.encode_batch([text])[0], settings, eos)
        if len(ids) >= recipe.model.context_length:
            raise ConfigError(
                f"prompt {text[:40]!r} has {len(ids)} tokens; model.context_length "
                f"{recipe.model.context_length} leaves no room to continue it"
            )
        out = generate(model, ids, settings, eos_token_id=eos)
        new = out.tokens[:-1] if out.stop_reason == "eos" else out.tokens
        items.append(
            {
                "prompt": text,
                "completion": tokenizer.decode(new),
                "new_tokens": len(out.tokens),
                "stop_reason": out.stop_reason,
            }
        )
    return {"settings": prompts.sampling.as_dict(), "items": items}


def export_model(
    recipe: RecipeConfig,
    checkpoint: Path,
    output: Path,
    *,
    dtype: str = "float32",
    worker: int | None = None,
    prompts: PromptSet | None = None,
    gguf: bool = False,
    force: bool = False,
) -> dict[str, Any]:
    """Write the export directory ``output`` (an older export only with ``force``); return its facts.

    ``gguf``: also write ``model.gguf`` for llama.cpp (``tiny_llm.export.gguf_file``).
    """
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    checkpoint = Path(checkpoint)
    check_output(output, checkpoint)
    check_replaceable(output, force=force)  # before any work
    state = checkpoint_state_dict(recipe, checkpoint, worker=worker)
    cache = open_cache(recipe.data.cache_dir, verify=False)
    cache.check_compatible(recipe)
    tensors = to_hf_state_dict(state, DTYPES[dtype])
    output = Path(output)
    with replacing_directory(output, force=force) as tmp:
        facts = export_tokenizer(
            cache.path, tmp, eos_token_id=cache.eos_token_id, context_length=recipe.model.context_length
        )
        training = training_facts(find_result(checkpoint, recipe))
        trained = (training or {}).get("tokens_per_model") or (training or {}).get("tokens")
        start = document_start(cache, facts, trained)
        facts = set_bos_token(tmp, facts, start["token"], start["id"])
        # the umask's mode like every other file here (safetensors' save_file makes it 0600)
        write_safetensors(tmp / "model.safetensors", tensors)
        gguf_facts = _write_gguf(tmp, output.name, recipe, tensors, facts) if gguf else None
        sampling = prompts.sampling if prompts else SamplingConfig()
        _write_json(tmp / "config.json", llama_config(recipe, facts, dtype))
        _write_json(
            tmp / "generation_config.json", generation_config(facts, sampling, recipe.model.vocab_size)
        )
        samples = None
        if prompts is not None:
            exported = {k: v.to(DTYPES[dtype]).float() for k, v in state.items()}  # what the files hold
            samples = sample_continuations(recipe, exported, prompts, tmp, cache.eos_token_id)
        dec = recipe.decentralized
        weights = (
            "one model"
            if dec is None
            else f"worker {worker} of {dec.num_models}"
            if worker is not None
            else f"FP32 average of {dec.num_models} workers"
        )
        meta = {
            "format": EXPORT_FORMAT,
            "version": EXPORT_VERSION,
            "name": output.name,
            "parameters": parameter_count(recipe.model),
            "model": {
                "vocab_size": recipe.model.vocab_size,
                "num_layers": recipe.model.num_layers,
                "width": recipe.model.width,
                "num_heads": recipe.model.num_heads,
                "ffn_width": recipe.model.ffn_width,
                "context_length": recipe.model.context_length,
                "rope_theta": recipe.model.rope_theta,
                "norm_eps": recipe.model.norm_eps,
            },
            "recipe": recipe_facts(recipe),
            "recipe_identity": recipe_identity(recipe, cache.identity),
            "weights": weights,
            "checkpoint": f"{checkpoint.parent.name}/{checkpoint.name}",  # the run and file, no local path
            "worker": worker,
            "dtype": dtype,
            "training": training,
            "cache": {
                "identity": cache.identity,
                "dataset": portable_reference(cache.manifest.get("dataset")),
                "tokenizer": portable_reference(cache.manifest.get("tokenizer")),
                "tokenizer_revision": cache.manifest.get("tokenizer_revision"),
                "vocab_size": cache.vocab_size,
                "eos_token_id": cache.eos_token_id,
            },
            "tokenizer": {
                "backend": facts.backend,
                "eos_token": facts.eos_token,
                "eos_token_id": facts.eos_token_id,
                "bos_token": facts.bos_token,
                "bos_token_id": facts.bos_token_id,
                "files": list(facts.files),
                "dropped_special_token_template": facts.dropped_template,
                "document_start": start,
            },
            "samples": samples,
            "gguf": gguf_facts,
        }
        _write_json(tmp / EXPORT_FILE, meta)
        (tmp / "README.md").write_text(model_card(meta), encoding="utf-8")
        for file in tmp.iterdir():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    return {
        "output": str(output),
        **{k: meta[k] for k in ("name", "parameters", "weights", "dtype", "training")},
    }


def _write_gguf(
    directory: Path, name: str, recipe: RecipeConfig, tensors: dict[str, torch.Tensor], facts: TokenizerFacts
) -> dict[str, Any]:
    from tiny_llm.export.gguf_file import GGUF_FILE, write_gguf

    vocab = write_gguf(
        directory / GGUF_FILE,
        name=name,
        model=recipe.model,
        hf_tensors=tensors,
        tokenizer_dir=directory,
        facts=facts,
    )
    return {"file": GGUF_FILE, "tokenizer_model": vocab.model, "pre_tokenizer": vocab.pre}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def check_output(output: Path, checkpoint: Path) -> None:
    """Refuse to export into the run directory itself (replacing it would delete the run)."""
    out = Path(output).resolve()
    run_dir = Path(checkpoint).resolve().parent
    if out == run_dir or out in run_dir.parents:
        raise DataError(f"--output {output} would replace the directory holding {checkpoint}; choose another")
