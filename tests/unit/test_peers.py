"""benchmarks/peers.py at the tiny shape: every peer trains the same weights on the same batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_peers_print_tokens_per_second_and_ratios_for_the_same_training(tmp_path: Path) -> None:
    env = {**os.environ, "TINY_LLM_COMPILE_CACHE": str(tmp_path / "compile-cache")}
    cmd = [sys.executable, str(REPO / "benchmarks" / "peers.py"), "--config", "tiny", "--threads", "1"]
    cmd += ["--set", "runtime.fused_optimizer=true", "--warmup", "1", "--steps", "1", "--windows", "2"]
    # Dynamo's capture and AOTAutograd without Inductor's C++ code (the GPU's is Triton): 30 s less CPU
    cmd += ["--compile-backend", "aot_eager"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["protocol"] == {"warmup": 1, "steps": 1, "windows": 2, "figure": "median", "clock": "wall"}
    assert out["compile_backend"] == "aot_eager"
    peers = out["peers"]
    assert list(peers) == ["library", "transformers", "transformers-compiled", "minimal"]
    assert peers["library"]["ratio_to_library"] == 1.0
    for row in peers.values():
        assert len(row["window_tokens_per_second"]) == 2 and row["tokens_per_second"] > 0
        assert row["ratio_to_library"] == pytest.approx(
            row["tokens_per_second"] / peers["library"]["tokens_per_second"]
        )
        # the same initial weights and batches: the same first loss (FP32 on the CPU; kernels differ a little)
        assert row["first_loss"] == pytest.approx(peers["library"]["first_loss"], rel=1e-5)
        assert row["last_loss"] < row["first_loss"]
