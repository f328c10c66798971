"""One analysis job: a run's checkpoint x one data case, resumable sample by sample.

Output directory::

    manifest.json                 inputs, settings and identity (written when the job starts)
    samples/random-NNNN.json      one per Rademacher direction r: r^T H r
    samples/consensus-NNN.json    packed runs: one per worker i, e_i^T H e_i
    samples/noise-NNNN.json       one per sampled effective batch (NNNN its index): g, v = g - mean, v^T H v
    state/mean-gradient.pt        the full-epoch mean gradient while the job runs (removed at the end)
    result.json                   statistics; written last, so a workflow declares only this file

Every file is written atomically as soon as its value is known, so a killed job redoes at most the pass it
was in. A rerun with the same identity (inputs and measured settings) continues where the last one stopped,
or, when result.json exists, does nothing; another identity in the directory is refused.

Passes over the epoch: the first computes the mean gradient together with up to ``directions_per_pass``
directions that do not need it (Rademacher, consensus); every later pass takes the next directions in the
order random, consensus, noise.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny_llm.analysis.checkpoints import SavedWeights, load_saved_weights
from tiny_llm.analysis.data import AnalysisEpoch, batch_record, load_epoch
from tiny_llm.analysis.hessian import (
    FlatParameters,
    curvature_pass,
    gradient,
    model_loss,
    norm_squared,
    rademacher,
)
from tiny_llm.analysis.settings import FORMAT, VERSION, AnalysisConfig, analysis_identity
from tiny_llm.analysis.stats import summarize
from tiny_llm.config import RecipeConfig, identity_differences, load_recipe, recipe_identity
from tiny_llm.data.cache import open_cache
from tiny_llm.errors import RunStateError
from tiny_llm.io import atomic_write_json, atomic_write_with, exclusive_lock, read_json
from tiny_llm.model import Llama
from tiny_llm.output_dirs import claim_output_dir
from tiny_llm.runtime.device import setup_runtime, to_device
from tiny_llm.terminal import progress_bar

_NOISE_STREAM = 4
Log = Callable[[str], None]


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_recipe(run_dir: Path, settings: AnalysisConfig) -> RecipeConfig:
    """The run's resolved.yaml with the job's device and threads."""
    resolved = run_dir / "resolved.yaml"
    if not resolved.is_file():
        raise RunStateError(f"{run_dir} is not a training run directory (no resolved.yaml)")
    recipe = load_recipe([str(resolved)])
    runtime = recipe.runtime
    runtime = dataclasses.replace(
        runtime,
        device=settings.device or runtime.device,
        cpu_threads=settings.threads or runtime.cpu_threads,
    )
    return dataclasses.replace(recipe, runtime=runtime)


def matmul_precision(recipe: RecipeConfig, settings: AnalysisConfig) -> str:
    """'tf32' where FP32 matmuls may use TF32 (CUDA, FP32, not deterministic, no --no-tf32), else 'ieee'."""
    device = recipe.runtime.device
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    tf32 = cuda and settings.tf32 and settings.dtype == "float32" and not recipe.runtime.deterministic
    return "tf32" if tf32 else "ieee"


def noise_batches(num_batches: int, settings: AnalysisConfig) -> list[int]:
    """Indices of the sampled effective batches: S of them without replacement (seeded), sorted; or all."""
    if settings.noise_samples == "all" or settings.noise_samples >= num_batches:
        return list(range(num_batches))
    rng = np.random.default_rng(np.random.SeedSequence([settings.seed, _NOISE_STREAM]))
    return sorted(int(i) for i in rng.choice(num_batches, settings.noise_samples, replace=False))


def sample_name(kind: str, index: int) -> str:
    return f"{kind}-{index:03d}.json" if kind == "consensus" else f"{kind}-{index:04d}.json"


class AnalysisJob:
    def __init__(
        self, run_dir: Path, checkpoint: str, output: Path, settings: AnalysisConfig, log: Log
    ) -> None:
        self.run_dir, self.output, self.settings, self.log = Path(run_dir), Path(output), settings, log
        self.started = time.perf_counter()
        self.recipe = run_recipe(self.run_dir, settings)
        self.cache = open_cache(self.recipe.data.cache_dir, verify=False)
        self.cache.check_compatible(self.recipe)
        packed = self.recipe.decentralized is not None
        self.saved: SavedWeights = load_saved_weights(
            self.run_dir, checkpoint, self.recipe, self.cache.identity, workers=packed and settings.consensus
        )
        inputs = {
            "recipe_identity": recipe_identity(self.recipe, self.cache.identity),
            "cache_identity": self.cache.identity,
            "checkpoint": self.saved.name,
            **self.saved.hashes,
        }
        self.matmul_precision = matmul_precision(self.recipe, settings)
        self.identity = analysis_identity(inputs, settings, self.matmul_precision)
        self.samples_dir = output / "samples"
        self.state_path = output / "state" / "mean-gradient.pt"

    # ------------------------------------------------------------------ identity and files

    def check_output(self) -> dict[str, Any] | None:
        """Refuse another job's directory; return the finished result of this one, if any.

        Other measured settings, another checkpoint name or case: refused (a new --output is another job).
        The same job on inputs that changed since (the run was trained again: other weights, recipe or cache
        identity): the old samples describe weights that no longer exist, so the job starts over.
        """
        manifest = self.output / "manifest.json"
        if manifest.is_file():
            old = read_json(manifest).get("identity_payload", {})
            if old.get("identity") != self.identity["identity"]:
                changed = [
                    c for c in identity_differences(old, self.identity) if not c.startswith("identity:")
                ]
                job = [
                    c
                    for c in changed
                    if c.startswith(
                        ("settings.", "inputs.checkpoint:", "format", "version", "matmul_precision")
                    )
                ]
                if job or not changed:
                    raise RunStateError(
                        f"{self.output} holds another analysis ({'; '.join(job or ['identity'])}); "
                        "use a new --output directory or remove it"
                    )
                self.log(f"{self.output}: inputs changed since ({'; '.join(changed)}); starting over")
                self.start_over()
        result = self.output / "result.json"
        if result.is_file():
            done = read_json(result)
            if done.get("identity") == self.identity["identity"]:
                return done
        return None

    def start_over(self) -> None:
        for path in [*self.samples_dir.glob("*.json"), self.state_path, self.output / "result.json"]:
            path.unlink(missing_ok=True)

    def header(self, epoch: AnalysisEpoch) -> dict[str, Any]:
        """What manifest.json and result.json both say about the job: its identity, inputs and settings."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "identity": self.identity["identity"],
            "run": str(self.run_dir),
            "checkpoint": self.saved.record(),
            "case": self.settings.case,
            "data": epoch.metadata(),
            "settings": dataclasses.asdict(self.settings),
            **self.environment(),
        }

    def environment(self) -> dict[str, Any]:
        """Where the numbers were computed: device, matmul precision, torch version (every sample too)."""
        device = str(self.device) if hasattr(self, "device") else self.recipe.runtime.device
        return {"device": device, "matmul_precision": self.matmul_precision, "torch": torch.__version__}

    def write_manifest(self, epoch: AnalysisEpoch) -> None:
        atomic_write_json(
            self.output / "manifest.json", {**self.header(epoch), "identity_payload": self.identity}
        )

    def read_sample(self, kind: str, index: int) -> dict[str, Any] | None:
        path = self.samples_dir / sample_name(kind, index)
        if not path.is_file():
            return None
        row = read_json(path)
        return row if row.get("identity") == self.identity["identity"] else None

    def write_sample(self, row: dict[str, Any]) -> None:
        row = {**row, **self.environment()}
        atomic_write_json(self.samples_dir / sample_name(row["kind"], row["index"]), row)

    # ------------------------------------------------------------------ the computation

    def run(self) -> dict[str, Any]:
        claim_output_dir(self.output, "--output")  # a user's folder: refused, kept
        with exclusive_lock(self.output / ".lock", f"analysis directory {self.output}"):
            finished = self.check_output()
            if finished is not None:
                self.log(f"{self.output}: already complete")
                return finished
            return self._run()

    def _run(self) -> dict[str, Any]:
        s, recipe = self.settings, self.recipe
        self.device = setup_runtime(recipe)
        if self.device.type == "cuda" and self.matmul_precision == "ieee":
            torch.set_float32_matmul_precision("highest")
        epoch = load_epoch(recipe, self.cache, s.case, self.saved.blocks_per_range)
        self.write_manifest(epoch)
        dtype = torch.float64 if s.dtype == "float64" else torch.float32
        model = Llama(recipe.model, reference_attention=True)
        model.load_state_dict(self.saved.weights)
        model.to(device=self.device, dtype=dtype)
        self.epoch, self.dtype = epoch, dtype
        self.names = [name for name, _ in model.named_parameters()]
        self.flat = FlatParameters(list(model.parameters()))
        self.loss_fn = model_loss(model, amp=s.amp)
        self.hvp_micro = s.hvp_batch_size or recipe.training.micro_batch_size
        chosen = noise_batches(len(epoch.batches), s)
        workers = len(self.saved.workers) if self.saved.workers is not None else 0
        wanted = (
            [("random", i) for i in range(s.random_samples)]
            + [("consensus", w) for w in range(workers)]
            + [("noise", b) for b in chosen]
        )
        pending = [key for key in wanted if self.read_sample(*key) is None]
        mean = self.load_mean()
        self.log(
            f"analyze {self.run_dir.name} {self.saved.name} {s.case}: {epoch.num_targets:,} targets in "
            f"{len(epoch.batches)} effective batches, D={self.flat.size:,}; {len(pending)} of {len(wanted)} "
            f"directions to measure{'' if mean is None else ' (mean gradient saved)'}"
        )
        bar = progress_bar(len(pending), desc="analyze", unit="direction")
        while mean is None or pending:
            if mean is None:
                group = [key for key in pending if key[0] != "noise"][: s.directions_per_pass]
            else:
                group = pending[: s.directions_per_pass]
            mean = self.measure(group, mean)
            pending = [key for key in pending if key not in group]
            bar.update(len(group))
        bar.close()
        return self.finish(wanted, mean)

    def microbatches(self, blocks: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
        for start in range(0, blocks.shape[0], size):
            yield to_device(blocks[start : start + size], self.device)

    def measure(self, group: list[tuple[str, int]], mean: dict[str, Any] | None) -> dict[str, Any]:
        """One pass over the epoch for ``group`` (and the mean gradient while it is None); write samples."""
        started = time.perf_counter()
        directions, rows = [], []
        for kind, index in group:
            direction, row = self.direction(kind, index, mean)
            directions.append(direction)
            rows.append(row)
        pass_started = time.perf_counter()
        result = curvature_pass(
            self.loss_fn,
            self.flat,
            self.microbatches(self.epoch.blocks, self.hvp_micro),
            self.epoch.num_targets,
            directions,
            gradient=mean is None,
        )
        del directions
        seconds = time.perf_counter() - pass_started
        share = seconds / (len(group) + (mean is None))
        if mean is None:
            assert result.gradient is not None  # the pass was asked for it
            mean = {
                "identity": self.identity["identity"],
                "gradient": result.gradient.detach().cpu(),
                "loss": result.loss,
                "seconds": share,
            }
            atomic_write_with(self.state_path, lambda handle: torch.save(mean, handle))
        for row, quadratic in zip(rows, result.quadratics, strict=True):
            row["quadratic"] = quadratic
            row["normalized"] = quadratic / row["norm_squared"] if row["norm_squared"] > 0 else None
            row["hvp_seconds"] = share
            row["seconds"] = share + row.get("gradient_seconds", 0.0)
            self.write_sample(row)
        kinds = ", ".join(f"{k} {i}" for k, i in group) or "mean gradient only"
        self.log(f"  pass over the epoch: {kinds} in {time.perf_counter() - started:.1f}s")
        return mean

    def direction(
        self, kind: str, index: int, mean: dict[str, Any] | None
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The flat direction of one sample and its row (without the quadratic form yet)."""
        row: dict[str, Any] = {"identity": self.identity["identity"], "kind": kind, "index": index}
        if kind == "random":
            v = rademacher(self.flat.size, self.settings.seed, index, dtype=self.dtype, device=self.device)
            row["norm_squared"] = float(self.flat.size)
        elif kind == "consensus":
            if self.saved.workers is None:
                raise RunStateError("consensus samples need the packed run's worker weights")
            worker = self.saved.workers[index]
            mean_weights = self.flat.flatten(p.detach() for p in self.flat.params)
            local = self.flat.flatten(worker[name] for name in self.names)
            v = local.to(device=self.device, dtype=self.dtype) - mean_weights
            row["norm_squared"] = norm_squared(v)
        else:
            if mean is None:
                raise RuntimeError("noise samples need the mean gradient of the epoch first")
            started = time.perf_counter()
            batch = self.epoch.batches[index]
            blocks = self.epoch.batch_blocks(batch)
            micro = self.recipe.training.micro_batch_size
            targets = blocks.shape[0] * (blocks.shape[1] - 1)
            g, loss = gradient(self.loss_fn, self.flat, self.microbatches(blocks, micro), targets)
            v = g - mean["gradient"].to(device=self.device, dtype=self.dtype)
            squared = norm_squared(v)
            row.update(
                batch=batch_record(batch),
                batch_loss=loss,
                gradient_norm=math.sqrt(norm_squared(g)),
                noise_norm_squared=squared,
                norm_squared=squared,
                gradient_seconds=time.perf_counter() - started,
            )
        return v, row

    def load_mean(self) -> dict[str, Any] | None:
        if not self.state_path.is_file():
            return None
        mean = torch.load(self.state_path, map_location="cpu", weights_only=True)
        return mean if mean.get("identity") == self.identity["identity"] else None

    def finish(self, wanted: list[tuple[str, int]], mean: dict[str, Any]) -> dict[str, Any]:
        found = [self.read_sample(kind, index) for kind, index in wanted]
        rows = [row for row in found if row is not None]
        if len(rows) != len(found):
            raise RunStateError(f"{self.samples_dir}: a sample vanished while the job ran; rerun it")
        by_kind = {kind: [r for r in rows if r["kind"] == kind] for kind in ("noise", "random", "consensus")}
        full_norm = math.sqrt(norm_squared(mean["gradient"]))
        statistics = summarize(
            by_kind["noise"],
            by_kind["random"],
            by_kind["consensus"],
            dimension=self.flat.size,
            mean_gradient_norm=full_norm,
        )
        result = {
            **self.header(self.epoch),
            "epoch_loss": mean["loss"],
            "statistics": statistics,
            "seconds": mean["seconds"] + math.fsum(r["seconds"] for r in rows),
            "seconds_this_session": time.perf_counter() - self.started,
            "threads": torch.get_num_threads(),
        }
        atomic_write_json(self.output / "result.json", result)
        self.state_path.unlink(missing_ok=True)
        return result


def run_analysis(
    run_dir: Path, checkpoint: str, output: Path, settings: AnalysisConfig, log: Log = _stderr
) -> dict[str, Any]:
    """Analyse ``checkpoint`` of the run in ``run_dir`` on ``settings.case`` into ``output``; the result."""
    return AnalysisJob(run_dir, checkpoint, output, settings, log).run()


def result_line(result: dict[str, Any]) -> str:
    """The statistics a command prints (one JSON object)."""
    keep = {
        "checkpoint": result["checkpoint"]["name"],
        "case": result["case"],
        "step": result["checkpoint"]["step"],
    }
    return json.dumps({**keep, "epoch_loss": result["epoch_loss"], **result["statistics"]})
