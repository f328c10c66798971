#!/usr/bin/env bash
# Workflow rehearsal on one GPU (benchmarks/gpu_workflow.py; benchmarks/gpu_check.sh runs it as its workflow
# step): tuning to selected.yaml, campaign stage 1 with 2 seeds, SIGTERM to the controller, the rerun; --full
# adds packed, export, analysis, evaluation speed and peers. One line per step, JSON in the working directory.
#   benchmarks/gpu_workflow.sh [--dry-run | --cpu-smoke] [--full] [--timeout SECONDS] [--workdir DIR]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
workdir="${TINY_LLM_REHEARSAL_DIR:-$(mktemp -d -t tiny-llm-gpu-workflow.XXXXXX)}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
cd "$repo"
exec python benchmarks/gpu_workflow.py --workdir "$workdir" "$@"
