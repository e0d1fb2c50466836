#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: ruff, then pytest. CI runs exactly this.
#   bash scripts/test.sh [pytest args...]
# Two pytest workers (pytest-xdist), a test file's tests on one worker (its module fixtures built
# once); ENVACE_TEST_WORKERS=0 runs in one process, and "-n N" after it overrides. On the two
# shared cores (2026-12-06) the suite took 26 min with two workers; in one process it had taken
# 56 min, 14 of them two tests that evaluated every dev task (since cut to one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
.venv/bin/ruff check .
.venv/bin/python -m pytest -q -n "${ENVACE_TEST_WORKERS:-2}" --dist loadfile "$@"
