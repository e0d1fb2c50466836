#!/usr/bin/env bash
# The vLLM lane: set up .venv-vllm (idempotent; ~3.5 min cold) and run tests/vllm/ in it.
# CI runs it as a separate lane after scripts/test.sh. The main suite never collects tests/vllm/.
#   bash scripts/test_vllm.sh [pytest args...]
#   bash scripts/test_vllm.sh tests/vllm/test_vllm_endpoint.py [pytest args...]   (one file)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_vllm.sh
# vLLM's CPU engine keeps OpenMP threads bound to the cores; spinning, they slow the trainer's
# torch ops in the same process about 10x (measured): idle OpenMP threads must sleep
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} TOKENIZERS_PARALLELISM=false
# a first argument naming a test path replaces the whole lane
if [ $# -gt 0 ] && [ -e "${1%%::*}" ]; then targets=(); else targets=(tests/vllm); fi
exec .venv-vllm/bin/python -m pytest -q "${targets[@]}" "$@"
