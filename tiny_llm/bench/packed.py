"""Packed vs sequential benchmark worker (one execution per process).

``sequential`` runs N ordinary Llama models one after another with the same init,
inputs, per-worker clipping, AdamW and mixing as ``packed`` (one PackedEngine). Both
use synthetic tokens resident on the device. Protocol: the first update (compile),
the rest of the warmup, timed updates (median), a synchronised component pass
(compute, clipping, mixing, optimizer) and one profiled update written as a Chrome trace.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function

from tiny_llm.bench.worker import SyntheticBatches, total_memory_bytes
from tiny_llm.budget import parameter_count
from tiny_llm.config import DecentralizedConfig, RecipeConfig, recipe_identity
from tiny_llm.errors import ConfigError
from tiny_llm.model import loss_sum
from tiny_llm.packed.engine import PackedEngine, split_workers
from tiny_llm.packed.mixing import mix_tensor_lists_
from tiny_llm.runtime.device import (
    compile_loss,
    compute_context,
    peak_memory_bytes,
    quiet_profile,
    setup_runtime,
    synchronize,
    uses_compile,
    uses_fused_optimizer,
)
from tiny_llm.runtime.engine import build_model
from tiny_llm.runtime.environment import capture_environment
from tiny_llm.runtime.optim import build_optimizer, set_lr

COMPONENTS = ("compute", "clipping", "mixing", "optimizer")
BENCH_LR = 1e-4  # small and constant: timing does not depend on it, and weights stay finite


@dataclass(frozen=True, kw_only=True)
class PackedBenchOptions:
    execution: str
    """packed | sequential."""
    warmup: int = 3
    """Updates before timing (the first one, which compiles, is timed on its own)."""
    steps: int = 10
    """Timed updates."""
    component_steps: int = 3
    """Updates of the synchronised component pass."""
    trace: Path | None = None
    """Chrome trace of one profiled update; None = no trace."""


class PackedRunner:
    """The production PackedEngine, also split into components."""

    def __init__(self, recipe: RecipeConfig, device: torch.device) -> None:
        self.engine = PackedEngine(recipe, device)

    def update(self, blocks: torch.Tensor, lr: float, step: int) -> float:
        return self.engine.train_step(blocks, lr, step).loss

    def compute(self, blocks: torch.Tensor) -> None:
        self.engine.forward_backward(blocks)

    def clip(self) -> None:
        self.engine.clip()

    def mix(self, update: int) -> None:
        self.engine.mix_params(update, 1.0)

    def optimize(self, lr: float) -> None:
        self.engine.optimizer.step(lr)


def packed_settings(recipe: RecipeConfig) -> DecentralizedConfig:
    """The recipe's decentralized section; ConfigError for an ordinary recipe."""
    if recipe.decentralized is None:
        raise ConfigError("the packed benchmark needs a packed recipe (a decentralized section)")
    return recipe.decentralized


class SequentialRunner:
    """N ordinary models, one after another: what packing replaces."""

    def __init__(self, recipe: RecipeConfig, device: torch.device) -> None:
        dec = packed_settings(recipe)
        self.recipe, self.device = recipe, device
        self.num_models, self.topology, self.scheme = dec.num_models, dec.topology, dec.scheme
        self.grad_clip = recipe.optimizer.grad_clip
        self.models = [build_model(recipe, device) for _ in range(self.num_models)]  # seeded: same init
        fused = uses_fused_optimizer(recipe, device)
        self.optimizers = [build_optimizer(m, recipe.optimizer, fused=fused) for m in self.models]
        self.params = [list(m.parameters()) for m in self.models]
        # One compiled graph serves every model (parameters are graph inputs).
        self.loss_fn: Callable[..., torch.Tensor] = compile_loss(loss_sum, recipe)

    def compute(self, blocks: torch.Tensor) -> torch.Tensor:
        workers = split_workers(blocks, self.num_models)
        losses = []
        for model, optimizer, samples in zip(self.models, self.optimizers, workers, strict=True):
            optimizer.zero_grad(set_to_none=True)
            targets = samples.shape[0] * (samples.shape[1] - 1)
            with compute_context(self.recipe, self.device):
                summed = self.loss_fn(model, samples[:, :-1], samples[:, 1:])
            (summed / targets).backward()
            losses.append(summed.detach() / targets)
        return torch.stack(losses)

    def clip(self) -> torch.Tensor:
        norms = []
        for params in self.params:
            grads = [p.grad for p in params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads, foreach=self.device.type == "cuda")
            if self.grad_clip is not None:
                torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm)
            norms.append(norm)
        return torch.stack(norms)

    def mix(self, update: int) -> None:
        mix_tensor_lists_(self.params, self.topology, update, 1.0)

    def optimize(self, lr: float) -> None:
        for optimizer in self.optimizers:
            set_lr(optimizer, lr)
            optimizer.step()

    def update(self, blocks: torch.Tensor, lr: float, step: int) -> float:
        """The same update as PackedEngine.train_step (``step`` 1-based)."""
        losses = self.compute(blocks)
        self.clip()
        if self.scheme == "awc":
            self.mix(step - 1)
            self.optimize(lr)
        else:
            self.optimize(lr)
            self.mix(step - 1)
        return losses.mean().item()  # the same host sync as the packed engine's logging


def _timed(device: torch.device, fn: Callable[[], Any]) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def component_pass(runner, batches: Callable[[], torch.Tensor], device: torch.device, steps: int, first: int):
    """Mean seconds per update of each component, each one synchronised on its own."""
    times: dict[str, list[float]] = {name: [] for name in COMPONENTS}
    for i in range(steps):
        blocks = batches()
        times["compute"].append(_timed(device, partial(runner.compute, blocks)))
        times["clipping"].append(_timed(device, runner.clip))
        times["mixing"].append(_timed(device, partial(runner.mix, first + i)))
        times["optimizer"].append(_timed(device, lambda: runner.optimize(BENCH_LR)))
    return {name: statistics.mean(values) for name, values in times.items()}


@contextlib.contextmanager
def _region(name: str) -> Iterator[None]:
    with record_function(name):
        yield


def write_trace(runner, blocks: torch.Tensor, device: torch.device, step: int, path: Path) -> None:
    """One update under the profiler, with compute / clipping / mixing / optimizer regions."""
    synchronize(device)
    with quiet_profile(device.type == "cuda") as prof:
        with _region("compute"):
            runner.compute(blocks)
        with _region("clipping"):
            runner.clip()
        with _region("mixing"):
            runner.mix(step)
        with _region("optimizer"):
            runner.optimize(BENCH_LR)
        synchronize(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))


def _measure(recipe: RecipeConfig, options: PackedBenchOptions, device: torch.device, out: dict) -> None:
    runner = (
        PackedRunner(recipe, device) if options.execution == "packed" else SequentialRunner(recipe, device)
    )
    blocks_per_update = recipe.training.batch_tokens // recipe.model.context_length
    batches = SyntheticBatches(recipe, device, blocks_per_update)
    step = 0
    step += 1  # 1-based update numbers, as in training
    out["first_update_seconds"] = _timed(device, lambda: runner.update(batches(), BENCH_LR, step))
    warmup_start = time.perf_counter()
    for _ in range(max(0, options.warmup - 1)):
        step += 1
        runner.update(batches(), BENCH_LR, step)
    synchronize(device)
    out["warmup_seconds"] = time.perf_counter() - warmup_start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, cpu_times, losses = [], [], []
    for _ in range(options.steps):
        step += 1
        synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        losses.append(runner.update(batches(), BENCH_LR, step))
        synchronize(device)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    seconds = statistics.median(times)
    out.update(
        status="ok",
        seconds_per_step=seconds,
        tokens_per_second=recipe.training.batch_tokens / seconds,
        step_seconds=times,
        # CPU time of this process (all threads): on a shared host it moves less with other load
        process_cpu_seconds_per_step=statistics.median(cpu_times),
        loss=losses[-1],
        peak_memory_bytes=peak_memory_bytes(device),
    )
    out["components"] = component_pass(runner, batches, device, options.component_steps, step)
    if options.trace is not None:
        write_trace(runner, batches(), device, step + options.component_steps, options.trace)
        out["trace"] = str(options.trace)


def run_packed_benchmark(recipe: RecipeConfig, options: PackedBenchOptions) -> dict[str, Any]:
    """Measure one execution of ``recipe`` (a packed recipe); never raises for a failed measurement."""
    dec = packed_settings(recipe)
    out: dict[str, Any] = {
        "status": "failed",
        "execution": options.execution,
        "num_models": dec.num_models,
        "topology": dec.topology,
        "scheme": dec.scheme,
        "compile": uses_compile(recipe),
        "micro_batch_size": recipe.training.micro_batch_size,
        "batch_tokens": recipe.training.batch_tokens,
        "tokens_per_model": recipe.training.batch_tokens // dec.num_models,
        "parameters_per_model": parameter_count(recipe.model),
        "synthetic": True,
        "protocol": {
            "warmup": options.warmup,
            "steps": options.steps,
            "component_steps": options.component_steps,
        },
        "config_identity": recipe_identity(recipe, None),
    }
    device = setup_runtime(recipe)
    out["environment"] = capture_environment(device)
    out["total_memory_bytes"] = total_memory_bytes(device)
    try:
        _measure(recipe, options, device, out)
    except torch.OutOfMemoryError as exc:
        out.update(status="memory_limit", error=str(exc).splitlines()[0])
    except Exception as exc:  # a failed measurement is a result, not a crash of the summary
        out.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    return out
