#!/usr/bin/env bash
# One-shot GPU check for a machine with one NVIDIA GPU and a working torch, sized for a short slot of GPU
# time: at most 540 s, its probes included (the budgets of the probes and of every step add up to that).
#
#   bash benchmarks/gpu_check.sh               # probe torch and the package, check CUDA, run the default steps
#   bash benchmarks/gpu_check.sh --install     # also `pip install -e .[dev]` when the package does not import
#   bash benchmarks/gpu_check.sh --dry-run     # print every command with its budget and the sum (CPU, nothing run)
#   bash benchmarks/gpu_check.sh --cpu-smoke   # the same steps with tiny settings on the CPU (proves the parsing)
#
# Options: --budget SECONDS (default 540, counted from the start, probes included; 3600 with --cpu-smoke),
# --only STEP[,STEP...] (the default steps, or bench-50m, packed-n4, train-resume, compile-mode, kernel-math,
# kernel-efficient, kernel-flash, kernel-cudnn, kernel-efficient-compiled), --python PY, --install,
# --no-install (the default; kept for old command lines).
#
# torch is never installed or reinstalled: a torch that imports is used as it is (its version is reported
# against the pin, torch==2.13.0 in envs/torch.yaml; the library runs on 2.10 and later), and one that does not
# import stops the check in one line (a CUDA torch needs a network and minutes: docs/cluster.md, "A CUDA torch").
# A slow import (a cold disk) only costs its timeout. --install runs pip for the package with the found torch
# pinned as a constraint, so pip can never replace it.
#
# Default steps, least known first, budget in s: env 8 (torch/CUDA, nvidia-smi); pytest-cuda 100 (pytest -m cuda
# tests/unit: the captured and the compiled-and-captured update against the ordinary engine, the finite guard's
# skip inside a replayed graph, Muon on the device, the memory cap, compiled graphs' peak floor, DDP on 2 GPUs
# where there are two, one GPU: skipped); data 20 (demo corpus, 512-token BPE, cache); train-20m 45 (one
# default-recipe 20m train: rows' tokens/s vs the updates' wall clock and bench-20m); cuda-graph-20m 40 (graph
# tests' outcome, then bench-20m with the whole update as one CUDA graph); muon 35 (a short Muon train, and
# Muon's optimizer step against AdamW's at 20m: benchmarks/optimizer_cost.py); map-points 35 (two throughput-map
# points of 20m under runtime.memory_limit_mb: one fits, one is a real CUDA out-of-memory); workflow 70
# (benchmarks/gpu_workflow.py: tuning to selected.yaml, campaign stage 1 with 2 seeds, SIGTERM to the
# controller, rerun); bench-20m/90m 40/50 (benchmark worker at the reference settings against the GH200
# figures); peers 60 (benchmarks/peers.py: library vs transformers compiled). Probes 35: torch 25 (version, CUDA),
# the package 10; --install adds pip 60.
# One line per step; one JSON per step, summary.json and every command's stdout/stderr under $OUT, or
# results/gpu-check/ when OUT is unset. A failed or timed-out step is recorded and the next one runs; a step
# the budget cut off is recorded as skipped_budget.
set -u -o pipefail

START=$(date +%s)
DRY_RUN=0
CPU_SMOKE=0
INSTALL=0
BUDGET=""
ONLY=""
PY="${PYTHON:-}"
TORCH_PIN="$(sed -n 's/^ *- *torch==\([0-9.]*\).*/\1/p' "$(dirname "${BASH_SOURCE[0]}")/../envs/torch.yaml" | head -n 1)"

usage() { sed -n '2,/^set /p' "$0" | sed -n 's/^# \{0,1\}//p'; }

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --cpu-smoke) CPU_SMOKE=1 ;;
        --no-install) INSTALL=0 ;;
        --install) INSTALL=1 ;;
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

# The probes' budget (s). torch's import took 3.8 s on the H200 (30 Nov 2026, env step); a cold disk takes
# longer, and a probe that times out only costs its timeout: it never starts pip.
TORCH_TIMEOUT=25
PACKAGE_TIMEOUT=10
PIP_TIMEOUT=60
INSTALL_SECONDS=$((TORCH_TIMEOUT + PACKAGE_TIMEOUT))
[ "$INSTALL" = 1 ] && INSTALL_SECONDS=$((INSTALL_SECONDS + PIP_TIMEOUT))
TORCH_PROBE='import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())'
# The package and what every step needs; the data step's gensim, the workflow's snakemake, pytest and the
# peers' transformers are reported when missing (the steps that need them fail on their own).
PACKAGE_CHECK="import tiny_llm, numpy, yaml, tokenizers, safetensors"
OPTIONAL_MODULES="datasets gensim snakemake pytest transformers"

RUN_ARGS=(benchmarks/gpu_check.py run --mode "$MODE" --out "$OUT_DIR" --deadline "$DEADLINE" --budget "$BUDGET"
    --install-seconds "$INSTALL_SECONDS")
[ -n "$ONLY" ] && RUN_ARGS+=(--only "$ONLY")

if [ "$DRY_RUN" = 1 ]; then
    echo "# gpu_check --dry-run: mode $MODE, output $OUT_DIR, budget ${BUDGET} s; nothing is executed"
    echo "# probes (budget ${INSTALL_SECONDS} s): torch (never installed: one that does not import stops the check), the package"
    echo "timeout $TORCH_TIMEOUT $PY -c '$TORCH_PROBE'"
    echo "timeout $PACKAGE_TIMEOUT $PY -c \"$PACKAGE_CHECK\""
    if [ "$INSTALL" = 1 ]; then
        echo "# --install, when the package does not import (the found torch a constraint: pip cannot replace it):"
        echo "timeout $PIP_TIMEOUT $PY -m pip install -e .[dev] --constraint <(echo torch==FOUND)"
    fi
    # The steps are listed by the same code that runs them (standard library only, no torch needed).
    exec "$PY" "${RUN_ARGS[@]}" --dry-run
fi

mkdir -p "$OUT_DIR/logs" || exit 2
echo "gpu_check: mode $MODE, python $(command -v "$PY"), output $OUT_DIR, budget ${BUDGET} s"

# ------------------------------------------------------------------ torch: probed, never installed
found=$(timeout "$TORCH_TIMEOUT" "$PY" -c "$TORCH_PROBE" 2>"$OUT_DIR/logs/torch.probe.log")
rc=$?
if [ $rc = 124 ]; then
    echo "[torch] import did not finish in ${TORCH_TIMEOUT} s (a cold disk?); going on, the steps import it themselves"
elif [ $rc != 0 ]; then
    echo "gpu_check: torch does not import with $PY (see $OUT_DIR/logs/torch.probe.log); it is never installed" \
        "here: install a CUDA build first (docs/cluster.md, 'A CUDA torch') - stopping"
    tail -n 3 "$OUT_DIR/logs/torch.probe.log" | sed 's/^/    /'
    exit 3
else
    read -r version cuda available <<<"$found"
    relation="the pin"
    [ "${version%%+*}" != "$TORCH_PIN" ] && relation="differs from the pin; the library runs on 2.10 and later"
    echo "[torch] torch $version (pin $TORCH_PIN: $relation), CUDA $cuda, cuda available: $available"
    if [ "$MODE" = gpu ] && [ "$available" != True ]; then
        build="a CPU-only build"
        [ "$cuda" != None ] && build="built for CUDA $cuda but sees no GPU (driver? CUDA_VISIBLE_DEVICES?)"
        echo "gpu_check: torch $version here is $build; install a CUDA build for $(uname -m) (docs/cluster.md," \
            "'A CUDA torch') - stopping. Use --cpu-smoke for a CPU run."
        exit 3
    fi
fi

# ------------------------------------------------------------------ the package (pip only with --install)
if timeout "$PACKAGE_TIMEOUT" "$PY" -c "$PACKAGE_CHECK" >"$OUT_DIR/logs/package.check.log" 2>&1; then
    missing=$(timeout "$PACKAGE_TIMEOUT" "$PY" -c "import importlib.util as u; print(' '.join(m for m in '$OPTIONAL_MODULES'.split() if u.find_spec(m) is None))" 2>/dev/null)
    echo "[package] imports${missing:+; missing (their steps fail): $missing}"
elif [ "$INSTALL" = 1 ] && [ -n "${version:-}" ]; then
    t0=$(date +%s)
    if timeout "$PIP_TIMEOUT" "$PY" -m pip install -e ".[dev]" --constraint <(echo "torch==$version") \
        >"$OUT_DIR/logs/install.stdout.log" 2>"$OUT_DIR/logs/install.stderr.log"; then
        echo "[install] ok: pip install -e .[dev], torch $version kept ($(( $(date +%s) - t0 )) s)"
    else
        echo "[install] FAILED ($(( $(date +%s) - t0 )) s); see $OUT_DIR/logs/install.stderr.log"
        tail -n 3 "$OUT_DIR/logs/install.stderr.log" | sed 's/^/    /'
    fi
else
    echo "[package] does not import (see $OUT_DIR/logs/package.check.log); the steps will fail: put the package" \
        "and its dependencies on PYTHONPATH, or rerun with --install where there is a network"
    tail -n 3 "$OUT_DIR/logs/package.check.log" | sed 's/^/    /'
fi

"$PY" "${RUN_ARGS[@]}"
rc=$?
echo "gpu_check: finished in $(( $(date +%s) - START )) s (exit $rc); results in $OUT_DIR"
exit $rc
