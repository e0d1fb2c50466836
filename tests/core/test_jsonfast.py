"""envace.core.jsonfast: orjson's parse where it is used is json's, object for object (types,
float bits, key order, duplicate keys), and every text it leaves to json (NaN, Infinity, 1e400,
big integers, lone surrogates, deep nesting, bad JSON) gets json's answer or json's error."""

from __future__ import annotations

import json
import math
import sys

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from envace.core import jsonfast
from envace.core.jsonfast import json_loads_noting_nonfinite, loads_noting_nonfinite
from envace.core.schema import read_line


def same(a: object, b: object) -> bool:
    """Equal as parsed objects: the same types (1 is not 1.0 nor True), the same float bits
    (-0.0, nan), the same key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a)
                                                      == math.copysign(1, b))
    return a == b


def outcome(fn, *args) -> tuple:
    try:
        data, nonfinite = fn(*args)
    except (ValueError, RecursionError) as exc:
        return ("error", type(exc), str(exc))
    return ("ok", data, nonfinite)


def check(text: str) -> None:
    want = outcome(json_loads_noting_nonfinite, text)
    raw = text.encode("utf-8", "surrogatepass")
    for got in (outcome(loads_noting_nonfinite, text), outcome(loads_noting_nonfinite, text, raw)):
        assert got[0] == want[0], (text[:200], got, want)
        if want[0] == "ok":
            assert same(got[1], want[1]) and got[2] == want[2], text[:200]
        else:
            assert got[1:] == want[1:]


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=8), kids,
                                                              max_size=5),
    max_leaves=25)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(values, st.sampled_from([None, (",", ":"), (", ", ": ")]), st.booleans())
def test_any_document_parses_as_json_parses_it(value, separators, ascii_only):
    check(json.dumps(value, separators=separators, ensure_ascii=ascii_only))


digits = st.text(alphabet="0123456789", min_size=1, max_size=24)


@st.composite
def number_literals(draw) -> str:
    """Number literals, valid and not (leading zeros, a bare dot, a bare exponent)."""
    sign = draw(st.sampled_from(["", "-", "+"]))
    whole = draw(digits)
    frac = draw(st.one_of(st.just(""), st.just("."), digits.map(lambda d: "." + d)))
    exp = draw(st.one_of(st.just(""), st.tuples(st.sampled_from("eE"),
                                                st.sampled_from(["", "+", "-"]),
                                                st.text(alphabet="0123456789", max_size=4))
                         .map("".join)))
    return sign + whole + frac + exp


@settings(max_examples=1500)
@given(number_literals(), st.sampled_from(["{0}", "[{0}]", '{{"a": {0}, "b": [1, {0}]}}']))
@example("9223372036854775807", "{0}")  # the largest int64: orjson's int
@example("9223372036854775808", "{0}")  # past int64 and within uint64: orjson's int
@example("18446744073709551616", "[{0}]")  # past uint64: orjson's float, so json's
@example("-9223372036854775809", "{0}")
@example("1.7976931348623159e308", "{0}")  # rounds to infinity: json's inf, nonfinite
@example("2.4703282292062327e-324", "{0}")  # rounds to 0.0
@example("1.00000000000000011102230246251565404236316680908203125", "{0}")  # a tie
@example("0.1e1", "{0}")
@example("-0", "{0}")
@example("-0.0", "{0}")
def test_every_number_literal_gives_json_s_number(literal, frame):
    check(frame.format(literal))


near_json = st.text(alphabet='{}[]",:. 0123456789eE-+truefalsnNIiybx\\u\n\t\x00\x7f\udc80é😀',
                    max_size=40)


@settings(max_examples=1500)
@given(near_json)
@example('{"a": 1, "a": 2, "b": 3, "a": 4}')  # duplicate keys: the last value, the first place
@example('"\\ud800"')  # a lone surrogate escape: json keeps it
@example('"\\ud83d\\ude00"')
@example("\ufeff{}")  # a byte order mark: json refuses it
@example('{"x": NaN, "y": -Infinity}')
@example("[1e400]")
@example(" [1, 2] \n")
@example('{"a": "\x01"}')  # a control character in a string: json refuses it
@example("[1,]")
def test_text_that_is_almost_json_gets_json_s_answer(text):
    check(text)


def test_non_finite_numbers_go_to_json_and_are_noted():
    data, nonfinite = loads_noting_nonfinite('{"x": NaN, "y": 1e400, "z": 1.5}')
    assert nonfinite and math.isnan(data["x"]) and data["y"] == math.inf and data["z"] == 1.5
    assert loads_noting_nonfinite('{"z": 1.5, "w": 123456789012345678901234567890}') == (
        {"z": 1.5, "w": 123456789012345678901234567890}, False)


def _at_depth(k: int, fn, *args):
    return fn(*args) if k == 0 else _at_depth(k - 1, fn, *args)


@pytest.mark.parametrize("levels", [100, 800, 950, 990, 1000, 1024, 1025])
@pytest.mark.parametrize("frames", [0, 200])
def test_nesting_json_cannot_read_is_json_s_error_whatever_the_stack(levels, frames):
    text = "[" * levels + "]" * levels
    assert sys.getrecursionlimit() >= 1000
    want = _at_depth(frames, outcome, json_loads_noting_nonfinite, text)
    got = _at_depth(frames, outcome, loads_noting_nonfinite, text)
    assert got[0] == want[0] and (got[0] == "ok" or got[1] is want[1])


def test_without_orjson_json_reads_everything(monkeypatch):
    monkeypatch.setattr(jsonfast, "orjson", None)
    assert loads_noting_nonfinite('{"a": [1, 2.5, "x"]}') == ({"a": [1, 2.5, "x"]}, False)
    assert loads_noting_nonfinite("[NaN]")[1] is True


def test_a_trajectory_line_with_nan_reads_as_before(examples):
    rec = json.loads((examples / "real.jsonl").read_text().splitlines()[0])
    line = json.dumps(rec).replace('{"folder": "Drafts"}', '{"folder": "Drafts", "x": NaN}')
    assert "NaN" in line
    item = read_line("f.jsonl", 1, (line + "\n").encode())
    assert item.trajectory is not None and item.error is None and item.maybe_nonfinite
    (call,) = [c for m in item.trajectory.messages for c in m.tool_calls or ()
               if isinstance(c.function.arguments, dict) and "x" in c.function.arguments]
    assert math.isnan(call.function.arguments["x"])
    plain = read_line("f.jsonl", 1, (json.dumps(rec) + "\n").encode())
    assert plain.trajectory == read_line("f.jsonl", 1, json.dumps(rec).encode()).trajectory
    assert not plain.maybe_nonfinite  # read by orjson: nothing non-finite, as json would say


def test_an_ordinary_document_is_read_by_orjson(monkeypatch):
    if jsonfast.orjson is None:
        pytest.skip("orjson is not installed")

    def refuse(text):
        raise AssertionError("json was asked")

    monkeypatch.setattr(jsonfast, "json_loads_noting_nonfinite", refuse)
    doc = '{"id": "t-1", "n": [1, 2.5, -0.0, 922337203685477580], "s": "é \\u00e9 😀"}'
    assert loads_noting_nonfinite(doc) == (json.loads(doc), False)
