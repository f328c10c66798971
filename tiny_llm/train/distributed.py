"""One model on several ranks (``runtime.num_gpus``, launched by ``torchrun --nproc-per-node K``): data
parallelism that computes what one process accumulating K times as many microbatches computes.

- Every rank reads the whole update from the same loader (same seed, same state) and trains its contiguous
  share of the update's microbatches, the same microbatches one process would run. The loader state, the
  budget, the schedule and the data order are therefore one process's, and a K-rank state is a 1-rank state.
- Each microbatch's summed loss is divided by the targets of the whole update (all ranks), and the model runs
  under PyTorch's DDP with ``no_sync`` on all but each rank's last microbatch and a comm hook that sums
  (not averages) the buckets, so the ranks' gradients add up to one process's gradient exactly, up to FP32
  summation order: one all-reduce of the gradients per update, overlapped with the last backward, and one
  of the update's loss. DDP's gradient buckets are the engine's persistent gradient tensors
  (``gradient_as_bucket_view``); a compiled loss runs inside DDP's forward, as DDP(compiled module) does.
- Norm, clipping and the finite check then read identical all-reduced values on every rank, so every rank
  skips or fails the same update.
- Stops are agreed: SIGTERM/SIGINT only set a local flag, which an asynchronous MAX all-reduce on a gloo
  group carries to every rank; its result is read at the next update's start, so all ranks see the stop at
  the same update, one update after the signal, without a device sync or a blocking host round trip.
- Rank 0 owns the run directory. The other ranks (followers) train in a private temporary directory, start
  from the state rank 0 chose (``agree_start``), and write no states or weights (``writes_files``).
- Evaluation is sharded: rank r takes batches r, r+K, ..., and the FP64 loss sums and target counts are
  all-reduced (``shard``, ``sum_over_ranks``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import signal
import tempfile
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.profiler import record_function

from tiny_llm.config import TRACKING_ENV, RecipeConfig
from tiny_llm.errors import ConfigError
from tiny_llm.runtime import signals
from tiny_llm.runtime.device import default_cpu_threads
from tiny_llm.runtime.engine import StepStats, UpdateAborted
from tiny_llm.train.engine import ModelEngine

T = TypeVar("T")


@dataclass(frozen=True)
class RankContext:
    """This process's place among torchrun's ranks."""

    rank: int
    world_size: int
    local_rank: int


def launched_ranks() -> RankContext | None:
    """The ranks torchrun started (RANK, WORLD_SIZE, LOCAL_RANK), None outside torchrun."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    env = os.environ
    return RankContext(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])))


def active() -> bool:
    """Whether this process trains as one of several ranks."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def writes_files() -> bool:
    """Whether this process writes training states and weights: rank 0, or the only process."""
    return not active() or dist.get_rank() == 0


def check_launch(recipe: RecipeConfig, ranks: RankContext | None) -> None:
    """The processes started must be the ranks the recipe asks for; one line naming the fix otherwise."""
    k, started = recipe.runtime.num_gpus, 1 if ranks is None else ranks.world_size
    if k != started:
        how = "under torchrun" if ranks is not None else "without torchrun"
        raise ConfigError(
            f"runtime.num_gpus is {k} but {started} process(es) started {how}; launch "
            f"`torchrun --nproc-per-node {k} -m tiny_llm train ...` or set runtime.num_gpus {started}"
        )


def check_one_process(recipe: RecipeConfig, what: str) -> None:
    """``what`` measures one process: refuse runtime.num_gpus above 1 in one line."""
    if recipe.runtime.num_gpus != 1:
        raise ConfigError(
            f"runtime.num_gpus: {what} measures one GPU, and the recipe asks for {recipe.runtime.num_gpus}; "
            "set runtime.num_gpus 1 (only `train` runs several ranks)"
        )


def run_ranks(recipe: RecipeConfig, train: Callable[[RecipeConfig, bool], int]) -> int:
    """Run ``train(recipe, follower)`` as this rank of a process group: rank 0 in the run directory, the
    others in a private one. Returns this rank's exit code."""
    ranks = launched_ranks()
    check_launch(recipe, ranks)
    assert ranks is not None
    recipe = _rank_runtime(recipe, ranks)
    backend = "gloo"
    if recipe.runtime.device.startswith("cuda"):
        backend = "nccl"
        torch.cuda.set_device(ranks.local_rank)  # NCCL binds each rank's communicator to its GPU
    dist.init_process_group(backend, rank=ranks.rank, world_size=ranks.world_size)
    try:
        if ranks.rank == 0:
            return _lead(recipe, train)
        return _follow(recipe, train)
    finally:
        dist.destroy_process_group()


def _rank_runtime(recipe: RecipeConfig, ranks: RankContext) -> RecipeConfig:
    """The recipe with this rank's GPU (cuda:LOCAL_RANK), or the CPU where no GPU is to be had, and its
    share of the job's CPU threads (runtime.cpu_threads is the job's: K ranks on its cores)."""
    rt = recipe.runtime
    device = rt.device
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        device = "cpu"
    else:
        device = f"cuda:{ranks.local_rank}"
    threads = max(1, (rt.cpu_threads or default_cpu_threads()) // ranks.world_size)
    runtime = dataclasses.replace(rt, device=device, cpu_threads=threads)
    return dataclasses.replace(recipe, runtime=runtime)


_announced: list[bool] = []


def _lead(recipe: RecipeConfig, train: Callable[[RecipeConfig, bool], int]) -> int:
    """Rank 0: the ordinary session; followers still waiting for its start are told the exit code."""
    _announced.clear()
    code = 1
    try:
        code = train(recipe, False)
        return code
    finally:
        if not _announced:  # refused, complete already, or failed before the trainer started
            dist.broadcast_object_list([("exit", code, False)], src=0)


class RankExit(Exception):
    """Rank 0 ended before training started; a follower ends with its code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"rank 0 ended with code {code} before training")
        self.code = code


def _follow(recipe: RecipeConfig, train: Callable[[RecipeConfig, bool], int]) -> int:
    """A follower: the same session in a private directory, no tracking, quiet."""
    os.environ.pop(TRACKING_ENV, None)
    with tempfile.TemporaryDirectory(prefix=f"tiny-llm-rank{dist.get_rank()}-") as scratch:
        runtime = dataclasses.replace(recipe.runtime, output_dir=str(Path(scratch) / "run"))
        try:
            return train(dataclasses.replace(recipe, runtime=runtime, tracking=None), True)
        except RankExit as exc:
            return exc.code


def agree_start(
    path: Path | None, state: dict[str, Any] | None, branch: bool
) -> tuple[Path | None, dict[str, Any] | None, bool]:
    """Every rank starts from the state rank 0 chose: rank 0 sends (path, branch), followers take them (and
    read that file themselves). Outside a process group, the arguments unchanged."""
    if not active():
        return path, state, branch
    message: list[Any] = [("start", None if path is None else str(path), branch)]
    dist.broadcast_object_list(message, src=0)
    if dist.get_rank() == 0:
        _announced.append(True)
        return path, state, branch
    kind, chosen, chosen_branch = message[0]
    if kind == "exit":
        raise RankExit(chosen)
    chosen_path = None if chosen is None else Path(chosen)
    return chosen_path, state if chosen_path == path else None, chosen_branch


def shard(batches: Iterable[T]) -> Iterable[T]:
    """This rank's evaluation batches: r, r+K, r+2K, ... (all of them outside a process group)."""
    if not active():
        return batches
    return itertools.islice(batches, dist.get_rank(), None, dist.get_world_size())


def sum_over_ranks(
    totals: tuple[torch.Tensor, ...], counts: tuple[int, ...]
) -> tuple[tuple[torch.Tensor, ...], tuple[int, ...]]:
    """FP64 sums (the loss's, the text targets') and counts (targets, bytes) over all ranks: one all-reduce;
    counts stay exact below 2**53."""
    if not active():
        return totals, counts
    device = totals[0].device
    counted = [torch.tensor(float(c), dtype=torch.float64, device=device) for c in counts]
    both = torch.stack([*(t.double() for t in totals), *counted])
    dist.all_reduce(both)
    summed = tuple(both[: len(totals)].unbind())
    return summed, tuple(int(c) for c in both[len(totals) :].tolist())


class RankLostError(RuntimeError):
    """A collective failed: another rank died or left the process group."""


def collective(run: Callable[[], T], what: str) -> T:
    """``run()``, a collective; a peer's death becomes one line naming what was lost (torchrun names the
    rank and its exit code)."""
    try:
        return run()
    except (RuntimeError, dist.DistError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        first = text.split("] ", 1)[-1][:120]  # without the backend's source location
        raise RankLostError(
            f"rank {dist.get_rank()} lost its peers during {what} ({first}); the job fails, and its rerun "
            "resumes from the last saved state"
        ) from None


def share(num_items: int, rank: int, world_size: int) -> range:
    """Rank ``rank``'s contiguous share of ``num_items`` (equal when they divide; may be empty)."""
    return range(rank * num_items // world_size, (rank + 1) * num_items // world_size)


class StopVote:
    """A stop every rank agrees on: signals set a local flag; an asynchronous MAX all-reduce started at one
    update's start is read at the next's, on a gloo group (no device sync, no blocking round trip)."""

    def __init__(self) -> None:
        self.local = signals.withdraw_stop()  # a signal caught before this engine existed
        self.group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        self.flag = torch.zeros(1, dtype=torch.int32)
        self.pending: Any = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handler)  # the session's stop_on_signals restores its own at the end

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.local = True

    def agreed(self) -> bool:
        """True when the vote started at the previous update found a stop on any rank."""
        if self.pending is not None:
            collective(self.pending.wait, "the stop vote")
            if int(self.flag.item()):
                return True
        self.flag.fill_(int(self.local))
        self.pending = dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        return False


class _MicrobatchLoss(nn.Module):
    """The engine's summed microbatch loss as a module, for DDP to wrap: DDP's forward arms the gradient
    all-reduce that the backward then runs."""

    def __init__(self, model: nn.Module, loss: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, micro: torch.Tensor) -> torch.Tensor:
        return self.loss(micro)


def _sum_hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's bucket all-reduce as a sum, not DDP's mean: each rank's losses are already scaled by the whole
    update's targets, so the sum is one process's gradient."""
    work = dist.all_reduce(bucket.buffer(), async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# DDP compares the hook's annotations with the types themselves; postponed annotations are strings.
_sum_hook.__annotations__ = typing.get_type_hints(_sum_hook)


class DistributedEngine(ModelEngine):
    """The ordinary engine as one of K ranks under DDP: its share of the microbatches, gradients summed
    across ranks during the last one's backward."""

    def __init__(self, recipe: RecipeConfig, device: torch.device) -> None:
        super().__init__(recipe, device)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        super().zero_grads()  # attach the persistent gradients: DDP makes them views of its buckets

        def wrap() -> DistributedDataParallel:
            return DistributedDataParallel(
                _MicrobatchLoss(self.model, self.microbatch_loss),
                device_ids=None if device.type == "cpu" else [device],
                forward_sync_buffers=False,  # the buffers (RoPE tables) are computed alike on every rank
                gradient_as_bucket_view=True,  # no copies between the buckets and .grad
            )

        self.ddp = collective(wrap, "DDP's start")
        self.ddp.register_comm_hook(None, _sum_hook)
        self.vote = StopVote()

    def _bucket_views(self) -> list[torch.Tensor]:
        """The gradients as DDP holds them now: it re-points .grad when it rebuilds its buckets."""
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            raise RuntimeError("runtime.num_gpus: DDP left a parameter without its gradient view")
        return typing.cast(list[torch.Tensor], grads)

    def zero_grads(self) -> None:
        """Zero DDP's bucket views in place."""
        self.grads = self._bucket_views()
        torch._foreach_zero_(self.grads)

    def train_step(self, blocks: torch.Tensor, lr: float, step: int) -> StepStats:
        if self.vote.agreed():
            signals.request_stop()  # the loop and evaluation now see the stop, on every rank alike
            raise UpdateAborted()
        return super().train_step(blocks, lr, step)

    def forward_backward(
        self, blocks: torch.Tensor, num_targets: int, *, abortable: bool = True
    ) -> torch.Tensor:
        """This rank's microbatches (losses over the whole update's ``num_targets``); DDP sums every rank's
        gradients in the last one's backward (``no_sync`` before it), and one all-reduce sums the loss.
        Never aborted midway: every rank must reach the all-reduces. A rank without a microbatch (in a
        short epoch-end update) runs the update's first one at weight 0, to take part in DDP's sum."""
        self.zero_grads()
        micro = self.micro_batch_size
        mine = share(-(-blocks.shape[0] // micro), self.rank, self.world_size)
        weight = 1.0 if len(mine) else 0.0
        pieces = blocks[mine.start * micro : mine.stop * micro] if len(mine) else blocks[:micro]
        chunks = pieces.split(micro)
        total = torch.zeros((), device=self.device)
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            with contextlib.nullcontext() if last else self.ddp.no_sync():
                summed = self.ddp(chunk)
                total += summed.detach() * weight
                scaled = summed / num_targets * weight
                with record_function("backward"):
                    collective(scaled.backward, "the gradient all-reduce")
        collective(lambda: dist.all_reduce(total), "the loss all-reduce")
        self.grads = self._bucket_views()  # DDP rebuilds its buckets in the second update's forward
        return total

    def export_weights(self, path: Path) -> None:
        if writes_files():
            super().export_weights(path)
