"""Compiled evaluation (hidden states + chunked fused loss) against the eager path it replaces."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tiny_llm.config import load_recipe
from tiny_llm.engines import evaluate_checkpoint
from tiny_llm.model import IGNORE_INDEX, Llama, chunked_token_losses, token_losses
from tiny_llm.runtime.engine import write_safetensors
from tiny_llm.train import evaluate


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights a little away from the initialisation, so that losses differ from token to token."""
    torch.manual_seed(1)
    model = Llama(load_recipe(["tiny"]).model)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    path = tmp_path_factory.mktemp("weights") / "model.safetensors"
    write_safetensors(path, model.state_dict())
    return path


def recipe_with(cache: Path, recipe_args: Callable[[Path], list[str]], *sets: str):
    return load_recipe(["tiny"], [*recipe_args(cache), "runtime.cpu_threads=1", *sets])


# slow: a first compile of the evaluation builds about 34 C++ kernels (some 40 s of CPU with an empty
# inductor cache); the compiled path's bookkeeping is fast-tier (test_evaluation_compiles_once_per_model...)
@pytest.mark.slow
@pytest.mark.parametrize("full", [False, True], ids=["subset", "full"])
def test_compiled_evaluation_gives_the_eager_losses(
    tiny_cache: Path,
    tiny_recipe_args: Callable[[Path], list[str]],
    weights: Path,
    full: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 100-row chunks: uneven chunks (1,024 = 10 x 100 + 24 positions per batch) and a padded last batch.
    monkeypatch.setitem(evaluate.CHUNK_ELEMENTS, "cpu", 100 * 512)
    sets = ["evaluation.batch_size=12", "evaluation.subset_blocks=30"]
    eager = evaluate_checkpoint(recipe_with(tiny_cache, tiny_recipe_args, *sets), weights, full=full)
    sets.append("runtime.compile=true")
    compiled = evaluate_checkpoint(recipe_with(tiny_cache, tiny_recipe_args, *sets), weights, full=full)
    assert compiled["tokens"] == eager["tokens"] > 0
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-6)
    assert eager["loss"] != pytest.approx(compiled["loss"] + 1e-4, rel=1e-6)  # the tolerance can fail
    assert compiled["tokens_per_second"] > 0


@pytest.mark.slow  # compiles the evaluation under autocast: about 20 s with an empty inductor cache
def test_compiled_evaluation_under_bf16_autocast(
    tiny_cache: Path, tiny_recipe_args: Callable[[Path], list[str]], weights: Path
) -> None:
    sets = ["runtime.cpu_amp=true", "evaluation.subset_blocks=24"]
    eager = evaluate_checkpoint(recipe_with(tiny_cache, tiny_recipe_args, *sets), weights, full=False)
    sets.append("runtime.compile=true")
    compiled = evaluate_checkpoint(recipe_with(tiny_cache, tiny_recipe_args, *sets), weights, full=False)
    fp32 = evaluate_checkpoint(recipe_with(tiny_cache, tiny_recipe_args), weights, full=False)
    assert compiled["tokens"] == eager["tokens"]
    assert compiled["loss"] == pytest.approx(eager["loss"], rel=2e-3)  # BF16 logits: ~3 significant digits
    assert compiled["loss"] == pytest.approx(fp32["loss"], rel=2e-3)


def test_chunked_losses_are_the_per_target_losses_and_ignore_padding() -> None:
    torch.manual_seed(0)
    model = Llama(load_recipe(["tiny"]).model).eval()
    inputs = torch.randint(0, 512, (3, 64))
    targets = torch.randint(0, 512, (3, 64))
    targets[2, 10:] = IGNORE_INDEX
    with torch.no_grad():
        expected = token_losses(model, inputs, targets)
        chunked = chunked_token_losses(model, inputs, targets, rows=50)
        padded_in, padded_t = evaluate.pad_batch(inputs, targets, 5)
        padded = chunked_token_losses(model, padded_in, padded_t, rows=50)
    torch.testing.assert_close(chunked, expected, rtol=1e-6, atol=1e-6)
    assert padded_in.shape == (5, 64) and bool((padded_t[3:] == IGNORE_INDEX).all())
    assert bool((padded[3 * 64 :] == 0).all()) and bool((chunked[2 * 64 + 10 :] == 0).all())
    assert padded.double().sum().item() == pytest.approx(expected.double().sum().item(), rel=1e-7)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("default", None), ("reduce-overhead", None), ("max-autotune", "max-autotune-no-cudagraphs")],
)
def test_evaluation_compiles_once_per_model_and_never_with_cuda_graphs(
    monkeypatch: pytest.MonkeyPatch, mode: str, expected: str | None
) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(evaluate.torch, "compile", lambda fn, mode=None: seen.append(mode) or fn)
    recipe = load_recipe(["tiny"], ["runtime.compile=true", f"runtime.compile_mode={mode}"])
    model = Llama(recipe.model)
    first = evaluate.compiled_losses(model, recipe, torch.device("cpu"))
    assert evaluate.compiled_losses(model, recipe, torch.device("cpu")) is first and seen == [expected]
    eager = load_recipe(["tiny"], ["runtime.compile=true", "runtime.deterministic=true"])
    assert evaluate.compiled_losses(Llama(eager.model), eager, torch.device("cpu")) is None
