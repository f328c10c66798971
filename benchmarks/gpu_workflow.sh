#!/usr/bin/env bash
# Workflow rehearsal on one GPU (benchmarks/gpu_workflow.py): tuning, campaign stage 1, packed, interrupt and
# rerun, export, analysis, evaluation speed and peers, one line per step, JSON in the working directory.
#   benchmarks/gpu_workflow.sh [--dry-run | --cpu-smoke] [--workdir DIR]
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
workdir="${TINY_LLM_REHEARSAL_DIR:-$(mktemp -d -t tiny-llm-gpu-workflow.XXXXXX)}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
cd "$repo"
exec python benchmarks/gpu_workflow.py --workdir "$workdir" "$@"
