"""One profiled optimizer update with named regions, a Chrome trace and an operator table.

The profiled update performs the same work as ``ModelEngine.train_step`` (same
compiled loss, compute context, clipping and AdamW step), split into the
regions a trace reader looks for: data, forward_and_loss, backward, clipping,
optimizer. A unit test checks that it changes the weights exactly as
``train_step`` does, so the trace shows the production update.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tiny_llm.io import atomic_write_text
from tiny_llm.train.device import compute_context, synchronize
from tiny_llm.train.engine import ModelEngine
from tiny_llm.train.optim import set_lr

REGIONS = ("data", "forward_and_loss", "backward", "clipping", "optimizer")
TABLE_ROWS = 40
_ATTENTION_KEYS = ("attention", "sdpa", "flash", "fmha", "cudnn_attn", "efficient_attn")


def regioned_update(engine: ModelEngine, get_blocks: Callable[[], torch.Tensor], lr: float) -> float:
    """One update of a ModelEngine with record_function regions; returns the update's mean loss."""
    with record_function("data"):
        blocks = get_blocks().to(engine.device, non_blocking=True)
    num_targets = blocks.shape[0] * (blocks.shape[1] - 1)
    total = torch.zeros((), device=engine.device)
    for micro in blocks.split(engine.micro_batch_size):
        loss_fn = engine._compiled_loss if micro.shape[0] == engine.micro_batch_size else engine._loss
        with record_function("forward_and_loss"), compute_context(engine.recipe, engine.device):
            summed = loss_fn(micro[:, :-1], micro[:, 1:])
        with record_function("backward"):
            (summed / num_targets).backward()
        total += summed.detach()
    with record_function("clipping"):
        grads = [p.grad for p in engine.params if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=engine.device.type == "cuda")
        if engine.grad_clip is not None:
            torch.nn.utils.clip_grads_with_norm_(engine.params, engine.grad_clip, norm)
    with record_function("optimizer"):
        set_lr(engine.optimizer, lr)
        engine.optimizer.step()
        engine.optimizer.zero_grad(set_to_none=True)
    return (total / num_targets).item()


def profile_update(engine, get_blocks: Callable[[], torch.Tensor], lr: float) -> torch.profiler.profile:
    """Run one regioned update under the profiler (CPU, plus CUDA on a GPU)."""
    activities = [ProfilerActivity.CPU]
    if engine.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(engine.device)
    with profile(activities=activities, record_shapes=False) as prof:
        if isinstance(engine, ModelEngine):
            regioned_update(engine, get_blocks, lr)
        else:  # other engines (packed) are profiled as one opaque update
            with record_function("update"):
                engine.train_step(get_blocks(), lr, 0)
        synchronize(engine.device)
    return prof


def attention_kernels(prof: torch.profiler.profile) -> list[str]:
    """Names of the attention operators/kernels the profiled update dispatched."""
    names = set()
    for event in prof.key_averages():
        key = event.key
        # Autograd graph nodes only wrap the operators; keep the operators and device kernels.
        if key.startswith("autograd::") or key.endswith(("Backward0", "Backward1")):
            continue
        if any(k in key.lower() for k in _ATTENTION_KEYS):
            names.add(key)
    return sorted(names)


def write_profile(prof: torch.profiler.profile, trace_path: Path, table_path: Path, on_gpu: bool) -> None:
    """Chrome trace (JSON) and the top-40 operator table by self device time."""
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace_path.with_name(f".{trace_path.name}.tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(trace_path)
    sort_by = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=TABLE_ROWS)
    atomic_write_text(table_path, f"# top {TABLE_ROWS} operators by {sort_by}\n{table}\n")
