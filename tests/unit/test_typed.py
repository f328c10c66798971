"""The one typed-config builder (tiny_llm.typed), the validators that call it and the ranges beside the fields
(torch-free)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from tiny_llm.analysis.settings import AnalysisConfig
from tiny_llm.campaign import parse_campaign
from tiny_llm.config import recipe_from_dict
from tiny_llm.errors import ConfigError
from tiny_llm.export.settings import load_prompts, sampling_from_dict
from tiny_llm.tuning.candidates import profile_from_dict
from tiny_llm.typed import MOMENTUM, POSITIVE, out_of_bounds, typed_from_dict


def stage_with(**keys: Any) -> Callable[[], Any]:
    section = {"stages": [{"size": "20m", "lr": [1e-3], **keys}]}
    return lambda: parse_campaign(section, {"20m": {"preset": "20m"}}, "results/campaign")


def prompt_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prompts.yaml"
    path.write_text(text, encoding="utf-8")
    return path


VALIDATORS: list[tuple[str, Callable[..., Any], str]] = [
    (
        "recipe",
        lambda _: recipe_from_dict({"model": {"widht": 64}}),
        "invalid recipe: model.widht: unknown key (did you mean 'width'?)",
    ),
    (
        "tuning profile",
        lambda _: profile_from_dict("g", {"configs": ["tiny"], "spcae": "cpu"}),
        "tuning.profiles.g.spcae: unknown key (did you mean 'space'?)",
    ),
    (
        "tuning profile choice",
        lambda _: profile_from_dict("g", {"configs": ["tiny"], "attention_variants": ["flsh"]}),
        "tuning.profiles.g.attention_variants[0]: expected one of auto, flash, cudnn, efficient, math, "
        "reference, got str 'flsh'",
    ),
    (
        "export sampling",
        lambda _: sampling_from_dict({"temprature": 1}, "export.sampling"),
        "export.sampling.temprature: unknown key (did you mean 'temperature'?)",
    ),
    (
        "prompt file",
        lambda tmp: load_prompts(prompt_file(tmp, "prompts: [a]\ntop_k: true\n")),
        "prompt file {tmp}/prompts.yaml: top_k: expected an integer, got bool True",
    ),
    (
        "analysis settings",
        lambda _: typed_from_dict(AnalysisConfig, {"case": "seen", "noise_sample": 8}, "analysis"),
        "analysis.noise_sample: unknown key (did you mean 'noise_samples'?)",
    ),
    (
        "analysis value check",
        lambda _: typed_from_dict(AnalysisConfig, {"case": "sen", "seed": 1.5}, "analysis"),
        "analysis.case: expected one of seen, unseen, got str 'sen'; "
        "analysis.seed: expected an integer, got float 1.5",
    ),
    (
        "campaign stage",
        lambda _: stage_with(seedz=[1])(),
        "campaign.stages[0].seedz: unknown key (did you mean 'seeds'?)",
    ),
    (
        "campaign grid point",
        lambda _: parse_campaign(
            {"stages": [{"size": "20m", "points": [{"lr": float("nan"), "beta_2": 0.9}]}]},
            {"20m": {"preset": "20m"}},
            "results/campaign",
        ),
        "campaign.stages[0].points[0].beta_2: unknown key (did you mean 'beta2'?); "
        "campaign.stages[0].points[0].lr: expected a finite number, got nan",
    ),
]


@pytest.mark.parametrize(("what", "call", "message"), VALIDATORS, ids=[v[0] for v in VALIDATORS])
def test_each_validator_reports_one_line_naming_the_key(
    what: str, call: Callable[[Path], Any], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError) as info:
        call(tmp_path)
    assert str(info.value) == message.format(tmp=tmp_path)


@dataclass(frozen=True, kw_only=True)
class Inner:
    name: str
    flag: bool = False


@dataclass(frozen=True, kw_only=True)
class Outer:
    count: int | Literal["all"] = 1
    rate: float = 0.5
    pair: tuple[int, bool] = (1, False)
    inner: Inner | None = None
    extra: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.rate > 1:
            raise ConfigError(f"rate: {self.rate} is above 1")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"count": "some"}, "o.count: expected an integer or one of all, got str 'some'"),
        ({"count": True}, "o.count: expected an integer or one of all, got bool True"),
        (
            {"rate": True, "pair": [1]},
            "o.rate: expected a number, got bool True; o.pair: expected a list of 2 items, got list [1]",
        ),
        ({"inner": {"flag": 1}}, "o.inner.name: required; o.inner.flag: expected true or false, got int 1"),
        ({"extra": [1]}, "o.extra: expected a mapping, got list [1]"),
        ({"rate": 2}, "o: rate: 2.0 is above 1"),
        ([1], "o: expected a mapping, got list [1]"),
    ],
)
def test_the_builder_collects_every_problem_in_one_line(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        typed_from_dict(Outer, data, "o")
    assert str(info.value) == message


def test_the_builder_reads_numbers_as_people_write_them() -> None:
    built = typed_from_dict(Outer, {"count": "all", "rate": "1e-1", "pair": [2.0, True]}, "o")
    assert built == Outer(count="all", rate=0.1, pair=(2, True))
    assert typed_from_dict(Outer, {"count": "3", "inner": {"name": "x"}}, "").count == 3


@dataclass(frozen=True, kw_only=True)
class Bounded:
    rate: float = field(default=0.5, metadata=MOMENTUM)
    sizes: list[int] = field(default_factory=list, metadata=POSITIVE)
    cap: int | None = field(default=None, metadata={**POSITIVE, "maximum": 10})
    count: int | Literal["all"] = field(default=1, metadata={"minimum": 1})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"rate": 1}, "b.rate: must be in [0, 1), got 1"),
        (
            {"rate": "-1e-3", "count": 0},
            "b.rate: must be in [0, 1), got -0.001; b.count: must be >= 1, got 0",
        ),
        ({"sizes": [1, 0, -2]}, "b.sizes[1]: must be > 0, got 0; b.sizes[2]: must be > 0, got -2"),
        ({"cap": 11}, "b.cap: must be in (0, 10] or null, got 11"),
        ({"cap": 10**400}, "b.cap: must be in (0, 10] or null, got an integer of 401 digits"),
        ({"rate": float("nan"), "count": "all"}, "b.rate: expected a finite number, got nan"),
        ({"rate": True}, "b.rate: expected a number, got bool True"),
    ],
)
def test_a_range_beside_its_field_is_checked_before_the_value_is_converted(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        typed_from_dict(Bounded, data, "b")
    assert str(info.value) == message


def test_settings_made_from_flags_check_the_same_ranges() -> None:
    flags = Bounded(rate=1.0, sizes=[0], cap=2**70, count="all")
    assert out_of_bounds(flags, lambda name: f"--{name}") == [
        "--rate: must be in [0, 1), got 1",
        "--sizes[0]: must be > 0, got 0",
        "--cap: must be below 2**63 in size, got an integer of 22 digits",
    ]
    assert out_of_bounds(Bounded()) == []
