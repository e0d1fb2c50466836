"""The held-out test split, read once: the best world model of the skill bench on BFCL test.

    .venv/bin/python -m experiments.world_model_test --keep runs/world_model_skill

Every choice of issue #17 (which lever, which model, which options) is made on the dev split by
`experiments.world_model_skill`, whose result file names the winner under ``best`` (its
``probe_args``). This probes exactly that world model, teacher-forced and greedy on every
ground-truth call of the **test** split (``envace data export-real --split test``), against the same
reference (the lookup and majority built from the train split), one thread, and writes
``bench/results/world_model_skill_test.json``: the test skill block (point and trajectory-bootstrap
interval, by read/write tool and by novelty) beside the dev figures it was chosen on.

Test is read once. The result file keeps every look (``looks``); when one is already recorded,
the bench refuses (exit 2) unless ``--again`` is given, and then records the new look as a
second one: a world model chosen after seeing test figures is chosen on test, and the file says
so. The model folder must exist (``best.files`` says how each file and folder is made).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import machine
from bench.machine import write_result
from envace.core.layout import AUDIT
from experiments.world_model_skill import EXPORT, TRAIN, cell_result, dirname

TEST = "test.jsonl"
TEST_EXPORT = "envace data export-real --split test --out test.jsonl"


def best_of(result: dict[str, Any]) -> dict[str, Any]:
    """The ``best`` block of a skill-bench result; ValueError (one line) when it has none."""
    best = result.get("best") if isinstance(result, dict) else None
    if not isinstance(best, dict) or not isinstance(best.get("probe_args"), list):
        raise ValueError("the skill result names no best world model: run "
                         "experiments.world_model_skill")
    return best


def previous_looks(path: Path) -> list[dict[str, Any]]:
    """The looks at test already recorded in `path` ([] when there is no such file)."""
    if not path.is_file():
        return []
    try:
        old = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    looks = old.get("looks") if isinstance(old, dict) else None
    return list(looks) if isinstance(looks, list) else []


def refusal(looks: list[dict[str, Any]], again: bool) -> str | None:
    """Why test may not be read now (one line), or None."""
    if looks and not again:
        last = looks[-1]
        return (f"the test split was already read ({last.get('label')}, {last.get('date')}); a "
                "second look is a choice made on test: --again records it as one")
    return None


def probe_argv(probe_args: list[str], data: Path, out: Path) -> list[str]:
    """The `envace probe` command of the best world model on the test split."""
    real = [str(data / a) if a in EXPORT else a for a in probe_args]
    return [sys.executable, "-m", "envace.cli", "probe", *real, str(data / TEST),
            "--reference", str(data / TRAIN), "--out", str(out), "--quiet"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep", required=True, help="where the skill bench keeps its data; the "
                    "test audit goes here too")
    ap.add_argument("--skill", default="world_model_skill",
                    help="the skill bench's result name (bench/results/<name>.json)")
    ap.add_argument("--name", default="world_model_skill_test")
    ap.add_argument("--again", action="store_true",
                    help="read test although a look is recorded (recorded as another look)")
    args = ap.parse_args(argv)
    out_path = machine.RESULTS / f"{args.name}.json"
    try:
        best = best_of(json.loads((machine.RESULTS / f"{args.skill}.json").read_text()))
        looks = previous_looks(out_path)
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        print(f"experiments.world_model_test: {exc}", file=sys.stderr)
        return 2
    why = refusal(looks, args.again)
    if why:
        print(f"experiments.world_model_test: {why}", file=sys.stderr)
        return 2
    keep = Path(args.keep)
    data = keep / "data"
    data.mkdir(parents=True, exist_ok=True)
    for f, cmd in {**EXPORT, TEST: TEST_EXPORT}.items():
        if not (data / f).is_file():
            parts = cmd.split()
            subprocess.run([sys.executable, "-m", "envace.cli", *parts[1:-1], str(data / f)],
                           check=True, capture_output=True)
    out = keep / f"test_{dirname(best['label'])}_{len(looks) + 1}"
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    r = subprocess.run(probe_argv(best["probe_args"], data, out),
                       env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    if r.returncode != 0 or not (out / AUDIT.summary).is_file():
        print(f"experiments.world_model_test: probe failed ({r.returncode}): "
              f"{r.stderr.strip()[-500:]}", file=sys.stderr)
        return 1
    cell = cell_result(json.loads((out / AUDIT.summary).read_text()))
    look = {"label": best["label"], "probe_args": best["probe_args"],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": time.perf_counter() - t0,
            "audit": str(out), "dev_skill": best.get("skill"), "test": cell}
    path = write_result(args.name, {
        "split": "test", "reference": "train", "decoding": "greedy, teacher-forced",
        "threads": 1, "files": {**best.get("files", {}), TEST: TEST_EXPORT},
        "command": "python -m experiments.world_model_test --keep " + str(keep)
                   + (" --again" if args.again else ""),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "looks": [*looks, look], "latest": look})
    s = cell["skill"]
    shown = ", ".join(f"{k} {s.get(k)}" for k in ("point", "lo", "hi", "n"))
    print(f"{best['label']}: test skill {shown} (dev {best['skill'].get('point')}); wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
