"""What every stage's part of the workflow plan offers the plan: targets, switch, resources, cache needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Resources:
    """What one job asks of the scheduler."""

    threads: int
    mem_mb: int
    runtime_minutes: int
    gpu: int
    timed: bool = False
    """The job measures throughput: nothing else may run beside it (see WorkflowPlan.threads)."""
    ranks: int = 1
    """Processes of one model (`tiny_llm launch --nproc-per-node`; sizes.<size>.num_gpus)."""


class StagePlan(Protocol):
    """One stage (data, runs, tuning, campaign, packed, export, analysis, horizons, noise, fit, throughput) of
    the workflow plan (``pipeline.plan.STAGES``)."""

    @property
    def enabled(self) -> bool:
        """Whether `snakemake` with no target builds the stage's targets."""
        ...

    def targets(self) -> list[str]:
        """The stage's final files (its named target)."""
        ...

    def resources(self, wildcards: Any) -> Resources:
        """What one of the stage's jobs asks of the scheduler."""
        ...

    def cache_tokens_needed(self) -> list[int]:
        """Train tokens the token cache must hold for the stage's jobs."""
        ...
