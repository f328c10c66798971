#!/usr/bin/env bash
# One-shot GPU check for a fresh machine with one NVIDIA GPU (about 8 minutes in all).
#
#   bash benchmarks/gpu_check.sh               # install if needed, check CUDA, run every step
#   bash benchmarks/gpu_check.sh --no-install  # use the Python environment as it is
#   bash benchmarks/gpu_check.sh --dry-run     # print every command it would run (CPU, nothing executed)
#   bash benchmarks/gpu_check.sh --cpu-smoke   # the same steps with tiny settings on the CPU (proves the parsing)
#
# Options: --budget SECONDS (default 480, counted from the start, install included), --only STEP[,STEP...]
# (env, data, bench-20m, bench-50m, bench-90m, cuda-graph-20m, packed-n4, train-resume, compile-mode,
# kernel-math, kernel-efficient, kernel-flash, kernel-cudnn, kernel-efficient-compiled), --python PY.
#
# Steps: 20m/50m/90m benchmark worker at the reference settings (synthetic, 32,768-token updates, compiled,
# micro 32, bf16) against the GH200 figures; 20m again with the whole update as one CUDA graph; packed vs
# sequential N=4 (20m shape); a short CUDA train interrupted by SIGTERM, resumed with --resume auto, and
# evaluate --full against its result.json; every forced SDPA kernel; compile_mode reduce-overhead vs default
# with 4 microbatches per update. One line per step; one JSON per step, summary.json and every command's
# stdout/stderr under $OUT, or results/gpu-check/ when OUT is unset.
# A failed or timed-out step is recorded and the next one runs; each command has its own timeout.
set -u -o pipefail

START=$(date +%s)
DRY_RUN=0
CPU_SMOKE=0
NO_INSTALL=0
BUDGET=480
ONLY=""
PY="${PYTHON:-}"
TORCH_PIN="torch==2.13.0"  # envs/torch.yaml

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

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
DEADLINE=$((START + BUDGET))

RUN_ARGS=(benchmarks/gpu_check.py run --mode "$MODE" --out "$OUT_DIR" --deadline "$DEADLINE")
[ -n "$ONLY" ] && RUN_ARGS+=(--only "$ONLY")

INSTALL_CMDS=(
    "timeout 240 $PY -m pip install $TORCH_PIN"
    "timeout 180 $PY -m pip install -e .[demo]"
)
# The data step builds the embedded demo corpus from the gensim wheel's files (the demo extra).
IMPORT_CHECK="import torch, tiny_llm, numpy, yaml, tokenizers, safetensors, datasets, gensim"

if [ "$DRY_RUN" = 1 ]; then
    echo "# gpu_check --dry-run: mode $MODE, output $OUT_DIR, budget ${BUDGET} s; nothing is executed"
    echo "# install (skipped with --no-install/--cpu-smoke, or when '$PY -c \"$IMPORT_CHECK\"' already works):"
    for c in "${INSTALL_CMDS[@]}"; do echo "$c"; done
    if [ "$MODE" = gpu ]; then
        echo "# CUDA check (stops with a clear line if CUDA is not available):"
        echo "timeout 120 $PY -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'"
    fi
    # The steps are listed by the same code that runs them (standard library only, no torch needed).
    exec "$PY" "${RUN_ARGS[@]}" --dry-run
fi

mkdir -p "$OUT_DIR/logs" || exit 2
echo "gpu_check: mode $MODE, python $(command -v "$PY"), output $OUT_DIR, budget ${BUDGET} s"

# ------------------------------------------------------------------ install (skippable)
if [ "$NO_INSTALL" = 1 ] || [ "$CPU_SMOKE" = 1 ]; then
    echo "[install] skipped (--no-install / --cpu-smoke)"
elif timeout 120 "$PY" -c "$IMPORT_CHECK" >"$OUT_DIR/logs/install.check.log" 2>&1; then
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
    if ! timeout 120 "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
        >"$OUT_DIR/logs/cuda.check.log" 2>&1; then
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
