"""One profiled optimizer update with named regions, a Chrome trace and an operator table.

The profiled update is the production ``train_step``, whose named regions
(data, forward_and_loss, backward, clipping, optimizer) a trace reader looks for.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import record_function

from tiny_llm.io import atomic_write_text
from tiny_llm.runtime.device import quiet_profile, synchronize

REGIONS = ("data", "forward_and_loss", "backward", "clipping", "optimizer")
TABLE_ROWS = 40


def profile_update(engine, get_blocks: Callable[[], torch.Tensor], lr: float) -> torch.profiler.profile:
    """Run one production update (``engine.train_step``) under the profiler (CPU, plus CUDA on a GPU).

    ``ModelEngine.train_step`` marks its own regions (data, forward_and_loss, backward, clipping,
    optimizer); the packed engine shows up as its operators inside one ``update`` region.
    """
    synchronize(engine.device)
    cuda = engine.device.type == "cuda"
    with quiet_profile(cuda, record_shapes=False) as prof, record_function("update"):
        engine.train_step(get_blocks(), lr, 0)
        synchronize(engine.device)
    return prof


def write_profile(prof: torch.profiler.profile, trace_path: Path, table_path: Path, on_gpu: bool) -> None:
    """Chrome trace (JSON) and the top-40 operator table by self device time."""
    trace_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace_path.with_name(f".{trace_path.name}.tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(trace_path)
    sort_by = "self_device_time_total" if on_gpu else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort_by, row_limit=TABLE_ROWS)
    atomic_write_text(table_path, f"# top {TABLE_ROWS} operators by {sort_by}\n{table}\n")
