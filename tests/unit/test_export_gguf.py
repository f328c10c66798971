"""`export --gguf`: model.gguf for llama.cpp, read back with gguf's reader, for both tokenizer families."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from export_helpers import (
    directory_differences,
    documented_differences,
    saved_by_transformers,
    train_small,
)
from safetensors.torch import load_file

from tiny_llm.cli import main
from tiny_llm.config import load_recipe
from tiny_llm.data.prepare import prepare_cache
from tiny_llm.data.sources import resolve_source
from tiny_llm.data.tokenizer import load_tokenizer
from tiny_llm.errors import DataError
from tiny_llm.export.gguf_file import gguf_vocab, interleave_heads
from tiny_llm.export.tokenizer import TokenizerFacts
from tiny_llm.model import rope_tables

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SPACE = "\u2581"


def texts_of(corpus: Path, split: str, count: int) -> list[str]:
    texts = []
    for batch in resolve_source(str(corpus), None).iter_texts(split, batch_size=64):
        texts.extend(batch)
        if len(texts) >= count:
            break
    return texts[:count]


@pytest.fixture(scope="module")
def sp_tokenizer_dir(tiny_corpus_dir: Path, tmp_path_factory) -> Path:
    """A 512-piece SentencePiece BPE with byte fallback, set up like Llama's (no normaliser, dummy prefix)."""
    import sentencepiece

    root = tmp_path_factory.mktemp("sp")
    (root / "text.txt").write_text("\n".join(texts_of(tiny_corpus_dir, "train", 400)), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(root / "text.txt"), model_prefix=str(root / "sp"), vocab_size=512, model_type="bpe",
        byte_fallback=True, character_coverage=0.995, normalization_rule_name="identity",
        remove_extra_whitespaces=False, bos_id=1, eos_id=2, unk_id=0, minloglevel=2,
    )  # fmt: skip
    (root / "tokenizer").mkdir()
    (root / "sp.model").rename(root / "tokenizer" / "tokenizer.model")
    return root / "tokenizer"


def read(path: Path):
    return gguf.GGUFReader(str(path))


def field(reader, key: str):
    """A metadata value: a scalar, a string, or a list of them."""
    return reader.fields[key].contents()


def tensor(reader, name: str) -> np.ndarray:
    (t,) = [t for t in reader.tensors if t.name == name]
    data = np.asarray(t.data)
    if t.tensor_type == gguf.GGMLQuantizationType.BF16:
        data = gguf.quants.dequantize(data, t.tensor_type)
    return data.reshape(tuple(reversed([int(n) for n in t.shape])))


def check_model_metadata(reader, recipe) -> None:
    m = recipe.model
    assert field(reader, "general.architecture") == "llama"
    assert field(reader, "llama.context_length") == m.context_length
    assert field(reader, "llama.embedding_length") == m.width
    assert field(reader, "llama.block_count") == m.num_layers
    assert field(reader, "llama.feed_forward_length") == m.ffn_width
    assert field(reader, "llama.attention.head_count") == m.num_heads
    assert field(reader, "llama.attention.head_count_kv") == m.num_heads
    assert field(reader, "llama.rope.dimension_count") == m.width // m.num_heads
    assert field(reader, "llama.rope.freq_base") == pytest.approx(m.rope_theta)
    assert field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(m.norm_eps)
    assert field(reader, "tokenizer.ggml.eos_token_id") == 2
    assert field(reader, "tokenizer.ggml.bos_token_id") == 2  # the EOS before every training document
    assert field(reader, "tokenizer.ggml.add_bos_token") is False
    assert field(reader, "tokenizer.ggml.add_eos_token") is False


def check_tensors(reader, export: Path, recipe) -> None:
    m = recipe.model
    hf = load_file(str(export / "model.safetensors"))
    names = {t.name for t in reader.tensors}
    per_block = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up")
    expected = {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{part}.weight" for i in range(m.num_layers) for part in (*per_block, "ffn_down")
    }
    assert names == expected  # no output.weight: llama.cpp ties the head to token_embd
    assert tensor(reader, "token_embd.weight").shape == (m.vocab_size, m.width)
    assert tensor(reader, "blk.1.ffn_down.weight").shape == (m.width, m.ffn_width)
    assert tensor(reader, "blk.0.attn_norm.weight").shape == (m.width,)
    embed = hf["model.embed_tokens.weight"].float().numpy()
    assert np.array_equal(tensor(reader, "token_embd.weight"), embed)
    q = hf["model.layers.1.self_attn.q_proj.weight"].float()
    assert np.array_equal(tensor(reader, "blk.1.attn_q.weight"), interleave_heads(q, m.num_heads).numpy())
    assert not np.array_equal(tensor(reader, "blk.1.attn_q.weight"), q.numpy())
    v = hf["model.layers.1.self_attn.v_proj.weight"].float().numpy()
    assert np.array_equal(tensor(reader, "blk.1.attn_v.weight"), v)


# ---------------------------------------------------------------------------------------- RoPE layout


def test_interleaved_heads_give_ggml_rope_the_same_attention_scores():
    """ggml's Llama RoPE rotates pairs (2i, 2i+1); with q/k rows permuted, q·k equals ours (halves)."""
    heads, head_dim, width, length = 2, 8, 16, 6
    torch.manual_seed(0)
    wq, wk, x = torch.randn(width, width), torch.randn(width, width), torch.randn(length, width)
    cos, sin = rope_tables(length, head_dim, 10000.0)

    def halves(t: torch.Tensor) -> torch.Tensor:  # ours / transformers: rotate_half
        a, b = t[..., : head_dim // 2], t[..., head_dim // 2 :]
        return t * cos + torch.cat([-b, a], -1) * sin

    def pairs(t: torch.Tensor) -> torch.Tensor:  # ggml LLAMA_ROPE_TYPE_NORM: adjacent pairs
        c, s = cos[:, : head_dim // 2], sin[:, : head_dim // 2]
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack([even * c - odd * s, even * s + odd * c], -1).flatten(-2)

    def scores(rope, q_weight, k_weight) -> torch.Tensor:
        q = (x @ q_weight.T).view(length, heads, head_dim).transpose(0, 1)
        k = (x @ k_weight.T).view(length, heads, head_dim).transpose(0, 1)
        return rope(q) @ rope(k).transpose(-1, -2)

    ours = scores(halves, wq, wk)
    ggml = scores(pairs, interleave_heads(wq, heads), interleave_heads(wk, heads))
    assert torch.allclose(ours, ggml, atol=1e-5)
    assert not torch.allclose(ours, scores(pairs, wq, wk), atol=1e-2)  # unpermuted weights are wrong


# ---------------------------------------------------------------------------------------- byte-level BPE


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, tiny_cache, tiny_recipe_args):
    run_dir = tmp_path_factory.mktemp("gguf") / "tiny"
    return train_small(tiny_cache, tiny_recipe_args, run_dir), run_dir


def test_byte_level_bpe_export_reads_back(bpe_run, tiny_cache, tiny_corpus_dir, tmp_path, capsys):
    recipe, run_dir = bpe_run
    out = tmp_path / "demo"
    assert main(["export", "--run", str(run_dir), "--output", str(out), "--gguf"]) == 0
    capsys.readouterr()
    reader = read(out / "model.gguf")
    check_model_metadata(reader, recipe)
    check_tensors(reader, out, recipe)
    assert field(reader, "general.file_type") == int(gguf.LlamaFileType.ALL_F32)
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre") == "gpt-2"
    ours = load_tokenizer(str(tiny_cache / "tokenizer"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert tokens == ours.id_to_token()
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[:3] == [int(gguf.TokenType.CONTROL)] * 3 and set(types[3:]) == {int(gguf.TokenType.NORMAL)}
    # The file's tokens and merges with GPT-2's split rule encode held-out text as the cache did.
    from tokenizers import Tokenizer, models, pre_tokenizers

    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges")]
    rebuilt = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    rebuilt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    for text in texts_of(tiny_corpus_dir, "validation", 5):
        assert rebuilt.encode(text).ids == ours.encode_batch([text])[0]
    meta = json.loads((out / "tiny_llm_export.json").read_text())
    assert meta["gguf"] == {"file": "model.gguf", "tokenizer_model": "gpt2", "pre_tokenizer": "gpt-2"}
    assert "## llama.cpp" in (out / "README.md").read_text()


def test_bfloat16_gguf_keeps_norms_in_float32(bpe_run, tmp_path):
    recipe, run_dir = bpe_run
    from tiny_llm.export.hf import export_model

    export_model(recipe, run_dir / "final.safetensors", tmp_path / "bf16", dtype="bfloat16", gguf=True)
    reader = read(tmp_path / "bf16" / "model.gguf")
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert kinds["token_embd.weight"] == gguf.GGMLQuantizationType.BF16
    assert field(reader, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_BF16)
    check_tensors(reader, tmp_path / "bf16", recipe)  # the bf16 values, bit for bit


def test_export_without_gguf_writes_none(bpe_run, tmp_path):
    recipe, run_dir = bpe_run
    from tiny_llm.export.hf import export_model

    export_model(recipe, run_dir / "final.safetensors", tmp_path / "plain")
    assert not (tmp_path / "plain" / "model.gguf").exists()
    assert json.loads((tmp_path / "plain" / "tiny_llm_export.json").read_text())["gguf"] is None


def test_unsupported_pre_tokenizer_is_one_line(tiny_tokenizer_dir, tmp_path):
    data = json.loads((tiny_tokenizer_dir / "tokenizer.json").read_text())
    data["pre_tokenizer"] = {"type": "Whitespace"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    facts = TokenizerFacts("tokenizers", "</s>", 2, "<s>", 1, (), False)
    with pytest.raises(DataError, match="pre-tokenizer .* has no llama.cpp equivalent"):
        gguf_vocab(tmp_path, facts, 512)


# ---------------------------------------------------------------------------------------- SentencePiece


@pytest.fixture(scope="module")
def sp_run(tmp_path_factory, sp_tokenizer_dir, tiny_recipe_args):
    root = tmp_path_factory.mktemp("sp-run")
    args = [*tiny_recipe_args(root / "cache"), f"data.tokenizer={sp_tokenizer_dir}"]
    prepare_cache(load_recipe(["tiny"], args), progress=False)
    recipe = train_small(root / "cache", lambda _: args, root / "run")
    return recipe, root / "run"


def test_sentencepiece_export_reads_back(sp_run, sp_tokenizer_dir, tmp_path):
    recipe, run_dir = sp_run
    from tiny_llm.export.hf import export_model

    export_model(recipe, run_dir / "final.safetensors", tmp_path / "sp", gguf=True)
    reader = read(tmp_path / "sp" / "model.gguf")
    check_model_metadata(reader, recipe)
    check_tensors(reader, tmp_path / "sp", recipe)
    assert field(reader, "tokenizer.ggml.model") == "llama"
    assert field(reader, "tokenizer.ggml.add_space_prefix") is True
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_tokenizer_dir / "tokenizer.model"))
    assert field(reader, "tokenizer.ggml.tokens") == [sp.id_to_piece(i) for i in range(512)]
    assert field(reader, "tokenizer.ggml.scores") == pytest.approx([sp.get_score(i) for i in range(512)])
    types = field(reader, "tokenizer.ggml.token_type")
    assert types[:3] == [int(gguf.TokenType.UNKNOWN)] + [int(gguf.TokenType.CONTROL)] * 2
    assert types[3:259] == [int(gguf.TokenType.BYTE)] * 256


def test_sentencepiece_export_differs_from_save_pretrained_only_as_listed(sp_run, tmp_path):
    pytest.importorskip("google.protobuf")  # transformers reads tokenizer.model through protobuf
    recipe, run_dir = sp_run
    from tiny_llm.export.hf import export_model

    export_model(recipe, run_dir / "final.safetensors", tmp_path / "sp", gguf=True)
    theirs = saved_by_transformers(tmp_path / "sp", tmp_path / "theirs")
    found = directory_differences(tmp_path / "sp", theirs)
    assert found == documented_differences("sentencepiece", gguf=True)
    notes = (tmp_path / "sp" / "README.md").read_text().split("## Notes")[1]
    assert "`tokenizer.model`" in notes and "`model.gguf`" in notes


# ------------------------------------------------------------------ Llama-style tokenizer.json (the hub's)


def llama_tokenizer_json(sp_model: Path, output: Path) -> None:
    """TinyLlama's tokenizer.json form of a SentencePiece BPE, with merges as transformers derives them."""
    import sentencepiece
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    sp = sentencepiece.SentencePieceProcessor(model_file=str(sp_model))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = sorted(
        ((piece[:k], piece[k:]), index, vocab[piece[:k]])
        for piece, index in vocab.items()
        for k in range(1, len(piece))
        if piece[:k] in vocab and piece[k:] in vocab
    )
    merges.sort(key=lambda m: (m[1], m[2]))  # by the merged piece's rank, as its SentencePiece score says
    model = models.BPE(vocab, [m[0] for m in merges], unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    tokenizer.save(str(output / "tokenizer.json"))


def llama_cpp_spm(text: str, tokens: list[str], scores: list[float]) -> list[int]:
    """llama.cpp's SentencePiece tokenizer: merge the adjacent pair of highest score, then byte fallback."""
    ids = {token: index for index, token in enumerate(tokens)}
    symbols = list(SPACE + text.replace(" ", SPACE))
    while True:
        best = None
        for i in range(len(symbols) - 1):
            index = ids.get(symbols[i] + symbols[i + 1])
            if index is not None and (best is None or scores[index] > best[0]):
                best = (scores[index], i)
        if best is None:
            break
        i = best[1]
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
    out = []
    for symbol in symbols:
        out += [ids[symbol]] if symbol in ids else [ids[f"<0x{b:02X}>"] for b in symbol.encode()]
    return out


def test_llama_style_tokenizer_json_scores_reproduce_its_merges(sp_tokenizer_dir, tiny_corpus_dir, tmp_path):
    llama_tokenizer_json(sp_tokenizer_dir / "tokenizer.model", tmp_path)
    facts = TokenizerFacts("tokenizers", "</s>", 2, "<s>", 1, (), False)
    vocab = gguf_vocab(tmp_path, facts, 512)
    assert (vocab.model, vocab.pre, vocab.add_space_prefix) == ("llama", "default", True)
    ours = load_tokenizer(str(tmp_path))
    assert vocab.tokens == ours.id_to_token()
    assert vocab.types[:3] == [int(gguf.TokenType.UNKNOWN), *[int(gguf.TokenType.CONTROL)] * 2]
    assert vocab.types[3:259] == [int(gguf.TokenType.BYTE)] * 256
    texts = [*texts_of(tiny_corpus_dir, "validation", 4), "Zürich  café, 1905 — naïve"]
    for text in texts:
        expected = ours.encode_batch([text])[0]
        assert llama_cpp_spm(text, vocab.tokens, vocab.scores) == expected
    flat = llama_cpp_spm(texts[0], vocab.tokens, [0.0] * 512)  # the scores matter
    assert flat != ours.encode_batch([texts[0]])[0]


def test_gguf_is_not_imported_without_the_switch():
    code = "import sys, tiny_llm.export.hf, tiny_llm.commands.export; assert 'gguf' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# ---------------------------------------------------------------------------------------- llama.cpp itself


@pytest.mark.slow
@pytest.mark.parametrize("run", ["bpe_run", "sp_run"])
def test_llama_cpp_greedy_output_equals_tiny_llm_generate(run, request, tmp_path, capsys):
    """32 greedy tokens from llama.cpp (llama-cpp-python) on model.gguf equal `tiny_llm generate`'s. Opt-in:
    llama-cpp-python builds llama.cpp from source (over 15 minutes on 2 cores), so CI does not install it;
    with TINY_LLM_LLAMA_CPP=1 a missing one fails instead of skipping."""
    if not os.environ.get("TINY_LLM_LLAMA_CPP"):
        pytest.skip("opt-in: pip install llama-cpp-python, then set TINY_LLM_LLAMA_CPP=1")
    import llama_cpp

    recipe, run_dir = request.getfixturevalue(run)
    assert main(["export", "--run", str(run_dir), "--output", str(tmp_path / "e"), "--gguf"]) == 0
    prompt = "The history of the city"
    argv = ["generate", "--run", str(run_dir), "--prompt", prompt, "--temperature", "0"]
    capsys.readouterr()
    assert main([*argv, "--max-new-tokens", "32", "--device", "cpu", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)
    llm = llama_cpp.Llama(
        model_path=str(tmp_path / "e" / "model.gguf"),
        n_ctx=recipe.model.context_length,
        n_threads=1,
        verbose=False,
    )
    eos = llm.token_eos()
    expected = load_tokenizer(str(Path(recipe.data.cache_dir) / "tokenizer")).encode_batch([prompt])[0]
    assert llm.tokenize(prompt.encode(), add_bos=False, special=False) == expected
    new = []
    sampling = {"temp": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0, "repeat_penalty": 1.0}
    for token in llm.generate([eos, *expected], **sampling):
        new.append(token)
        if token == eos or len(new) == 32:
            break
    assert new == ours["token_ids"]
