"""Tests for audit.reference: trivial reference world models and skill scores."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.reference import REFERENCE_NAMES, build_reference, skill, skill_with_ci

TRIPLES = [
    ("ls", {"path": "."}, '{"files": ["a"]}'),
    ("ls", {"path": "docs"}, '{"files":["b"]}'),
    ("ls", {"path": "docs"}, "{'files': ['b']}"),  # same as the line above once canonical
    ("ls", {"path": "."}, '{"files": ["c"]}'),
    ("cd", {"folder": "x", "deep": True}, '{"cwd": "x"}'),
    ("cd", {"folder": "x", "deep": True}, '{"error": "no"}'),
    ("cd", {"deep": True, "folder": "x"}, '{"cwd": "x"}'),
]


def test_names():
    assert set(REFERENCE_NAMES) == {"majority", "lookup", "echo", "empty"}
    with pytest.raises(ValueError, match="known: majority"):
        build_reference("oracle", TRIPLES)


def test_majority():
    ref = build_reference("majority", TRIPLES)
    assert ref("ls", {"path": "anything"}) == '{"files":["b"]}'  # first raw text of the winner
    assert ref("cd", {}) == '{"cwd": "x"}'
    assert ref("rm", {"file": "a"}) == "{}"


def test_lookup_uses_canonical_arguments_then_majority():
    ref = build_reference("lookup", iter(TRIPLES))  # a one-shot iterable is fine
    assert ref("ls", {"path": "."}) == '{"files": ["a"]}'  # tie: first seen wins
    assert ref("cd", {"deep": True, "folder": "x"}) == '{"cwd": "x"}'
    assert ref("ls", {"path": "new"}) == '{"files":["b"]}'  # unseen call: majority
    assert ref("rm", {}) == "{}"


def test_echo_and_empty():
    echo = build_reference("echo", TRIPLES)
    assert json.loads(echo("cd", {"folder": "x", "n": 1})) == {"folder": "x", "n": 1}
    assert echo("cd", {"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    assert build_reference("empty", [])("ls", {"path": "."}) == "{}"


def test_skill_known_values():
    assert skill(0.8, 0.5) == pytest.approx(0.6)
    assert skill(0.25, 0.5) == pytest.approx(-0.5)
    assert skill(0.5, 0.5) == 0.0
    assert skill(1.0, 0.2) == 1.0
    assert skill(0.7, 1.0) is None
    assert skill(None, 0.5) is None


def test_skill_with_ci_steps_and_groups():
    model = [1, 1, 1, 0, 1, 1, 0, 1, 1, 1]
    ref = [1, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    out = skill_with_ci(model, ref, n_boot=500, seed=0)
    # F = 0.8, F_ref = 0.3 -> (0.8 - 0.3) / 0.7
    assert out["point"] == pytest.approx(5 / 7)
    assert (out["f_model"], out["f_ref"], out["n"]) == (0.8, 0.3, 10)
    assert out["lo"] <= out["point"] <= out["hi"] <= 1.0
    assert skill_with_ci(model, ref, n_boot=500, seed=0) == out
    groups = ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]
    grouped = skill_with_ci(model, ref, groups=groups, n_boot=500, seed=0)
    assert grouped["point"] == out["point"] and grouped["lo"] <= grouped["hi"]


def test_skill_with_ci_degenerate():
    out = skill_with_ci([0.5, 1.0], [1.0, 1.0], n_boot=50)
    assert out["point"] is None and out["lo"] is None and out["n_boot_used"] == 0
    assert skill_with_ci([], [])["point"] is None
    with pytest.raises(ValueError):
        skill_with_ci([1.0], [1.0, 0.0])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 0.99)), min_size=1, max_size=30))
def test_skill_with_ci_bounds(pairs):
    model, ref = [p[0] for p in pairs], [p[1] for p in pairs]
    out = skill_with_ci(model, ref, n_boot=50, seed=3)
    assert out["point"] is not None and out["point"] <= 1.0 + 1e-12
    assert out["lo"] <= out["hi"] <= 1.0 + 1e-12
    json.dumps(out, allow_nan=False)


def test_skill_block_by_read_write_and_novelty_known_answer():
    """The summary's skill strata: a model that matches the lookup on reads and beats it on
    every novel write has skill 0 on reads, 1 on the novel writes, with intervals."""
    from audit.summary import _skill_block

    rows = []
    for t in range(10):
        for i, (mut, nov, model, ref) in enumerate([(False, 0.1, 1.0, 1.0), (False, 0.1, 0.0, 0.0),
                                                    (True, 0.9, 1.0, 0.0)]):
            rows.append({"trajectory_id": f"t{t}", "depth": i, "tool": "x", "mutates_state": mut,
                         "novelty": nov, "scores": {"exact": model},
                         "ref_scores": {"lookup": {"exact": ref}, "empty": {"exact": 0.0}}})
    block = _skill_block(rows, ["exact"])
    assert block["by_scorer"]["exact"]["best_reference"] == "lookup"
    assert block["by_scorer"]["exact"]["point"] == pytest.approx(1 - (1 / 3) / (2 / 3))
    read, write = (block["by_mutates_state"]["exact"][k] for k in ("read", "write"))
    assert read["point"] == pytest.approx(0.0) and read["n"] == 20
    assert write["point"] == pytest.approx(1.0) and write["lo"] == pytest.approx(1.0)
    assert set(block["by_novelty"]["exact"]) == {"0.00-0.25", "0.75-1.00"}
    assert block["by_novelty"]["exact"]["0.75-1.00"]["f_ref"] == 0.0
