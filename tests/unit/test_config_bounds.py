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
