"""The benchmark worker: measure one recipe's training throughput, as training runs it.

Model, optimizer, loss, LR schedule, clipping and finite checks are the
training engine's. Protocol: the first update (compilation included) and the
rest of the warmup are timed separately; then peak memory is reset and
``windows`` windows of ``steps`` updates are timed, synchronised at window
edges, and more (up to ``max_windows``) while their spread is wide; the
median window is reported. One more, profiled update records the
attention kernels actually dispatched (and, with a profile path, writes a
Chrome trace and an operator table).
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from tiny_llm.bench import profiling
from tiny_llm.budget import flops_per_token, lr_at, make_budget
from tiny_llm.config import RecipeConfig, recipe_identity
from tiny_llm.engines import build_engine
from tiny_llm.errors import ConfigError, DataError, TinyLLMError, out_of_memory_line
from tiny_llm.runtime.device import (
    attention_kernels,
    check_cuda_graph,
    peak_memory_bytes,
    setup_runtime,
    synchronize,
)
from tiny_llm.runtime.engine import NonFiniteError
from tiny_llm.runtime.environment import capture_environment
from tiny_llm.runtime.memory import memory_limit
from tiny_llm.runtime.mfu import Peak, device_peak, matmul_precision, mfu
from tiny_llm.terminal import counted
from tiny_llm.train.distributed import check_one_process

MEMORY_LIMIT_FRACTION = 0.9
# Allocator settings that change CPU throughput a lot (see SPEC §10); recorded with the numbers.
ALLOCATOR_ENV = ("THP_MEM_ALLOC_ENABLE", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    data_mode: Literal["real", "synthetic"] = "real"
    warmup: int = 20
    """Updates before measuring, the first (with compilation) timed on its own."""
    steps: int = 100
    """Updates per timed window."""
    windows: int = 3
    max_windows: int = 0
    """More windows, up to this many, while the windows' spread (max - min tokens/s) exceeds max_spread of
    their median; 0: exactly ``windows``."""
    max_spread: float = 0.05
    profile_prefix: Path | None = None
    """Write <prefix>.trace.json and <prefix>.profile.txt from the profiled update."""
    require_gpu_name: str | None = None
    """Refuse to run unless the GPU name contains this (a tuning profile's hardware check)."""


def check_options(options: WorkerOptions) -> None:
    for key in ("warmup", "steps", "windows"):
        if getattr(options, key) < 1:
            raise ConfigError(f"--{key}: must be >= 1, got {getattr(options, key)}")
    if options.max_windows and options.max_windows < options.windows:
        raise ConfigError(
            f"--max-windows: 0 or at least --windows ({options.windows}), got {options.max_windows}"
        )
    if options.max_spread < 0:
        raise ConfigError(f"--max-spread: must be >= 0, got {options.max_spread}")


def spread_is_wide(measurements: list[dict[str, Any]], max_spread: float) -> bool:
    """Whether the windows' tokens/s spread (max - min) exceeds ``max_spread`` of their median."""
    rates = [m["tokens_per_second"] for m in measurements]
    return max(rates) - min(rates) > max_spread * statistics.median(rates)


def check_gpu_name(device: torch.device, wanted: str | None) -> None:
    if wanted is None:
        return
    found = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU (CPU)"
    if wanted.lower() not in found.lower():
        raise ConfigError(
            f"this tuning profile expects a GPU whose name contains '{wanted}', found {found}; "
            "use the profile for this hardware or set the profile's allow_other_gpu: true"
        )


def total_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


# ----------------------------------------------------------------------------- data


class SyntheticBatches:
    """Random tokens resident on the device: no loading, no host-to-device copy in the timing."""

    def __init__(self, recipe: RecipeConfig, device: torch.device, blocks: int) -> None:
        gen = torch.Generator().manual_seed(recipe.runtime.seed)
        shape = (blocks, recipe.model.context_length + 1)
        pool = [torch.randint(0, recipe.model.vocab_size, shape, generator=gen) for _ in range(2)]
        self.pool = [b.to(device) for b in pool]
        self.index = 0
        self.cache_identity: str | None = None

    def __call__(self) -> torch.Tensor:
        self.index += 1
        return self.pool[self.index % len(self.pool)]

    def close(self) -> None:
        self.pool.clear()


class RealBatches:
    """The production loader on the production cache prefix (restarting at the end of the prefix)."""

    def __init__(self, recipe: RecipeConfig, blocks: int) -> None:
        from tiny_llm.data.cache import open_cache

        self.recipe, self.blocks = recipe, blocks
        self.cache = open_cache(recipe.data.cache_dir, verify=False)
        self.cache.check_compatible(recipe)
        budget = make_budget(recipe)
        available = (self.cache.num_tokens("train") - 1) // recipe.model.context_length
        self.num_blocks = min(budget.num_blocks, available)
        if self.num_blocks < blocks:
            raise TinyLLMError(
                f"cache too small for one update: need {blocks * recipe.model.context_length + 1} tokens, "
                f"have {self.cache.num_tokens('train')} in {recipe.data.cache_dir}"
            )
        self.cache_identity = self.cache.identity
        self.passes = 0
        self._open()

    def _open(self) -> None:
        from tiny_llm.data.loader import TrainLoader

        self.loader = TrainLoader(
            self.cache,
            context_length=self.recipe.model.context_length,
            num_blocks=self.num_blocks,
            seed=self.recipe.runtime.seed + self.passes,
            buffer_size_mib=self.recipe.data.buffer_size_mib,
            prefetch=self.recipe.data.prefetch,
        )
        self.used = 0

    def __call__(self) -> torch.Tensor:
        if self.used + self.blocks > self.num_blocks:
            self.loader.close()
            self.passes += 1
            self._open()
        self.used += self.blocks
        return self.loader.next_blocks(self.blocks)

    def close(self) -> None:
        self.loader.close()


# ----------------------------------------------------------------------------- measurement


def median_window(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """The window with the median duration (the lower middle one for an even count)."""
    middle = statistics.median_low([m["seconds"] for m in measurements])
    return next(m for m in measurements if m["seconds"] == middle)


class Updater:
    """Production updates: LR from the token schedule at the update's end token, engine finite checks."""

    def __init__(self, recipe: RecipeConfig, engine, batches: Callable[[], torch.Tensor]) -> None:
        self.recipe, self.engine, self.batches = recipe, engine, batches
        self.budget = make_budget(recipe)
        self.step = 0

    def lr(self) -> float:
        end_tokens = min((self.step + 1) * self.recipe.training.batch_tokens, self.budget.tokens)
        return lr_at(end_tokens, self.budget.tokens, self.recipe.optimizer, self.recipe.training.batch_tokens)

    def __call__(self):
        stats = self.engine.train_step(self.batches(), self.lr(), self.step)
        self.step += 1
        return stats


def timed_windows(update: Updater, device: torch.device, options: WorkerOptions) -> list[dict[str, Any]]:
    """``windows`` timed windows, then more (up to ``max_windows``) while their spread is wide."""
    out = [
        _window(update, device, options.steps, window)
        for window in counted(range(options.windows), total=options.windows, desc="benchmark", unit="window")
    ]
    while len(out) < options.max_windows and spread_is_wide(out, options.max_spread):
        out.append(_window(update, device, options.steps, len(out)))
    return out


def _window(update: Updater, device: torch.device, steps: int, window: int) -> dict[str, Any]:
    synchronize(device)  # the bar moves between windows, outside the timed interval
    start = time.perf_counter()
    stats = [update() for _ in range(steps)]
    synchronize(device)
    seconds = time.perf_counter() - start
    return {
        "window": window,
        "seconds": seconds,
        "tokens_per_second": steps * update.recipe.training.batch_tokens / seconds,
        "loss": statistics.fmean(s.loss for s in stats),
        "grad_norm": statistics.fmean(s.grad_norm for s in stats),
    }


def make_batches(recipe: RecipeConfig, device: torch.device, options: WorkerOptions):
    blocks = recipe.training.batch_tokens // recipe.model.context_length
    if options.data_mode == "synthetic":
        return SyntheticBatches(recipe, device, blocks)
    return RealBatches(recipe, blocks)


def _measure(recipe: RecipeConfig, device: torch.device, options: WorkerOptions, out: dict[str, Any]) -> None:
    """Fill ``out`` with the protocol's numbers; raises on failure (the caller maps it to a status)."""
    batches = make_batches(recipe, device, options)
    out["protocol"]["cache_identity"] = batches.cache_identity
    out["config_identity"] = recipe_identity(recipe, batches.cache_identity)
    try:
        engine = build_engine(recipe, device)
        # runtime.memory_limit_mb caps what the updates allocate beyond the built engine (activations,
        # optimizer moments; tiny_llm.runtime.memory), on every device; past it they raise an out-of-memory,
        # as on CUDA. The profiler's own buffers come after, outside the cap.
        with memory_limit(recipe.runtime.memory_limit_mb, device) as cap:
            if cap is not None:
                out["memory_limit_bytes"], out["memory_baseline_bytes"] = cap.limit_bytes, cap.baseline_bytes
            update = _run_protocol(recipe, device, options, out, engine, batches)
        _profile(engine, batches, update, options, out, device)
    finally:
        batches.close()


def _run_protocol(
    recipe: RecipeConfig,
    device: torch.device,
    options: WorkerOptions,
    out: dict[str, Any],
    engine: Any,
    batches: SyntheticBatches | RealBatches,
) -> Updater:
    """The warm-up and timed windows of a built engine (fills ``out``)."""
    update = Updater(recipe, engine, batches)
    synchronize(device)
    start = time.perf_counter()
    update()
    synchronize(device)
    out["first_update_seconds"] = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(options.warmup - 1):
        update()
    synchronize(device)
    out["warmup_seconds"] = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    out["measurements"] = timed_windows(update, device, options)
    engine.check_finite()  # a sync-free engine's skipped update, if any
    best = median_window(out["measurements"])
    out["seconds_per_step"] = best["seconds"] / options.steps
    out["tokens_per_second"] = best["tokens_per_second"]
    # A replayed CUDA graph never moves the allocator's peak: the capture's is the floor (the 90% guard).
    out["peak_memory_bytes"] = max(peak_memory_bytes(device), engine.replay_peak_bytes())
    return update


def _profile(
    engine: Any,
    batches: SyntheticBatches | RealBatches,
    update: Updater,
    options: WorkerOptions,
    out: dict[str, Any],
    device: torch.device,
) -> None:
    """One more, profiled update: the attention kernels dispatched (and, asked for, a trace)."""
    prof = profiling.profile_update(engine, batches, update.lr())
    out["attention_kernels"] = attention_kernels(prof)
    if options.profile_prefix is not None:
        prefix = options.profile_prefix
        trace, table = Path(f"{prefix}.trace.json"), Path(f"{prefix}.profile.txt")
        profiling.write_profile(prof, trace, table, device.type == "cuda")
        out["protocol"]["trace"], out["protocol"]["operator_table"] = str(trace), str(table)


def _empty_result(recipe: RecipeConfig, options: WorkerOptions) -> dict[str, Any]:
    rt = recipe.runtime
    return {
        "status": "failed",
        "error": None,
        "synthetic": options.data_mode == "synthetic",
        "tokens_per_second": None,
        "seconds_per_step": None,
        "first_update_seconds": None,
        "warmup_seconds": None,
        "peak_memory_bytes": None,
        "total_memory_bytes": None,
        "memory_limit_bytes": None,
        "memory_baseline_bytes": None,
        "micro_batch_size": recipe.training.micro_batch_size,
        "batch_tokens": recipe.training.batch_tokens,
        "compile": rt.compile,
        "compile_mode": rt.compile_mode,
        "cuda_graph": rt.cuda_graph,
        "sdpa_backend": rt.sdpa_backend,
        "attention_backend": rt.attention_backend,
        "cpu_amp": rt.cpu_amp,
        "amp": rt.amp,
        "cpu_threads": rt.cpu_threads,
        "attention_kernels": [],
        "environment": {},
        "protocol": {
            "warmup": options.warmup,
            "steps": options.steps,
            "windows": options.windows,
            "max_windows": options.max_windows,
            "max_spread": options.max_spread,
            "data_mode": options.data_mode,
            "profile": options.profile_prefix is not None,
            "cache_identity": None,
        },
        "measurements": [],
        "config_identity": None,
        "flops_per_token": flops_per_token(recipe.model),
        "peak_flops_per_second": None,
        "peak_source": None,
        "mfu": None,
    }


def run_worker(recipe: RecipeConfig, options: WorkerOptions) -> dict[str, Any]:
    """Measure ``recipe``; always returns the JSON document (status says how it went).

    A wrong-hardware or bad-option error is the user's to fix and is raised instead.
    """
    check_options(options)
    check_one_process(recipe, "the benchmark worker")
    out = _empty_result(recipe, options)
    try:
        device = setup_runtime(recipe)
        check_cuda_graph(recipe, device)
    except ConfigError as exc:  # e.g. a forced GPU-only SDPA kernel, or runtime.cuda_graph, on the CPU
        out["error"] = str(exc)
        return out
    check_gpu_name(device, options.require_gpu_name)
    allocator = {k: os.environ[k] for k in ALLOCATOR_ENV if k in os.environ}
    out["environment"] = capture_environment(device, allocator_env=allocator)
    out["total_memory_bytes"] = total_memory_bytes(device)
    try:
        _measure(recipe, device, options, out)
        out["status"] = "ok"
    except DataError:
        raise  # a missing or incompatible cache hits every candidate: the user must fix it
    except torch.OutOfMemoryError as exc:
        out.update(status="memory_limit", error=f"out of memory: {str(exc).splitlines()[0]}")
    except NonFiniteError as exc:
        out["error"] = f"non-finite values at {exc}"
    except TinyLLMError as exc:
        out["error"] = str(exc)
    except Exception as exc:  # a kernel or compiler failure belongs to this candidate, not to the tuner
        if out_of_memory_line(exc):  # not the caching allocator's: cuBLAS, a CUDA call, a Triton module load
            out.update(status="memory_limit", error=f"out of memory: {out_of_memory_line(exc)}")
        else:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            out["error"] = f"{type(exc).__name__}: {first}"
        out["traceback"] = traceback.format_exc(limit=8)
    near = near_memory_limit(out, device) if out["status"] == "ok" else None
    if near is not None:
        out.update(status="memory_limit", error=near)
    _add_mfu(recipe, device, out)
    return out


def near_memory_limit(out: dict[str, Any], device: torch.device) -> str | None:
    """The 90% guard: a measurement whose peak reaches 90% of the memory it may use is an out-of-memory in
    waiting (fragmentation, a longer run); its reason, or None. Under runtime.memory_limit_mb that is the cap,
    against the peak beyond the baseline the cap counts from; otherwise the device's memory. On the CPU the
    cap is the kernel's own limit on the data segment, exact for every allocation, while the peak there is
    the resident set, which also grows by code and library pages touched for the first time (10 MiB at a
    tiny model's first point): a CPU point under a cap is out of memory when an allocation failed, only."""
    peak, cap = out["peak_memory_bytes"], out.get("memory_limit_bytes")
    if cap:
        if device.type != "cuda":
            return None
        used = max(0, peak - out["memory_baseline_bytes"])
        if used >= MEMORY_LIMIT_FRACTION * cap:
            mib = used / 2**20
            return f"peak memory beyond set-up ({mib:.1f} MiB) at or above 90% of runtime.memory_limit_mb"
        return None
    if peak >= MEMORY_LIMIT_FRACTION * out["total_memory_bytes"]:
        return "peak memory at or above 90% of the device memory"
    return None


def _add_mfu(recipe: RecipeConfig, device: torch.device, out: dict[str, Any]) -> None:
    if out["tokens_per_second"] is None:
        return
    peak: Peak | None = device_peak(device, matmul_precision(recipe, device))
    if peak is not None:
        out["peak_flops_per_second"], out["peak_source"] = peak.flops_per_second, peak.source
    out["mfu"] = mfu(out["flops_per_token"], out["tokens_per_second"], peak)
