"""Generation speed: tiny-llm's KV-cache `generate` vs transformers' `generate` on the exported model.

For each shape, one random-initialised model (seeded) is exported to a temporary Hugging Face directory
(config.json + model.safetensors, as `tiny-llm export` writes them) and loaded with
`AutoModelForCausalLM.from_pretrained`. Both then continue the same random prompt (batch 1) by
`--new-tokens` tokens, EOS never stopping them, greedy and sampled (temperature 0.8, top-k 50, top-p 0.95),
alternating trials in the same process; the best trial of each counts (tokens/s = new tokens / time,
prompt included). `--clock cpu` times the process's CPU seconds instead of wall seconds: with one thread
that is the figure a shared, busy machine cannot distort (other jobs only delay a wall clock). Prints one
JSON object.

The demo shape's context (128) cannot hold 256 new tokens; the demo row uses context 512 (same weights
otherwise; the context only sizes the RoPE tables and the KV cache).

Example:
    python benchmarks/generate_speed.py --shapes demo-s 20m --new-tokens 256 --trials 3 --threads 2
    python benchmarks/generate_speed.py --threads 1 --clock cpu
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from tiny_llm.config import load_recipe  # noqa: E402
from tiny_llm.export.generate import generate  # noqa: E402
from tiny_llm.export.hf import llama_config  # noqa: E402
from tiny_llm.export.settings import SamplingConfig  # noqa: E402
from tiny_llm.export.tokenizer import TokenizerFacts  # noqa: E402
from tiny_llm.export.weights import to_hf_state_dict  # noqa: E402
from tiny_llm.model import Llama  # noqa: E402

FACTS = TokenizerFacts("tokenizers", "</s>", 2, "<s>", 1, (), False)
MODES = {
    "greedy": SamplingConfig(temperature=0, stop_at_eos=False),
    "sampled": SamplingConfig(temperature=0.8, top_k=50, top_p=0.95, stop_at_eos=False),
}


def shape_recipe(shape: str, new_tokens: int, prompt_tokens: int):
    recipe = load_recipe([shape])
    if recipe.model.context_length < prompt_tokens + new_tokens:
        context = max(512, prompt_tokens + new_tokens)
        recipe = load_recipe([shape], [f"model.context_length={context}", "training.micro_batch_size=1"])
    return recipe


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]


def ours(model: Llama, prompt: list[int], settings: SamplingConfig) -> tuple[float, list[int]]:
    start = clock()
    out = generate(model, prompt, settings, eos_token_id=2)
    return clock() - start, out.tokens


def theirs(hf, prompt: list[int], settings: SamplingConfig) -> tuple[float, list[int]]:
    ids = torch.tensor([prompt])
    kwargs = {"do_sample": False}
    if settings.temperature > 0:
        kwargs = {"do_sample": True, "temperature": settings.temperature, "top_k": settings.top_k,
                  "top_p": settings.top_p}  # fmt: skip
    start = clock()
    with torch.inference_mode():
        out = hf.generate(
            ids, max_new_tokens=settings.max_new_tokens, eos_token_id=None, pad_token_id=2, **kwargs
        )
    return clock() - start, out[0, len(prompt) :].tolist()


def measure(shape: str, args: argparse.Namespace) -> dict:
    import transformers

    recipe = shape_recipe(shape, args.new_tokens, args.prompt_tokens)
    torch.manual_seed(0)
    model = Llama(recipe.model).eval()
    with tempfile.TemporaryDirectory() as tmp:
        save_file(to_hf_state_dict(model.state_dict()), str(Path(tmp) / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        (Path(tmp) / "config.json").write_text(json.dumps(llama_config(recipe, FACTS, "float32")))
        hf = transformers.AutoModelForCausalLM.from_pretrained(tmp, local_files_only=True).eval()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, recipe.model.vocab_size, (args.prompt_tokens,), generator=g).tolist()
    row = {
        "shape": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "context_length": recipe.model.context_length,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
    }
    for mode, base in MODES.items():
        settings = SamplingConfig(**{**base.as_dict(), "max_new_tokens": args.new_tokens})
        ours(model, prompt, settings)  # warm-up of both paths
        theirs(hf, prompt, settings)
        times: dict[str, list[float]] = {"tiny_llm": [], "transformers": []}
        tokens = {}
        for _ in range(args.trials):
            seconds, tokens["tiny_llm"] = ours(model, prompt, settings)
            times["tiny_llm"].append(seconds)
            seconds, tokens["transformers"] = theirs(hf, prompt, settings)
            times["transformers"].append(seconds)
        best = {k: min(v) for k, v in times.items()}
        row[mode] = {
            "tiny_llm_tokens_per_second": args.new_tokens / best["tiny_llm"],
            "transformers_tokens_per_second": args.new_tokens / best["transformers"],
            "speedup": best["transformers"] / best["tiny_llm"],
            "seconds": {k: [round(s, 4) for s in v] for k, v in times.items()},
            "tokens_generated": {k: len(v) for k, v in tokens.items()},
        }
        if mode == "greedy":
            row[mode]["same_tokens"] = tokens["tiny_llm"] == tokens["transformers"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["demo-s", "20m"])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=tuple(CLOCK), default="wall", help="wall or process CPU seconds")
    args = parser.parse_args()
    global clock
    clock = CLOCK[args.clock]
    torch.set_num_threads(args.threads)
    import transformers

    transformers.utils.logging.disable_progress_bar()

    result = {
        "protocol": {
            "batch": 1,
            "new_tokens": args.new_tokens,
            "prompt_tokens": args.prompt_tokens,
            "trials": args.trials,
            "threads": args.threads,
            "clock": args.clock,
            "statistic": f"best trial; tokens/s = new tokens / {args.clock} seconds (prompt pass included)",
        },
        "environment": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
            "cpus": len(os.sched_getaffinity(0)),
        },
        "shapes": [measure(shape, args) for shape in args.shapes],
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
