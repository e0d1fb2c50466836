"""Tests for audit.worlds.reference: trivial reference world models and skill scores."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.worlds.reference import (
    REFERENCE_NAMES,
    build_reference,
    rank_by_similarity,
    skill,
    skill_with_ci,
    substitute,
)

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
    from audit.cli import BASELINES

    assert set(REFERENCE_NAMES) == {"majority", "lookup", "edit", "echo", "empty"}
    assert BASELINES == REFERENCE_NAMES  # envace-audit baseline --model offers every one
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


def test_edit_known_answers():
    triples = [
        ("cd", {"folder": "docs"}, '{"current_working_directory": "docs"}'),
        ("cd", {"folder": "documents"}, '{"current_working_directory": "documents"}'),
        ("cp", {"source": "a.txt", "destination": "arch"},
         '{"result": "\'a.txt\' copied to \'arch/a.txt\'"}'),
        ("wc", {"file_name": "f", "mode": "l"}, '{"count": 15, "type": "lines"}'),
        ("ls", {}, '{"files": []}'),
    ]
    edit = build_reference("edit", triples)
    assert edit("cd", {"folder": "docs"}) == '{"current_working_directory": "docs"}'  # lookup
    assert edit("cd", {"folder": "tmp"}) == '{"current_working_directory": "tmp"}'
    assert edit("cd", {"folder": "documentz"}) == '{"current_working_directory": "documentz"}'
    assert (edit("cp", {"source": "b.md", "destination": "arch"})
            == '{"result": "\'b.md\' copied to \'arch/b.md\'"}')
    # the file name is not in the response and 15 is not the mode: nothing to copy
    assert edit("wc", {"file_name": "g", "mode": "l"}) == '{"count": 15, "type": "lines"}'
    assert edit("ls", {"a": 1}) == '{"files": []}'
    assert edit("rm", {"file": "x"}) == "{}"  # unseen tool


def test_substitute_known_answers():
    assert substitute('{"n": 5, "m": 15, "s": "5.5", "e": "5."}', {"x": 5}, {"x": 7}) == \
        '{"n": 7, "m": 15, "s": "5.5", "e": "7."}'
    assert substitute('{"f": "docs/a.txt", "g": "mydocs"}', {"d": "docs"}, {"d": "tmp"}) == \
        '{"f": "tmp/a.txt", "g": "mydocs"}'
    # simultaneous: a -> b and b -> a swap, never chain
    assert substitute('{"p": "a", "q": "b"}', {"x": "a", "y": "b"}, {"x": "b", "y": "a"}) == \
        '{"p": "b", "q": "a"}'
    # escaped as JSON writes it
    assert substitute('{"t": "say \\"hi\\""}', {"m": 'say "hi"'}, {"m": 'say "yo"'}) == \
        '{"t": "say \\"yo\\""}'
    assert substitute('{"t": ["#a", "#b"]}', {"tags": ["#a", "#b"]}, {"tags": ["#c"]}) == \
        '{"t": ["#c"]}'
    # booleans, null, objects, missing or equal arguments are never substituted
    assert substitute('{"v": true}', {"v": True}, {"v": False}) == '{"v": true}'
    assert substitute('{"v": null}', {"v": None}, {"v": 1}) == '{"v": null}'
    assert substitute('{"v": {"a": 1}}', {"v": {"a": 1}}, {"v": {"a": 2}}) == '{"v": {"a": 1}}'
    assert substitute('{"v": "a"}', {"v": "a"}, {}) == '{"v": "a"}'
    assert substitute('{"v": 1.0}', {"v": 1}, {"v": 1.0}) == '{"v": 1.0}'


def test_substitute_keeps_json_valid_across_kinds_and_escapes():
    """Reviewer's cases: a kind change writes a JSON value, never bare text; values that look
    like escape letters never land inside escapes; digit strings stay out of longer numbers."""
    assert json.loads(substitute('{"count": 5}', {"n": 5}, {"n": "five"})) == {"count": "five"}
    assert json.loads(substitute('{"id": 5}', {"n": "5"}, {"n": "7"})) == {"id": 7}
    assert json.loads(substitute('{"t": ["a", "b"]}', {"x": ["a", "b"]}, {"x": "c"})) == \
        {"t": ["a", "b"]}  # a list never becomes a string, nor the reverse
    for letter in ("r", "n", "u00e9", "t"):
        got = substitute('{"s": "a\\r\\n\\u00e9\\t b"}', {"x": letter}, {"x": "Q"})
        assert json.loads(got) == {"s": "a\r\n\u00e9\t b"}
    assert json.loads(substitute('{"v": 1.5, "w": "-5", "x": "1e5", "y": "5"}',
                                 {"k": "5"}, {"k": "7"})) == \
        {"v": 1.5, "w": "-5", "x": "1e5", "y": "7"}
    # longest first across strings and numbers alike
    assert json.loads(substitute('{"s": "12 1"}', {"a": 1, "b": "12"}, {"a": 2, "b": "x"})) == \
        {"s": "x 2"}
    # keys stay; empty lists are not values; a response equal after parsing comes back as is
    assert substitute('{"docs": "docs"}', {"d": "docs"}, {"d": "tmp"}) == '{"docs": "tmp"}'
    assert substitute('{"t": []}', {"x": []}, {"x": ["a"]}) == '{"t": []}'
    assert substitute('{ "a" : 1 }', {"x": 2}, {"x": 3}) == '{ "a" : 1 }'
    # written back in the response's own style
    assert substitute('{"a":"x"}', {"v": "x"}, {"v": "y"}) == '{"a":"y"}'
    assert substitute('{"a": "é x"}', {"v": "x"}, {"v": "y"}) == '{"a": "é y"}'
    # not JSON: rewritten as text with the same rule
    assert substitute("moved docs to mydocs", {"d": "docs"}, {"d": "tmp"}) == \
        "moved tmp to mydocs"


def test_substitute_never_raises_and_stays_linear():
    big = 10 ** 5000
    assert substitute('{"a": 1}', {"x": big}, {"x": 2}) == '{"a": 1}'
    assert substitute('{"a": 1}', {("t",): 7}, {("t",): 2}) == '{"a": 1}'
    assert substitute('{"a": NaN}', {"x": [float("nan")]}, {"x": [1]}) == '{"a": NaN}'
    deep = "[" * 100_000 + "]" * 100_000
    assert substitute(deep, {"x": "a"}, {"x": "b"}) == deep
    # repetitive text and value: str.find scanning, not a backtracking regex
    value = "ab" * 20_000
    out = substitute(json.dumps({"s": value + " " + value}), {"x": value}, {"x": "z"})
    assert json.loads(out) == {"s": "z z"}


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-100, 100), st.text(max_size=6),
              st.floats(allow_nan=False, allow_infinity=False)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=12)
_ARG = st.one_of(st.text(max_size=4), st.integers(-20, 20), st.booleans(), st.none(),
                 st.lists(st.one_of(st.text(max_size=3), st.integers(0, 9)), max_size=3))


@settings(max_examples=300, deadline=None)
@given(_JSON, st.dictionaries(st.sampled_from("abc"), _ARG, max_size=3),
       st.dictionaries(st.sampled_from("abc"), _ARG, max_size=3),
       st.sampled_from([{}, {"ensure_ascii": False}, {"separators": (",", ":")}]))
def test_substitute_json_in_json_out(value, old, new, style):
    """A JSON response stays JSON, in its own style, with the same keys and shape of objects."""
    response = json.dumps(value, **style)
    out = substitute(response, old, new)
    parsed = json.loads(out)
    if out != response:
        assert out == json.dumps(parsed, **style)

    def keys(v):
        if isinstance(v, dict):
            return {k: keys(x) for k, x in v.items()}
        return None
    assert keys(parsed) == keys(value)


_SCALAR = st.one_of(st.text(max_size=8), st.integers(-1000, 1000),
                    st.floats(allow_nan=False, allow_infinity=False, width=32), st.booleans(),
                    st.none())


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.dictionaries(st.sampled_from("abc"), _SCALAR, max_size=3),
       st.dictionaries(st.sampled_from("abc"), _SCALAR, max_size=3))
def test_substitute_properties(response, old, new):
    out = substitute(response, old, new)
    assert isinstance(out, str)
    assert substitute(response, old, old) == response  # nothing differs: unchanged
    assert substitute(response, old, {}) == response


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="abcdef_", min_size=1, max_size=6),
       st.text(alphabet="ghijkl", min_size=1, max_size=6))
def test_substitute_copies_a_value_into_its_template(old, new):
    """A response that quotes the argument answers another value with that value quoted."""
    def template(value):
        return json.dumps({"current_working_directory": value})

    assert substitute(template(old), {"folder": old}, {"folder": new}) == template(new)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=6), st.lists(st.text(max_size=6), max_size=8))
def test_rank_by_similarity_is_a_stable_ranking(query, keys):
    order = rank_by_similarity(query, keys)
    assert sorted(order) == list(range(len(keys)))
    if query in keys:
        assert order[0] == keys.index(query)  # an identical key first, the first of equals


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


def test_skill_with_ci_no_spread_and_nan():
    # a model right on every step of 10 trajectories: not "certainly perfect" (the percentile
    # interval would be [1, 1]); Wilson on the 10 trajectories' miss rate instead
    groups = [i // 3 for i in range(30)]
    perfect = skill_with_ci([1] * 30, [1, 0, 1] * 10, groups=groups, n_boot=200)
    assert perfect["point"] == 1.0 and perfect["hi"] == 1.0 and perfect["method"] == "wilson_groups"
    # Wilson upper bound of 0 misses in 10: 1.96^2 / (10 + 1.96^2) = 0.2775; F_ref = 2/3
    assert perfect["lo"] == pytest.approx(1 - 0.27754 / (1 / 3), abs=1e-4)
    # a step without a verdict (NaN) is left out, never turned into a NaN interval
    out = skill_with_ci([1, 0, float("nan"), 1], [0, 0, 1, 1], groups=[0, 1, 2, 3], n_boot=200)
    assert out["n"] == 3 and out["f_model"] == pytest.approx(2 / 3)
    json.dumps(out, allow_nan=False)
    assert out["method"] == "bootstrap"


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
    every novel write has skill 0 on reads, 1 on the novel writes, with intervals that are not
    zero-width."""
    from audit.stats.summary import _skill_block

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
    against = block["by_scorer"]["exact"]["against"]
    assert set(against) == {"lookup", "empty"}
    assert against["lookup"]["point"] == block["by_scorer"]["exact"]["point"]
    assert against["empty"]["point"] == pytest.approx(2 / 3)  # F 2/3 against F_ref 0
    assert against["empty"]["f_ref"] == 0.0
    assert against["empty"]["lo"] <= against["empty"]["point"] <= against["empty"]["hi"]
    read, write = (block["by_mutates_state"]["exact"][k] for k in ("read", "write"))
    assert read["point"] == pytest.approx(0.0) and read["n"] == 20
    # the model equals the lookup on every read: skill is exactly 0 in every resample, a
    # zero-width interval labelled so (issue 38); right on every write, the replicates have no
    # spread either: Wilson on the 10 trajectories, not a zero-width interval
    assert read["method"] == "identical_to_reference" and write["method"] == "wilson_groups"
    assert read["lo"] == read["hi"] == read["point"] == 0.0
    assert write["point"] == pytest.approx(1.0) and write["hi"] == pytest.approx(1.0)
    assert write["lo"] == pytest.approx(1 - 0.27754, abs=1e-4)  # Wilson upper of 0/10, F_ref 0
    assert set(block["by_novelty"]["exact"]) == {"0.00-0.25", "0.75-1.00"}
    assert block["by_novelty"]["exact"]["0.75-1.00"]["f_ref"] == 0.0


def test_references_bench_pairs_calls_by_trajectory(tmp_path):
    """experiments.references: skill of one baseline against another, call by call."""
    from experiments.references import exact_by_step, paired_skill

    def write(name, scores):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"trajectory_id": t, "step": i,
                                            "scores": {"exact": v}}) + "\n"
                                for (t, i), v in scores.items()))
        return exact_by_step(path)

    ref = write("ref.jsonl", {("a", 0): 1.0, ("a", 1): 0.0, ("b", 0): 0.0, ("b", 1): 0.0})
    model = write("m.jsonl", {("a", 0): 1.0, ("a", 1): 1.0, ("b", 0): 0.0, ("b", 1): 1.0})
    got = paired_skill(model, ref)
    assert got["point"] == pytest.approx(1 - (1 / 4) / (3 / 4))
    assert got["n"] == 4
    with pytest.raises(ValueError, match="different calls"):
        paired_skill(model, {("a", 0): 1.0})


def test_leave_scenario_out_answers_from_other_scenarios_only(small_real_files, tmp_path):
    """experiments.references' train figure: a call never sees its own scenario's calls; with one
    scenario in the file every reference has nothing to copy and answers ``{}``."""
    from audit.scoring.canonical import canonical_text
    from audit.worlds.memory import ResponseMemory, scenario_key
    from experiments.references import leave_scenario_out

    entries = ResponseMemory.from_file(small_real_files["train"]).entries
    got = leave_scenario_out(small_real_files["train"])
    assert got["calls"] == len(entries)
    assert got["scenarios"] == len({scenario_key(e.task_id) for e in entries}) > 1
    assert got["lookup"]["skill_vs_lookup"]["point"] == 0.0
    one = tmp_path / "one_scenario.jsonl"
    one.write_text("".join(
        json.dumps({**json.loads(line), "task_id": "multi_turn_base_0"}) + "\n"
        for line in small_real_files["train"].read_text().splitlines()))
    alone = leave_scenario_out(one)
    empty = sum(canonical_text(e.response) == "{}" for e in entries) / len(entries)
    for name in ("lookup", "edit", "majority"):
        assert alone[name]["exact"] == pytest.approx(empty)


def test_readable_ceiling_known_answer(tmp_path):
    """experiments.references' bound on copying: a response value found in no other scenario's
    responses of the tool and nowhere in what the call shows makes the call unreadable."""
    from experiments.references import readable_ceiling, response_values

    assert sorted(response_values('{"a": [1, "x"], "b": {"c": null}}')) == ["1", "null", "x"]
    assert response_values("None") == ["None"] and response_values("plain text") == ["plain text"]

    def traj(n, user, x, response):
        return {"schema": "envace.trajectory/1", "id": f"real-{n}",
                "task_id": f"multi_turn_base_{n}", "source": "real",
                "env": {"name": "bfcl", "task": f"multi_turn_base_{n}"},
                "messages": [{"role": "user", "content": user},
                             {"role": "assistant", "content": "", "tool_calls": [
                                 {"id": "c0", "type": "function",
                                  "function": {"name": "f", "arguments": {"x": x}}}]},
                             {"role": "tool", "content": json.dumps(response),
                              "tool_call_id": "c0", "name": "f", "rehearsed": False}]}

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in (
        traj(0, "hi", 1, {"v": 7}),                # 7 is in scenario 1's responses: readable
        traj(1, "hi", 2, {"v": 7, "w": "abc"}),    # "abc" is nowhere else: unreadable
        traj(2, "name is zed", 3, {"v": "zed"}),   # "zed" is in the user's turn: readable
    )))
    got = readable_ceiling(path)
    assert (got["calls"], got["unreadable"]) == (3, 1)
    assert got["readable_share"] == pytest.approx(2 / 3)
    assert got["examples"] == [{"tool": "f", "values": ["abc"]}]
    assert 0.0 <= got["edit_exact"] <= got["readable_share"]
