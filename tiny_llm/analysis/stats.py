"""Statistics of one checkpoint x case from its sample rows (torch-free, so the summariser can use them).

Rows are the per-sample JSON objects a job writes: noise rows carry ``quadratic`` (v^T H v),
``noise_norm_squared`` and ``gradient_norm``; random rows ``quadratic``; consensus rows ``quadratic`` and
``norm_squared``. Sums use math.fsum, so the order the rows were measured in does not matter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def summarize(
    noise: Sequence[dict[str, Any]],
    random: Sequence[dict[str, Any]],
    consensus: Sequence[dict[str, Any]],
    *,
    dimension: int,
    mean_gradient_norm: float,
) -> dict[str, Any]:
    """SPEC §11's statistics, under the reference's names where it has them.

    noise_alignment = sum v^T H v / S; normalized_noise_alignment = sum v^T H v / sum |v|^2;
    normalized_random_alignment = sum r^T H r / (D R), what the normalised alignment of noise without a
    preferred direction would be (tr H / D); alignment_ratio = the normalised noise alignment over it;
    average_noise_norm = mean |v_k|; average_batch_gradient_norm = mean |g_k|; mean_gradient_norm = |g-bar|,
    the norm of the epoch's mean gradient; average_consensus_norm = mean |e_i|.
    """
    if not noise:
        raise ValueError("statistics need at least one noise sample")
    q_noise = math.fsum(row["quadratic"] for row in noise)
    squared = math.fsum(row["noise_norm_squared"] for row in noise)
    normalized = _ratio(q_noise, squared)
    isotropic = math.fsum(row["quadratic"] for row in random) / (dimension * len(random)) if random else None
    out: dict[str, Any] = {
        "noise_samples": len(noise),
        "random_samples": len(random),
        "dimension": dimension,
        "noise_alignment": q_noise / len(noise),
        "normalized_noise_alignment": normalized,
        "average_noise_norm": math.fsum(math.sqrt(row["noise_norm_squared"]) for row in noise) / len(noise),
        "average_batch_gradient_norm": math.fsum(row["gradient_norm"] for row in noise) / len(noise),
        "mean_gradient_norm": mean_gradient_norm,
        "normalized_random_alignment": isotropic,
        "alignment_ratio": (
            normalized / isotropic if normalized is not None and isotropic not in (None, 0.0) else None
        ),
    }
    if consensus:
        q_consensus = math.fsum(row["quadratic"] for row in consensus)
        out.update(
            consensus_workers=len(consensus),
            consensus_alignment=q_consensus / len(consensus),
            normalized_consensus_alignment=_ratio(
                q_consensus, math.fsum(row["norm_squared"] for row in consensus)
            ),
            average_consensus_norm=math.fsum(math.sqrt(row["norm_squared"]) for row in consensus)
            / len(consensus),
        )
    return out
