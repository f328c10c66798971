"""The whole-update CUDA graph (runtime.cuda_graph): the ordinary engine's update, captured once, replayed.

The update (zero the gradients, forward and backward over the microbatches, the finite flag, clipping,
fused AdamW) is one static function: it reads its batch from a persistent input buffer, its learning rate
and step number from device tensors, and leaves [loss, grad_norm] in a persistent buffer. Nothing in it
reads a value on the host, so on CUDA it is captured with ``torch.cuda.graph`` after ``WARMUP_UPDATES``
eager full updates (compilation, the optimizer's lazy state, cuBLAS workspaces) and replayed for every
later full update: one launch instead of hundreds of kernel launches. A short update (an epoch's last,
``Budget.epoch_updates``) runs the same function eagerly on its own shape.

Uncaptured (the CPU, or ``capturer=None``) every update runs that function eagerly; the unit tests compare
it bit for bit with ``ModelEngine``'s fused update, so everything but the capture itself is tested on the
CPU. One difference on CUDA only: its fused AdamW kernel reads a tensor learning rate as FP32 (the
ordinary update hands it a double), so the graph's lr is the schedule's rounded to FP32 (relative 6e-8).

Memory: the capture keeps a private pool holding one update's activations; the eager short update and the
evaluations allocate beside it, so from the first epoch end a run holds about one more microbatch's
activations than an eager run. The short shape is not captured as well: it runs once per epoch, so its own
warm-up (eager updates of that shape, which would have to be real updates) could never pay, and running eager
work inside the graph's pool is safe only while no tensor made there outlives the work, which compiled
evaluation's caches do not promise. Size a graph run by its captured peak (``replay_peak_bytes``, in its
train rows) plus one microbatch, or leave the graph off where memory is tight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from tiny_llm.config import RecipeConfig
from tiny_llm.errors import ConfigError
from tiny_llm.runtime.device import pin_for, to_device
from tiny_llm.runtime.engine import StepStats
from tiny_llm.train.engine import ModelEngine

WARMUP_UPDATES = 3
"""Eager full updates before the capture (torch's CUDA-graph notes ask for a few, on the capture stream)."""


class Capturer(Protocol):
    """Runs the warm-up updates and captures the update: CUDA's, or a stand-in in the tests."""

    def warm(self, update: Callable[[], None]) -> None:
        """Run ``update`` eagerly where the capture will record it."""
        ...

    def capture(self, update: Callable[[], None]) -> Callable[[], None]:
        """Record ``update`` without running it; return what replays it."""
        ...


class CudaCapturer:
    """``torch.cuda.graph`` on a side stream of its own, where the warm-up updates run too."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.peak_bytes = 0
        """The allocator's peak as the capture left it: a replay reuses the capture's memory, graph-owned, and
        never moves ``max_memory_allocated`` again, so a window that only replays reports this floor."""

    def warm(self, update: Callable[[], None]) -> None:
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # after the input copy queued on the current stream ...
        with torch.cuda.stream(self.stream):
            update()
        current.wait_stream(self.stream)  # ... and before whatever the current stream does next

    def capture(self, update: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):  # synchronizes first, then records, runs nothing
            update()
        self.peak_bytes = int(torch.cuda.max_memory_allocated(self.device))
        return graph.replay  # on the current stream, after the input copy; the bound method keeps the graph


class GraphEngine(ModelEngine):
    """``ModelEngine`` whose full updates replay one captured update."""

    def __init__(
        self, recipe: RecipeConfig, device: torch.device, *, capturer: Capturer | str | None = "cuda"
    ) -> None:
        """``capturer``: "cuda" (a ``CudaCapturer`` on CUDA, none elsewhere), None (every update eager), or
        one given (the tests' stand-in)."""
        super().__init__(recipe, device)
        if not self.deferred_check:  # recipe validation refuses this first; an engine built by hand too
            raise ConfigError(
                "runtime.cuda_graph: needs runtime.fused_optimizer true and deterministic false"
            )
        if capturer == "cuda":
            capturer = CudaCapturer(device) if device.type == "cuda" else None
        self.capturer = capturer if not isinstance(capturer, str) else None
        # CUDA's fused kernel takes a tensor lr as FP32 only; the CPU's as a double, as the ordinary update.
        lr_dtype = torch.float32 if device.type == "cuda" else torch.float64
        self.lr = torch.full((), recipe.optimizer.lr, dtype=lr_dtype, device=device)
        self.step = torch.zeros((), dtype=torch.int64, device=device)
        self.values = torch.zeros(2, device=device)
        """The last update's [loss, grad_norm], written by the update (graph-owned under capture)."""
        blocks = recipe.training.batch_tokens // recipe.model.context_length
        self.inputs = torch.zeros(blocks, recipe.model.context_length + 1, dtype=torch.int64, device=device)
        self.replay: Callable[[], None] | None = None
        """The captured update's replay, once captured."""
        self.warm_updates = 0
        self._use_device_lr()

    def _use_device_lr(self) -> None:
        """Point the optimizer at the device lr (a loaded state brings a float lr and capturable false)."""
        assert isinstance(self.optimizer, torch.optim.AdamW)  # the recipe refuses cuda_graph under muon
        for group in self.optimizer.param_groups:
            if not isinstance(group["lr"], torch.Tensor):
                self.lr.fill_(group["lr"])
            group["lr"], group["capturable"] = self.lr, True
        # Warm-up and short updates run uncaptured on purpose: no warning about capturable=True for them.
        self.optimizer._warned_capturable_if_run_uncaptured = True

    def train_step(self, blocks: torch.Tensor, lr: float, step: int) -> StepStats:
        num_targets = blocks.shape[0] * (blocks.shape[1] - 1)
        self.lr.fill_(lr)  # device writes, queued like any kernel: no host wait
        self.step.fill_(step)
        if blocks.shape != self.inputs.shape:  # an epoch's short last update: eagerly, on its own shape
            self.update(to_device(blocks, self.device))
        else:
            self.inputs.copy_(pin_for(blocks, self.device), non_blocking=True)
            self.full_update()
        return StepStats.deferred(self.values.clone(), num_targets)  # the next replay overwrites values

    def update(self, batch: torch.Tensor) -> None:
        """The whole update of ``batch`` (on the device), with no host read: what the graph captures."""
        num_targets = batch.shape[0] * (batch.shape[1] - 1)
        total = self.forward_backward(batch, num_targets, abortable=False)
        norm_t, values = self.norm_and_values(total, num_targets)
        self.guard.flag(values, self.step)
        self.clip(norm_t)
        self.optimizer.step()
        self.values.copy_(values)

    def full_update(self) -> None:
        """The update of ``inputs``: eager while uncaptured or warming up, then captured once and replayed."""
        if self.replay is not None:
            self.replay()
        elif self.capturer is None:
            self.update(self.inputs)
        elif self.warm_updates < WARMUP_UPDATES:
            self.capturer.warm(self.update_inputs)
            self.warm_updates += 1
        else:
            self.replay = self.capturer.capture(self.update_inputs)
            self.replay()

    def update_inputs(self) -> None:
        """The update of the input buffer: what is warmed up and captured (a bound method: a capturer can
        see the engine whose buffers it records)."""
        self.update(self.inputs)

    def state_dict(self) -> dict:
        """The ordinary engine's format (a float lr, capturable false): either engine resumes the other's."""
        state = super().state_dict()
        for group in state["optimizer"]["param_groups"]:
            group["lr"], group["capturable"] = float(self.lr), False
        return state

    def replay_peak_bytes(self) -> int:
        """The peak memory of a replayed update (the capture's), 0 before a capture: the clock's floor for
        a window's peak, which the allocator's statistics do not show for a replay."""
        return int(getattr(self.capturer, "peak_bytes", 0)) if self.replay is not None else 0

    def load_state_dict(self, state: dict) -> None:
        """Load, then capture again: the optimizer's state tensors are new, the old graph points at others."""
        super().load_state_dict(state)
        self._use_device_lr()
        self.replay, self.warm_updates = None, 0
