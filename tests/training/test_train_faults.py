"""Issue #39, training faults: a damaged newest checkpoint, a full disk, a read-only output_dir,
two resumes of one run at once, and one run spelled two ways.

Small and real: checkpoint files are written by torch and safetensors themselves, then cut; the
full disk is a 20 MB tmpfs and the read-only directory a read-only tmpfs (mounting needs root:
skipped with the reason otherwise). Model loading is replaced by a tripwire where a test is
about what happens before it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from envace import cli
from envace.training.checkpoint import CheckpointWriteError, save_checkpoint
from envace.training.config import TrainConfig, dump_yaml, load_config
from envace.training.resume import RunDirError, RunLock, checkpoint_problem, plan_resume
from tests.conftest import ROOT


class Loaded(Exception):
    """Raised instead of loading a model: the command got past every check."""


@pytest.fixture
def tripwire(monkeypatch):
    def build_policy(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr("envace.training.train.build_policy", build_policy)


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(["train", *argv, "--quiet"])
    return rc, capsys.readouterr().err


def _checkpoint(run: Path, step: int) -> Path:
    """A checkpoint folder as save_checkpoint lays it out, its files real (small)."""
    d = run / "checkpoints" / f"step_{step}"
    (d / "policy").mkdir(parents=True)
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(d / "policy" /
                                                                  "model.safetensors"))
    torch.save({"optimizers": {}, "schedulers": {}, "rng": None}, d / "trainer_state.pt")
    (d / "trainer_state.json").write_text(json.dumps({"step": step}))
    return d


def _run_dir(tmp_path: Path, steps: int = 3, ckpts: tuple[int, ...] = (1, 2)) -> Path:
    run = tmp_path / "r"
    run.mkdir()
    cfg = load_config(TrainConfig, ROOT / "configs" / "tiny.yaml",
                      [f"output_dir={tmp_path}", "run_name=r", "kl_coef=0"])
    dump_yaml(cfg, run / "config.yaml")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n"
                                               for s in range(steps)))
    for c in ckpts:
        _checkpoint(run, c)
    return run


def _cut(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("damage", ["policy/model.safetensors", "trainer_state.json",
                                    "trainer_state.pt"])
def test_a_truncated_newest_checkpoint_resumes_from_the_intact_one_before(tmp_path, capsys,
                                                                         tripwire, damage):
    """Before: a traceback. Now: one line naming the damage, and the run resumes from step_1
    (its rows and checkpoint make the resumption exact; step 2 is redone)."""
    run = _run_dir(tmp_path)
    assert checkpoint_problem(run, 2) is None
    _cut(run / "checkpoints" / "step_2" / damage)
    assert checkpoint_problem(run, 2) is not None
    plan = plan_resume(run)
    assert plan.step == 1 and plan.redo == [2] and [s for s, _ in plan.damaged] == [2]
    with pytest.raises(Loaded):
        _run(capsys, "--resume", str(run))
    err = capsys.readouterr().err
    assert "checkpoint step_2 is damaged" in err and "resuming from step_1" in err
    assert "Traceback" not in err


def test_every_checkpoint_damaged_is_one_clear_refusal(tmp_path, capsys, tripwire):
    run = _run_dir(tmp_path)
    for c in (1, 2):
        _cut(run / "checkpoints" / f"step_{c}" / "policy" / "model.safetensors")
    rc, err = _run(capsys, "--resume", str(run))
    assert rc == 2 and "every checkpoint is damaged" in err and "Traceback" not in err


def test_a_second_resume_of_a_run_in_training_is_refused(tmp_path, capsys, tripwire):
    """Before: both ran, metrics.jsonl steps [0, 1, 2, 2, 3, 3]."""
    run = _run_dir(tmp_path)
    held = RunLock(run).acquire()  # what the first `envace train --resume` holds while it runs
    try:
        rc, err = _run(capsys, "--resume", str(run))
        assert rc == 2 and "being trained by another envace train" in err
    finally:
        held.release()
    assert not (run / ".train.lock").exists()
    with pytest.raises(Loaded):  # once it is free, it resumes
        _run(capsys, "--resume", str(run))


def test_the_lock_is_held_across_processes(tmp_path):
    run = _run_dir(tmp_path, ckpts=())
    code = ("import sys, time; from pathlib import Path; "
            "from envace.training.resume import RunLock; "
            f"RunLock(Path({str(run)!r})).acquire(); print('held', flush=True); time.sleep(30)")
    p = subprocess.Popen([os.sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(RunDirError, match="being trained"):
            RunLock(run).acquire()
    finally:
        p.kill()
        p.wait()
    RunLock(run).acquire().release()  # the kernel released it with the process


@pytest.mark.parametrize("spelling", ["relative", "dot", "absolute_from_elsewhere"])
def test_one_run_spelled_two_ways_is_one_run(tmp_path, capsys, tripwire, monkeypatch,
                                             spelling):
    """Before: refused as "made by another configuration" (output_dir: 'runs' -> '/abs/runs')."""
    run = _run_dir(tmp_path, ckpts=())
    monkeypatch.chdir(tmp_path if spelling != "absolute_from_elsewhere" else "/")
    arg = {"relative": "r", "dot": "./r", "absolute_from_elsewhere": str(run)}[spelling]
    with pytest.raises(Loaded):
        _run(capsys, "--resume", arg, "--restart")


@contextlib.contextmanager
def _tmpfs(where: Path, size: str = "20m", ro: bool = False):
    where.mkdir()
    opts = f"size={size}" + (",ro" if ro else "")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_a_checkpoint_on_a_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """Before: torch's "unexpected pos" traceback, and a .step_0.tmp filling the disk."""
    with _tmpfs(tmp_path / "disk") as disk:
        run = disk / "r"
        run.mkdir()
        big = {"adam": {"m": torch.zeros(8_000_000)}}  # 32 MB on a 20 MB disk
        with pytest.raises(CheckpointWriteError, match="No space left on device"):
            save_checkpoint(run, 0, {}, None, big, {}, {})
        assert [p.name for p in (run / "checkpoints").iterdir()] == []


def test_a_read_only_output_dir_is_one_line(tmp_path, capsys):
    with _tmpfs(tmp_path / "ro", ro=True) as ro:
        rc, err = _run(capsys, f"output_dir={ro}", "run_name=x", "steps=1")
        assert rc == 2 and "Read-only file system" in err, err
        assert "Traceback" not in err and err.strip().count("\n") == 0
        with pytest.raises(CheckpointWriteError, match="Read-only file system"):
            save_checkpoint(ro / "r", 0, {}, None, {}, {}, {})


def test_replay_out_on_a_full_disk_leaves_no_partial_or_lock(tmp_path):
    """Before: "no space left; nothing written" but a 20 MB .audit.partial-* and .audit.lock
    stayed, and the next audit there failed too."""
    from audit.cli import main

    recs = []
    for i in range(40):  # each step row carries its 600 kB rehearsed text: 24 MB in all
        recs.append({"schema": "envace.trajectory/1", "id": f"t{i}", "task_id": "t",
                     "env": {"name": "bfcl", "state": {"involved_classes": ["MathAPI"]}},
                     "source": "rehearsed", "messages": [
                         {"role": "user", "content": "go"},
                         {"role": "assistant", "content": "", "tool_calls": [
                             {"id": "c0", "type": "function",
                              "function": {"name": "add", "arguments": {"a": i, "b": 1}}}]},
                         {"role": "tool", "tool_call_id": "c0", "name": "add",
                          "content": "z" * 600_000, "rehearsed": True}]})
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with _tmpfs(tmp_path / "disk") as disk:
        rc = main(["--quiet", "replay", str(src), "--out", str(disk / "audit"),
                   "--call-timeout", "0"])
        assert rc == 2
        assert sorted(p.name for p in disk.iterdir()) == []
