"""The settings of one analysis job and the identity that decides whether a rerun may reuse its files."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from tiny_llm.errors import ConfigError
from tiny_llm.io import canonical_json
from tiny_llm.typed import NON_NEGATIVE, out_of_bounds

FORMAT, VERSION = "tiny-llm-analysis", 2  # 2: the reference's statistic names, matmul precision
EXECUTION_FIELDS = frozenset({"hvp_batch_size", "directions_per_pass", "device", "threads"})
"""Settings that change how fast a job runs, not what it measures: a resumed job may change them."""


@dataclass(frozen=True, kw_only=True)
class AnalysisConfig:
    case: Literal["seen", "unseen"]
    """seen: the run's first epoch replayed in training order; unseen: an epoch of blocks after the budget."""
    noise_samples: int | Literal["all"] = field(default=32, metadata={"minimum": 1})
    """S: effective batches whose gradient noise is measured (all: every batch of the epoch)."""
    random_samples: int = field(default=32, metadata=NON_NEGATIVE)
    """R: Rademacher directions of the isotropic reference (0: none)."""
    seed: int = field(default=42, metadata=NON_NEGATIVE)
    """Chooses the noise batches and the Rademacher directions."""
    dtype: Literal["float32", "float64"] = "float32"
    """Parameters, directions and every derivative (the attention and the loss are FP32 at least)."""
    amp: bool = False
    """BF16 autocast for the matmuls of the forward (FP32 parameters only); the attention stays FP32."""
    consensus: bool = True
    """Packed runs: also e_i^T H e_i of every worker's consensus error e_i = x_i - mean."""
    tf32: bool = True
    """FP32 matmuls on CUDA may use TF32 (the runtime's setting); False: IEEE FP32 (--no-tf32)."""
    hvp_batch_size: int | None = field(default=None, metadata={"minimum": 1})
    """Sequences per microbatch of the Hessian passes (None: the run's training.micro_batch_size)."""
    directions_per_pass: int = field(default=8, metadata={"minimum": 1})
    """Directions whose Hessian-vector products share one pass over the epoch (memory: one vector each)."""
    device: str | None = None
    """None: the run's runtime.device."""
    threads: int | None = field(default=None, metadata={"minimum": 1})
    """CPU threads (None: the run's runtime.cpu_threads)."""

    def __post_init__(self) -> None:
        # The ranges of settings made from the command's flags (the builder checks them first otherwise).
        problems = out_of_bounds(self, lambda name: f"--{name.replace('_', '-')}")
        if self.amp and self.dtype != "float32":
            problems.append("--amp: BF16 autocast needs --dtype float32")
        if problems:
            raise ConfigError("; ".join(problems))

    def measured(self) -> dict[str, Any]:
        """The settings that decide the results (part of the identity)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in EXECUTION_FIELDS}

    def execution(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k in EXECUTION_FIELDS}

    def tag(self) -> str:
        """A short directory name for the measured settings but the case (``s32-r32-seed42``, then ``-fp64``,
        ``-amp``, ``-noconsensus``, ``-notf32`` where set): a workflow that puts it in the path sends other
        settings to a new directory instead of having them refused."""
        parts = [f"s{self.noise_samples}", f"r{self.random_samples}", f"seed{self.seed}"]
        parts += (
            ["fp64"] * (self.dtype == "float64")
            + ["amp"] * self.amp
            + ["noconsensus"] * (not self.consensus)
            + ["notf32"] * (not self.tf32)
        )
        return "-".join(parts)

    def flags(self) -> list[str]:
        """The ``analyze`` options giving these settings, case included (device and threads: where set)."""
        out = ["--case", self.case, "--noise-samples", str(self.noise_samples)]
        out += ["--random-samples", str(self.random_samples), "--seed", str(self.seed), "--dtype", self.dtype]
        out += (
            ["--amp"] * self.amp + ["--no-consensus"] * (not self.consensus) + ["--no-tf32"] * (not self.tf32)
        )
        if self.hvp_batch_size is not None:
            out += ["--hvp-batch-size", str(self.hvp_batch_size)]
        out += ["--directions-per-pass", str(self.directions_per_pass)]
        out += ["--device", self.device] if self.device else []
        return out + (["--threads", str(self.threads)] if self.threads else [])


def parse_noise_samples(text: str) -> int | Literal["all"]:
    """``all`` or a positive count (argparse type)."""
    if text == "all":
        return "all"
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--noise-samples: {text!r} is neither a count nor all") from None


def analysis_identity(
    inputs: dict[str, Any], settings: AnalysisConfig, matmul_precision: str
) -> dict[str, Any]:
    """The identity payload (inputs: recipe and cache identities, checkpoint and its weights' hash; the
    matmul precision, tf32 or ieee) and its sha256: a job whose payload differs must not reuse an output
    directory."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "inputs": inputs,
        "settings": settings.measured(),
        "matmul_precision": matmul_precision,
    }
    return {**payload, "identity": hashlib.sha256(canonical_json(payload).encode()).hexdigest()}
