"""The scripts that run one audit across machines (docs/scaling.md): a Ray driver whose merged
shards are the single run's audit (skipped where Ray is not installed: `envace[ray]`), and a
Slurm array submission checked against a stand-in `sbatch` that records its arguments."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

ROOT = Path(__file__).resolve().parents[2]


def _input(path: Path) -> str:
    trajs = list(export_real(split_tasks("dev")[:6]))
    for k, t in enumerate(trajs):
        for st in t.tool_steps():
            st.response.rehearsed = True
            if (st.step + k) % 2 == 0:
                st.response.content = json.dumps({"rehearsed": st.step})
    with TrajectoryWriter(path, mode="w") as w:
        for t in trajs:
            w.write(t)
    return str(path)


def test_ray_shards_merge_into_the_single_run(tmp_path):
    pytest.importorskip("ray")
    spec = importlib.util.spec_from_file_location("audit_ray", ROOT / "scripts" / "audit_ray.py")
    audit_ray = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(audit_ray)
    inp = _input(tmp_path / "in.jsonl")
    run_audit([inp], tmp_path / "single", AuditOptions(progress=False))
    code = audit_ray.run([inp], 2, str(tmp_path / "work"), str(tmp_path / "merged"), num_cpus=2)
    assert code == 0
    for name in ("steps.jsonl", "trajectories.jsonl"):
        assert (tmp_path / "merged" / name).read_bytes() == (tmp_path / "single" / name
                                                              ).read_bytes()
    one, merged = (json.loads((tmp_path / d / "summary.json").read_text())
                   for d in ("single", "merged"))
    one.pop("seconds"), merged.pop("seconds")
    assert merged == one


def test_the_slurm_script_submits_an_array_and_a_dependent_merge(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "sbatch.log"
    (fake / "sbatch").write_text(f"#!/usr/bin/env bash\nprintf '%s\\n' \"$@\" >> {log}\n"
                                 "echo 77\n")
    (fake / "sbatch").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    script = str(ROOT / "scripts" / "audit_slurm.sh")
    work = tmp_path / "my work"
    r = subprocess.run(["bash", script, "3", str(work), str(tmp_path / "out"),
                        str(tmp_path / "a b.jsonl"), "--", "--threshold", "0.9"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    args = log.read_text()
    assert "--array=0-2" in args and "--dependency=afterok:77" in args
    assert "--shard ${SLURM_ARRAY_TASK_ID}/3" in args and "--threshold 0.9" in args
    assert "a\\ b.jsonl" in args and "my\\ work/shard_2" in args  # quoted for the job's shell
    assert "merge " in args and work.is_dir()
    bad = subprocess.run(["bash", script, "0", str(work), "o", "i"], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2 and "positive integer" in bad.stderr
