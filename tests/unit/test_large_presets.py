"""The 250m and 500m presets train on the CPU at a cut-down budget: their full layer stacks (20 x 960 and
24 x 1280), a 512-token vocabulary to match the test corpus, context 16 and two updates of one sequence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tiny_llm.budget import make_budget, parameter_count
from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.data.prepare import prepare_cache
from tiny_llm.engines import run_training
from tiny_llm.io import read_json

pytestmark = pytest.mark.slow

CONTEXT, SEQUENCES, UPDATES = 16, 1, 2


def cut_down(
    preset: str, recipe_args: Callable[[Path], list[str]], cache: Path, run_dir: Path
) -> RecipeConfig:
    shape = load_recipe([preset], ["model.vocab_size=512", f"model.context_length={CONTEXT}"]).model
    # Exactly UPDATES full updates: UPDATES x SEQUENCES blocks of CONTEXT targets, one epoch.
    per_parameter = UPDATES * SEQUENCES * CONTEXT / parameter_count(shape)
    return load_recipe(
        [preset],
        [
            *recipe_args(cache),
            "data.prepare_train_tokens=4096",
            "data.prepare_validation_tokens=64",
            "model.vocab_size=512",
            f"model.context_length={CONTEXT}",
            f"training.batch_tokens={SEQUENCES * CONTEXT}",
            f"training.micro_batch_size={SEQUENCES}",
            f"training.tokens_per_parameter={per_parameter}",
            f"training.epoch_tokens_per_parameter={per_parameter}",
            "training.checkpoint_policy=none",
            "training.log_every=1",
            "evaluation.subset_blocks=2",
            "runtime.device=cpu",
            "runtime.compile=false",
            "runtime.cpu_threads=2",
            f"runtime.output_dir={run_dir}",
        ],
    )


@pytest.mark.parametrize("preset", ["250m", "500m"])
def test_large_presets_train_two_updates(
    preset: str, tmp_path_factory: pytest.TempPathFactory, tiny_recipe_args: Callable[[Path], list[str]]
) -> None:
    root = tmp_path_factory.mktemp(preset)
    recipe = cut_down(preset, tiny_recipe_args, root / "cache", root / "run")
    assert make_budget(recipe).num_updates == UPDATES
    prepare_cache(recipe, progress=False)
    assert run_training(recipe, quiet=True) == 0
    result = read_json(root / "run" / "result.json")
    assert result["step"] == UPDATES and result["parameters"] == parameter_count(recipe.model)
    assert result["final_validation"]["loss"] > 0
