"""One audit writer, typed outputs (issue #14): step rows and summaries round-trip through
``audit.store.models``; replay, probe, rescore and the trainer write the same files through
``audit.store.output.AuditWriter``; the trainer replays each rollout once per step."""

from __future__ import annotations

import copy
import json
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import run_audit
from audit.probe import run_probe
from audit.rescore import rescore
from audit.scoring.settings import AuditOptions
from audit.store.models import SUMMARY_VERSION, AuditSummary, read_summary_data, summary_data
from audit.store.step_rows import StepRow, step_line, step_problem
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.layout import AUDIT, RUN
from envace.core.schema import Trajectory, TrajectoryWriter

QUIET = {"progress": False, "plots": False}
text = st.text(max_size=12)
finite = st.floats(0, 1, allow_nan=False)
maybe_bool = st.none() | st.booleans()
json_leaf = st.none() | st.booleans() | st.integers(-5, 5) | text
arguments = st.none() | text | st.dictionaries(text, json_leaf, max_size=3)


@st.composite
def step_rows(draw: Any) -> dict[str, Any]:
    """A steps.jsonl row as replay writes it: required fields, then any optional ones, in the
    spec's order (answered rows: scores and verdict; unanswered: no response)."""
    answered = draw(st.booleans())
    row: dict[str, Any] = {
        "trajectory_id": draw(text), "task_id": draw(text), "step": draw(st.integers(0, 50)),
        "tool": draw(text), "arguments": draw(arguments),
        "rehearsed": draw(text) if answered else None, "actual": draw(text),
        "actual_error": draw(st.booleans()), "mutates_state": draw(maybe_bool),
        "source_rehearsed": draw(maybe_bool), "malformed": draw(st.none() | text),
        "unanswered": not answered,
        "novelty": draw(st.none() | st.integers(0, 9) | finite),
        "rehearsed_error": draw(maybe_bool) if answered else None,
        "scores": draw(st.dictionaries(st.sampled_from(["exact", "json_f1", "fuzzy"]), finite))
        if answered else {},
        "diverged": draw(st.booleans()) if answered else True,
    }
    if answered and draw(st.booleans()):
        row["references"] = {n: {"response": draw(text), "scores": {"exact": draw(finite)}}
                             for n in draw(st.lists(st.sampled_from(["lookup", "echo"]),
                                                    unique=True, max_size=2))}
    if draw(st.booleans()):
        row["depth"] = draw(st.none() | st.integers(0, row["step"]))  # depth <= step
    if draw(st.booleans()):
        row["probe"] = "teacher_forced"
    return row


@settings(max_examples=150, deadline=None)
@given(step_rows())
def test_a_step_row_round_trips_byte_for_byte(row):
    line = step_line(row)
    assert line == json.dumps(row, ensure_ascii=False) + "\n"  # the same bytes as a plain dump
    back = json.loads(line)
    assert back == row and step_problem(back) is None
    assert StepRow.model_validate_json(line).dump() == row


BAD = [("step", "3"), ("step", True), ("step", -1), ("step", 1.5), ("diverged", "yes"),
       ("diverged", None), ("diverged", 1), ("scores", {"exact": "1"}), ("scores", None),
       ("scores", {"exact": float("nan")}), ("scores", {"exact": True}), ("trajectory_id", 3),
       ("trajectory_id", None), ("actual", None), ("actual", ["a"]), ("depth", -1),
       ("source_rehearsed", "false")]


@settings(max_examples=100, deadline=None)
@given(step_rows(), st.sampled_from(BAD) | st.sampled_from(["step", "tool", "actual"]))
def test_a_step_row_of_the_wrong_type_is_refused_with_a_reason(row, bad):
    if isinstance(bad, str):
        key = bad
        del row[key]
    else:
        key, row[key] = bad
    why = step_problem(row)
    assert why is not None and key in why, why


skipped = st.fixed_dictionaries({"file": text, "line": st.none() | st.integers(1, 99),
                                 "reason": text})
summaries = st.fixed_dictionaries(
    {"schema": st.just(SUMMARY_VERSION), "inputs": st.lists(text, max_size=2),
     "scorers": st.lists(text, max_size=3),
     "verdict": st.fixed_dictionaries({"scorer": text, "threshold": finite}),
     "reference_file": st.none() | text, "audited_model": st.none() | text,
     "counts": st.dictionaries(st.sampled_from(["steps", "scored_steps", "skipped"]),
                               st.integers(0, 99)),
     "reconciles": st.booleans(), "skipped_records": st.lists(skipped, max_size=2),
     "divergence_rate": st.none() | finite,
     "divergence_ci": st.lists(st.none() | finite, min_size=2, max_size=2)},
    optional={"probe": text, "endpoint": st.dictionaries(text, text, max_size=2)})


@settings(max_examples=100, deadline=None)
@given(summaries)
def test_a_summary_round_trips(summary):
    written = summary_data(summary)
    order = [f.alias or n for n, f in AuditSummary.model_fields.items()]
    assert written == summary  # values kept; fields in the spec's order, unknown ones last
    assert list(written) == sorted(summary, key=lambda k: order.index(k) if k in order
                                   else len(order))
    back, problems = read_summary_data(json.loads(json.dumps(written)))
    assert problems == [] and back is not None and back.dump() == summary


@settings(max_examples=60, deadline=None)
@given(summaries, st.sampled_from(["counts", "inputs", "verdict", "skipped_records"]))
def test_a_malformed_summary_field_is_dropped_and_named(summary, key):
    summary[key] = "not the right type"
    back, problems = read_summary_data(summary)
    assert back is not None and key not in back.dump()
    assert [p["reason"] for p in problems] == [f"field {key!r} is malformed; not used"]
    assert back.dump()["schema"] == SUMMARY_VERSION


def test_old_summaries_read_and_count_their_steps():
    old, _ = read_summary_data({"schema": "envace.audit/1", "counts": {"answered_steps": 7}})
    assert old is not None and old.scored_steps == 7
    new, _ = read_summary_data({"schema": SUMMARY_VERSION,
                                "counts": {"answered_steps": 7, "scored_steps": 4}})
    assert new is not None and new.scored_steps == 4


def test_one_settings_object_and_one_default_scorer_list():
    from audit import cli
    from audit.scoring.scorers import DEFAULT_SCORERS, list_scorers

    assert AuditOptions is AuditOptions
    assert AuditOptions().scorers == list(DEFAULT_SCORERS)
    assert set(DEFAULT_SCORERS) <= set(list_scorers())
    opts = AuditOptions(["json_f1"], "exact", 0.5)
    assert opts.scorers == ["json_f1", "exact"] and opts.verdict({"exact": 0.4})
    args = cli.build_parser().parse_args(["replay", "x.jsonl", "--out", "o"])
    assert args.scorers == list(DEFAULT_SCORERS)


# ------------------------------------------------------------ four producers, one writer


def _trajectories(n: int = 4) -> list[Trajectory]:
    """Real dev trajectories, every response marked rehearsed, one in three made wrong."""
    out = []
    for t in export_real(split_tasks("dev")):
        steps = t.tool_steps()
        if len(steps) < 2:
            continue
        for st_ in steps:
            st_.response.rehearsed = True
            if st_.step % 3 == 1:
                st_.response.content = json.dumps({"guess": st_.step})
        out.append(t)
        if len(out) == n:
            return out
    raise AssertionError("not enough dev trajectories")


def _write(path: Path, trajs: list[Trajectory]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with TrajectoryWriter(path, mode="w") as w:
        for t in trajs:
            w.write(t)
    return path


def _check_audit_dir(d: Path) -> dict[str, Any]:
    for line in (d / AUDIT.steps).read_text(encoding="utf-8").splitlines():
        assert step_problem(json.loads(line)) is None, line[:200]
    summary = json.loads((d / AUDIT.summary).read_text(encoding="utf-8"))
    AuditSummary.model_validate(summary)
    assert summary["schema"] == SUMMARY_VERSION
    return summary


def test_replay_probe_rescore_and_trainer_write_the_same_files(tmp_path):
    from envace.training.fidelity import audit_rollouts

    trajs = _trajectories()
    src = _write(tmp_path / "in.jsonl", trajs)
    opts = dict(scorers=["exact", "json_f1"], **QUIET)
    run_audit([str(src)], tmp_path / "replay", AuditOptions(**opts))
    real = {(t.id, s.step): s.response.content for t in trajs for s in t.tool_steps()}
    run_probe([str(src)], tmp_path / "probe",
              lambda messages, tools, tool, args: "{}", AuditOptions(**opts))
    rescore(tmp_path / "replay", tmp_path / "rescore", AuditOptions(**opts))
    audit_rollouts(trajs, ["exact", "json_f1"], "exact", tmp_path / "trainer", str(src))
    made = {d: sorted(os.listdir(tmp_path / d)) for d in ("replay", "probe", "rescore",
                                                         "trainer")}
    expected = sorted([AUDIT.steps, AUDIT.trajectories, AUDIT.summary, AUDIT.report])
    assert all(names == expected for names in made.values()), made
    steps = {}
    for d in made:
        s = _check_audit_dir(tmp_path / d)
        assert s["counts"]["trajectories"] == len(trajs), d
        steps[d] = (tmp_path / d / AUDIT.steps).read_text(encoding="utf-8")
    # the trainer's replay is the audit's replay; rescoring with the same scorers changes nothing
    assert steps["trainer"] == steps["replay"] == steps["rescore"]
    assert len(real) == len(steps["probe"].splitlines())


def test_a_writer_left_by_an_exception_writes_nothing(tmp_path):
    from audit.store.output import AuditWriter

    with pytest.raises(RuntimeError), AuditWriter(tmp_path / "out") as w:
        w.write_lines("", "")
        raise RuntimeError("boom")
    assert not (tmp_path / "out").exists() and os.listdir(tmp_path) == []


def test_a_record_that_is_not_a_step_row_is_not_written(tmp_path):
    from pydantic import ValidationError

    from audit.store.output import AuditWriter

    with pytest.raises(ValidationError), AuditWriter(tmp_path / "out") as w:
        w.write_steps([{"trajectory_id": "t", "step": "1"}])
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------ the trainer replays once


def _tiny_policy(cfg: Any, rollout: Any) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from envace.training.train_setup import Policy, _optim

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64))
    from types import SimpleNamespace

    pol = Policy(model, SimpleNamespace(pad_token_id=0), Path("."), rollout=rollout)
    for name, m, _ in pol.trainees(cfg.mode):
        pol.optimizers[name], pol.schedulers[name] = _optim(m, cfg)
    return pol


def test_a_training_step_replays_each_rollout_once(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    from envace.model.rollout import ACT, CONTEXT, REHEARSE, Episode
    from envace.training import fidelity
    from envace.training.config import TrainConfig
    from envace.training.train import train_step

    trajs = _trajectories(2)
    by_task = {t.task_id: t for t in trajs}
    tasks = [t for t in split_tasks("dev") if t.id in by_task]

    def rollout(model, tok, batch, rcfg, simulator, world_model, timer=None):
        eps = []
        for task in batch:
            traj = copy.deepcopy(by_task[task.id])
            roles = [CONTEXT] * 4 + [ACT, REHEARSE] * 3
            calls = [[(s.tool, s.arguments or {}) for s in traj.tool_steps()]]
            eps.append(Episode(task, traj, list(range(1, 11)), roles, [0.0] * 4 + [-1.0] * 6,
                               [-1] * 10, 4, "finished", calls))
        return eps

    replays: Counter = Counter()
    real_replay = fidelity.replay_trajectory

    def counted(traj, *a, **kw):
        replays[id(traj)] += 1
        return real_replay(traj, *a, **kw)

    monkeypatch.setattr(fidelity, "replay_trajectory", counted)
    monkeypatch.setattr("audit.replay.replay_trajectory", counted)
    monkeypatch.setattr("audit.workers.replay_trajectory", counted)
    cfg = TrainConfig(prompts_per_step=2, group_size=2, micro_batch_size=4, lr=1e-3,
                      audit_scorers=["exact", "json_f1"], grounded_lambda=0.5)
    (tmp_path / RUN.rollouts).mkdir()
    record = train_step(3, _tiny_policy(cfg, rollout), tasks, cfg, tmp_path)
    assert record is not None
    assert len(replays) == 4 and set(replays.values()) == {1}, replays  # 4 rollouts, once each
    audit_dir = RUN.step_audit(tmp_path, 3)
    summary = _check_audit_dir(audit_dir)
    ids = {json.loads(x)["id"] for x in RUN.rollout_file(tmp_path, 3).read_text().splitlines()}
    rows = [json.loads(x) for x in (audit_dir / AUDIT.trajectories).read_text().splitlines()]
    assert {r["trajectory_id"] for r in rows} == ids  # the ids the trainer gave them
    assert all(r["meta"]["train_step"] == 3 for r in rows)
    steps = [json.loads(x) for x in (audit_dir / AUDIT.steps).read_text().splitlines()]
    assert {s["trajectory_id"] for s in steps} == ids
    assert summary["counts"]["scored_steps"] == record["fidelity/steps"]
    assert math.isclose(summary["divergence_rate"], record["fidelity/divergence_rate"])
