"""The one way benchmarks and tests call Snakemake on the repository's Snakefile, and their scratch workdirs.

Benchmark scripts import it as a sibling module; tests/workflow and tests/slurm put benchmarks/ on sys.path
for it. It imports nothing of tiny-llm at module level, so a test helper that imports it stays torch-free.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"


def snakemake_command(
    workdir: Path, *args: str, configfile: Path | None = None, replace_config: bool = True
) -> list[str]:
    """``python -m snakemake`` on the repository's Snakefile, run on ``workdir``.

    ``configfile`` replaces the Snakefile's own workflow config (``replace_config``), or is merged over it.
    ``args`` follow: how jobs run (``--cores 2``, ``--workflow-profile DIR``), then targets and flags.
    """
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--directory", str(workdir)]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)] + ["--replace-workflow-config"] * replace_config
    return cmd + list(args)


def claim_workdir(workdir: Path, *, empty: bool = False) -> Path:
    """``workdir`` resolved, created and marked as a benchmark's (tiny-llm's ``.tiny-llm-output``), and with
    ``empty`` emptied; a non-empty directory without the marker is refused in one line (``error: ...``, exit
    2) before anything in it is touched: a benchmark deletes nothing of yours."""
    from tiny_llm.errors import TinyLLMError
    from tiny_llm.output_dirs import claim_output_dir

    try:
        workdir = claim_output_dir(workdir.resolve(), "--workdir")
    except TinyLLMError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if empty:
        shutil.rmtree(workdir)
        claim_output_dir(workdir, "--workdir")
    return workdir
