"""Tests for audit.scoring.scorers: known answers, registry, verdicts, and properties of every
scorer."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.scoring.scorers import (
    Score,
    ScoreContext,
    Verdict,
    get_scorer,
    list_scorers,
    make_verdict,
    register_scorer,
    score_step,
    score_step_explained,
)

CTX = ScoreContext(tool="ls", arguments={}, step=0)
BUILTIN = ["error_agreement", "exact", "fuzzy", "json_f1", "state_change"]
SYMMETRIC = ["exact", "fuzzy", "error_agreement", "json_f1"]

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-1000, 1000)
    | st.floats(-1e6, 1e6)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "error"]), children, max_size=3)
    ),
    max_leaves=8,
)
RESPONSES = st.one_of(st.text(max_size=40), JSON_VALUES.map(json.dumps), JSON_VALUES.map(repr))


def run(name, rehearsed, actual, context=CTX, **options):
    return get_scorer(name, **options)(rehearsed, actual, context)


def test_registry():
    assert set(BUILTIN) <= set(list_scorers())
    with pytest.raises(ValueError, match="known scorers: .*exact"):
        get_scorer("nope")
    with pytest.raises(ValueError, match="bad options"):
        get_scorer("exact", bogus=1)

    @register_scorer("test_always_half")
    def half():
        return lambda r, a, c: Score(0.5, "half")

    assert run("test_always_half", "x", "y").value == 0.5


def test_score_validates_range():
    with pytest.raises(ValueError):
        Score(1.5, "too big")
    with pytest.raises(ValueError):
        Score(float("nan"))


def test_exact():
    assert run("exact", '{"a": 1, "b": null}', "{'b': None, 'a': 1}").value == 1.0
    assert run("exact", '{"a": 1}', '{"a": 2}').value == 0.0
    assert run("exact", "  done \n", "done").value == 1.0


def test_json_f1_three_of_four_leaves():
    rehearsed = '{"a": 1, "b": "x", "c": [true, 2]}'
    actual = '{"a": 1, "b": "x", "c": [true, 3]}'
    s = run("json_f1", rehearsed, actual)
    assert s.value == pytest.approx(0.75)  # P = R = 3/4
    assert "precision 0.750" in s.explanation


def test_json_f1_unequal_leaf_counts():
    # P = 2/2, R = 2/4, F1 = 2 * 1 * 0.5 / 1.5 = 2/3
    s = run("json_f1", '{"a": 1, "b": 2}', '{"a": 1, "b": 2, "c": 3, "d": 4}')
    assert s.value == pytest.approx(2 / 3)


def test_json_f1_numbers_within_tolerance():
    assert run("json_f1", '{"x": 1.0}', '{"x": 1.0000000001}').value == 1.0
    assert run("json_f1", '{"x": 1.0}', '{"x": 1.01}').value == 0.0
    assert run("json_f1", '{"x": 1.0}', '{"x": 1.01}', rel_tol=0.05).value == 1.0
    assert run("json_f1", '{"x": 1}', '{"x": "1"}').value == 0.0  # types differ
    assert run("json_f1", '{"x": true}', '{"x": 1}').value == 0.0


def test_json_f1_string_partial_credit():
    # ratio("hello world", "hello world!") = 2 * 11 / 23
    s = run("json_f1", '{"m": "hello world"}', '{"m": "hello world!"}')
    assert s.value == pytest.approx(22 / 23)
    assert run("json_f1", '{"m": "abc"}', '{"m": "abd"}').value == 0.0  # 2/3 < 0.9
    s = run("json_f1", '{"m": "abc"}', '{"m": "abd"}', string_threshold=0.5)
    assert s.value == pytest.approx(2 / 3)


def test_json_f1_empty_and_fallback():
    assert run("json_f1", "{}", "{}").value == 1.0
    assert run("json_f1", "[]", "{}").value == 0.0
    s = run("json_f1", "abc", '"abd"')
    assert "fell back" in s.explanation
    assert s.value == pytest.approx(run("fuzzy", "abc", '"abd"').value)


def test_fuzzy():
    assert run("fuzzy", "abc", "abd").value == pytest.approx(2 / 3)
    assert run("fuzzy", '{"a":1}', "{'a': 1}").value == 1.0


def test_error_agreement():
    err, ok = '{"error": "No such file"}', '{"result": 1}'
    assert run("error_agreement", err, "Error during execution: boom").value == 1.0
    assert run("error_agreement", ok, ok).value == 1.0
    assert run("error_agreement", ok, err).value == 0.0
    told = ScoreContext(tool="ls", actual_error=True, rehearsed_error=None)
    assert run("error_agreement", ok, ok, told).value == 0.0  # context flag wins over the text


def test_state_change():
    write = ScoreContext(tool="mv", mutates_state=True)
    err, ok = '{"error": "No such file"}', '{"result": "moved"}'
    assert run("state_change", ok, ok, write).value == 1.0
    assert run("state_change", ok, err, write).value == 0.0  # claimed a change that failed
    assert run("state_change", err, ok, write).value == 0.0
    assert run("state_change", err, err, write).value == 1.0
    noop = ScoreContext(tool="mv", mutates_state=True, actual_state_changed=False)
    assert run("state_change", ok, ok, noop).value == 0.0  # documented caveat
    read = ScoreContext(tool="ls", mutates_state=False)
    assert run("state_change", ok, err, read).value == 1.0
    assert run("state_change", ok, err, CTX).value == 1.0  # nothing known


def test_verdict():
    verdict = make_verdict()
    assert verdict == Verdict("exact", 1.0)
    assert verdict({"exact": 0.0}) is True
    assert verdict({"exact": 1.0}) is False
    soft = make_verdict("json_f1", 0.8)
    assert soft({"json_f1": 0.85}) is False
    assert soft({"json_f1": 0.5}) is True
    with pytest.raises(KeyError):
        soft({"exact": 1.0})
    with pytest.raises(ValueError):
        make_verdict("nope")
    with pytest.raises(ValueError):
        make_verdict("exact", 2.0)


def test_score_step():
    scores = score_step('{"a": 1}', '{"a": 2}', CTX, ["exact", "json_f1"])
    assert scores == {"exact": 0.0, "json_f1": 0.0}
    detailed = score_step_explained("x", "x", CTX, {"json_f1": {"string_threshold": 0.5}})
    assert detailed["json_f1"].value == 1.0 and detailed["json_f1"].explanation


@settings(max_examples=120, deadline=None)
@given(RESPONSES)
def test_identity_scores_one(text):
    for name in BUILTIN:
        assert run(name, text, text).value == 1.0, name


@settings(max_examples=120, deadline=None)
@given(RESPONSES, RESPONSES, st.sampled_from([None, True, False]))
def test_bounded_and_symmetric(a, b, mutates):
    ctx = ScoreContext(tool="t", mutates_state=mutates)
    for name in BUILTIN:
        ab = run(name, a, b, ctx).value
        assert 0.0 <= ab <= 1.0
        if name in SYMMETRIC:
            assert run(name, b, a, ctx).value == ab, name
