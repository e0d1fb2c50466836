#!/usr/bin/env bash
# Download, here (where PyPI answers), the wheels the GPU check needs on the lent GPU machine
# (Python 3.12, manylinux x86-64, torch/transformers/accelerate/numpy/scipy/... preinstalled,
# no registry), into .gpu-wheels/ (git-ignored: name it in the device run's `carry`).
#   bash scripts/gpu_wheels.sh            # then: bash scripts/gpu_check.sh OUTDIR (on the device)
# Each wheel is pinned to the version the CPU suite runs with and fetched --no-deps: the machine
# has every other dependency (docs/gpu_check.md lists what it holds). Prints each wheel's size
# and the total, and fails when the repository that travels (tracked + untracked-not-ignored
# files) plus the wheels would exceed ENVACE_TRAVEL_MAX_MIB (56; the device takes 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${ENVACE_GPU_WHEELS:-.gpu-wheels}
MAX_MIB=${ENVACE_TRAVEL_MAX_MIB:-56}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
# what envace imports on the check's paths that the machine lacks (docs/gpu_check.md):
#   bfcl-eval      the executable BFCL backends, tasks and docs (--no-deps: it pins API clients)
#   rapidfuzz      the audit's fuzzy scorers
#   pydantic (+ pydantic-core, annotated-types, typing-inspection): the trajectory models
#   mpmath, overrides: what bfcl-eval's backends import (mpmath is also there, via sympy)
#   typing-extensions: pydantic 2.14 needs a recent one; the machine's version is not known
WHEELS=(
  "bfcl-eval==2026.3.23"
  "rapidfuzz==3.14.6"
  "pydantic==2.14.4"
  "pydantic-core==2.50.5"
  "annotated-types==0.8.0"
  "typing-inspection==0.4.5"
  "typing-extensions==4.16.0"
  "mpmath==1.3.0"
  "overrides==7.7.0"
)
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do
  PLATFORMS+=(--platform "$p")
done
tmp="$DIR.tmp"
rm -rf "$tmp"
mkdir -p "$tmp"
echo "[gpu_wheels] downloading ${#WHEELS[@]} wheels for CPython 3.12, manylinux x86-64"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" -d "$tmp" "${WHEELS[@]}"
printf '%s\n' "${WHEELS[@]}" > "$tmp/MANIFEST"
rm -rf "$DIR"
mv "$tmp" "$DIR"
"$PY" - "$DIR" "$MAX_MIB" <<'PYEOF'
import subprocess
import sys
from pathlib import Path

folder, max_mib = Path(sys.argv[1]), float(sys.argv[2])
wanted = [line.split("==")[0].replace("-", "_").lower()
          for line in (folder / "MANIFEST").read_text().split()]
wheels = sorted(folder.glob("*.whl"))
names = [w.name.split("-")[0].lower() for w in wheels]
for want in wanted:
    if names.count(want) != 1:
        sys.exit(f"[gpu_wheels] expected one wheel of {want}, found {names.count(want)}")
mib = 2 ** 20
for w in wheels:
    print(f"  {w.stat().st_size / mib:7.2f} MiB  {w.name}")
wheel_bytes = sum(w.stat().st_size for w in wheels)
# what travels with a device run: tracked and untracked-not-ignored files (plus carried paths)
files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], check=True,
                       capture_output=True).stdout.decode().split("\0")
repo_bytes = sum(Path(f).stat().st_size for f in files if f and Path(f).is_file())
total = (wheel_bytes + repo_bytes) / mib
print(f"[gpu_wheels] wheels {wheel_bytes / mib:.2f} MiB + repository {repo_bytes / mib:.2f} MiB"
      f" = {total:.2f} MiB to travel (cap {max_mib:g} MiB; the device takes 64)")
if total > max_mib:
    sys.exit(f"[gpu_wheels] {total:.2f} MiB would travel, over {max_mib:g} MiB: leave something "
             "out (an untracked file in the tree travels too)")
PYEOF
echo "[gpu_wheels] ready: $DIR (carry it: run(command=\"bash scripts/gpu_check.sh \$OUT\", carry=[\"$DIR\"]))"
