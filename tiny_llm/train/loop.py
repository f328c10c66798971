"""The training run: budgeted updates, per-epoch validation, checkpoints, resume, signals, results
(``tiny_llm.train.session`` claims, locks and resumes the run directory first).

Exit codes: 0 complete, 130 interrupted (state saved when the policy allows), 1 failed (status.json says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from tiny_llm.budget import Budget, flops_per_token, kept_epochs, lr_at, make_budget
from tiny_llm.config import RecipeConfig, recipe_identity, recipe_identity_payload, recipe_to_dict
from tiny_llm.data.cache import TokenCache, open_cache
from tiny_llm.data.loader import TrainLoader, iter_validation, validation_subset
from tiny_llm.errors import DiskFullError
from tiny_llm.io import (
    atomic_write_json,
    atomic_write_yaml,
)
from tiny_llm.runtime import signals
from tiny_llm.runtime.device import DeviceTimer, check_cuda_graph, pin_for, setup_runtime, uses_compile
from tiny_llm.runtime.engine import Engine, EngineFactory, NonFiniteError, StepStats, UpdateAborted
from tiny_llm.runtime.environment import device_name
from tiny_llm.runtime.mfu import matmul_precision, peak_flops
from tiny_llm.train import checkpoint, continuation, distributed
from tiny_llm.train.clock import RunClock
from tiny_llm.train.evaluate import EvalResult, EvaluationAborted, byte_table, evaluate, subset_batches
from tiny_llm.train.metrics import MetricsLog, RunLog
from tiny_llm.train.progress import Progress, Window
from tiny_llm.train.rows import console_line, result_record, train_row, validation_row
from tiny_llm.train.run_dir import check_resumable, write_environment, write_status
from tiny_llm.train.tracking import Tracker, open_tracker

EXIT_COMPLETE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


class Interrupted(Exception):
    """Stop requested; the loop saves what the policy allows and exits 130."""


def device_timer(device: torch.device) -> DeviceTimer:
    """The clock's view of ``device`` (the tests put an asynchronous stand-in here)."""
    return DeviceTimer(device)


class Trainer:
    def __init__(self, recipe: RecipeConfig, run_dir: Path, log: RunLog, build_engine: EngineFactory) -> None:
        self.recipe = recipe
        self.build_engine = build_engine
        self.run_dir = run_dir
        self.log = log
        self.device = setup_runtime(recipe)
        self.progress = Progress()
        self.clock = RunClock(device_timer(self.device), self.progress)
        check_cuda_graph(recipe, self.device)
        # One rank verifies the cache's checksums (rank 0, before it hands the start to the others).
        self.cache: TokenCache = open_cache(recipe.data.cache_dir, verify=distributed.writes_files())
        self.cache.check_compatible(recipe)
        self.token_bytes = byte_table(self.cache)  # bits per byte of every validation (None: no tokenizer)
        self.budget: Budget = make_budget(recipe)
        self.cache.check_capacity(self.budget.cache_tokens_needed)
        self.identity = recipe_identity(recipe, self.cache.identity)
        self.schedule = self.budget.update_schedule()
        self.metrics = MetricsLog(run_dir / "metrics.jsonl")
        self.tracker: Tracker | None = None
        self.policy = recipe.training.checkpoint_policy
        self.kept_epochs = set(kept_epochs(recipe))
        self.stop_at: int | None = None
        """Stop after this update, keep its state and write stopped.json (a trunk)."""
        self.keep_at: set[int] = set()
        """Updates after which an immutable step-NNNNNNN.pt is kept (a trunk's branch points)."""
        self._engine: Engine | None = None
        self._loader: TrainLoader | None = None
        self.unsettled: list[tuple[StepStats, int, int]] = []
        """Updates not yet in the window: (stats, step and tokens before the update)."""

    @property
    def started(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            raise RuntimeError("the trainer has no engine before start()")
        return self._engine

    @property
    def loader(self) -> TrainLoader:
        if self._loader is None:
            raise RuntimeError("the trainer has no loader before start()")
        return self._loader

    # ------------------------------------------------------------------ setup

    def start(
        self, resume_path: Path | None, state: dict[str, Any] | None = None, branch: bool = False
    ) -> None:
        """Start afresh, or resume ``resume_path`` (``state``: that file, already loaded); ``branch``: the
        state is another run's, trained to a point this recipe shares (`continuation`)."""
        resume_path, state, branch = distributed.agree_start(resume_path, state, branch)  # rank 0's choice
        if state is None and resume_path is not None:  # a follower: rank 0 verified the file's checksums
            state = checkpoint.load_state(resume_path, verify=distributed.writes_files())
        if branch:
            if resume_path is None or state is None:
                raise RuntimeError("a branch starts from another run's state file")
            continuation.check_continues(state, resume_path, self.recipe, self.cache.identity)
            continuation.copy_trunk_metrics(resume_path.parent / "metrics.jsonl", self.metrics.path)
        elif state is not None:
            check_resumable(state, resume_path, self.recipe, self.identity, self.cache.identity)
        self.tracker = open_tracker(self.recipe, self.run_dir, self.identity, self.log)
        self.metrics.listener = self.tracker.log_row
        self._engine = self.build_engine(self.recipe, self.device)
        self._loader = TrainLoader(
            self.cache,
            context_length=self.recipe.model.context_length,
            num_blocks=self.budget.num_blocks,
            seed=self.recipe.data_seed,
            buffer_size_mib=self.recipe.data.buffer_size_mib,
            prefetch=self.recipe.data.prefetch,
            passes=self.budget.data_passes,
            shuffle_group_size=self.recipe.data.shuffle_group_size,
        )
        if state is None:
            self.metrics.reset()
            for name in ("best.json", "result.json"):
                (self.run_dir / name).unlink(missing_ok=True)
            b = self.budget
            self.log(f"start: {b.num_updates} updates, {b.tokens} tokens, {b.num_epochs} epochs")
            if b.data_passes > 1:  # repeating data is a choice of the recipe: say so where the run starts
                unique = b.unique_blocks * b.context_length
                self.log(f"data: {b.data_passes} passes over {unique} unique tokens (training.data_passes)")
        else:
            self._restore(state)
            self.log(f"resumed from {resume_path} at step {self.progress.step}/{self.budget.num_updates}")
        atomic_write_yaml(self.run_dir / "resolved.yaml", recipe_to_dict(self.recipe))
        _, start, blocks = self.schedule[-1]
        total = (start + blocks) * self.recipe.model.context_length  # every update's tokens (packed: all)
        self.log.start_bar(total, self.progress.tokens, len(self.schedule))
        self._write_status("running")
        write_environment(
            self.run_dir,
            self.device,
            self.engine,
            self.identity,
            self.cache.identity,
            uses_compile(self.recipe),
            resumed=state is not None and not branch,
        )
        self.clock.start_session(self.progress, self.engine.replay_peak_bytes)
        ev = self.recipe.evaluation
        subset = validation_subset(self.cache, self.recipe.model.context_length, ev.subset_blocks, ev.seed)
        self.subset = subset_batches(subset, ev.batch_size, self.device)  # made and pinned once per session

    def _restore(self, state: dict[str, Any]) -> None:
        self.engine.load_state_dict(state["engine"])
        self.loader.load_state_dict(state["loader"])
        checkpoint.set_rng_state(state["rng"])
        self.progress = Progress.from_dict(state["progress"])
        self.metrics.truncate_to_step(self.progress.step)
        self._write_best()  # best.json as of the resumed state (an epoch file may rewind the run)

    # ------------------------------------------------------------------ the loop

    def run(self) -> int:
        if self.progress.pending_epoch is not None:
            self.finish_epoch()
        end = len(self.schedule) if self.stop_at is None else min(self.stop_at, len(self.schedule))
        self.keep_state()
        while self.progress.step < end:
            if signals.stop_requested():
                raise Interrupted()
            self.update()
            self.keep_state()
        if end < len(self.schedule):
            return self.stop()
        self.finish()
        return EXIT_COMPLETE

    def keep_state(self) -> None:
        """The state after a branch point, once (immutable)."""
        step = self.progress.step
        if step in self.kept_points():
            self.save(continuation.state_name(step), keep_existing=True)

    def kept_points(self) -> set[int]:
        """The updates after which a state is kept: the branch points and the stop."""
        return self.keep_at | ({self.stop_at} if self.stop_at is not None else set())

    def stop(self) -> int:
        """A trunk's end: the state to resume from, status ``stopped`` and stopped.json last."""
        p = self.progress
        if self.policy != "none":
            self.save(checkpoint.LATEST)
        self._write_status("stopped")
        kept = sorted(s for s in self.kept_points() if s <= p.step)
        continuation.write_stopped(self.run_dir, p.step, p.tokens, kept)
        self.log(f"stopped at step {p.step} (--stop-at-step); kept states after steps {kept}")
        return EXIT_COMPLETE

    def update(self) -> None:
        p, training = self.progress, self.recipe.training
        epoch, start_block, num_blocks = self.schedule[p.step]
        step = p.step + 1
        epoch_end = p.blocks + num_blocks == self.budget.epoch_boundaries[epoch]
        logs_row = step % training.log_every == 0 or epoch_end
        saves = self.policy in ("interval", "all") and (epoch_end or step % training.checkpoint_every == 0)
        self.clock.update_started()  # a span starts on an idle device; its updates then queue without a wait
        loader_state = self.loader.state_dict()
        blocks = pin_for(self.loader.next_blocks(num_blocks), self.device)
        end_tokens = (start_block + num_blocks) * self.recipe.model.context_length
        lr = lr_at(end_tokens, self.budget.tokens, self.recipe.optimizer, self.recipe.training.batch_tokens)
        try:
            stats = self.engine.train_step(blocks, lr, step)
        except UpdateAborted:
            self.loader.load_state_dict(loader_state)
            raise Interrupted() from None
        self._account(stats, num_blocks)
        if logs_row:
            self.log_train_row(epoch + 1, lr, stats)
        if epoch_end:
            p.pending_epoch = epoch + 1
            self.finish_epoch()
        if saves:
            self.save(checkpoint.LATEST)

    def _account(self, stats: StepStats, blocks: int) -> None:
        p = self.progress
        self.unsettled.append((stats, p.step, p.tokens))
        p.step += 1
        p.blocks += blocks
        p.tokens += stats.tokens
        self.clock.update_queued(stats.tokens)

    def settle(self) -> None:
        """Bring the updates since the last settle into the window: the engine's deferred finite check
        first (NonFiniteError naming the first non-finite update, progress set back to just before it),
        then their losses and norms in one device read."""
        if not self.unsettled:
            return
        try:
            self.engine.check_finite()
        except NonFiniteError as exc:
            before = next((u for u in self.unsettled if u[1] == exc.step - 1), None)
            if before is not None:
                self.progress.step, self.progress.tokens = before[1], before[2]
            raise
        StepStats.read_all([stats for stats, *_ in self.unsettled])
        for stats, *_ in self.unsettled:
            self.progress.window.add(stats.loss, stats.tokens, stats.grad_norm)
        self.unsettled.clear()

    def log_train_row(self, epoch: int, lr: float, last: StepStats) -> None:
        clock = self.clock.row()  # the window's last kernels are done: its values read without a wait
        self.settle()
        p = self.progress
        row = train_row(p, epoch, lr, clock, self.mfu_flops(), self.engine.row_fields(last, p.tokens))
        self.metrics.append(row)
        eta = clock.seconds_per_update * (len(self.schedule) - p.step)
        self.log(console_line(row, self.budget.num_epochs, len(self.schedule), eta), row=row, eta=eta)
        p.window = Window()

    def mfu_flops(self) -> tuple[float, float | None]:
        """(training FLOPs per token, the peak FLOP/s of every rank's device or None): a train row's MFU."""
        peak = peak_flops(device_name(self.device), matmul_precision(self.recipe, self.device))
        # the row's tokens are every rank's: K GPUs' peak
        return flops_per_token(self.recipe.model), peak and peak * distributed.world_size()

    # ------------------------------------------------------------------ epochs, evaluation, checkpoints

    def finish_epoch(self) -> None:
        """Subset validation, best and per-epoch files for ``progress.pending_epoch``.

        The progress (epochs done, best) is updated before the epoch's state file is written, so
        resuming from ``epoch-NNN.pt`` knows this epoch's result.
        """
        p = self.progress
        epoch = p.pending_epoch
        if epoch is None:
            raise RuntimeError("finish_epoch without a pending epoch")
        result, peak = self.evaluate_subset()
        self.metrics.append(validation_row(self.progress, "validation", epoch, result, peak))
        self.log(f"epoch {epoch}/{self.budget.num_epochs} validation loss {result.loss:.4f}")
        improved = p.best_loss is None or result.loss < p.best_loss
        p.epochs_done, p.pending_epoch = epoch, None
        keep = epoch in self.kept_epochs
        if improved:
            weights = f"{checkpoint.epoch_stem(epoch)}.safetensors" if keep else None
            p.best_epoch, p.best_loss, p.best_weights = epoch, result.loss, weights
        if keep:
            self.save_epoch_files(epoch)
        if improved:
            self._write_best()

    def _write_best(self) -> None:
        p = self.progress
        if p.best_epoch is None:
            (self.run_dir / "best.json").unlink(missing_ok=True)
            return
        best = {"epoch": p.best_epoch, "loss": p.best_loss, "weights": p.best_weights}
        atomic_write_json(self.run_dir / "best.json", best)

    def evaluate_subset(self) -> tuple[EvalResult, int]:
        return self._evaluate(self.subset, "subset")

    def _evaluate(
        self, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], split: str
    ) -> tuple[EvalResult, int]:
        """An evaluation pass and its own peak memory, kept apart from the training peak."""
        with self.clock.untimed("evaluation") as peak:
            try:
                result = evaluate(
                    self.engine.eval_model(),
                    batches,
                    self.recipe,
                    self.device,
                    split=split,
                    validation_complete=self.cache.validation_complete,
                    should_stop=signals.stop_requested,
                    token_bytes=self.token_bytes,
                )
            except EvaluationAborted:
                raise Interrupted() from None
        if not math.isfinite(result.loss):  # the weights diverged although the training losses were finite
            raise NonFiniteError(self.progress.step, f"non-finite {split} validation loss ({result.loss})")
        return result, peak.bytes

    def save_epoch_files(self, epoch: int) -> None:
        """epoch-NNN.safetensors + epoch-NNN.pt; immutable once written."""
        stem = checkpoint.epoch_stem(epoch)
        self.export(f"{stem}.safetensors", keep_existing=True)
        self.save(f"{stem}.pt", keep_existing=True)

    def export(self, name: str, *, keep_existing: bool = False) -> None:
        """The model's weights as ``name`` (rank 0 writes; every rank waits for it)."""
        path = self.run_dir / name

        def write() -> None:
            if not (keep_existing and path.exists()):
                self.engine.export_weights(path)

        distributed.on_rank0(write, f"export of {name}")

    def save(
        self, name: str, loader_state: dict[str, Any] | None = None, *, keep_existing: bool = False
    ) -> None:
        """The training state as ``name`` (``keep_existing``: not over one already there). Rank 0 writes
        (a K-rank state is a 1-rank state); every rank waits for it, on the host."""
        with self.clock.untimed():  # the span's kernels are done: the state is read without a wait, untimed
            self.settle()  # never save state past a non-finite update; the window's sums are in the state
        path = self.run_dir / name

        def write() -> None:
            if keep_existing and path.exists():
                return
            state = {
                "recipe_identity": self.identity,
                "identity_payload": recipe_identity_payload(self.recipe),
                "cache_identity": self.cache.identity,
                "progress": dataclasses.asdict(self.progress),
                "engine": self.engine.state_dict(),
                "loader": loader_state or self.loader.state_dict(),
                "rng": checkpoint.rng_state(),
            }
            checkpoint.save_state(path, state)

        distributed.on_rank0(write, f"save of {name}")

    def interrupt(self) -> int:
        with self.clock.untimed():
            try:
                self.settle()
            except NonFiniteError as exc:  # a non-finite update before the signal: the run failed there
                return self.fail(str(exc))
        if self.policy != "none" and self.started:
            try:
                self.save(checkpoint.LATEST)
                where = f"state saved to {self.run_dir / checkpoint.LATEST}"
            except DiskFullError as exc:
                where = f"no state saved ({exc})"
        else:
            where = "no state saved (checkpoint_policy none)"
        with contextlib.suppress(DiskFullError):
            self._write_status("interrupted")
        self.log(f"interrupted at step {self.progress.step}; {where}")
        return EXIT_INTERRUPTED

    # ------------------------------------------------------------------ the end

    def finish(self) -> None:
        with self.clock.untimed("end"):  # elapsed time ends at the final state: the full validation is after
            if self.policy != "none":
                self.save(checkpoint.FINAL)
                self.export("final.safetensors")
            L, batch = self.recipe.model.context_length, self.recipe.evaluation.batch_size
            full, peak = self._evaluate(iter_validation(self.cache, L, batch), "full")
        self.metrics.append(
            validation_row(self.progress, "final_validation", self.budget.num_epochs, full, peak)
        )
        self.log(f"final validation loss {full.loss:.4f} over {full.tokens} tokens")
        if self.policy == "final":
            (self.run_dir / checkpoint.LATEST).unlink(missing_ok=True)
        self._write_status("complete")
        session = self.clock.seconds_this_session()
        record = result_record(self.progress, full, self.budget.parameters, self.identity, session)
        atomic_write_json(
            self.run_dir / "result.json", {**record, **self.engine.result_fields(record["tokens"])}
        )

    def _write_status(self, status: str, **extra: Any) -> None:
        write_status(self.run_dir, status, self.progress.step, self.progress.tokens, **extra)

    def fail(self, error: str) -> int:
        with contextlib.suppress(DiskFullError):  # a full disk may refuse status.json too: run.log says why
            self._write_status("failed", error=error)
        self.log(f"failed at step {self.progress.step}: {error}")
        return EXIT_FAILED

    def close(self) -> None:
        self.log.close_bar()
        if self.tracker is not None:
            self.tracker.close()
        if self._loader is not None:
            self._loader.close()
