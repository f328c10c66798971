"""`prepare` and the cache reader: contents, identity, reuse, immutability, locking, corruption, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from data_helpers import doc, write_c4

from tiny_llm.cli import main
from tiny_llm.config import load_recipe
from tiny_llm.data.cache import open_cache
from tiny_llm.data.loader import TrainLoader
from tiny_llm.data.prepare import prepare_cache
from tiny_llm.data.tokenizer import load_tokenizer
from tiny_llm.errors import DataError, RunStateError
from tiny_llm.io import exclusive_lock

DOCS = [
    "The river rose quickly after the storm, and the town council met at dawn.",
    "A literal <s> and </s> in a document are ordinary text, not special tokens.",
    "Short one.",
    "Farmers in the valley said the harvest was the best in a decade.",
]


def recipe_for(tiny_recipe_args, cache_dir: Path, *sets: str, dataset: Path | None = None):
    args = tiny_recipe_args(cache_dir)
    if dataset is not None:
        args = [f"data.dataset={dataset}", *args[1:]]
    return load_recipe(["tiny"], [*args, *sets])


@pytest.fixture()
def small(tiny_recipe_args, tmp_path: Path):
    """Recipe factory for 5,000-token caches of the tiny corpus under tmp_path."""

    def make(name: str, *sets: str, dataset: Path | None = None):
        return recipe_for(
            tiny_recipe_args, tmp_path / name, "data.prepare_train_tokens=5000", *sets, dataset=dataset
        )

    return make


def test_documents_get_eos_and_no_bos_and_literal_specials_stay_text(
    tiny_tokenizer_dir, tiny_recipe_args, tmp_path
):
    corpus = tmp_path / "corpus"
    write_c4(corpus, "train", [doc(t) for t in DOCS * 20])
    write_c4(corpus, "validation", [doc(t) for t in DOCS])
    recipe = recipe_for(tiny_recipe_args, tmp_path / "cache", "data.prepare_train_tokens=50", dataset=corpus)
    prepare_cache(recipe, progress=False)
    tokenizer = load_tokenizer(str(tiny_tokenizer_dir))
    bos, eos = tokenizer.tokenizer.token_to_id("<s>"), tokenizer.eos_token_id
    assert eos == 2
    with open_cache(tmp_path / "cache") as cache:
        validation = cache.read("validation", 0, cache.num_tokens("validation"))
        assert cache.manifest["preprocessing"] == {
            "shuffle_seed": 42,
            "shuffle_buffer": 64,
            "append_eos": True,
            "add_special_tokens": False,
        }
    expected = [t for ids in tokenizer.encode_batch(DOCS) for t in [*ids, eos]]
    assert validation.tolist() == expected  # validation keeps source order
    assert int((validation == eos).sum()) == len(DOCS) and bos not in validation
    second = tokenizer.encode_batch([DOCS[1]])[0]
    assert eos not in second and tokenizer.tokenizer.decode(second) == DOCS[1]


def test_manifest_identity_is_deterministic_and_follows_the_shuffle_seed(small):
    first = prepare_cache(small("a"), progress=False)
    again = prepare_cache(small("b"), progress=False)
    reseeded = prepare_cache(small("c", "data.shuffle_seed=7"), progress=False)
    assert first.identity == again.identity != reseeded.identity
    caches = [open_cache(Path(r.path)) for r in (first, reseeded)]
    train = [c.read("train", 0, 5000) for c in caches]
    validation = [c.read("validation", 0, c.num_tokens("validation")) for c in caches]
    assert not np.array_equal(*train)  # only train is shuffled
    assert np.array_equal(*validation)
    manifest = caches[0].manifest
    assert set(manifest) == {
        "version", "dataset", "dataset_revision", "tokenizer", "tokenizer_revision", "tokenizer_fingerprint",
        "vocab_size", "eos_token_id", "dtype", "preprocessing", "validation_complete", "splits", "identity",
    }  # fmt: skip
    assert manifest["splits"]["train"]["tokens"] == 5000 and manifest["validation_complete"] is True
    assert manifest["dtype"] == "<u2" and manifest["dataset_revision"] is None


def test_reuse_checks_compatibility_capacity_and_prefix(small, tiny_recipe_args, tmp_path):
    big = prepare_cache(small("big", "data.prepare_train_tokens=9000"), progress=False)
    reused = prepare_cache(small("big"), progress=False)  # needs 5,000 <= 9,000
    assert reused.reused and reused.identity == big.identity
    with pytest.raises(DataError, match="cache too small: need 20000 tokens, have 9000"):
        prepare_cache(small("big", "data.prepare_train_tokens=20000"), progress=False)
    with pytest.raises(DataError, match="data.shuffle_seed"):
        prepare_cache(small("big", "data.shuffle_seed=1"), progress=False)
    with pytest.raises(DataError, match="model.vocab_size"):
        open_cache(tmp_path / "big").check_compatible(small("x", "model.vocab_size=1024"))
    # Prefix reuse: the small cache is the big one's first tokens, so both feed a run identically.
    prepare_cache(small("small"), progress=False)
    with open_cache(tmp_path / "big") as big_cache, open_cache(tmp_path / "small") as small_cache:
        assert np.array_equal(big_cache.read("train", 0, 5000), small_cache.read("train", 0, 5000))
        loaders = [TrainLoader(c, 64, 78, seed=3, buffer_size_mib=1) for c in (big_cache, small_cache)]
        assert all(np.array_equal(*(ld.next_blocks(78) for ld in loaders)) for _ in [0])
        for ld in loaders:
            ld.close()


def test_truncated_validation_is_marked_and_not_reused_for_full(small):
    result = prepare_cache(small("cut", "data.prepare_validation_tokens=300"), progress=False)
    assert result.validation_tokens == 300 and result.validation_complete is False
    with pytest.raises(DataError, match="truncated validation"):
        prepare_cache(small("cut"), progress=False)


def test_flipped_byte_is_caught_before_use(tiny_cache, tmp_path):
    copy = tmp_path / "cache"
    shutil.copytree(tiny_cache, copy)
    shard = copy / "train-00001.bin"
    data = bytearray(shard.read_bytes())
    data[1234] ^= 0x01
    shard.write_bytes(bytes(data))
    open_cache(copy, verify=False).close()  # sizes still match
    with pytest.raises(DataError, match="train-00001.bin is corrupt"):
        open_cache(copy, verify=True)


def test_second_preparer_fails_fast_and_first_finishes(small, tmp_path):
    recipe = small("locked")
    with exclusive_lock(tmp_path / "locked.lock", "test"), pytest.raises(RunStateError, match="in use"):
        prepare_cache(recipe, progress=False)
    assert not (tmp_path / "locked").exists() and not (tmp_path / "locked.partial").exists()
    assert not prepare_cache(recipe, progress=False).reused


def test_a_filesystem_without_flock_is_named_in_one_line(tmp_path, monkeypatch):
    """NFSv3 without a reachable lock manager answers flock with ENOLCK (Lustre mounted noflock: ENOSYS)."""
    import errno
    import fcntl

    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(RunStateError) as caught, exclusive_lock(tmp_path / "x.lock", "test"):
        pass
    message = str(caught.value)
    assert "\n" not in message and "does not support flock" in message and "x.lock" in message


def test_stale_partial_is_removed(small, tmp_path, capsys):
    stale = tmp_path / "killed.partial"
    stale.mkdir()
    (stale / ".tiny-llm-output").write_text("")  # its preparer marked it first
    (stale / "train-00000.bin").write_bytes(b"\x00" * 100)  # what kill -9 mid-write leaves behind
    result = prepare_cache(small("killed"), progress=False)
    assert not stale.exists() and "stale partial" in capsys.readouterr().err
    with open_cache(result.path) as cache:
        assert cache.num_tokens("train") == 5000


def bad_corpora(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (dataset dir, expected error fragment)."""
    cases = {}
    (root / "empty").mkdir(parents=True)
    cases["empty"] = (root / "empty", "holds no c4-train")
    cases["missing"] = (root / "missing", "dataset directory not found")
    write_c4(root / "noval", "train", [doc("text")])
    cases["noval"] = (root / "noval", "no validation files")
    write_c4(root / "notext", "train", [doc("fine"), {"url": "https://example.org/"}])
    write_c4(root / "notext", "validation", [doc("fine")])
    cases["notext"] = (root / "notext", "no 'text'")
    bad = write_c4(root / "corrupt", "train", [doc("some text " * 50)] * 50)
    write_c4(root / "corrupt", "validation", [doc("fine")])
    bad.write_bytes(bad.read_bytes()[:-40])
    cases["corrupt"] = (root / "corrupt", "c4-train.00000-of-00001.json.gz: corrupt or truncated gzip")
    return cases


def test_bad_input_gives_one_line_and_leaves_nothing(small, tmp_path, tiny_recipe_args, capsys):
    for name, (dataset, message) in bad_corpora(tmp_path / "in").items():
        with pytest.raises(DataError, match=message) as caught:
            prepare_cache(small(name, dataset=dataset), progress=False)
        assert "\n" not in str(caught.value), name
        assert not (tmp_path / name).exists() and not (tmp_path / f"{name}.partial").exists(), name
    with pytest.raises(DataError, match="has 512 tokens but model.vocab_size is 1024"):
        prepare_cache(small("vocab", "model.vocab_size=1024"), progress=False)
    # The CLI prints the same line as `error: ...` and exits 2.
    argv = ["prepare", "--config", "tiny", "--no-progress"]
    for value in tiny_recipe_args(tmp_path / "cli"):
        argv += ["--set", value]
    assert main([*argv, "--set", "data.dataset=./no/such/dir"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: dataset directory not found") and len(err.splitlines()) == 1


SLOW_PREPARER = """
import sys, time
import tiny_llm.data.prepare as prepare
from tiny_llm.config import load_recipe

join = prepare.join_with_eos


def stall(ids, eos):  # mid-write, holding the lock: say so, then wait to be killed
    print("stalled", flush=True)
    time.sleep(600)
    return join(ids, eos)


prepare.join_with_eos = stall
prepare.prepare_cache(load_recipe(["tiny"], sys.argv[1:]), progress=False)
"""


@pytest.mark.slow
def test_killed_preparer_holds_the_lock_and_its_partial_is_cleaned(small, tiny_recipe_args, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    sets = [*tiny_recipe_args(tmp_path / "killed"), "data.prepare_train_tokens=5000"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-c", SLOW_PREPARER, *sets]
    errors = tmp_path / "preparer.err"
    with errors.open("w") as stderr:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        # blocks until the preparer stalls mid-write (or ends, closing its stdout: then it failed)
        assert "stalled\n" in iter(proc.stdout.readline, ""), errors.read_text()
        with pytest.raises(RunStateError, match="in use by another process"):
            prepare_cache(small("killed"), progress=False)
        assert proc.poll() is None  # refused while the holder still runs: it did not wait for the lock
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert (tmp_path / "killed.partial").exists() and not (tmp_path / "killed").exists()
    result = prepare_cache(small("killed"), progress=False)
    assert not (tmp_path / "killed.partial").exists() and result.train_tokens == 5000


def test_prepare_cli_verifies_and_reuses_a_complete_cache(tiny_cache, tiny_recipe_args, capsys):
    import json

    argv = ["prepare", "--config", "tiny", "--no-progress"]
    for value in tiny_recipe_args(tiny_cache):
        argv += ["--set", value]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    with open_cache(tiny_cache, verify=False) as cache:
        assert summary["reused"] is True and summary["identity"] == cache.identity
        assert summary["train_tokens"] == cache.num_tokens("train") == 200_000


def follow_advice(message: str) -> None:
    """Do what a cache error says: `...; delete the token cache directory <path> and run prepare again`."""
    head, sep, rest = message.rpartition("delete the token cache directory ")
    assert sep and rest.endswith(" and run prepare again"), message
    shutil.rmtree(rest.removesuffix(" and run prepare again"))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda text: text[: len(text) // 2], r"manifest.json is damaged \(not valid JSON: "),
        (
            lambda text: text.replace('"validation_complete": true', '"validation_complete": false'),
            r"identity",
        ),
        (lambda text: "[]", r"manifest.json is damaged \(not a cache manifest: "),
        (
            lambda text: text.replace('"splits"', '"split"'),
            r"manifest.json is damaged \(missing field 'splits'\)",
        ),
    ],
    ids=["torn", "modified", "not-a-manifest", "missing-field"],
)
def test_the_advice_for_a_damaged_manifest_rebuilds_the_cache(
    small, tiny_recipe_args, tmp_path, capsys, damage, reason
):
    """Following the one line's advice gives a working cache (deleting only the manifest, as it used to
    say, is refused: 'exists but is not a token cache')."""
    recipe = small("damaged")
    first = prepare_cache(recipe, progress=False)
    manifest = tmp_path / "damaged" / "manifest.json"
    manifest.write_text(damage(manifest.read_text()))
    for _ in range(2):  # rerunning as it is never helps
        with pytest.raises(DataError, match=reason) as err:
            prepare_cache(recipe, progress=False)
    message = str(err.value)
    assert "\n" not in message and message.endswith(
        f"; delete the token cache directory {tmp_path / 'damaged'} and run prepare again"
    )
    argv = ["prepare", "--config", "tiny", "--no-progress"]
    for setting in [*tiny_recipe_args(tmp_path / "damaged"), "data.prepare_train_tokens=5000"]:
        argv += ["--set", setting]
    capsys.readouterr()
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    follow_advice(message)
    again = prepare_cache(recipe, progress=False)
    assert not again.reused and again.identity == first.identity
    assert prepare_cache(recipe, progress=False).reused


UMASK_027_CACHE = """
import sys
from pathlib import Path
import numpy as np
from tiny_llm.data.prepare import write_token_cache
write_token_cache(Path(sys.argv[1]), np.arange(300), np.arange(100), shard_tokens=100)
"""


def test_the_manifest_follows_the_umask_like_the_shards(tmp_path: Path) -> None:
    import subprocess
    import sys

    cache = tmp_path / "cache"
    subprocess.run([sys.executable, "-c", UMASK_027_CACHE, str(cache)], check=True, umask=0o027, timeout=60)
    modes = {p.name: p.stat().st_mode & 0o777 for p in cache.iterdir() if p.is_file()}
    assert modes["manifest.json"] == modes["train-00000.bin"] == 0o640, modes
