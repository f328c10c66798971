"""What the workflow must never do to a user's files: delete a directory named as the token cache, retrain
nothing after a recipe edit, or let a path reach the shell unquoted."""

from __future__ import annotations

from pathlib import Path

import pytest
from workflow_helpers import snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow


def test_a_foreign_cache_dir_is_refused_and_kept(tmp_path: Path) -> None:
    config = tiny_config()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "data.csv").write_text("precious")
    config["data"]["cache_dir"] = str(foreign)
    configfile = write_config(tmp_path / "tiny.yaml", config)
    proc = snakemake(tmp_path, configfile, "--cores", "1", "data")
    assert proc.returncode != 0  # not taken for a finished cache
    assert (foreign / "data.csv").read_text() == "precious"
    proc = snakemake(tmp_path, configfile, "--cores", "1", "--forcerun", "prepare_cache", "data")
    assert proc.returncode != 0  # a rerun of the cache's job deletes nothing either
    assert sorted(p.name for p in foreign.iterdir()) == ["data.csv"]
    log = (tmp_path / "logs/prepare_cache/cache.log").read_text()
    assert f"data.cache_dir {foreign} exists but is not a token cache" in log
