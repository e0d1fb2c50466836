"""`envace train` against a hostile user (#15): a new run never reuses a run directory, a resume is
exact or refused, config values are checked before anything loads, and Ctrl-C ends with one
line and exit code 130, leaving a run that resumes.

The fast tests run the command in process with the model loading replaced by a tripwire (it
must not be reached when a command is refused); one slow test interrupts a real run with SIGINT,
tears its metrics tail and resumes it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace import cli
from envace.training.config import TrainConfig, dump_yaml, load_config
from envace.training.resume import RunDirError, keep_metrics, plan_resume
from tests.conftest import ROOT


class Loaded(Exception):
    """Raised instead of loading a model: the command got past every check."""


@pytest.fixture
def tripwire(monkeypatch):
    """Model loading replaced: a refused command must never get there."""
    calls = []

    def build_policy(*args, **kwargs):
        calls.append(args)
        raise Loaded

    monkeypatch.setattr("envace.training.train.build_policy", build_policy)
    return calls


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(["train", *argv, "--quiet"])
    return rc, capsys.readouterr().err


def _row(step: int, **kw) -> str:
    return json.dumps({"step": step, "reward/mean": 0.1 * step, **kw})


def _finished_run(d: Path, steps: int = 3, checkpoints: tuple[int, ...] = (1, 2),
                  held: tuple[int, ...] = ()) -> None:
    """A run directory as the trainer leaves it (checkpoint folders with their state file
    only; ``held``: checkpoints whose trainer_state.json holds their step's row)."""
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("steps: 3\n")
    (d / "metrics.jsonl").write_text("".join(_row(s) + "\n" for s in range(steps)))
    (d / "report.md").write_text("# done\n")
    for c in checkpoints:
        info = {"step": c, **({"metrics": json.loads(_row(c))} if c in held else {})}
        (d / "checkpoints" / f"step_{c}").mkdir(parents=True)
        (d / "checkpoints" / f"step_{c}" / "trainer_state.json").write_text(json.dumps(info))


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- a new run, an existing dir


def test_a_new_run_over_a_finished_one_is_refused_before_anything_is_written(
        tmp_path, capsys, tripwire):
    run = tmp_path / "r1"
    _finished_run(run)
    before = _snapshot(run)
    rc, err = _run(capsys, f"output_dir={tmp_path}", "run_name=r1")
    assert rc == 2 and not tripwire
    assert "already exists" in err and f"--resume {run}" in err and "run_name=" in err
    assert _snapshot(run) == before  # metrics.jsonl and config.yaml untouched


def test_old_checkpoints_cannot_leak_into_a_new_run(tmp_path, capsys, tripwire):
    """A directory holding only another run's checkpoints is not a fresh start either."""
    run = tmp_path / "r2"
    (run / "checkpoints" / "step_4").mkdir(parents=True)
    (run / "checkpoints" / "step_4" / "trainer_state.json").write_text('{"step": 4}')
    rc, err = _run(capsys, f"output_dir={tmp_path}", "run_name=r2")
    assert rc == 2 and not tripwire and "--resume" in err
    # an empty directory (made by hand) is a fresh start: the run goes on to load its model
    (tmp_path / "fresh").mkdir()
    with pytest.raises(Loaded):
        _run(capsys, f"output_dir={tmp_path}", "run_name=fresh")
    assert json.loads((tmp_path / "fresh" / "RUNNING").read_text())["pid"] == os.getpid()


# ---------------------------------------------------------------- resume: exact or refused


def test_a_torn_metrics_tail_is_kept_aside_and_its_step_comes_back(tmp_path):
    run = tmp_path / "run"
    _finished_run(run, steps=2, checkpoints=(0, 1, 2), held=(2,))
    metrics = run / "metrics.jsonl"
    torn = _row(2)[:17]
    metrics.write_text(metrics.read_text() + torn)  # killed while writing step 2's row
    plan = plan_resume(run)
    assert plan.step == 2 and plan.torn == 1  # step 2's row is held by its checkpoint
    keep_metrics(metrics, plan.step)
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [0, 1]
    assert (run / "metrics.jsonl.truncated").read_text() == torn + "\n"


def test_a_lost_row_is_redone_from_the_checkpoint_before_it(tmp_path):
    """Checkpoint 2 without its row (an older checkpoint format, or a hand-torn line): resume
    from checkpoint 1 and redo step 2, rather than skip it."""
    run = tmp_path / "run"
    _finished_run(run, steps=3, checkpoints=(1, 2))
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines[:2]) + "\n" + lines[2][:10] + "\n")
    plan = plan_resume(run)
    assert plan.step == 1 and plan.torn == 1
    keep_metrics(metrics, plan.step)
    assert [json.loads(x)["step"] for x in metrics.read_text().splitlines()] == [0, 1]


def test_a_resume_that_cannot_be_exact_is_refused(tmp_path):
    run = tmp_path / "run"
    _finished_run(run, steps=4, checkpoints=(2, 3))
    metrics = run / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([lines[0], '{"step": "one"}', *lines[2:]]) + "\n")
    with pytest.raises(RunDirError, match=r"lacks the row of step\(s\) 1 .*step_2, step_3"):
        plan_resume(run)


def test_resume_without_a_checkpoint_refuses_unless_restart_is_asked(tmp_path, capsys,
                                                                    tripwire):
    run = tmp_path / "nock"
    _finished_run(run, checkpoints=())
    (run / "report.md").unlink()
    cfg = load_config(TrainConfig, ROOT / "configs" / "tiny.yaml",
                      [f"output_dir={tmp_path}", "run_name=nock"])
    dump_yaml(cfg, run / "config.yaml")  # the run's own resolved config, as the trainer writes
    before = _snapshot(run)
    rc, err = _run(capsys, "--resume", str(run))
    assert rc == 2 and not tripwire
    assert "no checkpoint" in err and "--restart" in err and "step 0" in err
    assert _snapshot(run) == before
    rc, err = _run(capsys, "--restart")
    assert rc == 2 and "--resume" in err
    with pytest.raises(Loaded):  # asked for: it goes on to load the model
        _run(capsys, "--resume", str(run), "--restart")
    keep_metrics(run / "metrics.jsonl", None)  # what the restart then does with the old rows
    assert (run / "metrics.jsonl.before_restart").read_bytes() == before["metrics.jsonl"]
    # a run that has a checkpoint is resumed, never restarted
    (run / "checkpoints" / "step_0").mkdir(parents=True)
    (run / "checkpoints" / "step_0" / "trainer_state.json").write_text('{"step": 0}')
    with pytest.raises(RunDirError, match="has checkpoint step_0"):
        plan_resume(run, restart=True)


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_simulator_endpoint_that_is_down_is_refused_before_anything_is_written(
        tmp_path, capsys, tripwire):
    down = f"simulator_model=http://127.0.0.1:{_closed_port()}/v1#world"
    rc, err = _run(capsys, f"output_dir={tmp_path}", "run_name=sim", "mode=simulator", down)
    assert rc == 2 and not tripwire, err
    assert "simulator_model=" in err and "no usable OpenAI-compatible server" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # no run directory, no config.yaml, no RUNNING
    # resuming (here: --restart of a run without a checkpoint) leaves the run as it was
    run = tmp_path / "nock"
    _finished_run(run, checkpoints=())
    (run / "report.md").unlink()
    cfg = load_config(TrainConfig, ROOT / "configs" / "tiny.yaml",
                      [f"output_dir={tmp_path}", "run_name=nock", "mode=simulator", down])
    dump_yaml(cfg, run / "config.yaml")
    before = _snapshot(run)
    rc, err = _run(capsys, "--resume", str(run), "--restart")
    assert rc == 2 and not tripwire and "no usable OpenAI-compatible server" in err
    assert _snapshot(run) == before


# ---------------------------------------------------------------- config values


@pytest.mark.parametrize("override,expected", [
    ("lr=inf", ["lr", "inf", "finite", "override 'lr=inf'"]),
    ("lr=nan", ["lr", "nan", "finite"]),
    ("clip_high=1e400", ["clip_high", "finite"]),
    ("dual_clip=-.inf", ["dual_clip", "finite"]),
    ("grounded_lambda=2.0", ["grounded_lambda", "2.0", "override 'grounded_lambda=2.0'"]),
    ("audit_scorers=[exact, nosuch]",
     ["audit_scorers[1]", "'nosuch'", "json_f1", "error_agreement", "override"]),
    ("audit_scorers=[exact, jsonf1]", ["audit_scorers[1]", "did you mean 'json_f1'"]),
    ("desc_chars=-1", ["desc_chars", "-1"]),
])
def test_bad_values_are_refused_before_anything_loads(tmp_path, capsys, tripwire, override,
                                                      expected):
    rc, err = _run(capsys, f"output_dir={tmp_path}", override)
    assert rc == 2 and not tripwire, err
    assert all(e in err for e in expected), (expected, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_lone_unknown_scorer_is_named_not_the_verdict(tmp_path, capsys, tripwire):
    rc, err = _run(capsys, f"output_dir={tmp_path}", "audit_scorers=nosuch")
    assert rc == 2 and "audit_scorers[0]='nosuch' is not a registered scorer" in err
    assert "verdict_scorer" not in err


@pytest.mark.parametrize("content,expected", [
    (bytes(range(128, 256)) * 4, "not UTF-8 text"),
    (b"lr: [1e-3\n", "cannot read config file"),
    (b"- a\n- b\n", "must hold a mapping"),
    (b"lr: .inf\n", "finite"),
])
def test_unreadable_config_files_are_refused(tmp_path, capsys, tripwire, content, expected):
    f = tmp_path / "bad.yaml"
    f.write_bytes(content)
    rc, err = _run(capsys, "--config", str(f), f"output_dir={tmp_path / 'runs'}")
    assert rc == 2 and not tripwire
    assert expected in err and str(f) in err and "Traceback" not in err


# ---------------------------------------------------------------- interrupts


def test_ctrl_c_in_any_subcommand_is_one_line_and_130(tmp_path, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("envace.training.train.build_policy", interrupted)
    rc, err = _run(capsys, f"output_dir={tmp_path}", "run_name=x")
    assert rc == 130
    assert err.strip() == (f"envace train: interrupted; continue with `envace train --resume "
                           f"{tmp_path / 'x'}`")
    monkeypatch.setattr("envace.core.envs.base.describe_env", interrupted)
    assert cli.main(["envs"]) == 130
    assert capsys.readouterr().err.strip() == "envace: interrupted"


def test_the_vllm_trainer_entry_keeps_the_same_rules(tmp_path, capsys, monkeypatch):
    """`python -m envace.training.vllm_train train` takes envace train's arguments: --restart
    without --resume and a missing run are refused (2), Ctrl-C is one line and 130, and
    --resume/--restart reach the trainer. (The engines are replaced by a fake that records the
    call: vLLM itself is tested in tests/vllm/.)"""
    pytest.importorskip("envace.model.backends.vllm_backend")
    from envace.training import vllm_train

    assert vllm_train.main(["train", "--restart"]) == 2
    assert vllm_train.main(["train", "--resume", str(tmp_path / "none")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    seen = []

    class FakeRollouts:  # fake: stands in for the vLLM engines
        backends: dict = {}
        seconds_sync = 0.0

        @classmethod
        def for_config(cls, cfg):
            return cls()

        def close(self):
            seen.append("closed")

    def fake_train(cfg, resume, progress, rollouts, restart):
        seen.append((cfg.run_name, resume, restart))
        raise KeyboardInterrupt

    monkeypatch.setattr(vllm_train, "VLLMRollouts", FakeRollouts)
    monkeypatch.setattr(vllm_train, "train_with_vllm", fake_train)
    rc = vllm_train.main(["train", f"output_dir={tmp_path}", "run_name=v"])
    assert rc == 130 and seen == [("v", False, False), "closed"]
    assert "envace train --resume" in capsys.readouterr().err


TIMING = ("time", "tokens_per_s", "seconds/")
ARGS = [f"model={ROOT / 'data' / 'models' / 'tiny-sft'}", "steps=3", "prompts_per_step=2",
        "group_size=2", "max_new_tokens=24", "max_turns=2", "checkpoint_every=1",
        "eval_tasks=1", "lr=1e-3"]


def _rows(run: Path) -> dict[int, dict]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        out[r["step"]] = {k: v for k, v in r.items() if not k.startswith(TIMING)}
    return out


def default_sigint() -> None:
    """In the child: Ctrl-C as a terminal delivers it. A suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python then never raises
    KeyboardInterrupt; the test is about the command, not about how pytest was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_sigint_then_a_torn_tail_then_resume(tmp_path, sig, code, word):
    """Ctrl-C (SIGINT), or a cluster's preemption (SIGTERM), in a real run: exit 130 (143), one
    line, no traceback; the dashboard reads it as died; then its last metrics line is torn (a
    kill mid-write) and --resume brings every step back exactly."""
    from dashboard.runs import run_status

    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "envace.cli", "train", *ARGS, f"output_dir={tmp_path}",
           "run_name=r", "--quiet"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, preexec_fn=default_sigint)
    run = tmp_path / "r"

    def logged() -> set[int]:  # the steps with a complete row
        try:
            text = (run / "metrics.jsonl").read_text()
        except FileNotFoundError:
            return set()
        return {json.loads(x)["step"] for x in text.splitlines()[:-1 if text[-1:] != "\n"
                                                                  else None]}

    deadline = time.time() + 900
    while 1 not in logged() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)  # step 1 done: whichever row is torn below, a checkpoint precedes it
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == code, err[-2000:]
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("Loading", "Writing"))]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert lines[-1] == f"envace train: {word}; continue with `envace train --resume {run}`"
    assert (run / "RUNNING").exists() and not (run / "report.md").exists()
    assert run_status(run) == "died"  # fresh heartbeat, but its process is gone
    before = _rows(run) if (run / "metrics.jsonl").exists() else {}
    # tear the last line, as a kill in the middle of writing it would
    text = (run / "metrics.jsonl").read_text() if before else ""
    last = text.rstrip("\n").rsplit("\n", 1)[-1] if before else _row(0)
    (run / "metrics.jsonl").write_text(text[:len(text.rstrip("\n")) - len(last)] + last[:30])
    resume = [sys.executable, "-m", "envace.cli", "train", "--resume", str(run), *ARGS,
              "--quiet"]
    r = subprocess.run(resume, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    after = _rows(run)
    assert sorted(after) == [0, 1, 2]
    assert all(after[s] == before[s] for s in before if s in after), "a step changed"
    assert (run / "metrics.jsonl.truncated").read_text() == last[:30] + "\n"
    assert (run / "report.md").exists() and run_status(run) == "finished"
