"""audit.replay.sizes_certain: a trajectory read from a line of at most MAX_CALL_BYTES / GROWTH
bytes cannot hold a call past the size limit, so the audit measures none (issue 44). The bound
is checked where it is tightest: numbers written longer than read (1e15), separators,
strings with lone surrogates (written with \\u escapes), arguments given as JSON text."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit import replay
from audit.replay import GROWTH, ReplayError, check_sizes, sizes_certain
from envace.core.schema import MAX_CALL_BYTES, json_text, read_line, utf8_len

#: a small limit, so that generated lines reach the bound
SMALL = 4000


def test_the_bound():
    assert sizes_certain(MAX_CALL_BYTES // GROWTH)
    assert not sizes_certain(MAX_CALL_BYTES // GROWTH + 1)
    assert not sizes_certain(None)


literals = st.sampled_from(["1e15", "9e15", "1e9", "-1e15", "1E15", "1e-7", "0.1e1", "1e22",
                            "12e14", "1e400", "NaN", "-Infinity", "0", "-0", "true", "null",
                            '"\\ud800"', '"\\u00e9"', '"é"', '"😀"', '"\\\\"', '"\\n"', "[]",
                            "{}"])


@st.composite
def raw_values(draw, depth: int = 0) -> str:
    """JSON text written as tightly as it may be (no spaces), from the literals that grow most
    when read and written back."""
    kind = draw(st.sampled_from(["literal", "literal", "list", "dict"] if depth < 3
                                else ["literal"]))
    if kind == "literal":
        return draw(literals)
    items = draw(st.lists(raw_values(depth + 1), max_size=40))
    if kind == "list":
        return "[" + ",".join(items) + "]"
    keys = draw(st.lists(st.sampled_from(['"a"', '"b"', '"\\ud800"', '"é"']),
                         min_size=len(items), max_size=len(items)))
    return "{" + ",".join(f"{k}:{v}" for k, v in zip(keys, items, strict=True)) + "}"


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(raw_values())
def test_a_value_written_back_takes_at_most_growth_times_its_bytes(raw):
    value = json.loads(raw)
    assert utf8_len(json_text(value)) <= GROWTH * utf8_len(raw)


def _line(arguments_raw: str, content: str) -> bytes:
    head = ('{"schema": "envace.trajectory/1", "id": "t", "task_id": "t", '
            '"env": {"name": "bfcl", "task": "x"}, "source": "real", "messages": ['
            '{"role": "user", "content": "go"}, {"role": "assistant", "content": "", '
            '"tool_calls": [{"id": "c0", "type": "function", "function": {"name": "f", '
            '"arguments": ')
    tail = (f'}}}}]}}, {{"role": "tool", "tool_call_id": "c0", "content": '
            f'{json.dumps(content, ensure_ascii=False)}}}]}}\n')
    return (head + arguments_raw + tail).encode("utf-8", "surrogatepass")


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(raw_values(), st.booleans(), st.text(max_size=300))
def test_a_line_within_the_bound_holds_no_call_past_the_limit(monkeypatch_small, raw, as_text,
                                                             content):
    arguments = json.dumps(raw, ensure_ascii=False) if as_text else raw  # JSON text, or inline
    line = _line(arguments, content)
    item = read_line("f.jsonl", 1, line)
    if item.trajectory is None:
        return
    assert item.size == len(line)
    if sizes_certain(item.size):
        check_sizes(item.trajectory.tool_steps())  # never raises


@pytest.fixture(scope="module")
def monkeypatch_small():
    mp = pytest.MonkeyPatch()
    mp.setattr(replay, "MAX_CALL_BYTES", SMALL)
    yield
    mp.undo()


def test_the_small_limit_still_refuses_what_passes_it(monkeypatch_small):
    big = "[" + ",".join(["1e15"] * 400) + "]"  # 2 kB read, 8 kB written back
    item = read_line("f.jsonl", 1, _line(big, "ok"))
    assert not sizes_certain(item.size)
    with pytest.raises(ReplayError, match="arguments"):
        check_sizes(item.trajectory.tool_steps())
