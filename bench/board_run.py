"""Benchmark record of one `envace board` run: the board with its command, machine and load.

    .venv/bin/python -m bench.board_run --models models.yaml --envs bfcl agentdojo tau2 \\
        --limit 25 --out boards/dev-smollm2 --name board_dev_smollm2 \\
        [--serve smollm2=smollm2 --vllm-python .venv-vllm/bin/python] [-- --history both]

Runs the user's command, ``python -m envace.cli board --models M --envs ... --split S --out O``
(arguments after ``--`` are passed on), as a subprocess, and writes
``bench/results/<--name>.json``: the command, the machine, the load average at the start and
end, the wall-clock seconds, the models file's text, how each local model folder `envace sft`
made was made (``models_made``: steps reached, what stopped it, its command) and the finished
``board.json`` (its cells, each with its seconds). With ``--serve MODEL=NAME`` it first starts a
real vLLM OpenAI-compatible server (``VLLM_PYTHON -m vllm.entrypoints.openai.api_server``:
fp32, seed 0, eager, at most 8 sequences, a context of the model's positions up to 8,192 or
``--max-model-len``) over the local model ``MODEL`` (a folder or a name
``envace.model.models.resolve_model`` knows) served as ``NAME``
on a free port, waits until it answers, writes its URL wherever the models file says
``${ENVACE_BOARD_ENDPOINT}`` (``endpoint: "${ENVACE_BOARD_ENDPOINT}#NAME"``; into a temporary
copy, the user's file untouched) and always stops it afterwards; the server's startup seconds
are recorded (`envace.model.vllm_server`, the helper the vLLM lane's fixtures use).
Nothing here decides a figure: the board's cells are the board's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.machine import run_record, write_result
from envace.core.errors import UsageError
from envace.evaluation.board_models import read_models
from envace.model.models import default_cache_dir, position_limit, resolve_model, sft_made
from envace.model.vllm_server import ServerError, VLLMServer

ROOT = Path(__file__).resolve().parents[1]
START_DEADLINE_S = 600.0
#: the served context when neither --max-model-len nor a smaller model limit says otherwise
SERVED_CONTEXT = 8192


def models_made(models_file: str) -> dict[str, dict[str, Any]]:
    """For each local model of the models file that `envace sft` made, how it was made
    (`envace.model.models.sft_made`); {} for a file the board will refuse."""
    try:
        specs = read_models(models_file)
    except UsageError:
        return {}
    made = {name: sft_made(spec.model) for name, spec in specs.items() if spec.model}
    return {name: m for name, m in made.items() if m is not None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", required=True, help="the board's models file")
    ap.add_argument("--envs", nargs="+", required=True)
    ap.add_argument("--split", default="dev")
    ap.add_argument("--limit", type=int, default=0, help="passed to envace board (0: all)")
    ap.add_argument("--out", required=True, help="the board's directory (resumed if its own)")
    ap.add_argument("--name", required=True, help="bench/results/<name>.json")
    ap.add_argument("--serve", help="MODEL=NAME: serve MODEL with vLLM as NAME during the run")
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="the served context (default: the model's positions, at most "
                         f"{SERVED_CONTEXT})")
    ap.add_argument("rest", nargs="*", help="after --: more envace board arguments")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    models_text = Path(args.models).read_text()
    record: dict[str, Any] = {"models_file": models_text, "models_made": models_made(args.models)}
    server: VLLMServer | None = None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="board-run-")
    try:
        models_path = Path(args.models)
        if args.serve:
            model, _, name = args.serve.partition("=")
            path = resolve_model(model, default_cache_dir())
            max_len = args.max_model_len or min(SERVED_CONTEXT,
                                                position_limit(path) or SERVED_CONTEXT)
            try:
                server = VLLMServer.start(path, name or model,
                                          out.parent / f"{out.name}.vllm-server.log",
                                          python=args.vllm_python, deadline_s=START_DEADLINE_S,
                                          max_model_len=max_len)
            except ServerError as e:
                raise SystemExit(str(e)) from None
            record["server"] = {"model": model, "served_as": name or model,
                                "startup_s": server.startup_s,
                                "flags": "fp32, seed 0, --enforce-eager, --max-num-seqs 8",
                                "max_model_len": max_len}
            models_path = Path(tmp.name) / "models.yaml"
            models_path.write_text(models_text.replace("${ENVACE_BOARD_ENDPOINT}", server.url))
        cmd = [sys.executable, "-m", "envace.cli", "board", "--models", str(models_path),
               "--envs", *args.envs, "--split", args.split, "--out", str(out),
               "--limit", str(args.limit), *args.rest]
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        record["wall_seconds"] = round(time.monotonic() - t0, 1)
        record["returncode"] = rc
    finally:
        if server is not None:
            server.stop()
        tmp.cleanup()
    board_file = out / "board.json"
    record["board"] = json.loads(board_file.read_text()) if board_file.exists() else None
    rec = run_record("bench.board_run", argv, load_start)
    path = write_result(args.name, {**rec, **record})
    cells = (record["board"] or {}).get("cells", [])
    for c in cells:
        ex = c.get("exact") or {}
        print(f"{c.get('env')!s:10} {c.get('model')!s:14} {c.get('status')!s:6} "
              f"exact {ex.get('point')} [{ex.get('lo')}, {ex.get('hi')}] {c.get('seconds')} s")
    print(f"wrote {path} (envace board exit {record['returncode']})")
    return int(record["returncode"])


if __name__ == "__main__":
    raise SystemExit(main())
