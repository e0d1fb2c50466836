"""Tests for audit.scoring.canonical: parsing, canonical text, leaf flattening, error detection."""

import json
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from audit.scoring.canonical import (
    MAX_DEPTH,
    canonical_text,
    flatten_leaves,
    is_error_response,
    parse_value,
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


def _reverse_keys(value):
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value


def test_parse_json_and_python_literals():
    assert parse_value('{"a": [1, 2.5, null]}') == (True, {"a": [1, 2.5, None]})
    assert parse_value("None") == (True, None)
    assert parse_value("True") == (True, True)
    assert parse_value("{'name': 'x', 'ok': False}") == (True, {"name": "x", "ok": False})
    assert parse_value("(1, 2)") == (True, [1, 2])
    assert parse_value("{2, 1}") == (True, [1, 2])
    assert parse_value("{1: 'a'}") == (True, {"1": "a"})
    assert parse_value("  42 ") == (True, 42)
    assert parse_value('"a\nb"') == (True, "a\nb")  # raw control characters tolerated


def test_parse_plain_text_is_not_parsed():
    assert parse_value("hello world") == (False, "hello world")
    assert parse_value("") == (False, "")
    code = "__import__('os').system('true')"
    assert parse_value(code) == (False, code)


def test_parse_bounds_work_on_hostile_input():
    start = time.perf_counter()
    hostile = ["[" * 1_000_000, "(" * 100_000, "1" * 5000, "[" * 150 + "]" * 150, "x" * 3_000_000]
    for text in hostile:
        ok, _ = parse_value(text)
        assert ok is False
    assert time.perf_counter() - start < 5
    nested = "[" * (MAX_DEPTH - 5) + "]" * (MAX_DEPTH - 5)
    assert parse_value(nested)[0] is True


def test_canonical_text_forms():
    assert canonical_text("{'b': None, 'a': True}") == '{"a":true,"b":null}'
    assert canonical_text('{"b": 1, "a": {"d": 2, "c": 3}}') == '{"a":{"c":3,"d":2},"b":1}'
    assert canonical_text("  hello \n\t world  ") == "hello world"
    assert canonical_text('"café"') == '"café"'
    assert canonical_text("{'x': 'é'}") == canonical_text('{"x": "\\u00e9"}')


def test_flatten_leaves_paths():
    value = {"a": {"b": [1, {"c": 2}]}, "e": [], "f": {}, "file name.txt": "x"}
    assert flatten_leaves(value) == {
        "a.b[0]": 1,
        "a.b[1].c": 2,
        "e": [],
        "f": {},
        '["file name.txt"]': "x",
    }
    assert flatten_leaves(5) == {"": 5}
    assert flatten_leaves([]) == {"": []}
    assert len(flatten_leaves({"a.b": 1, "a": {"b": 2}})) == 2  # no collision


def test_is_error_response():
    assert is_error_response('{"error": "No such file or directory"}')
    assert is_error_response("{'error': 'bad id'}")
    assert is_error_response('{"error": "x", "detail": 1}')
    assert is_error_response("Error during execution: name 'foo' is not defined")
    assert is_error_response('"Error during execution: boom"')
    assert not is_error_response('{"error": null, "result": 1}')
    assert not is_error_response('{"result": "error"}')
    assert not is_error_response("None")
    assert not is_error_response("an error occurred")  # free text is not guessed at


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_never_raises_and_canonical_is_idempotent_on_text(text):
    ok, _ = parse_value(text)
    assert isinstance(ok, bool)
    once = canonical_text(text)
    assert canonical_text(once) == once


@settings(max_examples=150, deadline=None)
@given(JSON_VALUES)
def test_canonical_idempotent_and_key_order_invariant(value):
    text = json.dumps(value)
    once = canonical_text(text)
    assert canonical_text(once) == once
    assert canonical_text(json.dumps(_reverse_keys(value), indent=2)) == once
    assert canonical_text(repr(value)) == once  # Python literal of the same value
