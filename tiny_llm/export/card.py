"""The exported model's card (README.md) from its ``tiny_llm_export.json`` facts (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tiny_llm.output_dirs import OUTPUT_MARKER

EXPORT_FILE = "tiny_llm_export.json"
EXPORT_FORMAT = "tiny-llm-export"
EXPORT_VERSION = 1


@dataclass(frozen=True)
class Difference:
    """A deliberate difference from the directory transformers' ``save_pretrained`` writes for this model."""

    file: str
    keys: tuple[str, ...]
    """Top-level keys of the JSON file that differ; empty: the whole file is ours only (or theirs only)."""
    why: str
    backend: str | None = None
    """Only for exports whose tokenizer has this backend (``tokenizers`` or ``sentencepiece``)."""


DIFFERENCES = (
    Difference("README.md", (), "this model card; transformers writes none"),
    Difference("tiny_llm_export.json", (), "the card's facts for machines (the report reads them)"),
    Difference("model.gguf", (), "the same model for llama.cpp, written with --gguf"),
    Difference(OUTPUT_MARKER, (), "marks the directory as tiny-llm's: export replaces it only with --force"),
    Difference(
        "config.json",
        ("rope_theta",),
        "also at the top level, where transformers 4.x and llama.cpp's converter read it (5.x reads "
        "rope_parameters, which is written too)",
    ),
    Difference(
        "config.json",
        ("torch_dtype",),
        "beside dtype: older transformers and vLLM read only torch_dtype and would load bfloat16 as FP32",
    ),
    Difference("config.json", ("transformers_version",), "not written: transformers did not write the file"),
    Difference(
        "generation_config.json",
        ("transformers_version",),
        "not written: transformers did not write the file",
    ),
    Difference(
        "tokenizer_config.json",
        ("add_bos_token", "add_eos_token"),
        "written as false: training never added BOS or EOS, and Llama tokenizer classes add BOS unless told",
    ),
    Difference(
        "tokenizer_config.json",
        ("backend", "is_local", "local_files_only"),
        "not written: transformers records how it loaded the tokenizer",
    ),
    Difference(
        "tokenizer_config.json",
        ("tokenizer_class",),
        "PreTrainedTokenizerFast, which transformers 4.x loads too (5.x writes TokenizersBackend)",
        "tokenizers",
    ),
    Difference(
        "tokenizer.json",
        ("post_processor",),
        "null; transformers writes an empty template: neither adds a token",
        "tokenizers",
    ),
    Difference(
        "tokenizer.model",
        (),
        "the SentencePiece model itself, which llama.cpp and sentencepiece read; transformers writes its "
        "conversion to tokenizer.json instead",
        "sentencepiece",
    ),
    Difference(
        "tokenizer.json",
        (),
        "not written: transformers converts tokenizer.model when it loads it",
        "sentencepiece",
    ),
    Difference(
        "tokenizer_config.json",
        ("legacy",),
        "false: SentencePiece's own handling of text after special tokens, as training encoded",
        "sentencepiece",
    ),
    Difference(
        "tokenizer_config.json",
        ("add_prefix_space", "extra_special_tokens", "use_default_system_prompt"),
        "not written: transformers' defaults for its Llama tokenizer",
        "sentencepiece",
    ),
)


def differences(backend: str, gguf: bool) -> list[Difference]:
    """The deliberate differences of an export with this tokenizer backend (and model.gguf or not)."""
    return [d for d in DIFFERENCES if d.backend in (None, backend) and (gguf or d.file != "model.gguf")]


def _notes_lines(meta: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## Notes",
        "",
        "Compared with what transformers' `save_pretrained` writes for this model and tokenizer, "
        "the weights, config and tokenizer are the same except for:",
        "",
    ]
    for d in differences(meta["tokenizer"]["backend"], bool(meta.get("gguf"))):
        what = ", ".join(f"`{k}`" for k in d.keys)
        lines.append(f"- `{d.file}`" + (f" {what}" if what else "") + f": {d.why}")
    return lines


def _bos_line(tok: dict[str, Any]) -> str:
    start = tok.get("document_start")
    if not start:
        return ""
    own = start.get("tokenizer_bos")
    never = (
        f" The tokenizer's own `{own}` (id {start['tokenizer_bos_id']}) occurred "
        f"{start['tokenizer_bos_occurrences']:,} times there and is not used."
        if own and start.get("tokenizer_bos_id") != start.get("id")
        else ""
    )
    if start["id"] is None:
        return (
            f" No BOS is declared: `{tok['eos_token']}` did not occur in the first "
            f"{start['tokens_checked']:,} training tokens." + never
        )
    return (
        f" BOS (`bos_token_id` in config.json, generation_config.json and model.gguf) is id {start['id']} "
        f"(`{start['token']}`), the EOS that came before every document but the first: "
        f"{start['occurrences']:,} times in the first {start['tokens_checked']:,} training tokens." + never
    )


def _loss_line(meta: dict[str, Any]) -> str:
    training = meta.get("training")
    if not training or training.get("final_validation_loss") is None:
        return "- Final validation loss: not recorded (no result.json beside the checkpoint)"
    loss = training["final_validation_loss"]
    split = "full validation split" if training.get("validation_complete") else "truncated validation split"
    of = " (of the workers' average)" if meta.get("worker") is not None else ""
    tokens = training.get("validation_tokens")
    over = f" over {tokens:,} tokens" if isinstance(tokens, int) else ""
    return f"- Final validation loss{of}: {loss:.4f} nats per token ({split}{over})"


def _tokens_line(meta: dict[str, Any]) -> str:
    training = meta.get("training") or {}
    tokens = training.get("tokens")
    if tokens is None:
        return "- Training tokens: not recorded"
    per_model = training.get("tokens_per_model")
    extra = f" ({per_model:,} per worker)" if per_model is not None else ""
    return f"- Training tokens: {tokens:,}{extra}"


def _gguf_lines(meta: dict[str, Any]) -> list[str]:
    gguf = meta.get("gguf")
    if not gguf:
        return []
    tok = meta["tokenizer"]
    return [
        "",
        "## llama.cpp",
        "",
        f"`{gguf['file']}` holds the same weights and tokenizer for llama.cpp (tokenizer model "
        f"`{gguf['tokenizer_model']}`, pre-tokenizer `{gguf['pre_tokenizer']}`; no BOS is added). Start a "
        f"fresh document with EOS (`{tok['eos_token']}`) before the prompt, as in training:",
        "",
        "```bash",
        f"llama-completion -m {meta['name']}/{gguf['file']} -no-cnv --temp 0 -n 48 "
        f"-p '{tok['eos_token']}The history of'",
        "```",
    ]


def model_card(meta: dict[str, Any]) -> str:
    """README.md text: what the model is, how it was trained, how to load it, its sample continuations."""
    m, r, cache, tok = meta["model"], meta["recipe"], meta["cache"], meta["tokenizer"]
    packed = r.get("packed")
    shape = (
        f"{m['num_layers']} layers, width {m['width']}, {m['num_heads']} heads, "
        f"SwiGLU width {m['ffn_width']}, "
        f"context {m['context_length']}, vocabulary {m['vocab_size']}, RoPE θ {m['rope_theta']:g}, "
        f"RMSNorm ε {m['norm_eps']:g}, tied embeddings"
    )
    schedule = f"{r['lr_schedule']} schedule, warmup {r['warmup_fraction']:g}"
    optimizer = (
        f"AdamW lr {r['lr']:g} (β1 {r['beta1']:g}, β2 {r['beta2']:g}, weight decay {r['weight_decay']:g}), "
        f"{schedule}, {r['batch_tokens']:,}-token updates, "
        f"{r['tokens_per_parameter']:g} tokens per parameter, "
        f"seed {r['seed']}"
    )
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [tiny-llm, llama]",
        "---",
        "",
        f"# {meta['name']}",
        "",
        f"A {meta['parameters']:,}-parameter Llama-style causal language model trained with tiny-llm and "
        "exported to the Hugging Face `LlamaForCausalLM` format. It loads offline with "
        "`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`.",
        "",
        "## Training",
        "",
        f"- Model: {shape}",
        f"- Optimizer: {optimizer}",
    ]
    if packed:
        lines.append(
            f"- Packed decentralized training: {packed['num_models']} workers, "
            f"{packed['topology']} topology, {packed['scheme'].upper()}"
        )
    lines += [
        f"- Weights: {meta['weights']}, exported as {meta['dtype']} from `{meta['checkpoint']}`",
        _tokens_line(meta),
        _loss_line(meta),
        f"- Data: `{cache['dataset']}`, tokenizer `{cache['tokenizer']}`",
        f"- Token cache identity: `{cache['identity']}`",
        f"- Recipe identity: `{meta['recipe_identity']}`",
        "",
        "## Tokenizer",
        "",
        f"Texts were encoded without special tokens (no BOS), and every document ends with EOS "
        f"(`{tok['eos_token']}`, id {tok['eos_token_id']}); a literal `{tok['eos_token']}` inside a text is "
        "text. The exported tokenizer does the same: `tokenizer(text)` gives the ids training saw."
        + _bos_line(tok)
        + " A document starts right after an EOS: put `eos_token_id` before a prompt to start a fresh "
        "document:",
        "",
        "```python",
        "import torch",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f'tokenizer = AutoTokenizer.from_pretrained("{meta["name"]}")',
        f'model = AutoModelForCausalLM.from_pretrained("{meta["name"]}")',
        'ids = [tokenizer.eos_token_id] + tokenizer("The history of").input_ids',
        "out = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=True, top_k=50, top_p=0.95)",
        "print(tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))",
        "```",
    ]
    lines += _gguf_lines(meta)
    lines += _notes_lines(meta)
    samples = meta.get("samples")
    if samples:
        s = samples["settings"]
        how = (
            "greedy"
            if s["temperature"] == 0
            else f"temperature {s['temperature']:g}, top-k {s['top_k']}, top-p {s['top_p']:g}, "
            f"seed {s['seed']} + prompt index"
        )
        lines += ["", "## Samples", "", f"Continuations by tiny-llm's `generate` ({how}):", ""]
        for item in samples["items"]:
            lines += [f"**{item['prompt']}**{item['completion']}", ""]
        lines.pop()
    return "\n".join(lines) + "\n"
