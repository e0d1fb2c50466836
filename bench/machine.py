"""Machine facts recorded beside every benchmark figure, and the shared result writer."""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().split("\n")[0].split()[1]
        info["mem_gib"] = round(int(mem) / 2**20, 1)
    except OSError:
        pass
    return info


def write_result(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "machine": machine(), **data}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def run_record(module: str, argv: list[str] | None,
               load_start: tuple[float, float, float]) -> dict[str, Any]:
    """What every result file records about its run: the command that made it (`argv`, or the
    process's own arguments when None; quoted as a shell needs them), the load average at its
    start and end, and whether the machine was quiet (1-minute load below 1.5 at both)."""
    end = os.getloadavg()
    args = sys.argv[1:] if argv is None else argv
    return {"command": shlex.join(["python", "-m", module, *args]),
            "load_average": {"start": list(load_start), "end": list(end)},
            "quiet_machine": max(load_start[0], end[0]) < 1.5}


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [header] + [[f"{c:.4g}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))  # noqa: E731
    return "\n".join([fmt(cells[0]), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells[1:]])
