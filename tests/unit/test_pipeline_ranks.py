"""sizes.<size>.num_gpus in the workflow plan: the recipe's runtime.num_gpus, `tiny_llm launch` as the
training jobs' launcher (GPU jobs requiring CUDA), gpu=K and K x threads on one node, and one-line refusals
where a stage runs one GPU per job."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pipeline_helpers import plan_of, tiny

from tiny_llm.errors import ConfigError


def two_ranks(device: str = "cpu", **extra) -> dict:
    config = tiny(**extra)
    size = config["sizes"]["tiny"]
    size.update(num_gpus=2, threads=3, overrides={"runtime": {"device": device}})
    return config


def test_a_size_of_two_ranks_trains_through_the_launcher_on_two_gpus() -> None:
    plan = plan_of(two_ranks("cuda"))
    job = SimpleNamespace(run="a")
    resources = plan.job_resources("runs", job)
    assert (resources.gpu, resources.threads, resources.ranks) == (2, 6, 2)
    assert plan.resources("runs")["nodes"](job) == 1
    launch = "python -m tiny_llm launch --nproc-per-node 2 --shutdown-timeout 100 -m"
    assert plan.launcher("runs")(job) == f"TINY_LLM_REQUIRE_CUDA=1 {launch}"
    assert plan.files.content("results/runs/a/recipe.yaml")["runtime"]["num_gpus"] == 2


def test_a_cpu_size_of_two_ranks_asks_for_no_gpu() -> None:
    plan = plan_of(two_ranks("cpu"))
    job = SimpleNamespace(run="a")
    assert plan.job_resources("runs", job).gpu == 0
    assert plan.launcher("runs")(job).startswith("python -m tiny_llm launch --nproc-per-node 2 ")
    assert plan_of(tiny()).launcher("runs")(job) == "python -m"  # the CPU demo's jobs: unchanged


def test_a_one_gpu_size_requires_cuda() -> None:
    config = tiny()
    config["sizes"]["tiny"]["overrides"] = {"runtime": {"device": "auto"}}
    assert plan_of(config).launcher("runs")(SimpleNamespace(run="a")) == "TINY_LLM_REQUIRE_CUDA=1 python -m"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"packed": {"runs": {"p": {"size": "tiny", "preset": "packed4-tiny"}}}},
            "packed.runs.p.size: size 'tiny' has num_gpus 2, and packed runs and their benchmark run on one",
        ),
        (
            {"tuning": {"default_profiles": [], "profiles": {"t": {"size": "tiny", "space": "cpu"}}}},
            "tuning.profiles.t.size: size 'tiny' has num_gpus 2, and the tuner's candidates run on one GPU",
        ),
    ],
)
def test_one_gpu_stages_refuse_a_size_of_two_ranks_in_one_line(extra: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_of(two_ranks(**extra))
    assert message in str(err.value) and "\n" not in str(err.value)
