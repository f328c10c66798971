"""Training throughput side by side with peers: the same initial weights, the same batches, one protocol.

Peers, each in its own process, one after the other, on the same device:

- `library`: tiny-llm's own engine (`ModelEngine.train_step`: the recipe's compile, fused AdamW, autocast);
- `transformers`, `transformers-compiled`: transformers' `LlamaForCausalLM` loaded from the weights as
  `tiny-llm export` writes them (`tiny_llm.export`: config.json + Llama-named safetensors), trained eagerly
  and with its forward+loss under `torch.compile`;
- `minimal`: a nanoGPT-style loop of ~40 lines (`minimal_loop` below): the library's model, fused AdamW, a
  compiled forward+loss, no host read per update.

Every peer starts from the seeded model of the recipe, takes the same random token batches (seeded), makes
updates of `training.batch_tokens` in microbatches of `training.micro_batch_size` with the recipe's AdamW
(decay on >= 2-D tensors), clipping, learning rate and autocast. Protocol: `--warmup` updates (the first timed
alone: it compiles), then `--windows` windows of `--steps` updates, the device synchronised at each window's
ends; a peer's figure is its median window's tokens/s (`--clock cpu`: the process's CPU seconds, which other
jobs on a shared machine cannot distort when the peer runs one thread). Losses are read after the timing: each
peer's first update's loss shows they train the same model on the same data. Prints one JSON object.

Example:
    python benchmarks/peers.py --config demo-s --set runtime.compile=true --threads 1
    python benchmarks/peers.py --config 20m --set runtime.device=cuda --warmup 5 --steps 10 --windows 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tiny_llm.config import RecipeConfig, load_recipe  # noqa: E402
from tiny_llm.runtime.device import autocast_dtype, setup_runtime, synchronize, to_device  # noqa: E402
from tiny_llm.runtime.engine import build_model  # noqa: E402
from tiny_llm.runtime.optim import parameter_groups  # noqa: E402

CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
PEERS = ("library", "transformers", "transformers-compiled", "minimal")
Update = Callable[[torch.Tensor], torch.Tensor | float]
"""One optimizer update from a batch of blocks [n, L+1]; returns its loss (a device tensor or a float)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="demo-s", help="preset or recipe YAML (the shape)")
    parser.add_argument("--set", action="append", default=[], help="dotted.key=value, as for train")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS))
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="updates per timed window")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--clock", choices=sorted(CLOCK), default="wall", help="cpu: process CPU seconds")
    parser.add_argument(
        "--compile-backend",
        choices=("inductor", "aot_eager"),
        default="inductor",
        help="torch.compile backend of the compiled peers; aot_eager captures and differentiates the graph "
        "without generating code (a quick check on the CPU, not a figure to report)",
    )
    parser.add_argument("--one", choices=PEERS, help=argparse.SUPPRESS)  # a child process: one peer
    return parser.parse_args(argv)


def autocast(recipe: RecipeConfig, device: torch.device):
    dtype = autocast_dtype(recipe, device)
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def adamw(model: torch.nn.Module, recipe: RecipeConfig, fused: bool) -> torch.optim.AdamW:
    opt = recipe.optimizer
    groups = parameter_groups(model, opt.weight_decay)
    return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, fused=fused)


def library(recipe: RecipeConfig, device: torch.device) -> Update:
    from tiny_llm.train.engine import ModelEngine

    engine = ModelEngine(recipe, device)

    def update(blocks: torch.Tensor) -> torch.Tensor | float:
        stats = engine.train_step(blocks, recipe.optimizer.lr, 1)
        return stats.loss if stats.values is None else stats.values[0]  # unread where it is deferred

    return update


def transformers_peer(recipe: RecipeConfig, device: torch.device, backend: str | None) -> Update:
    """LlamaForCausalLM from the export's files, its own forward, our loss, accumulation and AdamW."""
    import transformers
    from safetensors.torch import save_file

    from tiny_llm.export.hf import llama_config
    from tiny_llm.export.tokenizer import TokenizerFacts
    from tiny_llm.export.weights import to_hf_state_dict

    facts = TokenizerFacts("tokenizers", "</s>", 2, "<s>", 1, (), False)
    with tempfile.TemporaryDirectory() as tmp:
        state = to_hf_state_dict(build_model(recipe, torch.device("cpu")).state_dict())
        save_file(state, str(Path(tmp) / "model.safetensors"), metadata={"format": "pt"})
        (Path(tmp) / "config.json").write_text(json.dumps(llama_config(recipe, facts, "float32")))
        model = transformers.AutoModelForCausalLM.from_pretrained(
            tmp, local_files_only=True, attn_implementation="sdpa", torch_dtype=torch.float32
        )
    model.to(device).train()

    def loss_sum(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=inputs, use_cache=False).logits
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")

    compiled = torch.compile(loss_sum, backend=backend) if backend else loss_sum
    return accumulating_update(model, compiled, recipe, device)


def accumulating_update(
    model: torch.nn.Module, loss_sum, recipe: RecipeConfig, device: torch.device
) -> Update:
    optimizer = adamw(model, recipe, fused=recipe.runtime.fused_optimizer)

    def update(blocks: torch.Tensor) -> torch.Tensor:
        targets_total = blocks.shape[0] * (blocks.shape[1] - 1)
        total = torch.zeros((), device=device)
        for micro in blocks.split(recipe.training.micro_batch_size):
            with autocast(recipe, device):
                summed = loss_sum(micro[:, :-1], micro[:, 1:])
            (summed / targets_total).backward()
            total += summed.detach()
        if recipe.optimizer.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optimizer.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / targets_total

    return update


def minimal_loop(recipe: RecipeConfig, device: torch.device, backend: str) -> Update:
    """A nanoGPT-style loop: one model, fused AdamW, compiled forward+loss, no host read per update."""
    model = build_model(recipe, device).train()
    opt = recipe.optimizer
    optimizer = torch.optim.AdamW(
        parameter_groups(model, opt.weight_decay),
        lr=opt.lr,
        betas=(opt.beta1, opt.beta2),
        eps=opt.eps,
        fused=True,
    )
    micro, clip = recipe.training.micro_batch_size, opt.grad_clip

    @torch.compile(backend=backend)
    def loss_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")

    def update(blocks: torch.Tensor) -> torch.Tensor:
        n = blocks.shape[0] * (blocks.shape[1] - 1)
        total = torch.zeros((), device=device)
        for chunk in blocks.split(micro):
            with autocast(recipe, device):
                loss = loss_fn(chunk[:, :-1], chunk[:, 1:])
            (loss / n).backward()
            total += loss.detach()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / n

    return update


def build_peer(name: str, recipe: RecipeConfig, device: torch.device, backend: str) -> Update:
    if name == "library":
        return library(recipe, device)
    if name == "minimal":
        return minimal_loop(recipe, device, backend)
    return transformers_peer(recipe, device, backend if name == "transformers-compiled" else None)


def batches(recipe: RecipeConfig, count: int) -> list[torch.Tensor]:
    """The same seeded random batches for every peer (a pool of 4, taken in turn)."""
    n = recipe.training.batch_tokens // recipe.model.context_length
    gen = torch.Generator().manual_seed(0)
    shape = (n, recipe.model.context_length + 1)
    pool = [torch.randint(0, recipe.model.vocab_size, shape, generator=gen) for _ in range(4)]
    return [pool[i % len(pool)] for i in range(count)]


def measure(name: str, args: argparse.Namespace) -> dict:
    """One peer under the protocol (run in its own process)."""
    recipe = load_recipe([args.config], [*args.set, f"runtime.cpu_threads={args.threads}"])
    device = setup_runtime(recipe)
    update = build_peer(name, recipe, device, args.compile_backend)
    data = [to_device(b, device) for b in batches(recipe, args.warmup + args.windows * args.steps)]
    tokens = recipe.training.batch_tokens
    losses: list[torch.Tensor | float] = []
    clock = CLOCK[args.clock]
    start = clock()
    losses.append(update(data[0]))
    synchronize(device)
    first = clock() - start
    for blocks in data[1 : args.warmup]:
        losses.append(update(blocks))
    windows = []
    for w in range(args.windows):
        synchronize(device)
        start = clock()
        for blocks in data[args.warmup + w * args.steps : args.warmup + (w + 1) * args.steps]:
            losses.append(update(blocks))
        synchronize(device)
        windows.append(args.steps * tokens / (clock() - start))
    read = [float(loss) for loss in losses]
    return {
        "tokens_per_second": statistics.median(windows),
        "window_tokens_per_second": windows,
        "first_update_seconds": first,
        "first_loss": read[0],
        "last_loss": read[-1],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        json.dump(measure(args.one, args), sys.stdout)
        return 0
    peers = {}
    for name in args.peers:
        cmd = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--one", name]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"error: peer {name} failed:\n{done.stderr[-3000:]}")
        peers[name] = json.loads(done.stdout)
    base = peers.get("library", {}).get("tokens_per_second")
    for row in peers.values():
        row["ratio_to_library"] = row["tokens_per_second"] / base if base else None
    recipe = load_recipe([args.config], args.set)
    out = {
        "config": args.config,
        "sets": args.set,
        "threads": args.threads,
        "batch_tokens": recipe.training.batch_tokens,
        "micro_batch_size": recipe.training.micro_batch_size,
        "protocol": {
            "warmup": args.warmup,
            "steps": args.steps,
            "windows": args.windows,
            "figure": "median",
            "clock": args.clock,
        },  # fmt: skip
        "compile_backend": args.compile_backend,
        "torch": torch.__version__,
        "peers": peers,
    }
    json.dump(out, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
