#!/usr/bin/env bash
# The GPU check, sized for the lent H200 (one command, about 8 minutes at most): correctness on
# CUDA (pytest -m gpu), rollout/update throughput at Qwen3-0.6B and -1.7B shapes, a short
# `envace train` of the tiny cold start, part of the suite on the machine's own stack.
# Everything it measured goes to OUTDIR/gpu_check.json (rewritten after every stage) and
# OUTDIR/gpu_check.log. Nothing is installed from a registry: the wheels that the machine lacks
# travel in .gpu-wheels/ (made here by scripts/gpu_wheels.sh; carry it). docs/gpu_check.md.
#   bash scripts/gpu_check.sh OUTDIR                  # on the GPU machine:
#       run(command="bash scripts/gpu_check.sh $OUT", carry=[".gpu-wheels"], timeout_s=540)
#   bash scripts/gpu_check.sh --cpu-dry-run OUTDIR    # here: every stage at toy sizes, on .venv
# Knobs: ENVACE_GPU_PYTHON (python3), ENVACE_GPU_WHEELS (.gpu-wheels), ENVACE_GPU_BUDGET_S
# (450: the stages' total; each stage has its own cap too), ENVACE_GPU_STAGES (all; e.g.
# "gpu_tests,train" reruns those two after the preflight), ENVACE_GPU_CAP_SCALE (1: multiplies
# every cap and the budget), ENVACE_DRY_PYTHON (.venv/bin/python).
# Fails early, with a one-line reason, when the GPU, a wheel or the interpreter is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
if [ "${1:-}" = "--cpu-dry-run" ]; then
  DRY=1
  shift
fi
OUT=${1:?usage: bash scripts/gpu_check.sh [--cpu-dry-run] OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "[gpu_check] $*" | tee -a "$LOG"; }
fail() {  # one line, and a JSON that says so (no later stage ran)
  say "FAILED before any stage: $*"
  printf '{"check": "envace gpu_check", "finished": true, "ok": false, "reason": "%s", "stages": {}}\n' \
    "${*//\"/\'}" > "$OUT/gpu_check.json"
  exit 2
}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ "$DRY" = 1 ]; then
  PY=${ENVACE_DRY_PYTHON:-.venv/bin/python}
  [ -x "$PY" ] || command -v "$PY" >/dev/null || fail "no $PY: run bash scripts/setup.sh first"
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  say "CPU dry run with $PY (no wheels, no GPU: toy sizes)"
  set +e
  "$PY" -m scripts.gpu_check --cpu-dry-run --out "$OUT" ${ENVACE_GPU_BUDGET_S:+--budget-s "$ENVACE_GPU_BUDGET_S"} \
    ${ENVACE_GPU_STAGES:+--stages "$ENVACE_GPU_STAGES"} | tee -a "$LOG"
  exit "${PIPESTATUS[0]}"
fi

PY=${ENVACE_GPU_PYTHON:-python3}
WHEELS=${ENVACE_GPU_WHEELS:-.gpu-wheels}
command -v "$PY" >/dev/null || fail "no $PY on this machine"
command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this is not a GPU machine (use --cpu-dry-run)"
nvidia-smi -L >> "$LOG" 2>&1 || fail "nvidia-smi -L failed: no usable NVIDIA GPU"
[ -f "$WHEELS/MANIFEST" ] \
  || fail "no $WHEELS/MANIFEST: run bash scripts/gpu_wheels.sh where PyPI answers, and carry $WHEELS"
while read -r spec; do
  [ -n "$spec" ] || continue
  name=${spec%%==*}
  version=${spec##*==}
  norm=$(echo "$name" | tr 'A-Z-' 'a-z_')
  compgen -G "$WHEELS/${norm}-${version}-*.whl" >/dev/null || fail "wheel missing: $spec in $WHEELS"
done < "$WHEELS/MANIFEST"
SITE=${ENVACE_GPU_SITE:-/tmp/envace-gpu-site}
rm -rf "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
  "$WHEELS"/*.whl >> "$LOG" 2>&1 || fail "pip could not install the carried wheels (see $LOG)"
export PYTHONPATH="$SITE:$PWD"
say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1);" \
  "$("$PY" -c 'import sys, torch, transformers; print("Python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -1)"
set +e
"$PY" -m scripts.gpu_check --out "$OUT" ${ENVACE_GPU_BUDGET_S:+--budget-s "$ENVACE_GPU_BUDGET_S"} \
  ${ENVACE_GPU_STAGES:+--stages "$ENVACE_GPU_STAGES"} | tee -a "$LOG"
exit "${PIPESTATUS[0]}"
