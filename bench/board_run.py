"""Benchmark record of one `envace board` run: the board with its command, machine and load.

    .venv/bin/python -m bench.board_run --models models.yaml --envs bfcl agentdojo tau2 \\
        --limit 25 --out boards/dev-smollm2 --name board_dev_smollm2 \\
        [--serve smollm2=smollm2 --vllm-python .venv-vllm/bin/python] [-- --history both]

Runs the user's command, ``python -m envace.cli board --models M --envs ... --split S --out O``
(arguments after ``--`` are passed on), as a subprocess, and writes
``bench/results/<--name>.json``: the command, the machine, the load average at the start and
end, the wall-clock seconds, the models file's text and the finished ``board.json`` (its cells,
each with its seconds). With ``--serve MODEL=NAME`` it first starts a real vLLM
OpenAI-compatible server (``VLLM_PYTHON -m vllm.entrypoints.openai.api_server``: fp32, seed 0,
eager, at most 8 sequences; the flags of the vLLM lane's endpoint test) over the local model
``MODEL`` (a folder or a name ``envace.model.models.resolve_model`` knows) served as ``NAME``
on a free port, waits until it answers, writes its URL wherever the models file says
``${ENVACE_BOARD_ENDPOINT}`` (``endpoint: "${ENVACE_BOARD_ENDPOINT}#NAME"``; into a temporary
copy, the user's file untouched) and always stops it afterwards; the server's startup seconds
are recorded. The server start repeats the vLLM lane's fixtures (tests/vllm): one helper for
the three is still to be made.
Nothing here decides a figure: the board's cells are the board's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.machine import run_record, write_result

ROOT = Path(__file__).resolve().parents[1]
START_DEADLINE_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
            proc.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def serve(python: str, model: str, name: str, log: Path) -> tuple[subprocess.Popen, str, float]:
    """Start a vLLM server over ``model`` served as ``name``; its process, URL and startup s."""
    from envace.model.models import default_cache_dir, resolve_model

    path = resolve_model(model, default_cache_dir())
    port = free_port()
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", "8192", "--seed", "0", "--enforce-eager",
           "--max-num-seqs", "8"]
    url = f"http://127.0.0.1:{port}/v1"
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"vLLM server exited ({proc.returncode}); its log: {log}")
        try:
            with urllib.request.urlopen(url + "/models", timeout=5) as r:
                if name in r.read().decode():
                    return proc, url, time.monotonic() - t0
        except OSError:
            pass
        if time.monotonic() - t0 > START_DEADLINE_S:
            stop(proc)
            raise SystemExit(f"vLLM server not up in {START_DEADLINE_S:.0f} s; its log: {log}")
        time.sleep(2)


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
    ap.add_argument("rest", nargs="*", help="after --: more envace board arguments")
    args = ap.parse_args(argv)
    load_start = os.getloadavg()
    models_text = Path(args.models).read_text()
    record: dict[str, Any] = {"models_file": models_text}
    proc = None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix="board-run-")
    try:
        models_path = Path(args.models)
        if args.serve:
            model, _, name = args.serve.partition("=")
            proc, url, up_s = serve(args.vllm_python, model, name or model,
                                    out.parent / f"{out.name}.vllm-server.log")
            record["server"] = {"model": model, "served_as": name or model, "startup_s": up_s,
                                "flags": "fp32, seed 0, --enforce-eager, --max-num-seqs 8"}
            models_path = Path(tmp.name) / "models.yaml"
            models_path.write_text(models_text.replace("${ENVACE_BOARD_ENDPOINT}", url))
        cmd = [sys.executable, "-m", "envace.cli", "board", "--models", str(models_path),
               "--envs", *args.envs, "--split", args.split, "--out", str(out),
               "--limit", str(args.limit), *args.rest]
        t0 = time.monotonic()
        rc = subprocess.run(cmd, cwd=ROOT).returncode
        record["wall_seconds"] = round(time.monotonic() - t0, 1)
        record["returncode"] = rc
    finally:
        if proc is not None:
            stop(proc)
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
