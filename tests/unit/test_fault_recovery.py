"""How the fault benchmark (benchmarks/faults.py) times a recovery from run.log's lines: from the fault to the
run's next start after the save its trainer wrote on it, never the hit trainer's own start or save."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def recovery(
    benchmark: ModuleType, tmp_path: Path, fault_at: float, lines: list[tuple[float, str]]
) -> float | None:
    (tmp_path / "run").mkdir(exist_ok=True)
    text = "".join(f"{stamp(at)} {words}\n" for at, words in lines)
    (tmp_path / "run/run.log").write_text(text)
    fault = benchmark.Fault("node_down", 1, 0.0, "node", ["run"], fault_at)
    return benchmark.recovery_seconds(tmp_path, fault)


def test_a_start_in_the_faults_own_second_is_the_hit_trainer_not_its_restart(
    tmp_path: Path, fault_benchmark: ModuleType
) -> None:
    t0 = float(int(time.time()) - 1000)  # a whole second: the fault comes 0.57 s into it
    lines = [(t0, "start: 48 updates"), (t0, "interrupted at step 2"), (t0 + 137, "resumed from x")]
    assert recovery(fault_benchmark, tmp_path, t0 + 0.57, lines) == 136.4


def test_a_save_long_after_the_fault_belongs_to_a_later_one(
    tmp_path: Path, fault_benchmark: ModuleType
) -> None:
    t0 = float(int(time.time()) - 1000)
    # the trainer hit at t0 + 0.07 died before logging; its retry started at +35 and a later fault then hit it
    lines = [(t0 + 35, "start: 48 updates"), (t0 + 35, "interrupted at step 2"), (t0 + 172, "resumed from x")]
    assert recovery(fault_benchmark, tmp_path, t0 + 0.07, lines) == 34.9
    # a trainer that saved on the fault restarts after its save; a run that never did has no recovery
    saved = (t0 + 3, "interrupted at step 9")
    assert recovery(fault_benchmark, tmp_path, t0 + 0.07, [saved, (t0 + 20, "resumed from x")]) == 19.9
    assert recovery(fault_benchmark, tmp_path, t0 + 0.07, [saved]) is None
