"""Two workflow directories, two controllers started at once, one `data.cache_dir` (shared storage): one
prepares the token cache, the other's prepare job refuses in one line (or finds it published and reuses it);
the cache is complete and every shard verifies afterwards, and a rerun of the refused controller reuses it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from workflow_helpers import REPO, snakemake, snakemake_command, snakemake_env, write_config

pytestmark = pytest.mark.slow

REFUSAL = "is in use by another process"


def config(corpus: Path, tokenizer: Path, cache: Path) -> dict:
    return {
        "data": {"corpus": str(corpus), "tokenizer": str(tokenizer), "cache_dir": str(cache)},
        "sizes": {"tiny": {"preset": "tiny", "threads": 1, "mem_mb": 1000, "runtime_minutes": 10}},
        "runs": {"tiny-a": {"size": "tiny"}},
    }


def test_two_workflow_directories_prepare_one_shared_cache_at_once(
    tmp_path: Path, tiny_corpus_dir: Path, tiny_tokenizer_dir: Path
) -> None:
    cache = tmp_path / "shared" / "cache"
    dirs = [tmp_path / "wf-a", tmp_path / "wf-b"]
    env = snakemake_env()
    procs = []
    for workdir in dirs:
        workdir.mkdir()
        configfile = write_config(workdir / "config.yaml", config(tiny_corpus_dir, tiny_tokenizer_dir, cache))
        command = snakemake_command(workdir, configfile, "--cores", "1", "data")
        procs.append(subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, text=True))
    codes = [proc.wait(timeout=300) for proc in procs]
    assert 0 in codes, codes
    for workdir, code in zip(dirs, codes, strict=True):
        log = (workdir / "logs/prepare_cache/cache.log").read_text(encoding="utf-8")
        if code != 0:  # refused, in one line naming the cache, and removed nothing of the other's
            errors = [line for line in log.splitlines() if line.strip()]
            assert len(errors) == 1 and REFUSAL in errors[0] and str(cache) in errors[0], log
        else:
            assert json.loads(log[log.index("{") :])["path"] == str(cache), log  # the JSON after progress

    # complete: a new preparer verifies every shard's sha256 and reuses it
    prepare = ["prepare", "--config", "results/data/prepare.yaml", "--no-progress"]
    verify = subprocess.run(
        [sys.executable, "-m", "tiny_llm", *prepare],
        cwd=dirs[0],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert verify.returncode == 0, verify.stderr
    assert json.loads(verify.stdout)["reused"] is True
    assert not cache.with_name("cache.partial").exists()

    # the refused controller, rerun, reuses the published cache (it does not prepare it again)
    for workdir, code in zip(dirs, codes, strict=True):
        if code != 0:
            configfile = workdir / "config.yaml"
            rerun = snakemake(workdir, configfile, "--cores", "1", "data")
            assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-4000:]
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["identity"] == json.loads(verify.stdout)["identity"]
