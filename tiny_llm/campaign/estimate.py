"""The GPU-hour estimate: runs x realized tokens / tokens per second."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tiny_llm.budget import make_budget
from tiny_llm.campaign.stages import (
    CampaignConfig,
    planned_configurations,
    stage_name,
    stage_run_ids_of,
    stage_seeds,
)
from tiny_llm.config import recipe_from_dict
from tiny_llm.errors import REBUILD_TUNING
from tiny_llm.io import read_json


def gpu_hour_estimate(
    config: CampaignConfig,
    templates: Mapping[str, Mapping[str, Any]],
    throughput: Mapping[str, float | None],
) -> dict[str, Any]:
    """Runs x realized tokens / tokens per second, per stage and in total (null where tokens/s is unknown).

    Runs = configurations x seeds: every seed of a configuration is a run of its own.
    """
    stages = []
    configurations = planned_configurations(config)
    for i, stage in enumerate(config.stages):
        num_runs = len(stage_run_ids_of(config.stages, i))
        tokens = make_budget(recipe_from_dict(dict(templates[stage.size]))).tokens
        rate = throughput.get(stage.size)
        hours = num_runs * tokens / rate / 3600.0 if rate else None
        stages.append(
            {
                "stage": stage_name(i),
                "size": stage.size,
                "configurations": len(configurations[stage_name(i)]),
                "seeds": len(stage_seeds(config.stages, i)) or 1,
                "runs": num_runs,
                "tokens_per_run": tokens,
                "tokens_per_second": rate,
                "gpu_hours": hours,
            }
        )
    known = all(s["gpu_hours"] is not None for s in stages)
    return {"stages": stages, "total_gpu_hours": sum(s["gpu_hours"] for s in stages) if known else None}


def describe_estimate(estimate: Mapping[str, Any]) -> str:
    """One human line per stage plus the total."""
    lines = []
    for s in estimate["stages"]:
        hours = f"{s['gpu_hours']:.3f} GPU-h" if s["gpu_hours"] is not None else "unknown (no tokens/s)"
        runs = f"{s['runs']}"
        if s.get("seeds", 1) > 1:
            runs += f" ({s['configurations']} configurations x {s['seeds']} seeds)"
        lines.append(f"{s['stage']}: {runs} x {s['size']} x {s['tokens_per_run']:,} tokens -> {hours}")
    total = estimate["total_gpu_hours"]
    runs = sum(s["runs"] for s in estimate["stages"])
    if total is None:
        lines.append(f"campaign total: unknown ({runs} runs)")
    else:
        lines.append(f"campaign total: {total:.3f} GPU-h ({runs} runs)")
    return "\n".join(lines)


def tuned_throughput(selected_file: str | Path) -> float | None:
    """Tokens/s of the selected candidate, from the ``summary.json`` beside a tuning ``selected.yaml``."""
    summary_file = Path(selected_file).with_name("summary.json")
    if not summary_file.is_file():
        return None
    summary = read_json(summary_file, REBUILD_TUNING)
    selected = summary.get("selected")
    rate = selected.get("tokens_per_second") if isinstance(selected, dict) else None
    return float(rate) if isinstance(rate, (int, float)) and rate > 0 else None


def planned_throughput(config: CampaignConfig) -> dict[str, float | None]:
    """Tokens/s per size: the tuning result's measured figure, else campaign.throughput, else unknown."""
    throughput = {size: config.throughput.get(size) for size in config.sizes}
    for size, source in config.tuning.items():
        throughput[size] = tuned_throughput(source) or throughput[size]
    return throughput
