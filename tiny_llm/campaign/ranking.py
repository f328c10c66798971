"""Ranking finished runs and configurations: lower final validation loss first, ties broken by the optimizer.

A configuration (one grid point of a stage) trains once per seed and ranks by the mean final loss of its
seeds. Ties go to the lower lr, then weight decay, then beta1, then beta2. This one order agrees with both
of the reference's: lr, weight decay, beta2 in its campaign, and lr, beta1, beta2 in its later seed studies
(which keep weight decay fixed). A seed whose run diverged (or has no final loss) counts as the worst loss, so
its configuration ranks after every configuration whose seeds all finished.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny_llm.campaign.significance import StageNoise, place_fields, stage_noise
from tiny_llm.config import OptimizerLabel
from tiny_llm.io import read_json

DEFAULT_BETA1 = 0.9


@dataclass(frozen=True)
class RunOutcome:
    """What ranking needs from one finished run."""

    run_id: str
    loss: float
    """Final full-validation loss (inf when missing or not finite)."""
    lr: float
    weight_decay: float
    beta2: float
    beta1: float = DEFAULT_BETA1
    configuration: str = ""
    """The configuration the run is a seed of ('' = a configuration of its own)."""
    seed: int | None = None
    optimizer: OptimizerLabel = OptimizerLabel()
    """Its optimizer's name and, under muon, the hidden matrices' peak LR."""
    bpb: float | None = None
    """Final full-validation bits per byte (None when missing: a run from before it was measured)."""

    @property
    def configuration_id(self) -> str:
        return self.configuration or self.run_id


def rank_key(outcome: RunOutcome) -> tuple[float, float, float, float, float, str]:
    """Lower final loss first; ties -> lower lr, then weight decay, then beta1, then beta2."""
    o = outcome
    return (o.loss, o.lr, o.weight_decay, o.beta1, o.beta2, o.run_id)


def rank_runs(outcomes: Iterable[RunOutcome]) -> list[RunOutcome]:
    return sorted(outcomes, key=rank_key)


def loss_summary(losses: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, sample standard deviation) of final losses; SD None for a single value, both None for none.

    Any non-finite loss (a diverged seed) makes the mean None: the configuration counts as the worst.
    """
    if not losses or not all(math.isfinite(x) for x in losses):
        return None, None
    mean = statistics.fmean(losses)
    return mean, (statistics.stdev(losses) if len(losses) > 1 else None)


def bpb_summary(runs: Sequence[RunOutcome]) -> tuple[float | None, float | None]:
    """(mean, sample SD) of the runs' final bits per byte; None unless every run has a finite one."""
    values = [r.bpb for r in runs]
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None, None
    return loss_summary([float(v) for v in values if v is not None])


@dataclass(frozen=True)
class ConfigurationOutcome:
    """The runs (one per seed) of one configuration."""

    configuration: str
    runs: tuple[RunOutcome, ...]

    @property
    def losses(self) -> list[float]:
        return [r.loss for r in self.runs]

    @property
    def mean(self) -> float:
        """Mean final loss over the seeds; inf if any seed has no finite loss."""
        mean, _ = loss_summary(self.losses)
        return math.inf if mean is None else mean

    @property
    def sd(self) -> float | None:
        return loss_summary(self.losses)[1]

    @property
    def bpb(self) -> float | None:
        """Mean final bits per byte over the seeds; None unless every seed has one."""
        return bpb_summary(self.runs)[0]

    @property
    def bpb_sd(self) -> float | None:
        return bpb_summary(self.runs)[1]

    @property
    def diverged(self) -> list[str]:
        """Runs without a finite final loss (diverged or missing)."""
        return [r.run_id for r in self.runs if not math.isfinite(r.loss)]

    @property
    def best_run(self) -> RunOutcome:
        """The seed with the lowest final loss (what an export of the configuration picks)."""
        return min(self.runs, key=lambda r: (r.loss, r.run_id))

    def _first(self) -> RunOutcome:
        return self.runs[0]

    @property
    def lr(self) -> float:
        return self._first().lr

    @property
    def weight_decay(self) -> float:
        return self._first().weight_decay

    @property
    def beta1(self) -> float:
        return self._first().beta1

    @property
    def beta2(self) -> float:
        return self._first().beta2

    @property
    def optimizer(self) -> OptimizerLabel:
        return self._first().optimizer


def configuration_key(c: ConfigurationOutcome) -> tuple:
    """A configuration's place in its stage's ranking, compared in this order:

    1. the mean final loss over its seeds (inf once a seed diverged, so it ranks after every finished one);
    2. fewer diverged seeds;
    3. the mean loss of its finished seeds;
    4. lr, weight decay, beta1, beta2 (lower first), then the optimizer (AdamW before Muon, then the lower
       Muon LR: ``OptimizerLabel.sort_key``), then the configuration id.
    """
    finished = [x for x in c.losses if math.isfinite(x)]
    rest = statistics.fmean(finished) if finished else math.inf
    tail = (c.beta2, *c.optimizer.sort_key(), c.configuration)
    return (c.mean, len(c.diverged), rest, c.lr, c.weight_decay, c.beta1, *tail)


def group_configurations(outcomes: Iterable[RunOutcome]) -> list[ConfigurationOutcome]:
    """Runs grouped by configuration (first appearance order), seeds in run order."""
    groups: dict[str, list[RunOutcome]] = {}
    for o in outcomes:
        groups.setdefault(o.configuration_id, []).append(o)
    return [ConfigurationOutcome(cid, tuple(runs)) for cid, runs in groups.items()]


def rank_configurations(outcomes: Iterable[RunOutcome]) -> list[ConfigurationOutcome]:
    """Configurations best first, by the mean final loss of their seeds (see ``configuration_key``)."""
    return sorted(group_configurations(outcomes), key=configuration_key)


def final_loss(result: Mapping[str, Any]) -> float:
    """result.json's final full-validation loss; inf if absent or not finite, so such runs rank last."""
    loss = (result.get("final_validation") or {}).get("loss")
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        return math.inf
    return float(loss)


def final_bpb(result: Mapping[str, Any]) -> float | None:
    """result.json's final full-validation bits per byte; None if absent (a run from before it was measured,
    a cache without a tokenizer) or not finite."""
    bpb = (result.get("final_validation") or {}).get("bpb")
    if isinstance(bpb, bool) or not isinstance(bpb, (int, float)) or not math.isfinite(bpb):
        return None
    return float(bpb)


def outcome_from(
    run_id: str,
    result: Mapping[str, Any],
    recipe: Mapping[str, Any],
    configuration: str = "",
    seed: int | None = None,
) -> RunOutcome:
    opt = recipe["optimizer"]
    return RunOutcome(
        run_id,
        final_loss(result),
        opt["lr"],
        opt["weight_decay"],
        opt["beta2"],
        opt.get("beta1", DEFAULT_BETA1),
        configuration,
        seed,
        OptimizerLabel.of(opt),
        final_bpb(result),
    )


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def ranking_rows(ranked: Sequence[ConfigurationOutcome], promoted: int | None = None) -> list[dict[str, Any]]:
    """JSON rows of a stage ranking, one per configuration, best first.

    ``loss`` is the mean over the seeds (null when a seed diverged: ranked as the worst), ``loss_sd`` the
    sample standard deviation (null for one seed), ``run`` the configuration's best seed (its run directory
    lies beside the ranking), ``runs`` every seed's run and ``diverged`` those without a final loss.

    How sure the ranking is (SPEC §12; ``campaign.significance``): ``loss_se``, ``bpb`` and ``bpb_sd``
    (bits per byte over the seeds), ``versus_best`` (the difference to the best, its Welch 95% interval,
    p value and verdict), ``noise_floor`` (the stage's pooled SD, its degrees of freedom and the smallest
    difference its seeds detect), and given ``promoted`` (how many configurations go on), ``promoted`` per
    row and ``cut`` on the last promoted row and the first left behind (``inside_noise`` when the two are
    not told apart).
    """
    noise = stage_noise({c.configuration: c.losses for c in ranked}, promoted)
    rows = []
    for i, c in enumerate(ranked):
        rows.append(
            {
                "rank": i,
                "configuration": c.configuration,
                "run": c.best_run.run_id,
                "loss": _finite(c.mean),
                "loss_sd": c.sd,
                "n": len(c.runs),
                "runs": [r.run_id for r in c.runs],
                "seeds": [r.seed for r in c.runs],
                "run_losses": [_finite(r.loss) for r in c.runs],
                "diverged": c.diverged,
                "lr": c.lr,
                "weight_decay": c.weight_decay,
                "beta1": c.beta1,
                "beta2": c.beta2,
                **c.optimizer.fields(),
                **_noise_fields(c, i, noise),
            }
        )
    return rows


def _noise_fields(c: ConfigurationOutcome, rank: int, noise: StageNoise) -> dict[str, Any]:
    """A ranking row's bits per byte and how sure its place is (``ranking_rows``)."""
    return {
        "bpb": c.bpb,
        "bpb_sd": c.bpb_sd,
        "run_bpb": [r.bpb for r in c.runs],
        "noise_floor": {k: v for k, v in noise.summary().items() if k != "cut"},
        **place_fields(noise, c.configuration, rank),
    }


def diverged_result(run_dir: str | Path, exit_code: int) -> dict[str, Any] | None:
    """The result.json of a run that stopped on a non-finite loss or norm, or None for any other failure.

    A diverged grid point is an outcome of the campaign (it ranks last), not a reason to stop promoting the
    others. Crashes, interruptions and user errors are not outcomes: they still fail the job.
    """
    status_file = Path(run_dir) / "status.json"
    if exit_code != 1 or not status_file.is_file():
        return None
    status = read_json(status_file)
    if status.get("status") != "failed" or "non-finite" not in str(status.get("error", "")):
        return None
    return {
        "status": "diverged",
        "error": status["error"],
        "step": status.get("step"),
        "tokens": status.get("tokens"),
        "final_validation": None,
    }
