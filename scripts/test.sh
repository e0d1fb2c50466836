#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: ruff, then pytest. CI runs exactly this.
#   bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
.venv/bin/ruff check .
.venv/bin/python -m pytest -q "$@"
