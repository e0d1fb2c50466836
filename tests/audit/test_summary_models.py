"""The typed blocks of summary.json (`audit.store.models`): a stored summary reads into the
models and is written back byte for byte; blocks the models do not know (a newer writer's, a
plugin's) keep their place; the readers and the dashboard get models, not dicts."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import reference_triples, run_audit
from audit.probe import run_probe
from audit.rescore import rescore
from audit.scoring.settings import AuditOptions
from audit.store.models import (
    AuditSummary,
    Compounding,
    DepthRow,
    History,
    HistoryDepthRow,
    Skill,
    SkillRow,
    Stratum,
    read_summary_data,
)
from audit.store.output import write_json_atomic
from audit.worlds.reference import build_reference
from envace.core.worldmodel import from_lookup

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "spec_examples"
QUIET = {"progress": False, "plots": False}


def _rewritten(raw: bytes, tmp: Path) -> bytes:
    """What the one writer writes for the models read from `raw`."""
    back = AuditSummary.model_validate(json.loads(raw)).dump()
    write_json_atomic(tmp / "again.json", back)
    return (tmp / "again.json").read_bytes()


@pytest.fixture(scope="module")
def stored(tmp_path_factory, small_real_files):
    """summary.json files as the commands write them: a replay with references, a determinism
    check, a rescore, a probe of both histories."""
    tmp = tmp_path_factory.mktemp("summaries")
    run_audit([str(EXAMPLES / "rehearsed.jsonl")], tmp / "replay",
              AuditOptions(reference=str(EXAMPLES / "real.jsonl"), **QUIET))
    run_audit([str(EXAMPLES / "real.jsonl")], tmp / "real", AuditOptions(**QUIET))
    rescore(tmp / "replay", tmp / "rescored",
            AuditOptions(scorers=["exact", "fuzzy"], verdict_scorer="fuzzy",
                         verdict_threshold=0.9, **QUIET))
    dev, train = str(small_real_files["dev"]), str(small_real_files["train"])
    lookup = build_reference("lookup", reference_triples(train))
    run_probe([dev], tmp / "probe", from_lookup(lookup), AuditOptions(reference=train, **QUIET),
              limit=2, histories=("real", "own"))
    return {name: tmp / name / "summary.json" for name in ("replay", "real", "rescored", "probe")}


@pytest.mark.parametrize("name", ["replay", "real", "rescored", "probe"])
def test_a_stored_summary_round_trips_byte_for_byte(stored, name, tmp_path):
    raw = stored[name].read_bytes()
    assert _rewritten(raw, tmp_path) == raw


def test_the_blocks_are_typed(stored):
    s = AuditSummary.model_validate(json.loads(stored["replay"].read_bytes()))
    assert isinstance(s.compounding, Compounding) and isinstance(s.skill, Skill)
    assert s.by_depth and all(isinstance(r, DepthRow) for r in s.by_depth)
    assert s.by_depth[0].depth == 0 and s.by_depth[0].scores["exact"].ci is not None
    assert all(isinstance(r, Stratum) for r in (s.by_tool or {}).values())
    assert all(isinstance(r, SkillRow) for r in s.skill.by_scorer.values())
    assert s.first_divergence.rows[0].depth == 0
    p = AuditSummary.model_validate(json.loads(stored["probe"].read_bytes()))
    assert isinstance(p.history, History) and p.history.overall.real.point is not None
    assert all(isinstance(r, HistoryDepthRow) for r in p.history.by_depth)
    assert p.history.deep.min_depth is not None


def test_an_unknown_block_is_kept(stored, tmp_path):
    """Another writer's block is kept as written (last at the top level, where a field of its
    own is in the spec's order; in its place inside a typed block)."""
    data = json.loads(stored["replay"].read_bytes())
    data["another_writer"] = {"nats": 1.5, "rows": [{"depth": 0, "n": 2}]}
    data["by_depth"][0] = {"new_first": [1, 2], **data["by_depth"][0], "new_last": None}
    data["compounding"]["depth_trend"]["later"] = "x"
    raw = (json.dumps(data, indent=1, ensure_ascii=False) + "\n").encode()
    assert _rewritten(raw, tmp_path) == raw
    s, problems = read_summary_data(data)
    assert problems == [] and s is not None and s.model_extra["another_writer"]["nats"] == 1.5


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_any_key_order_round_trips(stored, seed):
    """Inside a block, fields are written in the order they are given, whatever it is (the
    top level is in the spec's order: tests/audit/test_audit_output.py)."""
    rng = random.Random(seed)

    def shuffled(v):
        if isinstance(v, dict):
            items = list(v.items())
            rng.shuffle(items)
            return {k: shuffled(x) for k, x in items}
        return [shuffled(x) for x in v] if isinstance(v, list) else v

    data = {k: shuffled(v) for k, v in json.loads(stored["probe"].read_bytes()).items()}
    assert json.dumps(AuditSummary.model_validate(data).dump()) == json.dumps(data)


def test_a_malformed_block_is_dropped_and_named(stored):
    data = json.loads(stored["replay"].read_bytes())
    data["compounding"]["ratio"] = "high"
    data["by_depth"][0]["depth"] = "0"
    s, problems = read_summary_data(data)
    assert s is not None and s.compounding is None and s.by_depth is None
    assert s.divergence_rate == data["divergence_rate"]
    assert sorted(p["reason"] for p in problems) == [
        "field 'by_depth' is malformed; not used", "field 'compounding' is malformed; not used"]


def test_the_dashboard_reads_models(stored):
    from dashboard import readers

    s, err = readers.audit_summary(stored["probe"].parent)
    assert err is None and isinstance(s, AuditSummary)
    assert s.scored_steps == s.counts.scored_steps


@pytest.mark.parametrize("bad", [
    {"likelihood": "x"}, {"confidence": [1]}, {"by_state_change": {"strata": 5}},
    {"by_state_change": {"strata": {"0": {"n": "many"}}}},
    {"likelihood": {"bits_per_byte": {"point": "nan"}}},
    {"confidence": {"auroc": {"point": [1]}}},
    {"by_state_change": {"cliff": {"present": "yes"}}},
])
def test_a_wrong_typed_newer_block_is_dropped_and_named(bad):
    """The likelihood, confidence and state-change blocks are typed like the others: a reader
    (the dashboard, rescore) never gets a block of the wrong shape, and is told which."""
    s, problems = read_summary_data({"schema": "envace.audit/2", **bad})
    (name,) = bad
    assert s is not None and getattr(s, name) is None
    assert [p["reason"] for p in problems] == [f"field {name!r} is malformed; not used"]
