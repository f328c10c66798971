"""Recipe config: merging, presets, strict validation with one clear line per problem, identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_llm.cli import main
from tiny_llm.config import (
    identity_differences,
    load_recipe,
    recipe_identity,
    recipe_identity_payload,
)
from tiny_llm.errors import ConfigError


def test_merge_order_configs_then_sets(tmp_path: Path) -> None:
    first = tmp_path / "a.yaml"
    first.write_text("model: {width: 128, num_heads: 4}\noptimizer: {lr: 0.01}\n")
    second = tmp_path / "b.yaml"
    second.write_text("optimizer: {lr: 0.02}\n")
    recipe = load_recipe(["tiny", str(first), str(second)], ["optimizer.beta2=0.99"])
    assert recipe.model.width == 128 and recipe.model.num_heads == 4
    assert recipe.model.num_layers == 2  # from the preset: mappings merge recursively
    assert recipe.optimizer.lr == 0.02 and recipe.optimizer.beta2 == 0.99
    assert load_recipe(["tiny"], ["optimizer.lr=0.5", "optimizer.lr=0.25"]).optimizer.lr == 0.25


def test_defaults_are_the_20m_model() -> None:
    assert load_recipe([], []).model == load_recipe(["20m"], []).model


def test_preset_by_name_and_by_path_agree() -> None:
    from importlib import resources

    path = resources.files("tiny_llm") / "presets" / "tiny.yaml"
    assert load_recipe([str(path)]) == load_recipe(["tiny"])


def test_set_values_parse_as_yaml() -> None:
    recipe = load_recipe(
        ["tiny"], ["optimizer.grad_clip=null", "runtime.cpu_threads=3", "runtime.compile=true"]
    )
    assert recipe.optimizer.grad_clip is None and recipe.runtime.cpu_threads == 3 and recipe.runtime.compile


BAD_CASES = [
    (["model.widht=64"], r"model\.widht: unknown key \(did you mean 'width'\?\)"),
    (["model.width=66"], r"model\.width: 66 is not divisible by model\.num_heads 4"),
    (["model.width=36"], r"model\.num_heads: head dim 9 must be even for RoPE"),
    (["optimizer.lr=.nan"], r"optimizer\.lr: expected a finite number"),
    (["optimizer.lr=.inf"], r"optimizer\.lr: expected a finite number"),
    (["optimizer.lr=-0.1"], r"optimizer\.lr: must be > 0"),
    (["optimizer.beta2=1.0"], r"optimizer\.beta2: must be in \[0, 1\)"),
    (["optimizer.warmup_fraction=1.5"], r"optimizer\.warmup_fraction: must be in \[0, 1\]"),
    (["optimizer.grad_clip=0"], r"optimizer\.grad_clip: must be > 0 or null"),
    (
        ["training.batch_tokens=1000"],
        r"training\.batch_tokens: 1000 is not a multiple of model\.context_length",
    ),
    (["training.micro_batch_size=32"], r"training\.micro_batch_size: 32 sequences exceed the 16 sequences"),
    (["training.checkpoint_policy=sometimes"], r"training\.checkpoint_policy: expected one of final, none"),
    (["training.epoch_tokens_per_parameter=5"], r"training\.epoch_tokens_per_parameter: larger than"),
    (["model.vocab_size=70000"], r"model\.vocab_size: must be in \(0, 65,536\], got 70,000"),
    (["model.context_length=1.5"], r"model\.context_length: expected an integer, got float 1\.5"),
    (["runtime.device=gpu"], r"runtime\.device: expected auto, cpu, cuda or cuda:N, got 'gpu'"),
    (["runtime.compile=2"], r"runtime\.compile: expected true or false, got int 2"),
    (["runtime.cpu_threads=0"], r"runtime\.cpu_threads: must be > 0 or null"),
    (
        ["runtime.attention_backend=reference", "runtime.sdpa_backend=math"],
        r"runtime\.sdpa_backend: 'math' has no",
    ),
    (["model=3"], r"model: expected a mapping, got int 3"),
    (["data.cache_dir="], r"data\.cache_dir: expected a non-empty string, got null"),
    (["evaluation.batch_size=0"], r"evaluation\.batch_size: must be > 0, got 0"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_CASES, ids=[c[0][-1] for c in BAD_CASES])
def test_bad_config_is_rejected_with_the_key(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_recipe(["tiny"], sets)


@pytest.mark.parametrize("kernel", ["flash", "cudnn"])
@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:1"])
def test_a_forced_half_precision_kernel_needs_amp(kernel: str, device: str) -> None:
    """flash and cudnn take only FP16/BF16 inputs: without runtime.amp the first CUDA update would fail."""
    sets = [f"runtime.device={device}", f"runtime.sdpa_backend={kernel}"]
    with pytest.raises(ConfigError) as info:
        load_recipe(["tiny"], [*sets, "runtime.amp=false"])
    (line,) = str(info.value).removeprefix("invalid recipe: ").splitlines()
    assert line.startswith(f"runtime.sdpa_backend: '{kernel}' takes only FP16/BF16") and "runtime.amp" in line
    assert load_recipe(["tiny"], [*sets, "runtime.amp=true"]).runtime.sdpa_backend == kernel
    for fp32_kernel in ("efficient", "math", "auto"):  # these take FP32 inputs
        load_recipe(["tiny"], [f"runtime.device={device}", f"runtime.sdpa_backend={fp32_kernel}"])


def test_the_amp_check_leaves_irrelevant_and_cpu_kernels_to_their_own_checks() -> None:
    """With the reference attention the forced kernel never runs (its own problem says so); on the CPU the
    device check refuses a GPU-only kernel when the run starts."""
    for ignored in ("runtime.attention_backend=reference", "runtime.deterministic=true"):
        with pytest.raises(ConfigError) as info:
            load_recipe(["tiny"], ["runtime.device=cuda", "runtime.sdpa_backend=flash", ignored])
        assert "has no effect with the reference attention" in str(info.value)
        assert "FP16/BF16" not in str(info.value)
    assert load_recipe(["tiny"], ["runtime.sdpa_backend=flash"]).runtime.device == "cpu"


def test_no_shipped_preset_forces_a_half_precision_kernel_without_amp() -> None:
    from importlib import resources

    for path in (resources.files("tiny_llm") / "presets").iterdir():
        if path.name.endswith(".yaml"):
            runtime = load_recipe([str(path)]).runtime
            assert runtime.amp or runtime.sdpa_backend not in ("flash", "cudnn"), path.name


def test_bad_set_syntax_and_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="--set expects dotted.key=value"):
        load_recipe(["tiny"], ["optimizer.lr"])
    with pytest.raises(ConfigError, match="unknown preset 'nope'.*presets: .*tiny"):
        load_recipe(["nope"])
    with pytest.raises(ConfigError, match="config file not found: missing.yaml"):
        load_recipe(["missing.yaml"])


def test_every_problem_is_reported_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_recipe(["tiny"], ["optimizer.lr=-1", "optimizer.beta1=2"])
    text = str(info.value)
    assert "optimizer.lr" in text and "optimizer.beta1" in text


def test_cli_prints_one_error_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["describe", "--config", "tiny", "--set", "training.batch_tokens=1000"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: invalid recipe: training.batch_tokens: 1000 is not a multiple")
    assert "Traceback" not in err


def test_identity_ignores_execution_only_fields() -> None:
    base = load_recipe(["tiny"])
    moved = load_recipe(
        ["tiny"],
        [
            "runtime.output_dir=elsewhere",
            "runtime.cpu_threads=1",
            "runtime.device=cpu",
            "data.cache_dir=/other/cache",
            "data.prefetch=false",
            "training.checkpoint_policy=interval",
            "training.checkpoint_every=7",
        ],
    )
    assert recipe_identity(base, "c") == recipe_identity(moved, "c")
    assert recipe_identity(base, "c") != recipe_identity(base, "other-cache")
    changed = load_recipe(["tiny"], ["optimizer.lr=0.01", "model.num_layers=3"])
    assert recipe_identity(base, "c") != recipe_identity(changed, "c")
    diffs = identity_differences(recipe_identity_payload(base), recipe_identity_payload(changed))
    assert diffs == ["model.num_layers: 2 -> 3", "optimizer.lr: 0.003 -> 0.01"]


def test_late_fields_at_default_leave_the_identity_unchanged() -> None:
    payload = recipe_identity_payload(load_recipe(["tiny"]))
    assert "lr_schedule" not in payload["optimizer"] and "decay_fraction" not in payload["optimizer"]
    wsd = recipe_identity_payload(load_recipe(["tiny"], ["optimizer.lr_schedule=wsd"]))
    assert wsd["optimizer"]["lr_schedule"] == "wsd"


def test_late_marks_only_fields_of_the_identity() -> None:
    """An execution-only field is never in the identity, so a late mark on it would say nothing."""
    import dataclasses

    from tiny_llm.config import EXECUTION_ONLY_FIELDS, RecipeConfig

    def late(cls: type, prefix: str) -> set[str]:
        found = set()
        for f in dataclasses.fields(cls):
            found |= {f"{prefix}{f.name}"} if f.metadata.get("late") else set()
            inner = [t for t in (f.type,) if isinstance(t, type) and dataclasses.is_dataclass(t)]
            found |= late(inner[0], f"{prefix}{f.name}.") if inner else set()
        return found

    sections = {
        f.name: f.default_factory for f in dataclasses.fields(RecipeConfig) if callable(f.default_factory)
    }
    marked = set().union(*(late(type(make()), f"{name}.") for name, make in sections.items()))
    assert "optimizer.lr_schedule" in marked and "training.data_seed" in marked
    assert not marked & EXECUTION_ONLY_FIELDS


def test_data_passes_are_part_of_the_identity_only_when_set() -> None:
    base = recipe_identity_payload(load_recipe(["tiny"]))
    assert "data_passes" not in base["training"]  # at its default: older identities stay valid
    twice = recipe_identity_payload(load_recipe(["tiny"], ["training.data_passes=2"]))
    assert twice["training"]["data_passes"] == 2
    assert identity_differences(base, twice) == ["training.data_passes: None -> 2"]
    with pytest.raises(ConfigError, match="training.data_passes: must be > 0"):
        load_recipe(["tiny"], ["training.data_passes=0"])
    with pytest.raises(ConfigError, match="training.data_passes: 999999 passes exceed the run's"):
        load_recipe(["tiny"], ["training.data_passes=999999"])


def test_wsd_identity_names_its_decay_fraction() -> None:
    """decay_fraction's default moved from 0.2 to 0.1 (the reference's): a WSD run keeps it in its identity,
    so a state written under the old default is not resumed under the new one."""
    wsd = recipe_identity_payload(load_recipe(["tiny"], ["optimizer.lr_schedule=wsd"]))
    assert wsd["optimizer"]["decay_fraction"] == 0.1
    cosine = recipe_identity_payload(load_recipe(["tiny"], ["optimizer.decay_fraction=0.1"]))
    assert "decay_fraction" not in cosine["optimizer"]


def test_numbers_in_exponent_notation_are_numbers(tmp_path) -> None:
    """YAML 1.1 reads 1e-3 as a string; a person means a number (in --set and in recipe files)."""
    recipe = load_recipe(
        ["tiny"], ["optimizer.lr=1e-3", "optimizer.weight_decay=1E-1", "training.batch_tokens=8.192e3"]
    )
    assert (recipe.optimizer.lr, recipe.optimizer.weight_decay, recipe.training.batch_tokens) == (
        1e-3,
        0.1,
        8192,
    )
    path = tmp_path / "r.yaml"
    path.write_text("optimizer: {lr: 5e-4, beta2: 9.5E-1}\n")
    recipe = load_recipe(["tiny", str(path)])
    assert recipe.optimizer.lr == 5e-4 and recipe.optimizer.beta2 == 0.95
    with pytest.raises(ConfigError, match="optimizer.lr: expected a number, got str 'fast'"):
        load_recipe(["tiny"], ["optimizer.lr=fast"])


def test_recipe_commands_list_the_presets_in_their_help(capsys) -> None:
    from tiny_llm.config import preset_names

    for command in ("train", "describe"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(name in text for name in preset_names())


def test_shuffle_group_size_selects_loader_v2_and_enters_the_identity_only_when_set() -> None:
    base = recipe_identity_payload(load_recipe(["tiny"]))
    assert "shuffle_group_size" not in base["data"]  # v1 recipes keep their identities
    v2 = load_recipe(["tiny"], ["data.shuffle_group_size=2"])
    assert identity_differences(base, recipe_identity_payload(v2)) == ["data.shuffle_group_size: None -> 2"]
    with pytest.raises(ConfigError, match="data.shuffle_group_size: must be >= 1"):
        load_recipe(["tiny"], ["data.shuffle_group_size=0"])
    with pytest.raises(ConfigError, match="data.shuffle_group_size: loader v2 reads every block once"):
        load_recipe(["tiny"], ["data.shuffle_group_size=2", "training.data_passes=2"])
