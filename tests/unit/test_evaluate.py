"""Compiled evaluation (hidden states + chunked fused loss) against the eager path it replaces; where it
compiles (CUDA, not the CPU), that it compiles once per process and keeps no model alive."""

from __future__ import annotations

import gc
import weakref
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


@pytest.fixture
def compiled_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiled evaluation on the CPU too (it runs only on CUDA), with a compile cache of its own."""
    monkeypatch.setattr(evaluate, "COMPILED_DEVICE_TYPES", frozenset({"cpu", "cuda"}))
    monkeypatch.setattr(evaluate, "_COMPILED", {})
    torch._dynamo.reset()  # no compiled code (or recompile count) of another test's on these functions


# slow: a first compile of the evaluation builds about 34 C++ kernels (some 40 s of CPU with an empty
# inductor cache); the compiled path's bookkeeping is fast-tier (test_evaluation_compiles_once_per_process...)
@pytest.mark.slow
@pytest.mark.parametrize("full", [False, True], ids=["subset", "full"])
def test_compiled_evaluation_gives_the_eager_losses(
    tiny_cache: Path,
    tiny_recipe_args: Callable[[Path], list[str]],
    weights: Path,
    full: bool,
    monkeypatch: pytest.MonkeyPatch,
    compiled_on_cpu: None,
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
    tiny_cache: Path, tiny_recipe_args: Callable[[Path], list[str]], weights: Path, compiled_on_cpu: None
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


CUDA = torch.device("cuda")  # compiled_losses reads only the device's type: no GPU is needed


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("default", None), ("reduce-overhead", None), ("max-autotune", "max-autotune-no-cudagraphs")],
)
def test_evaluation_compiles_once_per_process_and_never_with_cuda_graphs(
    monkeypatch: pytest.MonkeyPatch, mode: str, expected: str | None
) -> None:
    seen: list[str | None] = []
    monkeypatch.setattr(
        evaluate.torch, "compile", lambda fn, mode=None, dynamic=None: seen.append(mode) or fn
    )
    monkeypatch.setattr(evaluate, "_COMPILED", {})
    recipe = load_recipe(["tiny"], ["runtime.compile=true", f"runtime.compile_mode={mode}"])
    first = evaluate.compiled_losses(Llama(recipe.model), recipe, CUDA)
    again = evaluate.compiled_losses(Llama(recipe.model), recipe, CUDA)  # another model: the same function
    assert first is not None and again is not None and first.func is again.func and seen == [expected]
    eager = load_recipe(["tiny"], ["runtime.compile=true", "runtime.deterministic=true"])
    assert evaluate.compiled_losses(Llama(eager.model), eager, CUDA) is None


def test_evaluation_on_the_cpu_is_eager_under_runtime_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU a run's compiles cost more than the compiled loss saves (benchmarks/README.md)."""
    compiles: list[object] = []
    monkeypatch.setattr(evaluate.torch, "compile", lambda *a, **k: compiles.append(a))
    recipe = load_recipe(["tiny"], ["runtime.compile=true", "evaluation.batch_size=4"])
    model = Llama(recipe.model)
    assert evaluate.compiled_losses(model, recipe, torch.device("cpu")) is None
    blocks = torch.randint(0, 512, (6, 65))
    loss, count = evaluate.evaluate_batches(
        model, evaluate.subset_batches(blocks, 4), recipe, torch.device("cpu")
    )
    assert count == 6 * 64 and loss > 0 and compiles == []


def tiny_compiled_recipe(compile_: bool = True):
    return load_recipe(
        ["tiny"],
        [
            f"runtime.compile={str(compile_).lower()}",
            "evaluation.batch_size=4",
            *("model.num_layers=1", "model.width=32", "model.num_heads=2", "model.ffn_width=64"),
            *("model.vocab_size=64", "model.context_length=16"),
        ],
    )


def test_subset_and_full_validation_share_one_compiled_graph(
    monkeypatch: pytest.MonkeyPatch, compiled_on_cpu: None
) -> None:
    """The subset's batches (from [n, L+1] blocks) and the full validation's (a short last one padded) have
    one shape and one layout: the evaluation compiles once, for every model, and never again."""
    graphs: list[object] = []

    def counting_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> Callable:
        graphs.append(gm)
        return gm.forward

    compile_ = torch.compile
    monkeypatch.setattr(
        evaluate.torch, "compile", lambda fn, mode=None, dynamic=None: compile_(fn, backend=counting_backend)
    )
    recipe, cpu = tiny_compiled_recipe(), torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    subset = evaluate.subset_batches(torch.randint(0, 64, (10, 17), generator=gen), 4)  # 4 + 4 + 2 rows
    full = [
        (torch.randint(0, 64, (n, 16), generator=gen), torch.randint(0, 64, (n, 16), generator=gen))
        for n in (4, 3)
    ]
    for model in (Llama(recipe.model), Llama(recipe.model)):
        for batches in (subset, full, subset):
            compiled, _ = evaluate.evaluate_batches(model, batches, recipe, cpu)
            eager, _ = evaluate.evaluate_batches(model, batches, tiny_compiled_recipe(False), cpu)
            assert compiled == pytest.approx(eager, rel=1e-6)
    assert len(graphs) == 1


@pytest.mark.parametrize(
    "backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)]
)  # inductor: about 4 s with a warm inductor cache, 18 s with an empty one
def test_compiled_evaluation_keeps_no_model_alive(
    monkeypatch: pytest.MonkeyPatch, compiled_on_cpu: None, backend: str
) -> None:
    compile_ = torch.compile
    monkeypatch.setattr(
        evaluate.torch,
        "compile",
        lambda fn, mode=None, dynamic=None: compile_(fn, backend=backend, mode=mode, dynamic=dynamic),
    )
    recipe = tiny_compiled_recipe()
    model = Llama(recipe.model)
    batches = evaluate.subset_batches(torch.randint(0, 64, (5, 17)), 4)
    result = evaluate.evaluate(
        model, batches, recipe, torch.device("cpu"), split="subset", validation_complete=True
    )
    assert result.tokens == 5 * 16 and evaluate._COMPILED
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
