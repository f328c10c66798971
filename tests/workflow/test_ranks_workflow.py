"""A size with num_gpus: 2 on the CPU, end to end through the workflow: the dry run shows the 2-rank job
(`tiny_llm launch`, gpu and nodes resources), and the job trains with 2 gloo processes through it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from workflow_helpers import snakemake, tiny_config, write_config

pytestmark = pytest.mark.slow

RUN = "tiny-a"
RESULT = f"results/runs/{RUN}/result.json"


def two_rank_config(workdir: Path, corpus: Path, tokenizer: Path) -> Path:
    """The tiny config on the session's corpus and tokenizer (no corpus or tokenizer job), 2 ranks."""
    training = {"tokens_per_parameter": 0.2, "epoch_tokens_per_parameter": 0.1}
    config = tiny_config(**{RUN: {"size": "tiny", "overrides": {"training": training}}})
    config["data"] = {"corpus": str(corpus), "tokenizer": str(tokenizer)}
    config["sizes"]["tiny"]["num_gpus"] = 2
    return write_config(workdir / "tiny-2ranks.yaml", config)


def test_a_two_rank_size_trains_through_the_launcher_on_the_cpu(
    tmp_path: Path, tiny_corpus_dir: Path, tiny_tokenizer_dir: Path
) -> None:
    config = two_rank_config(tmp_path, tiny_corpus_dir, tiny_tokenizer_dir)
    dry = snakemake(tmp_path, config, "--cores", "2", "-n", "-p", RESULT)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    job = dry.stdout.split("rule train_run:", 1)[1].split("\n\n", 1)[0]
    launch = "python -m tiny_llm launch --nproc-per-node 2 --shutdown-timeout 100 -m tiny_llm train"
    assert launch in dry.stdout and "TINY_LLM_REQUIRE_CUDA" not in dry.stdout  # CPU ranks
    assert re.search(r"resources:.*\bnodes=1\b", job) and "gpu=0" in job  # CPU ranks: no GPU asked for
    assert re.search(r"threads: 2\b", job)  # the size's 1 thread per rank

    proc = snakemake(tmp_path, config, "--cores", "2", RESULT, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "results" / "runs" / RUN
    result = json.loads((run_dir / "result.json").read_text())
    assert result["step"] > 0 and result["final_validation"]["loss"] > 0
    resolved = (run_dir / "resolved.yaml").read_text()
    assert "num_gpus: 2" in resolved
    log = (tmp_path / "logs" / "train_run" / f"{RUN}.log").read_text()
    assert "final validation loss" in log
