"""Config values that would hang or exhaust memory while the workflow is planned fail at once, in one line
naming the key; NaN and infinity never pass the workflow schema."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest
from pipeline_helpers import REPO, tiny

PLAN_IN_A_BOX = """
import json, sys
sys.path.insert(0, {helpers!r})
from pipeline_helpers import plan_of
try:
    plan_of(json.loads(sys.argv[1]))
except Exception as exc:
    print(f"{{type(exc).__name__}}: {{exc}}")
"""


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a runaway allocation fails, not the host


def plan_outcome(config: dict) -> str:
    """The plan built in a child process with 2 GiB of address space and 60 s: its error line, or ''."""
    code = PLAN_IN_A_BOX.format(helpers=str(REPO / "tests/unit"))
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(config)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limited,
    )
    return proc.stdout.strip() + proc.stderr.strip()


@pytest.mark.parametrize(
    ("training", "key"),
    [
        ({"epoch_tokens_per_parameter": 1e-8}, "training.epoch_tokens_per_parameter"),
        (
            {"tokens_per_parameter": 1e300, "epoch_tokens_per_parameter": 1e299},
            "training.tokens_per_parameter",
        ),
        ({"tokens_per_parameter": 1e300}, "training.tokens_per_parameter"),
    ],
)
def test_a_budget_too_large_to_plan_fails_in_one_line_naming_the_key(training: dict, key: str) -> None:
    config = tiny()
    config["sizes"]["tiny"]["overrides"] = {"training": training}
    outcome = plan_outcome(config)
    assert outcome.startswith("ConfigError: ") and key in outcome, outcome
    assert "\n" not in outcome


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_infinity_fail_the_workflow_schema(value: float) -> None:
    from pipeline_helpers import plan_of

    from tiny_llm.errors import ConfigError

    config = tiny(data={"validation_fraction": value})
    with pytest.raises(ConfigError, match="data.validation_fraction"):
        plan_of(config)
    config = tiny()
    config["sizes"]["tiny"]["overrides"] = {"optimizer": {"lr": value}}
    with pytest.raises(ConfigError, match="lr"):
        plan_of(config)


@pytest.mark.parametrize(
    "setting",
    [
        "max_new_tokens: .inf",
        "max_new_tokens: .nan",
        "top_k: .inf",
        "seed: 1e300",
        "seed: -1",
        "temperature: .nan",
    ],
)
def test_odd_numbers_in_a_prompt_file_are_one_line(tmp_path, setting: str) -> None:
    from tiny_llm.errors import ConfigError
    from tiny_llm.export.settings import load_prompts

    path = tmp_path / "prompts.yaml"
    path.write_text(f"prompts: [The history of]\n{setting}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_prompts(path)
    assert str(err.value).startswith(f"prompt file {path}: {setting.split(':')[0]}") and "\n" not in str(
        err.value
    )


def test_a_prompt_file_that_is_not_utf8_is_one_line(tmp_path) -> None:
    from tiny_llm.errors import ConfigError
    from tiny_llm.export.settings import load_prompts

    path = tmp_path / "prompts.yaml"
    path.write_bytes("prompts: [Caf\u00e9]\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"prompt file .*: not UTF-8 text \(byte 0xe9 at offset 13\)"):
        load_prompts(path)


# ------------------------------------------------------------------ upper bounds beside their fields


@pytest.mark.parametrize(
    ("assignment", "line"),
    [
        ("training.batch_tokens=1e30", "training.batch_tokens: must be in (0, 1,073,741,824], got 1e+30"),
        ("data.prepare_workers=100000", "data.prepare_workers: must be in (0, 256], got 100,000"),
        (
            "runtime.memory_limit_mb=1e14",
            "runtime.memory_limit_mb: must be in (0, 16,777,216] or null, got 1e+14",
        ),
        (
            "training.log_every=1e30",
            "training.log_every: must be below 2**63 in size, got an integer of 31 digits",
        ),
        (f"training.log_every='{'9' * 5000}'", "training.log_every: expected an integer, got float inf"),
        (
            f"model.rope_theta={'9' * 4000}",
            "model.rope_theta: expected a finite number, got an integer of 4000",
        ),
    ],
    ids=[
        "batch_tokens",
        "prepare_workers",
        "memory_limit_mb",
        "int-1e30",
        "int-5000-digit-text",
        "float-4000-digit",
    ],
)
def test_a_value_past_its_bound_is_one_line_naming_the_key(assignment: str, line: str) -> None:
    from tiny_llm.config import load_recipe
    from tiny_llm.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_recipe(["tiny"], [assignment])
    assert str(err.value).startswith(f"invalid recipe: {line}") and "\n" not in str(err.value)
    assert len(str(err.value)) < 200


def test_a_memory_limit_too_large_to_set_fails_the_plan_not_every_point() -> None:
    config = tiny(throughput={"sizes": ["tiny"], "contexts": [32], "max_micro_batch": 2})
    config["throughput"]["overrides"] = {"runtime": {"memory_limit_mb": 1e14}}
    outcome = plan_outcome(config)
    assert outcome.startswith("ConfigError: ") and "runtime.memory_limit_mb: must be in (0, 16,77" in outcome
    assert "\n" not in outcome


def test_max_new_tokens_past_any_context_and_a_5000_digit_seed_are_refused_in_one_line(
    tmp_path,
) -> None:
    from tiny_llm.errors import ConfigError
    from tiny_llm.export.settings import load_prompts, sampling_from_dict

    path = tmp_path / "prompts.yaml"
    path.write_text("prompts: [The history of]\nmax_new_tokens: 1e30\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_prompts(path)
    assert str(err.value) == f"prompt file {path}: max_new_tokens: must be in [0, 1,048,576], got 1e+30"
    with pytest.raises(ConfigError, match=r"max_new_tokens: must be in \[0, 1,048,576\], got 2,000,000$"):
        sampling_from_dict({"max_new_tokens": 2_000_000}, "generate")
    path.write_text(f"prompts: [The history of]\nseed: {'7' * 5000}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        load_prompts(path)
    assert str(err.value) == (
        f"prompt file {path}: not valid YAML (seed: an integer of more than 4,300 digits (line 2); no "
        "setting takes one)"
    )


LONG = "7" * 5000


@pytest.mark.parametrize(
    ("name", "text", "argv", "line"),
    [
        (
            "recipe.yaml",
            f"training:\n  log_every: {LONG}\n",
            ["describe", "--config", "tiny", "--config", "{path}"],
            "error: {path}: not valid YAML (training.log_every: an integer of more than 4,300 digits "
            "(line 2); no setting takes one)",
        ),
        (
            None,
            "",
            ["describe", "--config", "tiny", "--set", f"training.log_every={LONG}"],
            "error: --set training.log_every: more digits than any setting takes; check the value",
        ),
        (
            "settings.json",
            f'{{"root": "x", "stages": [], "sizes": {{"a": {LONG}}}}}',
            ["campaign", "plan", "--settings", "{path}"],
            "error: --settings: not valid JSON (an integer of more than 4,300 digits at char 43)",
        ),
    ],
    ids=["recipe-file", "set", "campaign-settings"],
)
def test_a_5000_digit_integer_is_one_line_naming_where_it_is(
    tmp_path, capsys, name: str | None, text: str, argv: list[str], line: str
) -> None:
    from tiny_llm.cli import main

    path = tmp_path / (name or "unused")
    if name:
        path.write_text(text, encoding="utf-8")
    argv = [a.format(path=path, dir=tmp_path) for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == line.format(path=path)


def test_a_5000_digit_integer_in_the_workflow_config_is_one_line_naming_its_key(tmp_path) -> None:
    from tiny_llm.errors import ConfigError
    from tiny_llm.io import read_json
    from tiny_llm.pipeline.schema import refuse_long_integers

    config = tmp_path / "workflow_config.yaml"
    config.write_text(f"sizes:\n  tiny:\n    threads: {LONG}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as err:
        refuse_long_integers(config)
    assert str(err.value) == (
        f"{config}: sizes.tiny.threads: an integer of more than 4,300 digits (line 3); no setting takes one"
    )
    huge = tiny()
    huge["sizes"]["tiny"]["threads"] = int("9" * 4000)  # read by Python: the plan names it
    outcome = plan_outcome(huge)
    assert "sizes.tiny.threads: must be below 2**63 in size, got an integer of 4000 digits" in outcome
    record = tmp_path / "record.json"
    record.write_text(f'{{"a": {LONG}}}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"record.json is damaged \(not valid JSON: an integer of more than"):
        read_json(record)
