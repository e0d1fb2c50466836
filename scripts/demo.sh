#!/usr/bin/env bash
# The main job, on a fresh machine: set up (idempotent), then train the tiny preset end to end
# (role-wise GRPO with world rehearsal, fidelity logged every step, evaluation in the real BFCL
# environment, an audit of the rehearsals, runs/tiny-demo/report.md). About 10 minutes on 2 cores.
#   bash scripts/demo.sh [key=value ...]      (overrides for configs/tiny.yaml)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# a new run never reuses a run directory: a second demo gets its own name
name=()
if [[ " $* " != *" run_name="* && " $* " != *" output_dir="* && -e runs/tiny-demo ]]; then
  name=("run_name=tiny-demo-$(date +%Y%m%d-%H%M%S)")
  echo "runs/tiny-demo exists: this demo writes runs/${name[0]#run_name=}"
fi
.venv/bin/envace train --config configs/tiny.yaml "$@" "${name[@]}"
echo
echo "Open the dashboard:  .venv/bin/envace-dashboard runs/   (then http://127.0.0.1:8501)"
