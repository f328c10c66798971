"""Budget arithmetic and LR schedules at their edges (torch-free)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tiny_llm.budget import lr_at, make_budget, parameter_count
from tiny_llm.config import load_recipe
from tiny_llm.errors import ConfigError

PRESET_PARAMETERS = {
    "20m": 20_403_520,
    "50m": 48_507_392,
    "90m": 91_605_120,
    "250m": 251_943_360,
    "500m": 516_814_080,
}


@pytest.mark.parametrize(("preset", "expected"), PRESET_PARAMETERS.items())
def test_preset_parameter_counts_are_exact(preset: str, expected: int) -> None:
    assert parameter_count(load_recipe([preset]).model) == expected


def test_20m_reference_budget() -> None:
    budget = make_budget(load_recipe(["20m"]))
    assert budget.target_tokens == 408_070_400
    assert budget.tokens == 408_071_168 and budget.num_blocks == 398_507
    assert budget.num_epochs == 40 and budget.num_updates == 3_120
    assert budget.cache_tokens_needed == budget.tokens + 1


def test_epoch_boundaries_and_short_updates() -> None:
    # tiny: P = 131,904; 0.1 x P = 13,191 targets (207 blocks at L=64); epochs of 0.04 x P = 5,276.16 targets.
    recipe = load_recipe(
        ["tiny"], ["training.tokens_per_parameter=0.1", "training.epoch_tokens_per_parameter=0.04"]
    )
    budget = make_budget(recipe)
    assert budget.epoch_boundaries == (83, 165, 207)  # ceil(5276.16/64), ceil(10552.32/64), ceil(13190.4/64)
    assert budget.epoch_updates(0) == [16] * 5 + [3]
    assert budget.epoch_updates(1) == [16] * 5 + [2]
    assert budget.epoch_updates(2) == [16, 16, 10]
    schedule = budget.update_schedule()
    assert len(schedule) == budget.num_updates == 15
    assert schedule[5] == (0, 80, 3) and schedule[6] == (1, 83, 16) and schedule[-1] == (2, 197, 10)
    assert sum(n for _, _, n in schedule) == budget.num_blocks


def test_exact_epochs_have_no_short_update() -> None:
    recipe = load_recipe(["tiny"], ["training.batch_tokens=64", "training.micro_batch_size=1"])
    budget = make_budget(recipe)
    assert all(n == 1 for _, _, n in budget.update_schedule())
    assert budget.num_updates == budget.num_blocks


def test_cosine_schedule_edges() -> None:
    opt = load_recipe(["tiny"], ["optimizer.lr=0.01", "optimizer.warmup_fraction=0.1"]).optimizer
    total = 10_000
    assert lr_at(0, total, opt) == 0.0
    assert lr_at(500, total, opt) == pytest.approx(0.005)
    assert lr_at(999, total, opt) == pytest.approx(0.01 * 999 / 1000)
    assert lr_at(1000, total, opt) == pytest.approx(0.01)  # end of warmup = peak
    assert lr_at(5500, total, opt) == pytest.approx(0.001 + 0.009 * 0.5)  # cosine midpoint
    assert lr_at(total, total, opt) == pytest.approx(0.001)  # floor = min_lr_ratio x peak
    assert lr_at(2 * total, total, opt) == pytest.approx(0.001)  # never below the floor


def test_wsd_schedule_edges() -> None:
    """The reference's WSD: warmup, hold at the peak, then peak x (1 - sqrt(q)) down to 0 (no floor)."""
    sets = ["optimizer.lr=0.01", "optimizer.warmup_fraction=0.1", "optimizer.lr_schedule=wsd"]
    opt = load_recipe(["tiny"], sets).optimizer
    assert opt.decay_fraction == 0.1 and opt.min_lr_ratio == 0.1  # min_lr_ratio is cosine's only
    total = 10_000
    assert lr_at(500, total, opt) == pytest.approx(0.005)  # warmup as for cosine
    assert lr_at(1000, total, opt) == pytest.approx(0.01)
    assert lr_at(8999, total, opt) == pytest.approx(0.01)  # stable phase up to the last 10%
    assert lr_at(9000, total, opt) == pytest.approx(0.01)  # q = 0: decay starts at the peak
    assert lr_at(9250, total, opt) == pytest.approx(0.005)  # q = 0.25 -> 1 - 0.5
    assert lr_at(9900, total, opt) == pytest.approx(0.01 * (1 - math.sqrt(0.9)))
    assert lr_at(total, total, opt) == 0.0  # q = 1: down to zero, not to min_lr_ratio x peak
    assert lr_at(2 * total, total, opt) == 0.0
    wider = load_recipe(["tiny"], [*sets, "optimizer.decay_fraction=0.2"]).optimizer
    assert lr_at(7999, total, wider) == pytest.approx(0.01)
    assert lr_at(9000, total, wider) == pytest.approx(0.01 * (1 - math.sqrt(0.5)))
    hold = load_recipe(["tiny"], [*sets, "optimizer.decay_fraction=0"]).optimizer
    assert lr_at(total, total, hold) == pytest.approx(0.01)  # no decay phase: the peak to the end
    late = load_recipe(["tiny"], [*sets, "optimizer.decay_fraction=1"]).optimizer
    assert lr_at(1000, total, late) == pytest.approx(0.01)  # decay never starts before warmup ends
    assert lr_at(3250, total, late) == pytest.approx(0.005)  # q = 0.25 of the 9,000 after warmup


def test_zero_warmup_starts_at_peak() -> None:
    opt = load_recipe(["tiny"], ["optimizer.warmup_fraction=0"]).optimizer
    assert lr_at(0, 1000, opt) == pytest.approx(opt.lr)


def test_data_passes_shrink_the_cache_need_not_the_budget() -> None:
    """training.data_passes: the same tokens and updates from ceil(blocks / passes) unique blocks."""
    sets = ["training.tokens_per_parameter=0.1", "training.epoch_tokens_per_parameter=0.04"]
    once = make_budget(load_recipe(["tiny"], sets))
    thrice = make_budget(load_recipe(["tiny"], [*sets, "training.data_passes=3"]))
    assert thrice.tokens == once.tokens and thrice.update_schedule() == once.update_schedule()
    assert (once.unique_blocks, thrice.unique_blocks) == (207, 69)  # ceil(207 / 3)
    assert thrice.cache_tokens_needed == 69 * 64 + 1 and once.cache_tokens_needed == once.tokens + 1


def test_warmup_steps_warm_up_over_full_updates_whatever_the_total() -> None:
    steps = ["optimizer.warmup_fraction=0", "optimizer.warmup_steps=4", "optimizer.lr_schedule=wsd"]
    opt = load_recipe(["tiny"], steps).optimizer
    for total in (10_000.0, 1_000_000.0):
        assert lr_at(0, total, opt, batch_tokens=100) == 0.0
        assert lr_at(100, total, opt, batch_tokens=100) == pytest.approx(opt.lr / 4)  # after update 1 of 4
        assert lr_at(400, total, opt, batch_tokens=100) == opt.lr
    with pytest.raises(ValueError, match="needs batch_tokens"):
        lr_at(100, 1000.0, opt)


def test_gen_a_epochs_before_the_total_do_not_depend_on_it() -> None:
    """The horizon prefix property under today's budget rule (short updates at epoch ends): a shorter
    horizon's epochs and updates are a prefix of a longer one's, so the Gen B+ rule is not needed for it."""

    def budget(horizon: float, *extra: str):
        sets = [
            f"training.tokens_per_parameter={horizon}",
            "training.epoch_tokens_per_parameter=0.03",
            *extra,
        ]
        return make_budget(load_recipe(["tiny"], sets))

    for extra in ((), ("decentralized={num_models: 2}", "training.micro_batch_size=8")):
        longest = budget(0.42, *extra)
        for horizon in (0.12, 0.24, 0.3):  # whole epochs: everything is a prefix
            short = budget(horizon, *extra)
            assert short.epoch_boundaries == longest.epoch_boundaries[: short.num_epochs]
            assert short.update_schedule() == longest.update_schedule()[: short.num_updates]
            assert any(n < short.blocks_per_update for _, _, n in short.update_schedule())  # short updates
        partial = budget(0.1, *extra)  # a last, partial epoch: every earlier one is still shared
        assert partial.epoch_boundaries[:-1] == longest.epoch_boundaries[: partial.num_epochs - 1]
        assert partial.epoch_boundaries[-1] < longest.epoch_boundaries[partial.num_epochs - 1]


def test_kept_epochs_and_the_checkpoints_an_analysis_can_name() -> None:
    from tiny_llm.analysis.names import saved_checkpoints
    from tiny_llm.budget import kept_epochs

    sets = ["training.tokens_per_parameter=0.1", "training.epoch_tokens_per_parameter=0.04"]  # 3 epochs
    every = load_recipe(["tiny"], [*sets, "training.checkpoint_policy=all"])
    assert kept_epochs(every) == [1, 2, 3] and kept_epochs(load_recipe(["tiny"], sets)) == []
    chosen = load_recipe(
        ["tiny"], [*sets, "training.checkpoint_policy=interval", "training.checkpoint_epochs=[2, 9]"]
    )
    assert kept_epochs(chosen) == [2]
    assert saved_checkpoints(chosen) == ["epoch-002", "final"]
    with pytest.raises(ConfigError, match="training.checkpoint_epochs: needs training.checkpoint_policy"):
        load_recipe(["tiny"], [*sets, "training.checkpoint_epochs=[1]"])
    with pytest.raises(ConfigError, match="optimizer.warmup_steps: exclusive with optimizer.warmup_fraction"):
        load_recipe(["tiny"], ["optimizer.warmup_steps=3"])


def test_loader_v2_reads_whole_groups_and_the_unseen_case_starts_after_them() -> None:
    from tiny_llm.analysis.names import unseen_range

    # tiny: 0.1 x P = 207 blocks of 64; groups of 2 shards of 4,096 tokens = 128 blocks each
    sets = [
        "training.tokens_per_parameter=0.1",
        "training.epoch_tokens_per_parameter=0.05",
        "data.shard_tokens=4096",
    ]
    v1 = make_budget(load_recipe(["tiny"], sets))
    v2 = make_budget(load_recipe(["tiny"], [*sets, "data.shuffle_group_size=2"]))
    assert v2.update_schedule() == v1.update_schedule()  # the budget itself does not change
    assert v1.cache_tokens_needed == 207 * 64 + 1 and v1.read_blocks == 207
    assert v2.cache_tokens_needed == 2 * 8192 + 1 and v2.read_blocks == 256  # both groups, one token more
    assert unseen_range(load_recipe(["tiny"], [*sets, "data.shuffle_group_size=2"]))[0] == 256


def test_a_budget_with_more_updates_than_can_be_scheduled_is_refused_at_validation() -> None:
    """Under the token cap, 2e7 tokens per parameter of `tiny` are 2.6e9 updates: one line, before any
    schedule (a list of every update, which ended in a MemoryError) is built."""
    sets = ["training.tokens_per_parameter=2e7", "training.epoch_tokens_per_parameter=2e7"]
    with pytest.raises(ConfigError) as err:
        load_recipe(["tiny"], sets)
    assert str(err.value).splitlines() == [
        "invalid recipe: training.tokens_per_parameter: 2e+07 gives 2.58e+09 updates of "
        "training.batch_tokens 1024, more than 10,000,000; lower it or raise training.batch_tokens"
    ]


def test_the_update_cap_holds_at_its_edge() -> None:
    """`tiny`: 131,904 parameters, 1,024 tokens per update; 10,000,000 updates are 10,240,000,000 tokens."""
    from tiny_llm.budget import MAX_UPDATES, budget_problems

    recipe = load_recipe(["tiny"])
    params = parameter_count(recipe.model)
    at_cap = MAX_UPDATES * recipe.training.batch_tokens / params

    def training(ratio: float):  # one epoch, so the epoch cap is not what is met
        return replace(recipe.training, tokens_per_parameter=ratio, epoch_tokens_per_parameter=ratio)

    assert budget_problems(training(at_cap * (1 - 1e-9)), params) == []
    over = budget_problems(training(at_cap * (1 + 1e-9)), params)
    assert len(over) == 1 and over[0].startswith("training.tokens_per_parameter: ")
