"""WSD horizons from one trunk: each branch's final state equals an independent run at its horizon, bit for
bit, on the CPU in deterministic mode, also when the trunk and a branch are interrupted and resumed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from train_helpers import metric_rows

from tiny_llm.budget import stable_updates
from tiny_llm.config import RecipeConfig, load_recipe
from tiny_llm.engines import run_training
from tiny_llm.errors import RunStateError
from tiny_llm.io import read_json
from tiny_llm.runtime import signals
from tiny_llm.train import checkpoint, loop
from tiny_llm.train.continuation import state_name
from tiny_llm.train.session import Continuation

pytestmark = pytest.mark.slow

HORIZONS = (0.1, 0.2)  # tokens per parameter: 15 and 28 updates; epochs of 0.04 end with short updates
WSD = [
    "training.epoch_tokens_per_parameter=0.04",
    "training.log_every=2",
    "optimizer.lr_schedule=wsd",
    "optimizer.warmup_fraction=0",
    "optimizer.warmup_steps=3",
    "data.shuffle_group_size=1",
    "evaluation.batch_size=64",
    "runtime.cpu_threads=1",
    "runtime.deterministic=true",
]


def horizon_recipe(
    cache: Path, recipe_args: Callable, run_dir: Path, horizon: float, *extra: str
) -> RecipeConfig:
    sets = [
        *recipe_args(cache),
        *WSD,
        f"training.tokens_per_parameter={horizon}",
        f"runtime.output_dir={run_dir}",
    ]
    return load_recipe(["tiny"], [*sets, *extra])


def stop_after(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    account = loop.Trainer._account

    def account_then_stop(self: loop.Trainer, *args: object) -> None:
        account(self, *args)
        if self.progress.step == step:
            signals.request_stop()

    monkeypatch.setattr(loop.Trainer, "_account", account_then_stop)


def assert_same_final_state(run_dir: Path, reference: Path) -> None:
    ours, theirs = (checkpoint.load_state(d / checkpoint.FINAL)["engine"] for d in (run_dir, reference))
    flat_ours, flat_theirs = _flatten(ours), _flatten(theirs)
    assert flat_ours.keys() == flat_theirs.keys()
    for key, value in flat_ours.items():
        other = flat_theirs[key]
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, key
    assert (run_dir / "final.safetensors").read_bytes() == (reference / "final.safetensors").read_bytes()
    assert metric_rows(run_dir) == metric_rows(reference)
    result, expected = read_json(run_dir / "result.json"), read_json(reference / "result.json")
    assert result["final_validation"]["loss"] == expected["final_validation"]["loss"]
    assert result["recipe_identity"] == expected["recipe_identity"]


def _flatten(value: object, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}{key}.").items()}
    if isinstance(value, (list, tuple)):
        return {k: v for i, item in enumerate(value) for k, v in _flatten(item, f"{prefix}{i}.").items()}
    return {prefix: value}


# A study of several sizes (horizons.sizes) runs this per size: the default tiny model and a wider one, whose
# other parameter count gives other budgets and decay starts.
SIZES = {"tiny": ((), {0.1: 13, 0.2: 26}), "wider": (("model.width=96",), {0.1: 20, 0.2: 40})}


@pytest.mark.parametrize("size", list(SIZES))
def test_branches_of_one_trunk_equal_independent_runs_bitwise(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable, size: str
) -> None:
    extra, expected = SIZES[size]
    recipes = {
        h: horizon_recipe(tiny_cache, tiny_recipe_args, tmp_path / f"alone-{h}", h, *extra) for h in HORIZONS
    }
    for recipe in recipes.values():
        assert run_training(recipe, quiet=True) == 0
    points = {h: stable_updates(r) for h, r in recipes.items()}
    assert points == expected  # tiny: of 15 and 28 updates, those before each decay start

    trunk_dir = tmp_path / "trunk"
    trunk = horizon_recipe(tiny_cache, tiny_recipe_args, trunk_dir, max(HORIZONS), *extra)
    plan = Continuation(stop_at_step=points[0.2], keep_states_at=(points[0.1],))
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 7)  # interrupted mid-trunk, before the first branch point
        assert run_training(trunk, resume="auto", quiet=True, plan=plan) == 130
    assert run_training(trunk, resume="auto", quiet=True, plan=plan) == 0
    stopped = read_json(trunk_dir / "stopped.json")
    short, long = points[0.1], points[0.2]
    assert stopped["step"] == long and stopped["states"] == {
        str(short): state_name(short),
        str(long): state_name(long),
    }
    assert read_json(trunk_dir / "status.json")["status"] == "stopped"
    assert not (trunk_dir / "result.json").exists()
    assert run_training(trunk, resume="auto", quiet=True, plan=plan) == 0  # a rerun trains nothing more
    assert read_json(trunk_dir / "stopped.json") == stopped

    for h in HORIZONS:
        branch = horizon_recipe(tiny_cache, tiny_recipe_args, tmp_path / f"branch-{h}", h, *extra)
        start = Continuation(from_state=trunk_dir / state_name(points[h]))
        if h == min(HORIZONS):
            with pytest.MonkeyPatch.context() as mp:
                stop_after(mp, points[h] + 1)  # interrupted mid-branch: it resumes from its own state
                assert run_training(branch, resume="auto", quiet=True, plan=start) == 130
        assert run_training(branch, resume="auto", quiet=True, plan=start) == 0
        assert_same_final_state(tmp_path / f"branch-{h}", tmp_path / f"alone-{h}")


def test_a_branch_refuses_states_it_does_not_share(
    tmp_path: Path, tiny_cache: Path, tiny_recipe_args: Callable
) -> None:
    trunk_dir = tmp_path / "trunk"
    trunk = horizon_recipe(tiny_cache, tiny_recipe_args, trunk_dir, 0.2)
    assert run_training(trunk, quiet=True, plan=Continuation(stop_at_step=14)) == 0
    start = Continuation(from_state=trunk_dir / state_name(14))
    short = horizon_recipe(tiny_cache, tiny_recipe_args, tmp_path / "short", 0.1)
    with pytest.raises(RunStateError, match="first 14 updates differ"):  # past 0.1's decay start (13)
        run_training(short, resume="auto", quiet=True, plan=start)
    other = horizon_recipe(tiny_cache, tiny_recipe_args, tmp_path / "lr", 0.2, "optimizer.lr=0.01")
    with pytest.raises(RunStateError, match="only training.tokens_per_parameter may differ"):
        run_training(other, resume="auto", quiet=True, plan=start)


def test_the_horizon_plot_is_ticked_at_the_horizons() -> None:
    """A log axis alone labels 0.05 as a minor tick's 6 x 10^-2 and leaves 0.05 itself unlabelled; with two
    sizes, every size's horizons are ticked, not only the last line's."""
    from matplotlib.pyplot import close

    from tiny_llm.report.horizons import draw

    rows = [
        {"parameters": n, "tokens_per_parameter": h, "mean_loss": y, "sd_loss": None, "losses": {"42": y}}
        for n, h, y in [(100, 0.05, 7.2), (100, 0.1, 7.17), (200, 0.1, 7.1), (200, 0.2, 7.01)]
    ]
    fig = draw(rows)
    fig.canvas.draw()
    axis = fig.axes[0].xaxis
    assert [t.get_text() for t in axis.get_majorticklabels()] == ["0.05", "0.1", "0.2"]
    assert not any(t.get_text() for t in axis.get_minorticklabels())
    close(fig)
