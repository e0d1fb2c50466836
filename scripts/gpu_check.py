"""The GPU check's stages, each in its own process under its own time cap, one JSON after each.

    python -m scripts.gpu_check --out OUTDIR                 # on the lent GPU
    (scripts/gpu_check.sh) python -m scripts.gpu_check --out OUTDIR --cpu-dry-run   # every stage at
    toy sizes on the CPU

Stages, in order (a stage that fails or runs out of time does not stop the next ones; a failed
preflight does, since nothing after it could run):

- ``preflight``: versions, the device, and every import the later stages need;
- ``gpu_tests``: ``pytest -m gpu tests/test_gpu.py`` (rollout log-probs against a fresh forward
  in fp32 and bf16, a role-wise GRPO update, split rollouts, a save/resume round trip);
- ``throughput``: ``bench.gpu_throughput`` (Qwen3-0.6B and -1.7B shapes, random weights, bf16);
- ``train``: a short ``envace train`` of the tiny cold start (``data/models/tiny-sft``) on BFCL
  tasks with the real environment's replay audit, fidelity logged per step;
- ``suite``: part of the CPU test suite, on this machine's torch/transformers/Python.

``OUTDIR`` receives ``gpu_check.json`` (rewritten after every stage), ``gpu_check.log`` (every
stage's output), the junit files, ``throughput.json`` and the training run's ``metrics.jsonl``
and ``report.md``: at most 8 files, flat, as the device tool brings back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.core.layout import AUDIT, RUN

ROOT = Path(__file__).resolve().parents[1]
TINY_SFT = ROOT / "data" / "models" / "tiny-sft"
BUDGET_S = {"gpu": 450.0, "dry": 300.0}  # the whole check; each stage also has its own cap
SUITE = {"gpu": ["tests/training/test_grpo.py", "tests/model/test_rollout.py",
                 "tests/core/test_schema.py", "tests/audit/test_scorers.py",
                 "tests/envs/test_bfcl_env.py"],
         "dry": ["tests/training/test_grpo.py"]}
# the e2e run: the tiny preset (per-turn tasks, action reward) with a few steps on the GPU
TRAIN = {"gpu": ["--config", "configs/tiny.yaml", "steps=4", "prompts_per_step=8",
                 "group_size=4", "eval_tasks=8", "checkpoint_every=2"],
         "dry": ["--config", "configs/tiny.yaml", "steps=1", "prompts_per_step=2",
                 "group_size=2", "eval_tasks=1", "max_new_tokens=24", "max_turns=2",
                 "task_unit=task", "checkpoint_every=1"]}


@dataclass
class Stage:
    name: str
    cap_s: dict[str, float]  # per mode: gpu, dry
    command: Callable[[Context], list[str]]
    collect: Callable[[Context, dict[str, Any]], None]


@dataclass
class Context:
    out: Path
    scratch: Path
    mode: str  # gpu or dry
    python: str
    log: Path


# -- stage commands and collectors ----------------------------------------------------------


def _preflight_cmd(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "scripts.gpu_check", "--probe", str(ctx.scratch / "probe.json"),
            *(["--require-cuda"] if ctx.mode == "gpu" else [])]


def _preflight_collect(ctx: Context, res: dict[str, Any]) -> None:
    res.update(_read_json(ctx.scratch / "probe.json"))


def _pytest_cmd(ctx: Context, name: str, files: list[str], marker: str) -> list[str]:
    return [ctx.python, "-m", "pytest", "-v", "-rfEs", "-p", "no:cacheprovider", "-m", marker,
            f"--junitxml={ctx.out / (name + '.xml')}", *files]


def _junit_collect(ctx: Context, res: dict[str, Any], name: str, skips_fail: bool) -> None:
    path = ctx.out / f"{name}.xml"
    if not path.exists():  # stopped at its cap: pytest writes junit at the end; count the log
        text = ctx.log.read_text().rsplit(f"===== {name} ", 1)[-1]
        seen = re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.M)
        res.update(tests=len(seen), partial=True, **{
            k: sum(o == v for _, o in seen) for k, v in (
                ("passed", "PASSED"), ("failures", "FAILED"), ("errors", "ERROR"),
                ("skipped", "SKIPPED"))})
        res["status"] = "failed"
        return
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    res.update(counts)
    cases = {}
    for case in suite.iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = tag
                res.setdefault("problems", []).append(
                    f"{case.get('name')}: {tag}: {(el.get('message') or '')[:300]}")
        props = {p.get("name"): _number(p.get("value")) for p in case.iter("property")}
        cases[case.get("name")] = {"outcome": outcome, "seconds": float(case.get("time", 0)),
                                   **({"measured": props} if props else {})}
    res["cases"] = cases
    bad = counts["failures"] + counts["errors"] + (counts["skipped"] if skips_fail else 0)
    if bad or counts["tests"] == 0:
        res["status"] = "failed"


def _gpu_tests_cmd(ctx: Context) -> list[str]:
    return _pytest_cmd(ctx, "gpu_tests", ["tests/test_gpu.py"], "gpu")


def _gpu_tests_collect(ctx: Context, res: dict[str, Any]) -> None:
    # on the GPU a skipped gpu test means CUDA was not seen: a failure of the check
    _junit_collect(ctx, res, "gpu_tests", skips_fail=True)


def _throughput_cmd(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "bench.gpu_throughput", "--out", str(ctx.out / "throughput.json"),
            *(["--toy"] if ctx.mode == "dry" else [])]


def _throughput_collect(ctx: Context, res: dict[str, Any]) -> None:
    res.update(_read_json(ctx.out / "throughput.json"))
    if not res.get("shapes"):
        res["status"] = "failed"


def _train_cmd(ctx: Context) -> list[str]:
    return [ctx.python, "-m", "scripts.gpu_check", "--train", str(ctx.scratch / "train.json"),
            "--", *TRAIN[ctx.mode], f"output_dir={ctx.scratch / 'runs'}",
            "run_name=gpu-check", f"model={TINY_SFT}"]


def _train_collect(ctx: Context, res: dict[str, Any]) -> None:
    res.update(_read_json(ctx.scratch / "train.json"))
    run = ctx.scratch / "runs" / "gpu-check"
    rows = _jsonl(run / RUN.metrics)
    for name in (RUN.metrics, RUN.report):
        if (run / name).exists():
            shutil.copy(run / name, ctx.out / f"train_{name}")
    res["steps_done"] = len(rows)
    if rows:
        steady = rows[1:] or rows  # step 0 holds the allocator's and kernels' warm-up
        mean = lambda k: sum(r.get(k, 0.0) for r in steady) / len(steady)  # noqa: E731
        res.update({
            "seconds_rollout": mean("seconds/rollout"), "seconds_audit": mean("seconds/audit"),
            "seconds_update": mean("seconds/update"), "tokens_per_s": mean("tokens_per_s"),
            "generated_tokens_per_step": mean("tokens/act") + mean("tokens/rehearse"),
            "reward_mean": [r.get("reward/mean") for r in rows],
            "ratio_mean": [r.get("ratio_mean") for r in rows],
            "fidelity": [{k: v for k, v in r.items() if k.startswith("fidelity/")}
                         for r in rows]})
        res["fidelity_logged"] = all("fidelity/divergence_rate" in r for r in rows)
    audits = sorted(p.parent.name for p in (run / RUN.audit).glob(f"step_*/{AUDIT.summary}"))
    res["audited_steps"] = len(audits)
    for split in ("dev", "dev_rehearsed"):
        summ = RUN.eval_dir(run, split) / RUN.eval_summary
        if summ.exists():
            res[f"eval_{split}"] = _scalars(_read_json(summ))
    res["checkpoints"] = sorted(p.name for p in (run / RUN.checkpoints).glob("step_*"))
    if not rows or not res.get("fidelity_logged") or not (run / RUN.report).exists():
        res["status"] = "failed"


def _suite_cmd(ctx: Context) -> list[str]:
    return _pytest_cmd(ctx, "suite", SUITE[ctx.mode], "not slow and not browser and not gpu")


def _suite_collect(ctx: Context, res: dict[str, Any]) -> None:
    _junit_collect(ctx, res, "suite", skips_fail=False)
    res.pop("cases", None)  # counts and problems are enough here
    res["files"] = SUITE[ctx.mode]


STAGES = [
    Stage("preflight", {"gpu": 60, "dry": 60}, _preflight_cmd, _preflight_collect),
    Stage("gpu_tests", {"gpu": 180, "dry": 180}, _gpu_tests_cmd, _gpu_tests_collect),
    Stage("throughput", {"gpu": 150, "dry": 60}, _throughput_cmd, _throughput_collect),
    Stage("train", {"gpu": 120, "dry": 90}, _train_cmd, _train_collect),
    Stage("suite", {"gpu": 60, "dry": 60}, _suite_cmd, _suite_collect),
]


# -- helpers --------------------------------------------------------------------------------


def _number(v: str | None) -> Any:
    try:
        return float(v) if v is not None else None
    except ValueError:
        return v


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _scalars(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if isinstance(v, int | float | str | bool)}


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def _run_capped(cmd: list[str], cap: float, log: Path, env: dict[str, str]) -> tuple[int, bool]:
    """Run ``cmd`` in its own process group, output appended to ``log``; on reaching ``cap``
    seconds the group gets SIGTERM, then SIGKILL. Returns (exit code, timed out)."""
    with open(log, "a") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            return proc.wait(timeout=cap), False
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return (proc.returncode if proc.returncode is not None else -9), True


def run_check(out: Path, dry: bool, python: str = sys.executable,
              budget_s: float | None = None, only: set[str] | None = None,
              cap_scale: float = 1.0) -> dict[str, Any]:
    """Run every stage (or the preflight and those in ``only``); ``out/gpu_check.json`` is
    rewritten after each. Returns the result. ``cap_scale`` multiplies every stage's cap and
    the default budget (a CPU shared with other jobs runs the dry run several times slower)."""
    mode = "dry" if dry else "gpu"
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="envace-gpu-check-"))
    ctx = Context(out, scratch, mode, python, out / "gpu_check.log")
    budget = budget_s if budget_s is not None else BUDGET_S[mode] * cap_scale
    start = time.monotonic()
    result: dict[str, Any] = {
        "check": "envace gpu_check", "mode": "cpu-dry-run" if dry else "gpu",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
        "budget_s": budget, "cap_scale": cap_scale, "stages": {}, "finished": False}
    json_path = out / "gpu_check.json"
    _write(json_path, result)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
               "PYTHONPATH")])])}
    if dry:
        env["ENVACE_GPU_TESTS_ON_CPU"] = "1"
    stop_reason = None
    stages = [s for s in STAGES if only is None or s.name in only or s.name == "preflight"]
    unknown = (only or set()) - {s.name for s in STAGES}
    if unknown:
        raise ValueError(f"unknown stages {sorted(unknown)}: {[s.name for s in STAGES]}")
    result["selected"] = [s.name for s in stages]
    for stage in stages:
        left = budget - (time.monotonic() - start)
        cap = min(stage.cap_s[mode] * cap_scale, left)
        res: dict[str, Any] = {"cap_s": round(cap, 1)}
        if stop_reason or left < 5:
            res.update(status="skipped", reason=stop_reason or "the check's time budget is spent")
            result["stages"][stage.name] = res
            _write(json_path, result)
            _say(f"{stage.name:10s} skipped: {res['reason']}")
            continue
        for old in out.glob(f"{stage.name}*"):  # a previous run's outputs of this stage
            old.unlink()
        cmd = stage.command(ctx)
        with open(ctx.log, "a") as fh:
            fh.write(f"\n===== {stage.name} (cap {cap:.0f} s): {' '.join(cmd)}\n")
        t = time.monotonic()
        code, timed_out = _run_capped(cmd, cap, ctx.log, env)
        res.update(seconds=round(time.monotonic() - t, 1), exit_code=code, timed_out=timed_out,
                   status="ok" if code == 0 else ("timeout" if timed_out else "failed"))
        try:
            stage.collect(ctx, res)
        except Exception as exc:  # a collector's bug must not lose the other stages
            res.update(status="failed", collect_error=f"{type(exc).__name__}: {exc}")
        if timed_out:
            res["status"] = "timeout"
        result["stages"][stage.name] = res
        _write(json_path, result)
        _say(f"{stage.name:10s} {res['status']:8s} {res['seconds']:6.1f} s  "
             f"{_brief(stage.name, res)}")
        if stage.name == "preflight" and res["status"] != "ok":
            stop_reason = f"preflight failed: {res.get('reason') or _last_line(ctx.log)}"
    result["seconds"] = round(time.monotonic() - start, 1)
    result["ok"] = all(s.get("status") == "ok" for s in result["stages"].values())
    result["finished"] = True
    _write(json_path, result)
    shutil.rmtree(scratch, ignore_errors=True)
    return result


def _last_line(log: Path) -> str:
    lines = [x for x in log.read_text().splitlines() if x.strip()] if log.exists() else []
    return lines[-1][:300] if lines else "no output"


def _brief(name: str, res: dict[str, Any]) -> str:
    if name == "preflight":
        return f"{res.get('device', '?')}, torch {res.get('torch', '?')}, " \
            f"transformers {res.get('transformers', '?')}, Python {res.get('python', '?')}"
    if name in ("gpu_tests", "suite"):
        return f"{res.get('passed', 0)} passed, {res.get('failures', 0)} failed, " \
            f"{res.get('errors', 0)} errors, {res.get('skipped', 0)} skipped"
    if name == "throughput":
        parts = []
        for shape, row in (res.get("shapes") or {}).items():
            gen = max((r["generated_tokens_per_s"] for r in row.get("rollout", [])), default=0)
            upd = (row.get("update") or {}).get("tokens_per_s", 0)
            parts.append(f"{shape}: rollout {gen:.0f} gen tok/s, update {upd:.0f} tok/s")
        return "; ".join(parts) or "nothing measured"
    if name == "train":
        return f"{res.get('steps_done', 0)} steps, fidelity logged {res.get('fidelity_logged')}" \
            f", peak {res.get('peak_memory_gib', float('nan')):.2f} GiB on {res.get('device')}"
    return ""


def _say(msg: str) -> None:
    print(f"[gpu_check] {msg}", flush=True)


# -- the in-process helpers the stages call --------------------------------------------------


def probe(path: Path, require_cuda: bool) -> int:
    """Write versions, the device and the import check to ``path``; 1 with a one-line reason
    when something the later stages need is missing."""
    import importlib
    import importlib.metadata as md

    info: dict[str, Any] = {"python": platform.python_version(), "executable": sys.executable}
    for dist in ("torch", "transformers", "accelerate", "tokenizers", "safetensors", "numpy",
                 "pydantic", "pydantic-core", "rapidfuzz", "bfcl-eval", "pytest"):
        try:
            info[dist] = md.version(dist)
        except md.PackageNotFoundError:
            info[dist] = None
    problems = []
    for mod in ("torch", "transformers", "pydantic", "rapidfuzz", "bfcl_eval", "yaml", "scipy",
                "sklearn", "matplotlib", "pytest", "envace.cli", "envace.training.command",
                "envace.training.train", "envace.model.rollout", "audit.pipeline",
                "bench.gpu_throughput"):
        try:
            importlib.import_module(mod)
        except Exception as exc:
            problems.append(f"import {mod}: {type(exc).__name__}: {exc}"[:200])
    try:
        from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

        from envace.core.envs.bfcl.tasks import BACKENDS
        for name in BACKENDS:
            importlib.import_module(CLASS_FILE_PATH_MAPPING[name])
    except Exception as exc:
        problems.append(f"BFCL backends: {type(exc).__name__}: {exc}"[:200])
    import torch

    info["cuda_available"] = torch.cuda.is_available()
    info["torch_cuda"] = torch.version.cuda
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=p.name, device_count=torch.cuda.device_count(),
                    capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                    memory_gib=round(p.total_memory / 2**30, 1))
        smi = shutil.which("nvidia-smi")
        if smi:
            q = subprocess.run([smi, "--query-gpu=driver_version,clocks.sm,memory.used",
                                "--format=csv,noheader"], capture_output=True, text=True)
            info["nvidia_smi"] = q.stdout.strip()
    else:
        info["device"] = f"cpu ({platform.machine()}, {os.cpu_count()} cores)"
        if require_cuda:
            problems.insert(0, f"no CUDA device visible to torch {torch.__version__}")
    info["problems"] = problems
    if problems:
        info["reason"] = problems[0]
    path.write_text(json.dumps(info, indent=1))
    if problems:
        print(f"[gpu_check] preflight: {problems[0]}", file=sys.stderr)
        return 1
    return 0


def train_stage(summary: Path, args: list[str]) -> int:
    """``envace train ARGS`` in this process; then the device it ran on and its peak memory."""
    import torch

    from envace.cli import main as envace_main

    t = time.monotonic()
    code = envace_main(["train", *args])
    info: dict[str, Any] = {"exit_code_train": code, "wall_s": round(time.monotonic() - t, 1),
                            "args": args}
    if torch.cuda.is_available():
        info.update(device=torch.cuda.get_device_name(0),
                    peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
    else:
        import resource

        info.update(device="cpu",
                    peak_memory_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    summary.write_text(json.dumps(info, indent=1))
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="the check's output folder")
    ap.add_argument("--cpu-dry-run", action="store_true", help="every stage at toy sizes, CPU")
    ap.add_argument("--budget-s", type=float, help="the whole check's time cap")
    ap.add_argument("--cap-scale", type=float, default=float(
        os.environ.get("ENVACE_GPU_CAP_SCALE", "1")), help="multiply every time cap (1)")
    ap.add_argument("--stages", help="comma-separated: only these (and the preflight), e.g. "
                    "for a rerun of the one that failed")
    ap.add_argument("--probe", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--require-cuda", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--train", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.probe:
        return probe(args.probe, args.require_cuda)
    if args.train:
        return train_stage(args.train, args.rest)
    if args.out is None:
        ap.error("--out OUTDIR is required")
    only = {x.strip() for x in args.stages.split(",") if x.strip()} if args.stages else None
    res = run_check(args.out, args.cpu_dry_run, budget_s=args.budget_s, only=only,
                    cap_scale=args.cap_scale)
    _print_tables(res)
    bad = [f"{k}: {v.get('status')}" for k, v in res["stages"].items() if v.get("status") != "ok"]
    _say(f"{'all stages ok' if not bad else 'NOT OK: ' + ', '.join(bad)} in {res['seconds']} s; "
         f"{args.out / 'gpu_check.json'}")
    return 0 if res["ok"] else 1


def _print_tables(res: dict[str, Any]) -> None:
    tp = res["stages"].get("throughput", {})
    for name, text in (tp.get("tables") or {}).items():
        print(f"\n[gpu_check] throughput: {name}\n{text}")
    gt = res["stages"].get("gpu_tests", {})
    for case, c in (gt.get("cases") or {}).items():
        measured = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                             for k, v in (c.get("measured") or {}).items())
        print(f"[gpu_check] {c['outcome']:7s} {case} {measured}")
    for p in gt.get("problems", []):
        print(f"[gpu_check]   {p}")
    print()


if __name__ == "__main__":
    sys.exit(main())
