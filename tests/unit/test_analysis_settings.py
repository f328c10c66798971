"""Analysis settings (torch-free): validation, identity, the directory tag and the command's flags."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys

import pytest

from tiny_llm.analysis.settings import AnalysisConfig, analysis_identity
from tiny_llm.commands import analyze
from tiny_llm.errors import ConfigError


def parsed(flags: list[str]) -> AnalysisConfig:
    parser = argparse.ArgumentParser()
    analyze.configure_parser(parser)
    args = parser.parse_args(["--run", "r", "--checkpoint", "final", "--output", "o", *flags])
    fields = {f.name for f in dataclasses.fields(AnalysisConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    return AnalysisConfig(**values, consensus=not args.no_consensus)


@pytest.mark.parametrize(
    "settings",
    [
        AnalysisConfig(case="seen"),
        AnalysisConfig(case="unseen", noise_samples="all", random_samples=0, seed=7, dtype="float64"),
        AnalysisConfig(case="seen", amp=True, consensus=False, hvp_batch_size=4, directions_per_pass=2),
        AnalysisConfig(case="seen", device="cuda:0", threads=3),
    ],
)
def test_flags_give_back_the_settings(settings: AnalysisConfig) -> None:
    assert parsed(settings.flags()) == settings


def test_tag_names_the_measured_settings_but_the_case() -> None:
    assert AnalysisConfig(case="seen").tag() == "s32-r32-seed42"
    unusual = AnalysisConfig(case="unseen", noise_samples="all", dtype="float64", consensus=False, seed=1)
    assert unusual.tag() == "sall-r32-seed1-fp64-noconsensus"
    assert AnalysisConfig(case="seen", tf32=False).tag() == "s32-r32-seed42-notf32"
    assert "--no-tf32" in AnalysisConfig(case="seen", tf32=False).flags()
    assert (
        AnalysisConfig(case="seen", amp=True, directions_per_pass=1, threads=2).tag() == "s32-r32-seed42-amp"
    )


def test_identity_follows_measured_settings_only() -> None:
    inputs = {"checkpoint": "final", "weights_hash": "abc"}
    base = analysis_identity(inputs, AnalysisConfig(case="seen"), "tf32")["identity"]
    faster = AnalysisConfig(case="seen", hvp_batch_size=2, directions_per_pass=1, device="cpu", threads=1)
    assert analysis_identity(inputs, faster, "tf32")["identity"] == base
    assert analysis_identity(inputs, faster, "ieee")["identity"] != base  # another matmul precision
    for changed in (
        {"case": "unseen"},
        {"noise_samples": 8},
        {"seed": 1},
        {"amp": True},
        {"consensus": False},
        {"tf32": False},
    ):
        other = dataclasses.replace(AnalysisConfig(case="seen"), **changed)
        assert analysis_identity(inputs, other, "tf32")["identity"] != base
    changed_weights = {**inputs, "weights_hash": "abd"}
    assert analysis_identity(changed_weights, AnalysisConfig(case="seen"), "tf32")["identity"] != base


def test_bad_settings_are_one_line_errors_naming_the_flags() -> None:
    with pytest.raises(ConfigError) as info:
        AnalysisConfig(case="seen", noise_samples=0, random_samples=-1, dtype="float64", amp=True)
    message = str(info.value)
    assert "\n" not in message
    for flag in (
        "--noise-samples: must be >= 1, got 0",
        "--random-samples: must be >= 0, got -1",
        "--amp: BF16 autocast needs",
    ):
        assert flag in message
    with pytest.raises(ConfigError, match="--directions-per-pass: must be >= 1, got 0"):
        AnalysisConfig(case="seen", directions_per_pass=0)
    with pytest.raises(ConfigError, match="--noise-samples: 'some' is neither a count nor all"):
        parsed(["--case", "seen", "--noise-samples", "some"])


def test_what_the_workflow_plan_and_the_summary_import_stays_torch_free() -> None:
    modules = ("names", "settings", "stats", "summary")
    code = "; ".join(f"import tiny_llm.analysis.{m}" for m in modules)
    code += "; import tiny_llm.commands.analysis_summary, sys; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
