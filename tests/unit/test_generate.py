"""`generate`: KV-cache decoding equals recomputation and transformers' greedy search; seeded sampling."""

from __future__ import annotations

import json

import pytest
import torch
from export_helpers import load_hf, train_small, transformers_module

from tiny_llm.cli import main
from tiny_llm.config import ModelConfig
from tiny_llm.data.tokenizer import load_tokenizer
from tiny_llm.errors import ConfigError
from tiny_llm.export.generate import generate, prompt_ids, sampling_distribution
from tiny_llm.export.hf import export_model
from tiny_llm.export.settings import SamplingConfig, load_prompts, sampling_from_dict
from tiny_llm.export.weights import load_model
from tiny_llm.model import KVCache, Llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOY = ModelConfig(vocab_size=97, num_layers=2, width=32, num_heads=4, ffn_width=48, context_length=24)
PROMPTS = ["The history of the city", "In the year", "Rivers and"]
GREEDY = SamplingConfig(temperature=0, max_new_tokens=32, stop_at_eos=False)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_cache, tiny_recipe_args):
    run_dir = tmp_path_factory.mktemp("generate") / "tiny"
    return train_small(tiny_cache, tiny_recipe_args, run_dir), run_dir


@pytest.fixture(scope="module")
def model(tiny_run):
    recipe, run_dir = tiny_run
    return load_model(recipe, run_dir / "final.safetensors", torch.device("cpu"))


@pytest.fixture(scope="module")
def tokenizer(tiny_cache):
    return load_tokenizer(str(tiny_cache / "tokenizer"))


def ids_of(tokenizer, text: str, settings: SamplingConfig = GREEDY) -> list[int]:
    return prompt_ids(tokenizer.encode_batch([text])[0], settings, 2)


# ---------------------------------------------------------------------------------------------- the cache


@pytest.mark.parametrize("reference", [False, True])
def test_decode_in_chunks_equals_the_full_forward(reference: bool) -> None:
    torch.manual_seed(0)
    toy = Llama(TOY, reference_attention=reference).eval()
    x = torch.randint(0, TOY.vocab_size, (2, TOY.context_length))
    cache = KVCache(TOY, 2, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        full = toy(x)
        parts = [toy.decode(x[:, a:b], cache) for a, b in ((0, 7), (7, 8), (8, 15), (15, 16))]
        parts += [toy.decode(x[:, i : i + 1], cache) for i in range(16, TOY.context_length)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=0, atol=1e-5)
    assert cache.length == TOY.context_length
    with pytest.raises(ValueError, match="exceed model.context_length 24"):
        toy.decode(x[:, :1], cache)


def test_kv_cache_generation_equals_generation_without_it(model, tokenizer) -> None:
    sampled = SamplingConfig(max_new_tokens=32, stop_at_eos=False, seed=7)
    for text in PROMPTS:
        for settings in (GREEDY, sampled):
            ids = ids_of(tokenizer, text, settings)
            cached = generate(model, ids, settings, eos_token_id=2)
            recomputed = generate(model, ids, settings, eos_token_id=2, use_cache=False)
            assert cached.tokens == recomputed.tokens and len(cached.tokens) == 32
            assert cached.stop_reason == "length"


# ---------------------------------------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def hf_model(tiny_run, tmp_path_factory):
    recipe, run_dir = tiny_run
    output = tmp_path_factory.mktemp("generate-export") / "tiny"
    export_model(recipe, run_dir / "final.safetensors", output)
    hf, hf_tokenizer, _ = load_hf(output)
    return hf, hf_tokenizer


def test_greedy_equals_transformers_generate_token_for_token(model, tokenizer, hf_model) -> None:
    hf, hf_tokenizer = hf_model
    for text in PROMPTS:
        ids = ids_of(tokenizer, text)
        assert ids[1:] == hf_tokenizer(text)["input_ids"]
        ours = generate(model, ids, GREEDY, eos_token_id=2).tokens
        with torch.no_grad():
            theirs = hf.generate(
                torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=2
            )[0, len(ids) :].tolist()
        assert len(ours) == 32 and ours == theirs, text
        # stopping at EOS as transformers does with the exported generation_config.json
        stop = generate(model, ids, SamplingConfig(temperature=0, max_new_tokens=32), eos_token_id=2)
        with torch.no_grad():
            default = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        assert stop.tokens == default[0, len(ids) :].tolist()


def test_sampling_distribution_follows_transformers_warpers() -> None:
    transformers = transformers_module()
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    g = torch.Generator().manual_seed(0)
    for temperature, top_k, top_p in ((0.7, 50, 0.9), (1.3, None, 0.5), (1.0, 5, 1.0), (0.5, None, 1.0)):
        logits = torch.randn(512, generator=g) * 3
        settings = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
        probs, ids = sampling_distribution(logits, settings)
        ours = torch.zeros(512).index_put_((ids,), probs)
        scores = TemperatureLogitsWarper(temperature)(None, logits[None].clone())
        if top_k is not None:
            scores = TopKLogitsWarper(top_k)(None, scores)
        if top_p < 1:
            scores = TopPLogitsWarper(top_p)(None, scores)
        torch.testing.assert_close(ours, scores.softmax(-1)[0], rtol=1e-5, atol=1e-7)
    assert transformers is not None


# ---------------------------------------------------------------------------------------------- sampling


def test_a_seed_gives_the_same_continuation(model, tokenizer) -> None:
    settings = SamplingConfig(max_new_tokens=24, stop_at_eos=False, seed=11)
    ids = ids_of(tokenizer, PROMPTS[0], settings)
    first = generate(model, ids, settings, eos_token_id=2).tokens
    assert generate(model, ids, settings, eos_token_id=2).tokens == first
    others = {
        tuple(
            generate(model, ids, SamplingConfig(**{**settings.as_dict(), "seed": s}), eos_token_id=2).tokens
        )
        for s in range(3)
    }
    assert len(others) > 1


def test_generation_stops_at_eos_or_a_full_context(model, tokenizer) -> None:
    context = model.cfg.context_length
    ids = ids_of(tokenizer, PROMPTS[0])
    out = generate(
        model, ids, SamplingConfig(temperature=0, max_new_tokens=500, stop_at_eos=False), eos_token_id=2
    )
    assert out.stop_reason == "context" and len(out.tokens) == context - len(ids)
    # call the first greedy token EOS: generation stops right after it, and it is part of the output
    first = out.tokens[0]
    stopped = generate(model, ids, SamplingConfig(temperature=0, max_new_tokens=10), eos_token_id=first)
    assert stopped.tokens == [first] and stopped.stop_reason == "eos"
    with pytest.raises(ValueError, match="no tokens"):
        generate(model, [], GREEDY, eos_token_id=2)


def test_prompts_start_a_document_with_eos_unless_asked_not_to() -> None:
    assert prompt_ids([5, 6], SamplingConfig(), 2) == [2, 5, 6]
    assert prompt_ids([5, 6], SamplingConfig(document_start=False), 2) == [5, 6]
    assert prompt_ids([], SamplingConfig(document_start=False), 2) == [2]


# ------------------------------------------------------------------------------------------- settings and CLI


def test_settings_are_validated_with_one_line(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^generate.top_p: must be in \(0, 1\], got 0$"):
        sampling_from_dict({"top_p": 0}, "generate")
    with pytest.raises(ConfigError, match="temperature: must be >= 0, got -1"):
        sampling_from_dict({"temperature": -1}, "")
    with pytest.raises(ConfigError, match="temperature: expected a finite number, got nan"):
        sampling_from_dict({"temperature": float("nan")}, "")
    file = tmp_path / "prompts.yaml"
    file.write_text("prompts: [Once upon a time, The river]\nmax_new_tokens: 16\ntemperature: 0\n")
    prompts = load_prompts(file)
    assert prompts.prompts == ("Once upon a time", "The river") and prompts.sampling.max_new_tokens == 16
    file.write_text("- just a list\n")
    assert load_prompts(file).prompts == ("just a list",)
    for text, message in (
        ("prompts: []\n", "non-empty list of strings"),
        ("prompts: [a]\ntemprature: 1\n", "unknown key"),
        ("prompts: [a]\nmax_new_tokens: 1.5\n", "max_new_tokens: expected an integer"),
        ("prompts: [a]\ntop_k: 0\n", "top_k: must be >= 1 or null, got 0"),
        ("{", "not valid YAML"),
    ):
        file.write_text(text)
        with pytest.raises(ConfigError, match=message):
            load_prompts(file)
    with pytest.raises(ConfigError, match="not found"):
        load_prompts(tmp_path / "missing.yaml")


def test_cli_generate_prints_text_or_json_reproducibly(tiny_run, model, tokenizer, capsys) -> None:
    _, run_dir = tiny_run
    argv = ["generate", "--run", str(run_dir), "--prompt", PROMPTS[0], "--device", "cpu"]
    assert main([*argv, "--seed", "3", "--max-new-tokens", "16"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(PROMPTS[0])
    assert main([*argv, "--seed", "3", "--max-new-tokens", "16", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert PROMPTS[0] + out["completion"] + "\n" == text
    assert out["new_tokens"] == len(out["token_ids"]) <= 16 and out["device"] == "cpu"
    assert main([*argv, "--temperature", "0", "--max-new-tokens", "12", "--json"]) == 0
    greedy = json.loads(capsys.readouterr().out)
    expected = generate(
        model, ids_of(tokenizer, PROMPTS[0]), SamplingConfig(temperature=0, max_new_tokens=12), eos_token_id=2
    )
    assert greedy["token_ids"] == expected.tokens and greedy["stop_reason"] == expected.stop_reason
    assert main([*argv, "--top-p", "1.5"]) == 2
    assert "generate.top_p: must be in (0, 1], got 1.5" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_generation_matches_the_cpu(tiny_run, model, tokenizer) -> None:
    recipe, run_dir = tiny_run
    matmul = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        gpu = load_model(recipe, run_dir / "final.safetensors", torch.device("cuda"))
        for text in PROMPTS:
            ids = ids_of(tokenizer, text)
            cpu_tokens = generate(model, ids, GREEDY, eos_token_id=2).tokens
            assert generate(gpu, ids, GREEDY, eos_token_id=2).tokens == cpu_tokens
            assert generate(gpu, ids, GREEDY, eos_token_id=2, use_cache=False).tokens == cpu_tokens
            sampled = SamplingConfig(max_new_tokens=32, stop_at_eos=False, seed=5)
            a = generate(gpu, ids, sampled, eos_token_id=2).tokens
            assert a == generate(gpu, ids, sampled, eos_token_id=2).tokens
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul
