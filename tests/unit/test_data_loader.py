"""Training loader and validation data: block layout, order, prefetch, resume, padding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tiny_llm.data.cache import open_cache
from tiny_llm.data.loader import (
    IGNORE_INDEX,
    TrainLoader,
    iter_validation,
    validation_num_targets,
    validation_subset,
)
from tiny_llm.data.prepare import write_token_cache
from tiny_llm.errors import DataError, RunStateError

L = 8
NUM_BLOCKS = 61  # four ranges of 16 blocks, the last one short


@pytest.fixture(scope="module")
def counting_cache(tmp_path_factory: pytest.TempPathFactory):
    """Token i == i, so a block reveals its position; shards of 100 tokens make blocks cross shards."""
    path = tmp_path_factory.mktemp("counting") / "cache"
    write_token_cache(
        path, np.arange(NUM_BLOCKS * L + 1), np.arange(1000, 1000 + 5 * L + 3), shard_tokens=100
    )
    cache = open_cache(path)
    yield cache
    cache.close()


def loader(cache, prefetch: bool = True, seed: int = 7) -> TrainLoader:
    return TrainLoader(cache, L, NUM_BLOCKS, seed, prefetch=prefetch, blocks_per_range=16)


def read_all(train_loader: TrainLoader, sizes: list[int]) -> torch.Tensor:
    parts = [train_loader.next_blocks(n) for n in sizes]
    train_loader.close()
    return torch.cat(parts)


def test_every_token_is_a_target_exactly_once(counting_cache):
    blocks = read_all(loader(counting_cache), [NUM_BLOCKS])
    assert blocks.dtype == torch.int64 and blocks.shape == (NUM_BLOCKS, L + 1)
    starts = blocks[:, 0]
    assert sorted(starts.tolist()) == [k * L for k in range(NUM_BLOCKS)]
    assert torch.equal(blocks, starts[:, None] + torch.arange(L + 1))  # contiguous, one-token overlap
    targets = blocks[:, 1:].flatten()
    assert sorted(targets.tolist()) == list(range(1, NUM_BLOCKS * L + 1))
    assert starts.tolist() != sorted(starts.tolist())  # shuffled


def test_order_is_seeded_and_independent_of_prefetch_and_call_sizes(counting_cache):
    reference = read_all(loader(counting_cache, prefetch=True), [NUM_BLOCKS])
    assert torch.equal(read_all(loader(counting_cache, prefetch=False), [NUM_BLOCKS]), reference)
    assert torch.equal(read_all(loader(counting_cache, prefetch=True), [5, 17, 1, 30, 8]), reference)
    assert not torch.equal(read_all(loader(counting_cache, seed=8), [NUM_BLOCKS]), reference)
    assert read_all(loader(counting_cache, seed=-1), [NUM_BLOCKS]).shape == reference.shape  # any int seed


def test_resume_at_every_cursor_continues_the_same_sequence(counting_cache):
    reference = read_all(loader(counting_cache), [NUM_BLOCKS])
    for cursor in range(NUM_BLOCKS + 1):
        first = loader(counting_cache)
        first.next_blocks(cursor)
        state = first.state_dict()
        first.close()
        assert state["cursor"] == cursor
        resumed = TrainLoader(counting_cache, L, NUM_BLOCKS, 7, prefetch=cursor % 2 == 0, buffer_size_mib=2)
        resumed.load_state_dict(state)  # the saved range size wins over the new buffer size
        assert torch.equal(read_all(resumed, [NUM_BLOCKS - cursor]), reference[cursor:])


def test_resume_refuses_another_order(counting_cache):
    state = loader(counting_cache).state_dict()
    other = TrainLoader(counting_cache, L, NUM_BLOCKS, seed=8)
    with pytest.raises(RunStateError, match="seed"):
        other.load_state_dict(state)
    with pytest.raises(DataError, match="remain"):
        other.next_blocks(NUM_BLOCKS + 1)
    other.close()


def test_capacity_is_checked(counting_cache):
    with pytest.raises(DataError, match=f"cache too small: need {(NUM_BLOCKS + 1) * L + 1} tokens, have"):
        TrainLoader(counting_cache, L, NUM_BLOCKS + 1, 0)


def test_several_passes_repeat_the_unique_prefix_each_in_its_own_order(counting_cache):
    """passes=3 over 150 blocks: the first 50 blocks three times; pass 1 in the single-pass order of 50."""
    num_blocks, passes = 150, 3  # the cache holds only 61 blocks: capacity counts the unique ones
    repeated = TrainLoader(counting_cache, L, num_blocks, 7, blocks_per_range=16, passes=passes)
    assert repeated.unique_blocks == 50
    blocks = read_all(repeated, [num_blocks])
    single = read_all(TrainLoader(counting_cache, L, 50, 7, blocks_per_range=16), [50])
    assert torch.equal(blocks[:50], single)
    starts = [blocks[50 * p : 50 * (p + 1), 0].tolist() for p in range(passes)]
    assert all(sorted(s) == [k * L for k in range(50)] for s in starts)  # each pass: every block once
    assert starts[0] != starts[1] and starts[1] != starts[2]  # in a new order
    uneven = read_all(TrainLoader(counting_cache, L, 101, 7, blocks_per_range=16, passes=2), [101])
    assert torch.equal(
        uneven[:51], read_all(TrainLoader(counting_cache, L, 51, 7, blocks_per_range=16), [51])
    )
    assert len(set(uneven[51:, 0].tolist())) == 50  # the last pass stops one block short
    with pytest.raises(DataError, match=f"need {61 * L + L + 1} tokens"):
        TrainLoader(counting_cache, L, 124, 0, passes=2)  # 62 unique blocks


def test_resume_within_a_later_pass_and_refuse_other_passes(counting_cache):
    def make(**kw):
        return TrainLoader(counting_cache, L, 120, 7, blocks_per_range=16, passes=2, **kw)

    reference = read_all(make(), [120])
    for cursor in (0, 59, 60, 61, 77, 120):
        first = make()
        first.next_blocks(cursor)
        state = first.state_dict()
        first.close()
        assert state["passes"] == 2
        resumed = make(prefetch=cursor % 2 == 0)
        resumed.load_state_dict(state)
        assert torch.equal(read_all(resumed, [120 - cursor]), reference[cursor:])
    one_pass = TrainLoader(counting_cache, L, 120 // 2, 7)
    with pytest.raises(RunStateError, match="num_blocks"):
        one_pass.load_state_dict(make().state_dict())
    other = TrainLoader(counting_cache, L, 120, 7, passes=3)
    with pytest.raises(RunStateError, match="passes was 2, now 3"):
        other.load_state_dict(make().state_dict())
    old = loader(counting_cache)
    old.load_state_dict({k: v for k, v in old.state_dict().items() if k != "passes"})  # saved before passes
    for item in (one_pass, other, old):
        item.close()


def test_validation_is_padded_and_counts_every_target_once(counting_cache):
    total = counting_cache.num_tokens("validation")  # 43 tokens = 42 targets = 5 full blocks + 2
    inputs, targets = (torch.cat(parts) for parts in zip(*iter_validation(counting_cache, L, 2), strict=True))
    assert inputs.shape == targets.shape == (6, L)
    valid = targets != IGNORE_INDEX
    assert int(valid.sum()) == validation_num_targets(counting_cache) == total - 1
    assert targets[valid].tolist() == list(range(1001, 1000 + total))
    assert inputs.flatten()[: total - 1].tolist() == list(range(1000, 1000 + total - 1))
    assert inputs[-1, :3].tolist() == [1040, 1041, 1042]  # the last token is an input without a target
    assert inputs[-1, 3:].eq(0).all() and targets[-1, 2:].eq(IGNORE_INDEX).all()


def test_validation_subset_is_sorted_seeded_and_full_blocks(counting_cache):
    subset = validation_subset(counting_cache, L, 3, seed=12345)
    chosen = np.sort(np.random.default_rng(12345).choice(5, size=3, replace=False))
    assert torch.equal(subset[:, 0], torch.as_tensor(1000 + chosen * L))
    assert torch.equal(subset, subset[:, :1] + torch.arange(L + 1))
    assert validation_subset(counting_cache, L, 99, seed=1).shape == (5, L + 1)


def test_blocks_cross_shards_and_documents_in_a_prepared_cache(tiny_cache: Path):
    with open_cache(tiny_cache) as cache:
        shard_tokens = cache.manifest["splits"]["train"]["shards"][0]["tokens"]
        raw = np.concatenate(
            [
                np.fromfile(tiny_cache / s["file"], dtype="<u2")
                for s in cache.manifest["splits"]["train"]["shards"]
            ]
        )
        context, num_blocks = 64, 2000
        train_loader = TrainLoader(cache, context, num_blocks, seed=42, buffer_size_mib=1)
        blocks = read_all(train_loader, [num_blocks]).numpy()
    expected = np.lib.stride_tricks.sliding_window_view(raw[: num_blocks * context + 1], context + 1)[
        ::context
    ]
    assert sorted(map(tuple, blocks.tolist())) == sorted(map(tuple, expected.tolist()))
    crossing = shard_tokens // context - 1  # its last token is the first of the second shard
    assert crossing * context < shard_tokens < (crossing + 1) * context + 1
    assert np.array_equal(expected[crossing], raw[crossing * context : (crossing + 1) * context + 1])
    assert any(np.array_equal(row, expected[crossing]) for row in blocks)
    eos = cache.eos_token_id
    assert any(eos in row[1:-1] for row in blocks)  # documents are not aligned to blocks


# ----------------------------------------------------------------------------- loader v2 (shuffle groups)


def v2_loader(cache, num_blocks: int, seed: int = 7, group: int = 2) -> TrainLoader:
    return TrainLoader(cache, L, num_blocks, seed, shuffle_group_size=group)


def test_v2_visits_groups_of_shards_in_file_order_each_in_its_seeded_permutation(counting_cache):
    """Shards of 100 tokens, groups of two: group g holds the blocks starting in [200g, 200g+200)."""
    blocks = read_all(v2_loader(counting_cache, 50), [50])
    starts = (blocks[:, 0] // L).tolist()
    first, second = starts[:25], starts[25:]
    assert sorted(first) == list(range(25)) and sorted(second) == list(range(25, 50))
    for g, rows in enumerate((first, second)):
        expected = np.random.default_rng([7, 1, g]).permutation(25)
        assert [r - 25 * g for r in rows] == expected.tolist()


def test_v2_shorter_run_is_an_exact_prefix_and_a_branch_resumes_a_longer_runs_state(counting_cache):
    long = read_all(v2_loader(counting_cache, 50), [7, 20, 23])
    for n in (1, 24, 25, 26, 37):
        assert torch.equal(read_all(v2_loader(counting_cache, n), [n]), long[:n])
    trunk = v2_loader(counting_cache, 50)
    trunk.next_blocks(31)
    state = trunk.state_dict()
    trunk.close()
    branch = v2_loader(counting_cache, 40)  # another total: v2's order does not depend on it
    branch.load_state_dict(state)
    assert torch.equal(read_all(branch, [9]), long[31:40])
    with pytest.raises(RunStateError, match="shuffle_group_size"):
        TrainLoader(counting_cache, L, 50, 7).load_state_dict(state)


def test_v2_needs_complete_groups(counting_cache, tmp_path):
    from tiny_llm.budget import loader_v2_tokens_needed

    with pytest.raises(DataError, match="complete groups"):
        v2_loader(counting_cache, 51)  # the third group is the cache's last, partial shard
    need = loader_v2_tokens_needed(50, L, 200)
    assert need == 401  # both groups, the last block's final target and one token of the next shard
    write_token_cache(tmp_path / "c", np.arange(need), np.arange(3 * L), shard_tokens=100)
    with open_cache(tmp_path / "c") as cache:
        assert torch.equal(
            read_all(v2_loader(cache, 50), [50]), read_all(v2_loader(counting_cache, 50), [50])
        )
    write_token_cache(tmp_path / "d", np.arange(need - 1), np.arange(3 * L), shard_tokens=100)
    with open_cache(tmp_path / "d") as cache, pytest.raises(DataError, match="need 401 train tokens"):
        v2_loader(cache, 50)
