"""`export`: Hugging Face directories that load offline and reproduce our model, loss and tokenizer."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from export_helpers import (
    directory_differences,
    documented_differences,
    load_hf,
    saved_by_transformers,
    train_packed,
    train_small,
    transformers_module,
)
from safetensors.torch import load_file

from tiny_llm.cli import main
from tiny_llm.config import ModelConfig, load_recipe
from tiny_llm.data.cache import open_cache
from tiny_llm.data.loader import validation_subset
from tiny_llm.data.sources import resolve_source
from tiny_llm.data.tokenizer import load_tokenizer
from tiny_llm.engines import evaluate_checkpoint
from tiny_llm.errors import ConfigError, DataError
from tiny_llm.export.hf import export_model, llama_config
from tiny_llm.export.settings import PromptSet, SamplingConfig
from tiny_llm.export.tokenizer import TokenizerFacts, export_tokenizer, without_special_token_templates
from tiny_llm.export.weights import checkpoint_state_dict, hf_name, load_model, to_hf_state_dict
from tiny_llm.model import IGNORE_INDEX, Llama, rope_tables

pytestmark = pytest.mark.usefixtures("one_torch_thread")
transformers = transformers_module()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_cache, tiny_recipe_args):
    run_dir = tmp_path_factory.mktemp("export") / "tiny"
    recipe = train_small(tiny_cache, tiny_recipe_args, run_dir)
    return recipe, run_dir


@pytest.fixture(scope="module")
def packed_run(tmp_path_factory, tiny_cache, tiny_recipe_args):
    run_dir = tmp_path_factory.mktemp("export") / "packed"
    return train_packed(tiny_cache, tiny_recipe_args, run_dir), run_dir


@pytest.fixture(scope="module")
def tiny_export(tiny_run, tmp_path_factory):
    recipe, run_dir = tiny_run
    output = tmp_path_factory.mktemp("exports") / "tiny"
    prompts = PromptSet(("The history of", "In the year"), SamplingConfig(max_new_tokens=12, seed=3))
    export_model(recipe, run_dir / "final.safetensors", output, prompts=prompts)
    return output


def assert_strict(info: dict) -> None:
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys") and not info.get("error_msgs"), info


def validation_blocks(recipe, cache_dir: Path) -> torch.Tensor:
    cache = open_cache(cache_dir, verify=False)
    L = recipe.model.context_length
    return validation_subset(cache, L, recipe.evaluation.subset_blocks, recipe.evaluation.seed)


def assert_same_logits(ours: Llama, hf, inputs: torch.Tensor, bound: float = 1e-4) -> None:
    with torch.no_grad():
        mine, theirs = ours(inputs), hf(input_ids=inputs).logits
    assert (mine - theirs).abs().max().item() <= bound
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))


# ---------------------------------------------------------------------------------------------- files


def test_export_directory_holds_the_hf_files_and_a_card(tiny_export, tiny_run, tiny_cache):
    recipe, run_dir = tiny_run
    names = {p.name for p in tiny_export.iterdir()}
    assert names == {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        "tiny_llm_export.json",
        ".tiny-llm-output",
    }
    config = json.loads((tiny_export / "config.json").read_text())
    m = recipe.model
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (64, 2, 4)
    assert config["intermediate_size"] == m.ffn_width and config["vocab_size"] == m.vocab_size
    assert config["max_position_embeddings"] == m.context_length == 64
    assert config["rope_theta"] == m.rope_theta and config["rms_norm_eps"] == m.norm_eps
    # BOS is the EOS before every training document; the trained BPE's <s> (id 1) never occurred.
    assert (config["eos_token_id"], config["bos_token_id"]) == (2, 2)
    assert config["torch_dtype"] == config["dtype"] == "float32"
    generation = json.loads((tiny_export / "generation_config.json").read_text())
    assert generation["eos_token_id"] == generation["bos_token_id"] == 2 and generation["do_sample"] is True
    assert generation["top_k"] == 50
    assert "lm_head.weight" not in load_file(str(tiny_export / "model.safetensors"))  # tied
    result = json.loads((run_dir / "result.json").read_text())
    card = (tiny_export / "README.md").read_text()
    assert f"{result['final_validation']['loss']:.4f}" in card
    assert f"{result['tokens']:,}" in card
    assert open_cache(tiny_cache, verify=False).identity in card
    assert "## Samples" in card and "**The history of**" in card
    meta = json.loads((tiny_export / "tiny_llm_export.json").read_text())
    start = meta["tokenizer"]["document_start"]
    assert start["id"] == 2 and start["tokenizer_bos_occurrences"] == 0
    assert start["tokens_checked"] == result["tokens"] and start["occurrences"] > 10
    assert (
        f"is id 2 (`</s>`), the EOS that came before every document but the first: {start['occurrences']:,}"
        in card
    )
    assert "`<s>` (id 1) occurred 0 times" in card
    assert meta["training"]["final_validation_loss"] == result["final_validation"]["loss"]
    assert [item["prompt"] for item in meta["samples"]["items"]] == ["The history of", "In the year"]
    assert all(1 <= item["new_tokens"] <= 12 for item in meta["samples"]["items"])


def test_every_exported_file_follows_the_umask(tiny_export):
    """A colleague loads an export as readily as its writer (safetensors' own writer makes 0600 files)."""
    import os
    import stat

    umask = os.umask(0)
    os.umask(umask)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tiny_export.iterdir()}
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)
    assert stat.S_IMODE(tiny_export.stat().st_mode) == 0o777 & ~umask


def test_directory_differs_from_transformers_save_pretrained_only_as_the_card_says(tiny_export, tmp_path):
    theirs = saved_by_transformers(tiny_export, tmp_path / "theirs")
    found = directory_differences(tiny_export, theirs)
    assert found == documented_differences("tokenizers", gguf=False)
    notes = (tiny_export / "README.md").read_text().split("## Notes")[1]
    assert "`config.json` `torch_dtype`" in notes and "`tokenizer.json` `post_processor`" in notes
    assert "model.gguf" not in notes and "tokenizer.model" not in notes


def test_top_k_off_is_the_vocabulary_not_zero(tiny_run, tmp_path):
    recipe, run_dir = tiny_run
    prompts = PromptSet((), SamplingConfig(top_k=None, temperature=0.7))
    export_model(recipe, run_dir / "final.safetensors", tmp_path / "out", prompts=prompts)
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation["top_k"] == recipe.model.vocab_size and generation["temperature"] == 0.7


def test_config_loads_as_llama_config(tiny_export):
    config = transformers.AutoConfig.from_pretrained(str(tiny_export), local_files_only=True)
    assert type(config).__name__ == "LlamaConfig"
    assert config.rope_parameters["rope_theta"] == 10000.0 and config.tie_word_embeddings


# ---------------------------------------------------------------------------------------------- fidelity


def test_rope_tables_are_transformers_tables_bit_for_bit():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    for context, head_dim, theta in ((64, 16, 10000.0), (1024, 64, 10000.0), (1024, 64, 500000.0)):
        cos, sin = rope_tables(context, head_dim, theta)
        config = transformers.LlamaConfig(
            hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=context, rope_theta=theta
        )
        theirs = LlamaRotaryEmbedding(config)(torch.zeros(1), torch.arange(context)[None])
        assert torch.equal(cos, theirs[0][0]) and torch.equal(sin, theirs[1][0])


def test_hf_loads_strictly_and_matches_logits_and_loss(tiny_export, tiny_run, tiny_cache):
    recipe, run_dir = tiny_run
    hf, _, info = load_hf(tiny_export)
    assert_strict(info)
    assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()  # tied
    ours = load_model(recipe, run_dir / "final.safetensors", torch.device("cpu"))
    blocks = validation_blocks(recipe, tiny_cache)
    inputs, targets = blocks[:, :-1], blocks[:, 1:]
    assert inputs.shape[1] == recipe.model.context_length  # full context
    assert_same_logits(ours, hf, inputs)
    # HF's loss on the same targets as our validation subset loss (all L targets of every block) ...
    ours_loss = evaluate_checkpoint(recipe, run_dir / "final.safetensors", full=False)["loss"]
    with torch.no_grad():
        hf_loss = hf(input_ids=inputs, labels=inputs, shift_labels=targets.contiguous()).loss.item()
    assert hf_loss == pytest.approx(ours_loss, rel=1e-5, abs=1e-6)
    # ... and HF's usual labels=inputs (each block's last target dropped) equals ours on those targets.
    with torch.no_grad():
        hf_usual = hf(input_ids=inputs, labels=inputs).loss.item()
        logits = ours(inputs)
    kept = targets.clone()
    kept[:, -1] = IGNORE_INDEX
    ours_usual = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), kept.flatten(), ignore_index=IGNORE_INDEX
    ).item()
    assert hf_usual == pytest.approx(ours_usual, rel=1e-5)


def test_non_default_rope_theta_and_norm_eps_round_trip(tiny_run, tiny_cache, tiny_recipe_args, tmp_path):
    recipe, run_dir = tiny_run
    weights = tmp_path / "weights" / "final.safetensors"
    weights.parent.mkdir()
    shutil.copy(run_dir / "final.safetensors", weights)
    other = load_recipe(
        [str(run_dir / "resolved.yaml")],
        ["model.rope_theta=500.0", "model.norm_eps=0.001", f"runtime.output_dir={tmp_path / 'nowhere'}"],
    )
    export_model(other, weights, tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["rope_theta"] == 500.0 and config["rms_norm_eps"] == 0.001
    hf, _, info = load_hf(tmp_path / "out")
    assert_strict(info)
    assert hf.config.rope_parameters["rope_theta"] == 500.0 and hf.config.rms_norm_eps == 0.001
    ours = load_model(other, weights, torch.device("cpu"))
    inputs = validation_blocks(other, tiny_cache)[:, :-1]
    assert_same_logits(ours, hf, inputs)
    default = load_model(recipe, weights, torch.device("cpu"))
    with torch.no_grad():  # the settings matter: the default model gives other logits
        assert not torch.allclose(default(inputs), ours(inputs), atol=1e-3)


@pytest.mark.parametrize("shape", ["demo-s", pytest.param("20m", marks=pytest.mark.slow)])
def test_preset_shapes_match_transformers_at_full_context(shape):
    """Random weights at twice the init scale, the preset's full context (1024 for 20m)."""
    cfg = load_recipe([shape], ["model.init_std=0.04"]).model
    torch.manual_seed(0)
    ours = Llama(cfg).eval()
    facts = TokenizerFacts("tokenizers", "</s>", 2, "<s>", 1, (), False)
    recipe = load_recipe([shape])
    hf_config = transformers.LlamaConfig(**llama_config(recipe, facts, "float32"))
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(ours.state_dict()), strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied: the embedding serves as the head
    hf.tie_weights()
    assert torch.equal(hf.lm_head.weight, ours.embed.weight)
    inputs = torch.randint(
        0, cfg.vocab_size, (1, cfg.context_length), generator=torch.Generator().manual_seed(1)
    )
    assert_same_logits(ours, hf, inputs)
    names = [hf_name(n) for n in ours.state_dict()]  # one transformers tensor per tensor of ours
    assert len(set(names)) == len(names) and {*names, "lm_head.weight"} == set(hf.state_dict())


def test_bfloat16_export_holds_the_rounded_weights(tiny_run, tmp_path):
    recipe, run_dir = tiny_run
    export_model(recipe, run_dir / "final.safetensors", tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    tensors = load_file(str(tmp_path / "bf16" / "model.safetensors"))
    ours = load_file(str(run_dir / "final.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert torch.equal(tensors["model.embed_tokens.weight"], ours["embed.weight"].bfloat16())
    hf, _, info = load_hf(tmp_path / "bf16")
    assert_strict(info)
    assert hf.model.embed_tokens.weight.dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------- checkpoints


def test_safetensors_and_pt_exports_give_the_same_weights(tiny_run, tmp_path):
    recipe, run_dir = tiny_run
    export_model(recipe, run_dir / "final.safetensors", tmp_path / "a")
    export_model(recipe, run_dir / "final.pt", tmp_path / "b")
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("a", "b"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_packed_export_average_by_default_or_one_worker(packed_run, tiny_cache, tmp_path):
    recipe, run_dir = packed_run
    for worker in (None, 2):
        from_weights = checkpoint_state_dict(recipe, run_dir / "final.safetensors", worker=worker)
        from_state = checkpoint_state_dict(recipe, run_dir / "final.pt", worker=worker)
        assert all(torch.equal(from_weights[k], from_state[k]) for k in from_weights)
    average = checkpoint_state_dict(recipe, run_dir / "final.pt")
    workers = [checkpoint_state_dict(recipe, run_dir / "final.pt", worker=k) for k in range(4)]
    mean = torch.stack([w["blocks.0.attn.q_proj.weight"] for w in workers]).mean(0)
    assert torch.equal(average["blocks.0.attn.q_proj.weight"], mean)
    assert not torch.equal(workers[2]["embed.weight"], average["embed.weight"])  # mixing is not complete
    inputs = validation_blocks(recipe, tiny_cache)[:, :-1]
    for worker, name in ((None, "average"), (2, "worker2")):
        export_model(recipe, run_dir / "final.pt", tmp_path / name, worker=worker)
        hf, _, info = load_hf(tmp_path / name)
        assert_strict(info)
        assert_same_logits(
            load_model(recipe, run_dir / "final.safetensors", torch.device("cpu"), worker=worker), hf, inputs
        )
    meta = json.loads((tmp_path / "worker2" / "tiny_llm_export.json").read_text())
    assert meta["weights"] == "worker 2 of 4" and meta["worker"] == 2
    assert "of the workers' average" in (tmp_path / "worker2" / "README.md").read_text()
    assert "4 workers" in (tmp_path / "average" / "README.md").read_text()


# ---------------------------------------------------------------------------------------------- tokenizer


def held_out_texts(corpus_dir: Path, count: int) -> list[str]:
    source = resolve_source(str(corpus_dir), None)
    texts = []
    for batch in source.iter_texts("validation", batch_size=16):
        texts.extend(batch)
        if len(texts) >= count:
            break
    return texts[:count]


def test_tokenizer_encodes_held_out_text_as_the_cache(tiny_export, tiny_cache, tiny_corpus_dir):
    _, tokenizer, _ = load_hf(tiny_export)
    texts = held_out_texts(tiny_corpus_dir, 5)
    stream = []
    for text in texts:  # the cache: each document without special tokens, then EOS
        stream += tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
    cache = open_cache(tiny_cache, verify=False)
    assert stream == cache.read("validation", 0, len(stream)).tolist()
    ours = load_tokenizer(str(tiny_cache / "tokenizer"))
    literal = "Tags like <s> and </s> stay text."
    assert tokenizer(literal)["input_ids"] == ours.encode_batch([literal])[0]
    assert tokenizer.eos_token_id not in tokenizer(literal)["input_ids"]
    assert (tokenizer.eos_token, tokenizer.bos_token) == ("</s>", "</s>")
    assert tokenizer.decode(tokenizer(texts[0])["input_ids"]) == texts[0]


def test_hub_style_template_is_dropped_so_no_bos_is_added(tiny_tokenizer_dir, tmp_path):
    """A hub Llama tokenizer.json adds <s> through its post-processor; the cache never did."""
    cache = tmp_path / "cache"
    shutil.copytree(tiny_tokenizer_dir, cache / "tokenizer")
    data = json.loads((cache / "tokenizer" / "tokenizer.json").read_text())
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    data["post_processor"] = {"type": "Sequence", "processors": [byte_level, template]}
    (cache / "tokenizer" / "tokenizer.json").write_text(json.dumps(data))
    out = tmp_path / "out"
    out.mkdir()
    facts = export_tokenizer(cache, out, eos_token_id=2, context_length=64)
    assert facts.dropped_template and facts.bos_token_id == 1
    exported = json.loads((out / "tokenizer.json").read_text())["post_processor"]
    assert exported == {"type": "Sequence", "processors": [byte_level]}
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    ours = load_tokenizer(str(cache / "tokenizer"))
    text = "Rivers and towns."
    assert tokenizer(text)["input_ids"] == ours.encode_batch([text])[0]
    assert without_special_token_templates(template) is None


def test_sentencepiece_tokenizer_is_exported_with_a_llama_config(tmp_path):
    import sentencepiece

    lines = [f"Sentence number {i} talks about rivers, towns, storms and harvests." for i in range(300)]
    (tmp_path / "text.txt").write_text("\n".join(lines))
    sentencepiece.SentencePieceTrainer.train(
        input=str(tmp_path / "text.txt"), model_prefix=str(tmp_path / "sp"), vocab_size=400,
        hard_vocab_limit=False, model_type="bpe", byte_fallback=True, bos_id=1, eos_id=2, unk_id=0,
        minloglevel=2,
    )  # fmt: skip
    (tmp_path / "cache" / "tokenizer").mkdir(parents=True)
    shutil.copy(tmp_path / "sp.model", tmp_path / "cache" / "tokenizer" / "tokenizer.model")
    out = tmp_path / "out"
    out.mkdir()
    facts = export_tokenizer(tmp_path / "cache", out, eos_token_id=2, context_length=64)
    assert facts.files == ("tokenizer.model", "tokenizer_config.json")
    assert (facts.eos_token, facts.bos_token, facts.bos_token_id) == ("</s>", "<s>", 1)
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "LlamaTokenizer" and config["add_bos_token"] is False
    assert (out / "tokenizer.model").read_bytes() == (tmp_path / "sp.model").read_bytes()


# ------------------------------------------------------------------------------------------- CLI and errors


def test_cli_export_from_a_run_directory_and_errors(tiny_run, packed_run, tmp_path, capsys):
    _, run_dir = tiny_run
    assert main(["export", "--run", str(run_dir), "--output", str(tmp_path / "cli")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["output"] == str(tmp_path / "cli") and summary["weights"] == "one model"
    config = ["--config", str(run_dir / "resolved.yaml")]
    cases = [
        (["--checkpoint", str(run_dir / "missing.safetensors")], "checkpoint not found"),
        (["--checkpoint", str(run_dir / "final.pt"), "--worker", "1"], "is not from a packed run"),
        (["--run", str(run_dir), "--checkpoint", str(run_dir / "final.pt")], "exactly one of"),
        (["--checkpoint", str(run_dir / "final.pt"), "--output", str(run_dir)], "would replace"),
    ]
    packed_dir = packed_run[1]
    cases.append(
        (
            ["--run", str(packed_dir), "--worker", "4", "--config", "packed4-tiny"],
            "out of range: the packed run has 4",
        )
    )
    for extra, message in cases:
        argv = ["export", *([] if "--run" in extra else config), *extra]
        if "--output" not in extra:
            argv += ["--output", str(tmp_path / "never")]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "never").exists()


def test_errors_are_typed(tiny_run, tmp_path):
    recipe, run_dir = tiny_run
    with pytest.raises(ConfigError, match=r"--worker 0: .* not from a packed run"):
        checkpoint_state_dict(recipe, run_dir / "final.safetensors", worker=0)
    (tmp_path / "x.bin").write_text("x")
    with pytest.raises(DataError, match="expected a .safetensors"):
        checkpoint_state_dict(recipe, tmp_path / "x.bin")
    other = load_recipe([str(run_dir / "resolved.yaml")], ["model.num_layers=3"])
    with pytest.raises(DataError, match="weights do not fit the recipe's model"):
        checkpoint_state_dict(other, run_dir / "final.safetensors")


def test_export_modules_keep_torch_out_of_the_samples_command():
    code = (
        "import sys, tiny_llm.export.samples, tiny_llm.export.settings, tiny_llm.export.runs, "
        "tiny_llm.export.card, tiny_llm.commands.samples; assert 'torch' not in sys.modules"
    )
    import subprocess

    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_model_config_defaults_give_llama_defaults():
    facts = TokenizerFacts("tokenizers", "</s>", 2, None, None, (), False)
    config = llama_config(load_recipe([]), facts, "float32")
    assert (
        config["bos_token_id"] is None
        and config["head_dim"] == ModelConfig().width // ModelConfig().num_heads
    )


def test_samples_command_tables_exports_and_their_continuations(tiny_export, tiny_run, tmp_path, capsys):
    recipe, run_dir = tiny_run
    plain = tmp_path / "plain"
    export_model(recipe, run_dir / "final.safetensors", plain)  # no prompts: a row, no samples
    out = tmp_path / "report"
    assert main(["samples", "--exports", str(tiny_export), str(plain), "--output-dir", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {"models": 2, "prompts": 2, "output_dir": str(out)}
    rows = json.loads((out / "exports.json").read_text())
    assert [r["model"] for r in rows] == ["tiny", "plain"] and rows[0]["directory"] == str(tiny_export)
    assert (
        rows[0]["final_loss"] == json.loads((run_dir / "result.json").read_text())["final_validation"]["loss"]
    )
    models = (out / "models.html").read_text()
    assert f"{rows[0]['final_loss']:.4f}" in models and str(plain) in models
    samples = (out / "samples.html").read_text()
    meta = json.loads((tiny_export / "tiny_llm_export.json").read_text())
    for item in meta["samples"]["items"]:
        assert f"<h2>{item['prompt']}</h2>" in samples
    assert "seed 3" in samples
    assert "# Sample continuations" in (out / "exports.md").read_text()


def test_export_never_deletes_a_directory_it_did_not_write(tiny_run, tmp_path):
    recipe, run_dir = tiny_run
    thesis = tmp_path / "thesis"
    thesis.mkdir()
    (thesis / "notes.txt").write_text("mine")
    for force in (False, True):
        with pytest.raises(ConfigError, match="did not write"):
            export_model(recipe, run_dir / "final.safetensors", thesis, force=force)
    assert [p.name for p in thesis.iterdir()] == ["notes.txt"]


def test_export_replaces_an_earlier_export_only_with_force(tiny_run, tmp_path, capsys):
    recipe, run_dir = tiny_run
    output = tmp_path / "out"
    args = ["export", "--run", str(run_dir), "--output", str(output)]
    assert main(args) == 0
    (output / "README.md").write_text("edited")
    capsys.readouterr()
    assert main(args) == 2
    assert "pass --force" in capsys.readouterr().err
    assert (output / "README.md").read_text() == "edited"
    assert main([*args, "--force"]) == 0
    assert (output / "README.md").read_text() != "edited"


def test_an_export_embeds_no_absolute_local_path(tiny_export, tiny_run, tiny_recipe_args, tmp_path_factory):
    base = str(tmp_path_factory.getbasetemp())  # every path of the run, its cache, corpus and tokenizer
    leaks = {}
    for path in tiny_export.iterdir():
        if path.suffix == ".safetensors":
            text = json.dumps(__import__("safetensors").safe_open(str(path), "pt").metadata())
        else:
            text = path.read_text(encoding="utf-8")
        for local in (base, str(Path.home()), str(Path.cwd())):
            if local in text:
                leaks[path.name] = local
    assert leaks == {}


def test_export_into_the_working_directory_is_refused_and_leaves_nothing(
    tiny_run, tmp_path, monkeypatch, capsys
):
    """`--output . --force` from inside an earlier export: a rename cannot move the working directory
    (EBUSY), which left `..old.*` folders behind. Refused in one line, before any work."""
    recipe, run_dir = tiny_run
    output = tmp_path / "out"
    assert main(["export", "--run", str(run_dir), "--output", str(output)]) == 0
    before = {p.name: p.read_bytes() for p in output.iterdir()}
    capsys.readouterr()
    monkeypatch.chdir(output)
    for target in (".", str(output), "..", str(tmp_path)):
        assert main(["export", "--run", str(run_dir), "--output", target, "--force"]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"error: --output {target} is the working directory or holds it, which cannot be replaced; "
            "choose a new path, such as a subdirectory\n"
        )
    assert {p.name: p.read_bytes() for p in output.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
