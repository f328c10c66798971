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
- Rank 0's own work (a state save, a weights export) runs behind a hand-off on a gloo control group
  (``on_rank0``): the followers wait for it on the host, with a timeout sized for a save on slow storage
  (``collective_timeout``, also NCCL's), never inside a device collective, and a failure of it fails every
  rank. Every rank leaves the job together (``run_ranks``), so a follower's end never makes torchrun stop rank
  0 mid-write. Start-up hand-offs (the state to start from) use that group too.
- Ranks launched by ``tiny_llm launch`` meet in its private FileStore (``STORE_ENV``) with their sockets on
  the loopback interface; under torchrun, in torchrun's store. Each rank compiles with cores / K Inductor
  workers (at least 2).
- DDP's logger is kept from timing iterations (``_NoRuntimeStats``): on CUDA that waits on events on the
  first 10 synced iterations and every 100th, a synchronize inside the clock's window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import inspect
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

from tiny_llm.budget import parameter_count
from tiny_llm.config import TRACKING_ENV, RecipeConfig
from tiny_llm.errors import ConfigError, DiskFullError
from tiny_llm.runtime import signals
from tiny_llm.runtime.device import default_cpu_threads
from tiny_llm.runtime.engine import StepStats, UpdateAborted
from tiny_llm.train.engine import ModelEngine
from tiny_llm.train.launch import SCRATCH_ENV, STORE_ENV, compile_workers, remove_stale_jobs

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


def world_size() -> int:
    """The ranks training the model (1 outside a process group)."""
    return dist.get_world_size() if active() else 1


# A save on busy shared storage: FP32 weights and Adam's two moments, and the weights' export, per parameter.
SAVE_BYTES_PER_PARAMETER = 16
SLOW_STORAGE_BYTES_PER_SECOND = 4e6
MIN_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)  # gloo's default


def collective_timeout(recipe: RecipeConfig) -> datetime.timedelta:
    """How long a rank waits in a collective before it gives up: at least 30 minutes, and long enough for
    rank 0 to save and export the model at 4 MB/s (NCCL's own default, 10 minutes, is not: its watchdog
    would kill a 500m job whose final save is slow)."""
    seconds = SAVE_BYTES_PER_PARAMETER * parameter_count(recipe.model) / SLOW_STORAGE_BYTES_PER_SECOND
    return max(MIN_COLLECTIVE_TIMEOUT, datetime.timedelta(seconds=seconds))


_CONTROL: list[Any] = []
"""The gloo group of the ranks' host-side hand-offs (``control_group``), while a process group is up."""


def control_group() -> Any:
    """The gloo group rank-0 hand-offs and start-up messages go through (the whole group under gloo)."""
    return _CONTROL[0] if _CONTROL else None


def _cap_compile_workers(world_size: int) -> None:
    """``launch.compile_workers`` Inductor compile workers per rank (cores / K, at least 2), also under
    torchrun: Inductor's default, up to 32, is per process, and K ranks compile at once. A value the user
    set is kept."""
    if "TORCHINDUCTOR_COMPILE_THREADS" in os.environ:
        return
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = compile_workers(world_size)


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
    _cap_compile_workers(ranks.world_size)
    backend = "gloo"
    if recipe.runtime.device.startswith("cuda"):
        backend = "nccl"
        torch.cuda.set_device(ranks.local_rank)  # NCCL binds each rank's communicator to its GPU
    timeout = collective_timeout(recipe)
    store = os.environ.get(STORE_ENV)  # tiny_llm launch's FileStore; torchrun's TCP store (env://) otherwise
    dist.init_process_group(
        backend,
        init_method=f"file://{store}" if store else None,
        rank=ranks.rank,
        world_size=ranks.world_size,
        timeout=timeout,
    )
    try:
        gloo = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
        _CONTROL[:] = [gloo]
        try:
            if ranks.rank == 0:
                return _lead(recipe, train)
            return _follow(recipe, train)
        finally:
            _farewell()
    finally:
        _CONTROL.clear()
        dist.destroy_process_group()


def _farewell() -> None:
    """Every rank leaves together: a follower done first waits for rank 0 (still writing its last state or
    status), so torchrun, which stops the other ranks once one exits, never stops rank 0 mid-write. A peer
    already gone ends the wait at once."""
    with contextlib.suppress(RuntimeError, dist.DistError):
        dist.barrier(group=control_group())


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
            dist.broadcast_object_list([("exit", code, False)], src=0, group=control_group())


class RankExit(Exception):
    """Rank 0 ended before training started; a follower ends with its code."""

    def __init__(self, code: int) -> None:
        super().__init__(f"rank 0 ended with code {code} before training")
        self.code = code


SCRATCH_PREFIX = "tiny-llm-rank-"


def _follow(recipe: RecipeConfig, train: Callable[[RecipeConfig, bool], int]) -> int:
    """A follower: the same session in a private directory, no tracking, quiet. The directory is below
    ``tiny_llm launch``'s job directory (removed with it), else in the temp directory, where those of
    followers killed before they could remove theirs (``tiny-llm-rank-<pid>-*``) are removed first."""
    os.environ.pop(TRACKING_ENV, None)
    root = os.environ.get(SCRATCH_ENV) or tempfile.gettempdir()
    remove_stale_jobs(Path(root), SCRATCH_PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=root) as scratch:
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
    dist.broadcast_object_list(message, src=0, group=control_group())
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
    collective(lambda: dist.all_reduce(both), "the evaluation's all-reduce")
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


def on_rank0(work: Callable[[], None], what: str) -> None:
    """``work`` (files rank 0 writes: a state, weights) on rank 0 only, every rank waiting for it on the
    host, on the control group (its timeout is sized for a slow save; no device collective waits meanwhile).
    A failure of rank 0's is raised on every rank (a full disk as DiskFullError), so all fail alike."""
    if not active():
        work()
        return
    error: Exception | None = None
    if dist.get_rank() == 0:
        try:
            work()
        except Exception as exc:  # handed to the followers first, then raised here
            error = exc
    message: list[Any] = [None if error is None else (type(error).__name__, str(error))]
    collective(lambda: dist.broadcast_object_list(message, src=0, group=control_group()), f"rank 0's {what}")
    if error is not None:
        raise error
    if message[0] is not None:
        kind, text = message[0]
        if kind == DiskFullError.__name__:
            raise DiskFullError(text)
        raise RuntimeError(f"rank 0 failed during {what}: {kind}: {text}")


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


def no_buffer_sync() -> dict[str, Any]:
    """DDP's argument that turns off its buffer broadcast before each forward: ``forward_sync_buffers``
    since torch 2.13, ``broadcast_buffers`` before (2.10-2.12 refuse the new name)."""
    accepted = inspect.signature(DistributedDataParallel.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in accepted else "broadcast_buffers"
    return {name: False}


class _NoRuntimeStats:
    """DDP's logger without its runtime statistics. DDP times its forward and backward on the first 10
    synced iterations and every 100th after (``set_runtime_stats_and_log``); on CUDA that waits on CUDA
    events, a device synchronize inside the run clock's window. Everything else goes to DDP's own logger."""

    def __init__(self, logger: Any) -> None:
        self._logger = logger

    def set_runtime_stats_and_log(self) -> None:
        """Nothing: no timing, no wait."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


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
                gradient_as_bucket_view=True,  # no copies between the buckets and .grad
                **no_buffer_sync(),  # the buffers (RoPE tables) are computed alike on every rank
            )

        self.ddp = collective(wrap, "DDP's start")
        self.ddp.logger = typing.cast(Any, _NoRuntimeStats(self.ddp.logger))
        self.ddp.register_comm_hook(None, _sum_hook)
        self.grads = []  # the tensors DDP copied into its buckets: none kept (see zero_grads)
        self.vote = StopVote()

    def _bucket_views(self) -> list[torch.Tensor]:
        """The gradients as DDP holds them now: it re-points .grad when it rebuilds its buckets."""
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):
            raise RuntimeError("runtime.num_gpus: DDP left a parameter without its gradient view")
        return typing.cast(list[torch.Tensor], grads)

    def zero_grads(self) -> None:
        """Zero DDP's bucket views in place, keeping none of them: DDP rebuilds its buckets in the second
        update's first forward, and a view held here through it would keep the old buckets alive through
        that update (4 bytes per parameter more at the first window's peak). ``forward_backward`` takes
        the views again once the update's backward is done."""
        torch._foreach_zero_(self._bucket_views())
        self.grads = []

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
