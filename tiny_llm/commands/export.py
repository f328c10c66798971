"""`export`: a checkpoint as a Hugging Face model directory (LlamaForCausalLM + tokenizer + model card),
with ``--gguf`` also as ``model.gguf`` for llama.cpp."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny_llm.cli import add_recipe_arguments


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    """--config/--set + --checkpoint, or --run DIR, or --best-of RANKING; --worker K (also for generate)."""
    add_recipe_arguments(parser, required=False)
    parser.add_argument("--checkpoint", type=Path, help=".safetensors weights or .pt state (with --config)")
    parser.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="a finished run directory: its resolved.yaml and final weights",
    )
    parser.add_argument(
        "--best-of",
        type=Path,
        metavar="RANKING",
        help="a campaign stage's ranking.json: its best run (the run directory beside the ranking)",
    )
    parser.add_argument(
        "--worker",
        type=int,
        metavar="K",
        help="packed runs: worker K's weights (default: the workers' average)",
    )


def resolve_source(args: argparse.Namespace):  # -> tuple[RecipeConfig, Path]
    """The recipe and checkpoint the arguments name (one-line errors for a wrong combination)."""
    from tiny_llm.export.runs import resolve_source as source

    return source(args.config, args.set, checkpoint=args.checkpoint, run=args.run, best_of=args.best_of)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument(
        "--output", required=True, type=Path, metavar="DIR", help="export directory (new, or empty)"
    )
    parser.add_argument("--force", action="store_true", help="replace an earlier export in --output")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="weight dtype")
    parser.add_argument(
        "--prompts",
        type=Path,
        metavar="FILE",
        help="YAML prompt file: sample each prompt into the model card and tiny_llm_export.json",
    )
    parser.add_argument(
        "--gguf", action="store_true", help="also write model.gguf for llama.cpp (needs the gguf package)"
    )


def run(args: argparse.Namespace) -> int:
    from tiny_llm.export.settings import load_prompts

    recipe, checkpoint = resolve_source(args)
    prompts = load_prompts(args.prompts) if args.prompts else None
    from tiny_llm.export.hf import export_model
    from tiny_llm.runtime.device import setup_runtime

    setup_runtime(_on_cpu(recipe))  # threads as the recipe asks; export and sampling run on the CPU
    summary = export_model(
        recipe,
        checkpoint,
        args.output,
        dtype=args.dtype,
        worker=args.worker,
        prompts=prompts,
        gguf=args.gguf,
        force=args.force,
    )
    print(json.dumps(summary, indent=2))
    return 0


def _on_cpu(recipe):  # -> RecipeConfig
    import dataclasses

    return dataclasses.replace(recipe, runtime=dataclasses.replace(recipe.runtime, device="cpu"))
