#!/usr/bin/env bash
# One-shot GPU check for a fresh machine with one NVIDIA GPU, sized for a short slot of GPU time: at most
# 540 s from a bare machine, install included (the budgets of the install and of every step add up to that).
#
#   bash benchmarks/gpu_check.sh               # install if needed, check CUDA, run the default steps
#   bash benchmarks/gpu_check.sh --no-install  # use the Python environment as it is
#   bash benchmarks/gpu_check.sh --dry-run     # print every command with its budget and the sum (CPU, nothing run)
#   bash benchmarks/gpu_check.sh --cpu-smoke   # the same steps with tiny settings on the CPU (proves the parsing)
#
# Options: --budget SECONDS (default 540, counted from the start, install included; 3600 with --cpu-smoke),
# --only STEP[,STEP...] (the default steps, or packed-n4, train-resume, compile-mode, kernel-math,
# kernel-efficient, kernel-flash, kernel-cudnn, kernel-efficient-compiled), --python PY.
#
# Default steps, least known first, budget in s: env 8 (torch/CUDA, nvidia-smi); pytest-cuda 30 (pytest -m cuda
# tests/unit, pass/fail counts); data 20 (demo corpus, 512-token BPE, cache); train-20m 45 (one default-recipe
# 20m train: rows' tokens/s vs the updates' wall clock and bench-20m); cuda-graph-20m 40 (graph tests' outcome,
# then bench-20m with the whole update as one CUDA graph); workflow 70 (benchmarks/gpu_workflow.py: tuning to
# selected.yaml, campaign stage 1 with 2 seeds, SIGTERM to the controller, rerun); bench-20m/50m/90m 40/42/50
# (benchmark worker at the reference settings against the GH200 figures); peers 66 (benchmarks/peers.py:
# library vs transformers compiled). Install 125: import check 15, torch 70, the package 30, CUDA check 10.
# One line per step; one JSON per step, summary.json and every command's stdout/stderr under $OUT, or
# results/gpu-check/ when OUT is unset. A failed or timed-out step is recorded and the next one runs; a step
# the budget cut off is recorded as skipped_budget.
set -u -o pipefail

START=$(date +%s)
DRY_RUN=0
CPU_SMOKE=0
NO_INSTALL=0
BUDGET=""
ONLY=""
PY="${PYTHON:-}"
TORCH_PIN="torch==2.13.0"  # envs/torch.yaml

usage() { sed -n '2,/^set /p' "$0" | sed -n 's/^# \{0,1\}//p'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --cpu-smoke) CPU_SMOKE=1 ;;
        --no-install) NO_INSTALL=1 ;;
        --budget) BUDGET="${2:?--budget needs seconds}"; shift ;;
        --budget=*) BUDGET="${1#*=}" ;;
        --only) ONLY="${2:?--only needs step names}"; shift ;;
        --only=*) ONLY="${1#*=}" ;;
        --python) PY="${2:?--python needs an interpreter}"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO" || exit 2
if [ -z "$PY" ]; then
    if command -v python >/dev/null 2>&1; then PY=python; else PY=python3; fi
fi
OUT_DIR="${OUT:-$REPO/results/gpu-check}"
MODE=gpu
[ "$CPU_SMOKE" = 1 ] && MODE=cpu-smoke
[ "$CPU_SMOKE" = 1 ] && [ -z "${OUT:-}" ] && OUT_DIR="$REPO/results/gpu-check-cpu-smoke"
if [ -z "$BUDGET" ]; then
    BUDGET=540
    [ "$CPU_SMOKE" = 1 ] && BUDGET=3600  # 2 CPU cores: the workflow rehearsal alone takes minutes
fi
DEADLINE=$((START + BUDGET))

# The install's budget (s): the import check, the two pip commands, the CUDA check. On a fast network; not
# measured on a bare machine (the H200 the figures come from had torch installed and no network).
IMPORT_TIMEOUT=15
CUDA_TIMEOUT=10
INSTALL_CMDS=(
    "timeout 70 $PY -m pip install $TORCH_PIN"
    "timeout 30 $PY -m pip install -e .[dev]"
)
INSTALL_SECONDS=$((IMPORT_TIMEOUT + 70 + 30 + CUDA_TIMEOUT))
# The data step builds the demo corpus from the gensim wheel's files (demo extra), the workflow step runs
# snakemake (workflow extra), pytest-cuda pytest, the peers transformers: the dev extra has them all.
IMPORT_CHECK="import torch, tiny_llm, numpy, yaml, tokenizers, safetensors, datasets, gensim, snakemake, pytest"
IMPORT_CHECK="$IMPORT_CHECK, transformers"
CUDA_CHECK='import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'

RUN_ARGS=(benchmarks/gpu_check.py run --mode "$MODE" --out "$OUT_DIR" --deadline "$DEADLINE" --budget "$BUDGET"
    --install-seconds "$INSTALL_SECONDS")
[ -n "$ONLY" ] && RUN_ARGS+=(--only "$ONLY")

if [ "$DRY_RUN" = 1 ]; then
    echo "# gpu_check --dry-run: mode $MODE, output $OUT_DIR, budget ${BUDGET} s; nothing is executed"
    echo "# install (budget ${INSTALL_SECONDS} s; skipped with --no-install/--cpu-smoke, or when the import check works):"
    echo "timeout $IMPORT_TIMEOUT $PY -c \"$IMPORT_CHECK\""
    for c in "${INSTALL_CMDS[@]}"; do echo "$c"; done
    echo "# CUDA check (gpu mode; stops with a clear line if CUDA is not available):"
    echo "timeout $CUDA_TIMEOUT $PY -c '$CUDA_CHECK'"
    # The steps are listed by the same code that runs them (standard library only, no torch needed).
    exec "$PY" "${RUN_ARGS[@]}" --dry-run
fi

mkdir -p "$OUT_DIR/logs" || exit 2
echo "gpu_check: mode $MODE, python $(command -v "$PY"), output $OUT_DIR, budget ${BUDGET} s"

# ------------------------------------------------------------------ install (skippable)
if [ "$NO_INSTALL" = 1 ] || [ "$CPU_SMOKE" = 1 ]; then
    echo "[install] skipped (--no-install / --cpu-smoke)"
elif timeout "$IMPORT_TIMEOUT" "$PY" -c "$IMPORT_CHECK" >"$OUT_DIR/logs/install.check.log" 2>&1; then
    echo "[install] skipped: torch and tiny_llm already import ($("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null))"
else
    i=0
    for c in "${INSTALL_CMDS[@]}"; do
        i=$((i + 1))
        t0=$(date +%s)
        if $c >"$OUT_DIR/logs/install.$i.stdout.log" 2>"$OUT_DIR/logs/install.$i.stderr.log"; then
            echo "[install] ok: $c ($(( $(date +%s) - t0 )) s)"
        else
            echo "[install] FAILED (exit $?): $c ($(( $(date +%s) - t0 )) s); see $OUT_DIR/logs/install.$i.stderr.log"
            tail -n 3 "$OUT_DIR/logs/install.$i.stderr.log" | sed 's/^/    /'
        fi
    done
fi

# ------------------------------------------------------------------ CUDA check
if [ "$MODE" = gpu ]; then
    if ! timeout "$CUDA_TIMEOUT" "$PY" -c "$CUDA_CHECK" >"$OUT_DIR/logs/cuda.check.log" 2>&1; then
        echo "gpu_check: CUDA is not available to $PY (torch.cuda.is_available() is False or torch does not import;" \
            "see $OUT_DIR/logs/cuda.check.log) - stopping. Use --cpu-smoke for a CPU run."
        tail -n 3 "$OUT_DIR/logs/cuda.check.log" | sed 's/^/    /'
        exit 3
    fi
fi

"$PY" "${RUN_ARGS[@]}"
rc=$?
echo "gpu_check: finished in $(( $(date +%s) - START )) s (exit $rc); results in $OUT_DIR"
exit $rc
