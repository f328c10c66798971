"""A checkpoint's weights as our model, or as Hugging Face ``LlamaForCausalLM`` tensors.

Checkpoints: a ``.safetensors`` weights file (a packed run's root file holds the FP32 average of its
workers, ``node-KKK/<name>`` worker K's weights) or a ``.pt`` training state, read into the engine the
recipe needs (packed: averaged model, or worker K). Both forms give the same tensors.

Our parameter names map one to one onto transformers' Llama names; nothing is permuted, because our RoPE
already rotates halves (transformers' ``rotate_half``), and the LM head is the tied embedding.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from tiny_llm.config import RecipeConfig
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.model import Llama

_BLOCK_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.out_proj.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.gate_proj.weight": "mlp.gate_proj.weight",
    "ffn.up_proj.weight": "mlp.up_proj.weight",
    "ffn.down_proj.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def hf_name(name: str) -> str:
    """Our parameter name -> transformers' Llama name (KeyError for a name that has none)."""
    if name in _TOP_NAMES:
        return _TOP_NAMES[name]
    match = _BLOCK.fullmatch(name)
    if match is None:
        raise KeyError(name)
    return f"model.layers.{match[1]}.{_BLOCK_NAMES[match[2]]}"


def to_hf_state_dict(
    state: dict[str, torch.Tensor], dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Our state dict -> transformers' tensors (contiguous host copies, optionally cast; no lm_head: tied)."""
    return {
        hf_name(name): tensor.detach().to("cpu", dtype=dtype or tensor.dtype).contiguous()
        for name, tensor in state.items()
    }


def check_worker(recipe: RecipeConfig, worker: int | None, path: Path) -> None:
    """--worker K needs a packed recipe and 0 <= K < num_models."""
    if worker is None:
        return
    packed = recipe.decentralized
    if packed is None:
        raise ConfigError(
            f"--worker {worker}: {path} is not from a packed run (its recipe has no decentralized section); "
            "leave --worker out"
        )
    if not 0 <= worker < packed.num_models:
        raise ConfigError(
            f"--worker {worker} is out of range: the packed run has {packed.num_models} workers "
            f"(0..{packed.num_models - 1})"
        )


def checkpoint_state_dict(
    recipe: RecipeConfig, path: Path, *, worker: int | None = None
) -> dict[str, torch.Tensor]:
    """Our model's tensors (CPU) from a .safetensors weights file or a .pt training state.

    Packed runs: the FP32 average of the workers by default, worker ``worker`` if given.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"checkpoint not found: {path}")
    check_worker(recipe, worker, path)
    if path.suffix == ".safetensors":
        if worker is not None:
            path = path.parent / f"node-{worker:03d}" / path.name
            if not path.is_file():
                raise DataError(f"worker {worker}'s weights not found: {path} (export the .pt state instead)")
        from safetensors.torch import load_file

        try:
            state = load_file(str(path), device="cpu")
        except Exception as exc:  # a truncated or foreign file
            raise DataError(
                f"{path}: not a readable .safetensors file ({str(exc).splitlines()[0]})"
            ) from None
    elif path.suffix == ".pt":
        state = _state_from_training_state(recipe, path, worker)
    else:
        raise DataError(f"{path}: expected a .safetensors weights file or a .pt training state")
    _check_fits(recipe, state, path)
    return state


def _state_from_training_state(
    recipe: RecipeConfig, path: Path, worker: int | None
) -> dict[str, torch.Tensor]:
    from tiny_llm.engines import build_engine
    from tiny_llm.train.checkpoint import load_state

    engine = build_engine(recipe, torch.device("cpu"))
    try:
        engine.load_state_dict(load_state(path)["engine"])
    except (KeyError, ValueError, RuntimeError) as exc:
        raise DataError(
            f"{path}: the training state does not fit the recipe's model ({str(exc).splitlines()[0]})"
        ) from None
    if worker is not None:
        from tiny_llm.packed.engine import PackedEngine

        assert isinstance(engine, PackedEngine)  # check_worker saw a packed recipe
        return engine.model.worker_state_dict(worker)
    return {k: v.detach().clone() for k, v in engine.eval_model().state_dict().items()}


def _check_fits(recipe: RecipeConfig, state: dict[str, torch.Tensor], path: Path) -> None:
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in Llama(recipe.model).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in state.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        shapes = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])
        detail = (
            f"missing {missing[:2]}"
            if missing
            else f"unexpected {extra[:2]}"
            if extra
            else f"{shapes[0]} is {got[shapes[0]]}, the recipe's model has {expected[shapes[0]]}"
        )
        raise DataError(
            f"{path}: weights do not fit the recipe's model ({detail}); is it the right --config?"
        )


def load_model(recipe: RecipeConfig, path: Path, device: torch.device, *, worker: int | None = None) -> Llama:
    """The recipe's model holding a checkpoint's weights, on ``device``, in eval mode.

    Built on the CPU like a training run's model, so its RoPE tables are the ones it was trained with.
    """
    from tiny_llm.runtime.device import uses_reference_attention

    state = checkpoint_state_dict(recipe, path, worker=worker)
    model = Llama(recipe.model, reference_attention=uses_reference_attention(recipe))
    model.load_state_dict(state)
    return model.to(device).eval()
