"""The trajectory format: the shared spec examples, bad lines, round trips, the writer."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.schema import (
    Trajectory,
    TrajectoryWriter,
    parse_arguments,
    read_trajectories,
    write_trajectories,
)


def test_real_examples_parse_as_real(examples):
    items = list(read_trajectories(examples / "real.jsonl"))
    assert [it.error for it in items] == [None, None]
    for it in items:
        t = it.trajectory
        assert t.source == "real"
        steps = t.tool_steps()
        assert steps and all(s.response is not None and s.response.rehearsed is False
                             for s in steps)
        assert [s.step for s in steps] == list(range(len(steps)))


def test_rehearsed_example(examples):
    (item,) = list(read_trajectories(examples / "rehearsed.jsonl"))
    steps = item.trajectory.tool_steps()
    assert len(steps) == 4
    assert all(s.response.rehearsed for s in steps)
    assert steps[1].response.error is True and steps[1].response.logprob == -3.2
    assert item.trajectory.meta["mode"] == "envace"


def test_edge_examples(examples):
    items = {it.line: it for it in read_trajectories(examples / "edge.jsonl")}
    assert len(items) == 6
    by_id = {it.trajectory.id: it.trajectory for it in items.values() if it.trajectory}
    # arguments as a JSON string are accepted
    s = by_id["edge-string-arguments"].tool_steps()
    assert s[0].arguments == {"folder": "Drafts"} and s[0].malformed is None
    # a string that is not valid JSON makes the call malformed, kept and counted
    m = by_id["edge-malformed-arguments"].tool_steps()
    assert m[0].arguments is None and "not valid JSON" in m[0].malformed
    assert [x.malformed is None for x in m] == [False, True, True, True]
    # an unknown tool still parses: it is the replay's business
    assert by_id["edge-unknown-tool"].tool_steps()[0].tool == "rm_rf_everything"
    # extra fields survive a round trip
    extra = by_id["edge-final-answer-and-extra-fields"].dump()
    assert extra["x_top_level"] == {"kept": True}
    assert extra["messages"][-1]["x_custom"] == 1
    # inline state
    assert by_id["edge-inline-state"].env["state"]["involved_classes"] == ["MathAPI"]
    # the truncated last record is reported with its line number, not dropped silently
    bad = [it for it in items.values() if it.error]
    assert len(bad) == 1 and bad[0].line == 6 and "truncated" in bad[0].error


def test_round_trip_keeps_everything(examples, tmp_path):
    for f in sorted(examples.glob("*.jsonl")):
        originals = [json.loads(line) for line in f.read_text().splitlines()
                     if line.strip() and line.rstrip().endswith("}")]
        trajs = [it.trajectory for it in read_trajectories(f) if it.trajectory]
        out = tmp_path / f.name
        write_trajectories(out, trajs)
        again = [json.loads(line) for line in out.read_text().splitlines()]
        assert again == originals[: len(again)]


def test_bad_lines_are_reported_and_reading_goes_on(tmp_path, examples):
    good = (examples / "real.jsonl").read_text().splitlines()[0]
    p = tmp_path / "mixed.jsonl"
    p.write_bytes(
        (good + "\n").encode()
        + b"{not json\n"
        + b"\xff\xfe bad bytes\n"
        + b'{"schema": "other/1", "id": "x"}\n'
        + b'{"schema": "envace.trajectory/1", "id": "y"}\n'
        + b"[1, 2]\n"
        + b"\n"
        + (good + "\n").encode()
    )
    items = list(read_trajectories(p))
    assert [it.line for it in items] == [1, 2, 3, 4, 5, 6, 8]
    assert [it.trajectory is not None for it in items] == [True] + [False] * 5 + [True]
    reasons = [it.error for it in items[1:6]]
    assert "invalid JSON" in reasons[0]
    assert "UTF-8" in reasons[1]
    assert "schema" in reasons[2]
    assert "task_id" in reasons[3]
    assert "JSON object" in reasons[4]


def test_writer_appends_and_flushes(tmp_path, examples):
    t = next(read_trajectories(examples / "real.jsonl")).trajectory
    p = tmp_path / "sub" / "out.jsonl"
    with TrajectoryWriter(p, fsync=True) as w:
        w.write(t)
        assert len(p.read_text().splitlines()) == 1  # visible before close
    with TrajectoryWriter(p) as w:
        w.write(t.model_copy(update={"id": "second"}))
    ids = [it.trajectory.id for it in read_trajectories(p)]
    assert ids == [t.id, "second"]


def test_constructed_record_carries_schema():
    t = Trajectory(id="a", task_id="t", env={"name": "bfcl", "task": "t"}, source="real",
                   messages=[])
    assert t.dump()["schema"] == "envace.trajectory/1"


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                      st.floats(allow_nan=False, allow_infinity=False))
json_obj = st.dictionaries(st.text(max_size=8), st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c,
                                                                   max_size=3), max_leaves=8),
    max_size=4)


@settings(max_examples=150, deadline=None)
@given(json_obj)
def test_arguments_object_or_string_agree(args):
    assert parse_arguments(args) == (args, None)
    assert parse_arguments(json.dumps(args)) == (args, None)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_parse_arguments_never_raises(text):
    value, reason = parse_arguments(text)
    assert (value is None) != (reason is None) or (value == {} and reason is None)


@settings(max_examples=60, deadline=None)
@given(args=json_obj, content=st.text(max_size=40), rehearsed=st.booleans())
def test_generated_trajectory_round_trip(args, content, rehearsed):
    data = {
        "schema": "envace.trajectory/1", "id": "g", "task_id": "t",
        "env": {"name": "bfcl", "task": "t"}, "source": "rehearsal",
        "messages": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "f", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "c0", "name": "f", "content": content,
             "rehearsed": rehearsed},
        ],
    }
    t = Trajectory.model_validate(data)
    assert t.dump() == data
    assert t.tool_steps()[0].arguments == args


# ---------------------------------------------------------------- non-finite numbers, fast

#: JSON number texts, finite and not: the constants, literals past the float range with and
#: without an exponent, escapes that spell NaN inside a string that is itself JSON
_NUMBER_TEXTS = st.sampled_from([
    "1.5", "-0.0", "1e30", "1e-400", "12345678901234567890", "NaN", "Infinity", "-Infinity",
    "1e999", "-2E+400", "1" + "0" * 320 + ".5", "0." + "0" * 320 + "1",
])


def _record(args_text: str, as_string: bool, reward: str, logprob: str) -> str:
    args = json.dumps(args_text) if as_string else args_text
    return ('{"schema": "envace.trajectory/1", "id": "t", "task_id": "x", '
            '"env": {"name": "bfcl", "task": "x"},'
            ' "source": "rehearsed", "reward": ' + reward + ', "messages": ['
            '{"role": "user", "content": "hi"},'
            '{"role": "assistant", "content": "", "tool_calls": [{"id": "c0", "type": '
            '"function", "function": {"name": "ls", "arguments": ' + args + '}}]},'
            '{"role": "tool", "content": "ok", "tool_call_id": "c0", "name": "ls", '
            '"rehearsed": true, "logprob": ' + logprob + '}]}')


@settings(max_examples=300, deadline=None)
@given(number=_NUMBER_TEXTS, as_string=st.booleans(), nested=st.booleans(),
       escaped=st.booleans(),
       reward=st.sampled_from(["0.5", "null", '"inf"', '"nan"', "NaN", "1e999"]),
       logprob=st.sampled_from(["-1.5", "null", '"-inf"', "-Infinity", "-1e400"]))
def test_the_fast_non_finite_flag_never_misses_what_the_walk_finds(
        tmp_path_factory, number, as_string, nested, escaped, reward, logprob):
    """The audit walks a record for NaN and infinities only when the flag read with it says it
    may hold one (``ReadItem.maybe_nonfinite``): the flag is set exactly where the full walk
    (``audit.pipeline.nonfinite_paths``) finds one. JSON text nested in the arguments (and a
    number spelled with an escape there) is a string to both."""
    from audit.pipeline import nonfinite_paths

    inner = '{"x": ' + number + ', "s": "a"}'
    if escaped:  # the number's first character spelled as an escape inside nested JSON text
        inner = '{"x": "\\\\u00' + format(ord(number[0]), "02x") + number[1:] + '"}'
    args = ('{"function": {"arguments": ' + json.dumps(inner) + '}}') if nested else inner
    p = tmp_path_factory.mktemp("nf") / "t.jsonl"
    p.write_text(_record(args, as_string, reward, logprob) + "\n", encoding="utf-8")
    (item,) = list(read_trajectories(p))
    assert item.error is None
    assert item.maybe_nonfinite == bool(nonfinite_paths(item.trajectory))


def test_finite_records_are_not_walked(examples):
    """The examples hold no NaN or infinity: none is flagged, so the walk is skipped."""
    items = list(read_trajectories(examples / "real.jsonl"))
    assert items and not any(it.maybe_nonfinite for it in items)
