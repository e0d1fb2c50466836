"""The choosing world model (audit.worlds.choice, issue #17): the model ranks its own answer against
real training responses by its own log-probability.

- `pick` and `candidates` (hypothesis): the highest score wins, ties to the first, unscorable
  never; candidates are the model's answer first, then the tool's most common response, then the
  similar calls', then their edits, no two equal, none only the asking task's own scenario has;
- where the lookup has no twin, the audit's ``edit`` answer is a candidate: the first ``edit``
  one, or an earlier one when the copy-edit's text was already there (then counted there);
- `ResponseMemory.majority` is the audit's ``majority`` reference on dev calls;
- `choice_batch` with scorers of pure logic (named fakes: they stand for the model's
  log-probability): the answer is the best-scored candidate and the tally counts its source;
- `sequence_logprobs` on a real tiny model equals a plain full forward, whatever the batch;
- `envace probe --choose ... --hybrid ...` on a real tiny model: the label, the `choice` block,
  and the refusals (`--choose` with `--endpoint`, a dev file as the memory).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.pipeline import reference_triples
from audit.scoring.canonical import canonical_text
from audit.worlds.choice import candidates, choice_batch, pick
from audit.worlds.memory import Entry, MemoryOptions, ResponseMemory, scenario_key
from audit.worlds.reference import build_reference, substitute
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.worldmodel import Unanswered


@pytest.fixture(scope="module")
def files(small_real_files):
    return small_real_files  # conftest: the first 40 train and 4 dev tasks, real


SCORES = st.lists(st.one_of(st.none(), st.integers(-5, 5).map(float)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(SCORES)
def test_pick_properties(scores):
    got = pick(scores)
    known = [s for s in scores if s is not None]
    if not known:
        assert got is None
        return
    assert scores[got] == max(known)
    assert all(s is None or s < max(known) for s in scores[:got])


TASKS = st.sampled_from(["multi_turn_base_1", "multi_turn_miss_func_1", "multi_turn_base_2",
                         "multi_turn_long_context_3@t1"])
ARGS = st.dictionaries(st.sampled_from(["a", "path"]), st.sampled_from(["x", "xy", "docs"]),
                       max_size=2)
RESPONSES = st.sampled_from(["ok", "{}", '{"a": 1}', '{ "a" : 1 }', "error"])
ENTRIES = st.lists(st.builds(Entry, st.sampled_from(["cd", "ls"]), ARGS, RESPONSES, TASKS),
                   max_size=20)


@settings(max_examples=200, deadline=None)
@given(ENTRIES, TASKS, st.sampled_from(["cd", "ls", "rm"]), ARGS,
       st.one_of(st.just(Unanswered("timeout")), RESPONSES), st.integers(0, 4), st.booleans())
def test_candidate_properties(entries, task, tool, arguments, own, k, edits):
    memory = ResponseMemory(entries)
    got = candidates(own, memory, tool, arguments, task, k, edits)
    if not edits:
        assert all(s != "edit" for s, _ in got)
        assert got == [c for c in candidates(own, memory, tool, arguments, task, k, True)
                       if c[0] != "edit"]
    texts = [t for _, t in got]
    assert len({canonical_text(t) for t in texts}) == len(texts)
    if isinstance(own, Unanswered):
        assert all(s != "own" for s, _ in got)
    else:
        assert got[0] == ("own", own)
    sources = [s for s, _ in got]
    assert sources == sorted(sources, key=["own", "majority", "similar", "edit"].index)
    assert len(got) <= 2 + 2 * k
    own_scenario = scenario_key(task)
    others = [e for e in entries if e.tool == tool and scenario_key(e.task_id) != own_scenario]
    allowed = {canonical_text(e.response) for e in others}
    edits = {canonical_text(substitute(e.response, e.arguments, arguments)) for e in others}
    for source, text in got:
        if source == "edit":
            assert canonical_text(text) in edits
        elif source != "own":
            assert canonical_text(text) in allowed
    majority = memory.majority(tool, task)
    assert (majority is None) == (not others)
    if majority is not None and not (not isinstance(own, Unanswered)
                                     and canonical_text(own) == canonical_text(majority)):
        assert ("majority", majority) in got


def test_majority_is_the_majority_reference(files):
    memory = ResponseMemory.from_file(files["train"])
    majority = build_reference("majority", reference_triples(files["train"]))
    checked = 0
    for traj in export_real(split_tasks("dev")[:4]):
        for s in traj.tool_steps():
            got = memory.majority(s.tool, traj.task_id)
            if got is not None:
                checked += 1
                assert got == majority(s.tool, s.arguments)
    assert checked > 0
    assert memory.majority("no_such_tool") is None


def test_first_edit_candidate_is_the_edit_reference(files):
    """Where the lookup has no twin, the edit of the most similar call is what the audit's
    ``edit`` reference answers (one retrieval, one rewrite), and it is a candidate: the first
    one labelled ``edit``, unless its text was already offered by an earlier source (a
    copy-edit that changed nothing, or equal to the majority), which then keeps it."""
    memory = ResponseMemory.from_file(files["train"])
    edit = build_reference("edit", reference_triples(files["train"]))
    checked = kept_earlier = 0
    for traj in export_real(split_tasks("dev")[:4]):
        for s in traj.tool_steps():
            if memory.exact(s.tool, s.arguments, traj.task_id) is not None \
                    or not memory.similar(s.tool, s.arguments, traj.task_id, 1):
                continue
            nearest = memory.similar(s.tool, s.arguments, traj.task_id, 1)[0]
            answer = edit(s.tool, s.arguments)
            assert substitute(nearest.response, nearest.arguments, s.arguments) == answer
            got = candidates("\x00own", memory, s.tool, s.arguments, traj.task_id, 3, True)
            first_edit = next((t for src, t in got if src == "edit"), None)
            earlier = [t for src, t in got if src != "edit"]
            if canonical_text(answer) in {canonical_text(t) for t in earlier}:
                kept_earlier += 1
            else:
                assert first_edit == answer
            checked += 1
    assert checked > kept_earlier


def _requests(files, n=6):
    trajs = list(export_real(split_tasks("dev")[:4]))
    out, tids = [], []
    for t in trajs:
        for s in t.tool_steps():
            out.append(([{"role": "user", "content": "hi"}], None, s.tool, s.arguments))
            tids.append(t.task_id)
    return out[:n], tids[:n]


def test_choice_batch_takes_the_best_scored(files):
    memory = ResponseMemory.from_file(files["train"])
    requests, tids = _requests(files)

    def fake_model(reqs):  # a named fake: a world model of pure logic
        return ["a long answer nobody returned"] * len(reqs)

    def fake_shortest(reqs, cands):  # a named fake scorer: the shortest text is most probable
        return [[-float(len(t)) for t in c] for c in cands]

    tally: dict[str, int] = {}
    got = choice_batch(fake_model, fake_shortest, memory, 2, tally=tally)(requests, tids)
    for r, t, answer in zip(requests, tids, got, strict=True):
        cands = [text for _, text in candidates("a long answer nobody returned", memory, r[2],
                                                r[3], t, 2)]
        assert answer == min(cands, key=len)
    assert sum(tally.values()) == len(requests)

    def fake_own_first(reqs, cands):  # the model's own answer always most probable
        return [[1.0] + [0.0] * (len(c) - 1) for c in cands]

    tally = {}
    got = choice_batch(fake_model, fake_own_first, memory, 2, tally=tally)(requests, tids)
    assert got == fake_model(requests) and tally == {"own": len(requests)}

    def fake_none(reqs, cands):  # nothing can be scored: the model's answer stands
        return [[None] * len(c) for c in cands]

    tally = {}
    got = choice_batch(fake_model, fake_none, memory, 2, tally=tally)(requests, tids)
    assert got == fake_model(requests) and tally == {"unscored": len(requests)}
    with pytest.raises(ValueError, match="scores for"):
        choice_batch(fake_model, lambda r, c: [[0.0]] * len(c), memory, 2)(requests, tids)


def test_memory_only_choice_asks_the_model_only_where_nothing_scores(files):
    memory = ResponseMemory.from_file(files["train"])
    requests, tids = _requests(files)
    asked: list = []

    def fake_model(reqs):  # a named fake world model: records what it is asked
        asked.extend(reqs)
        return ["written"] * len(reqs)

    def fake_first_unscored(reqs, cands):  # nothing scores for the first request only
        return [[None] * len(c) if i == 0 else [-float(len(t)) for t in c]
                for i, c in enumerate(cands)]

    tally: dict[str, int] = {}
    got = choice_batch(fake_model, fake_first_unscored, memory, 2, tally=tally,
                       own=False)(requests, tids)
    assert asked == requests[:1] and got[0] == "written"
    for r, t, answer in zip(requests[1:], tids[1:], got[1:], strict=True):
        cands = [text for _, text in candidates(Unanswered("x"), memory, r[2], r[3], t, 2)]
        assert answer == min(cands, key=len) and answer != "written"
    assert tally.get("own", 0) == 0 and tally["unscored"] == 1
    assert sum(tally.values()) == len(requests)
    opts = MemoryOptions(choose=memory, k=2, scorer=fake_first_unscored, choose_own=False)
    assert opts.label("M") == "M+choice(k=2,memory-only)"
    assert opts.wrap(fake_model)[1]()["world_model"]["choice"]["among"] == "memory"
    assert opts.wrap(fake_model)[1]()["world_model"]["choice"]["edits"] is False


def test_choice_with_edits_can_answer_with_an_edit(files):
    """``--choose-edits``: a scorer that prefers the edit of the most similar call (a named
    fake: it stands for a model that copies) makes the answer the ``edit`` reference's."""
    memory = ResponseMemory.from_file(files["train"])
    requests, tids = _requests(files, 12)
    edit = build_reference("edit", reference_triples(files["train"]))

    def fake_prefers_first_edit(reqs, cands):  # a named fake scorer
        out = []
        for r, c in zip(reqs, cands, strict=True):
            first = edit(r[2], r[3])
            out.append([1.0 if canonical_text(t) == canonical_text(first) else 0.0 for t in c])
        return out

    opts = MemoryOptions(choose=memory, k=2, scorer=fake_prefers_first_edit, choose_own=False,
                         choose_edits=True)
    answer, block = opts.wrap(lambda reqs: ["written"] * len(reqs))
    got = answer(requests, tids)
    novel = [i for i, (r, t) in enumerate(zip(requests, tids, strict=True))
             if memory.exact(r[2], r[3], t) is None and memory.similar(r[2], r[3], t, 1)]
    assert novel
    for i in novel:
        assert canonical_text(got[i]) == canonical_text(edit(requests[i][2], requests[i][3]))
    chosen = block()["world_model"]["choice"]
    assert chosen["edits"] is True and opts.label("M") == "M+choice(k=2,memory-only,edits)"
    assert sum(chosen["chosen"].values()) == len(requests)


def test_choice_is_scored_under_the_note(files):
    """With a memory, the scorer sees the requests the model answered: the note included."""
    memory = ResponseMemory.from_file(files["train"])
    requests, tids = _requests(files, 3)
    seen: dict[str, list] = {"model": [], "scorer": []}

    def fake_model(reqs):
        seen["model"].extend(reqs)
        return ["x"] * len(reqs)

    def fake_scorer(reqs, cands):
        seen["scorer"].extend(reqs)
        return [[0.0] * len(c) for c in cands]

    opts = MemoryOptions(memory=memory, k=2, choose=memory, scorer=fake_scorer)
    answer, block = opts.wrap(fake_model)
    answer(requests, tids)
    assert seen["model"] == seen["scorer"] and len(seen["model"]) == 3
    assert any(m["role"] == "system" for m in seen["model"][0][0])
    assert opts.label("M") == "M+memory(k=2)+choice(k=2)"
    assert block()["world_model"]["choice"]["chosen"]["own"] == 3
    with pytest.raises(ValueError, match="needs a scorer"):
        MemoryOptions(choose=memory).wrap(fake_model)


def test_sequence_logprobs_equal_a_full_forward(tmp_path):
    import torch

    from envace.evaluation.model_probe import sequence_logprobs
    from envace.model.models import build_tiny, load_model
    from envace.training.sft import training_texts

    model_dir = build_tiny(training_texts(list(export_real(split_tasks("train")[:3]))),
                           tmp_path / "tiny")
    model, _tok = load_model(model_dir)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    pairs = [(torch.randint(0, vocab, (n,), generator=g).tolist(),
              torch.randint(0, vocab, (m,), generator=g).tolist())
             for n, m in ((5, 3), (12, 1), (2, 7), (9, 4))]
    want = []
    with torch.no_grad():
        for prompt, cont in pairs:
            ids = torch.tensor([prompt + cont])
            lp = torch.log_softmax(model(ids).logits[0].float(), -1)
            want.append(sum(float(lp[len(prompt) - 1 + j, t]) for j, t in enumerate(cont)))
    for batch in (1, 3, 8):
        got = sequence_logprobs(model, pairs, batch_size=batch)
        assert got == pytest.approx(want, abs=1e-4)
    # the scorer: a candidate longer than the generation budget is never scored
    from envace.evaluation.model_probe import response_scorer

    score = response_scorer(model, _tok, context=256, max_new_tokens=4)
    req = ([{"role": "user", "content": "list the files"}], None, "ls", {})
    got = score([req, req], [["ok", "a b c d e f g h i j k l m n o p"], ["{}"]])
    assert isinstance(got[0][0], float) and got[0][1] is None and isinstance(got[1][0], float)
    assert got[0][0] < 0


def test_probe_cli_choose(files, tmp_path):
    from envace.model.models import build_tiny
    from envace.training.sft import training_texts

    model_dir = build_tiny(training_texts(list(export_real(split_tasks("train")[:4]))),
                           tmp_path / "tiny")
    out = tmp_path / "probe"
    base = [sys.executable, "-m", "envace.cli", "probe", "--model", str(model_dir),
            str(files["dev"]), "--limit", "2", "--max-new-tokens", "6", "--quiet"]
    r = subprocess.run([*base, "--out", str(out), "--choose", str(files["train"]),
                        "--memory-k", "2", "--hybrid", str(files["train"]),
                        "--reference", str(files["train"])], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["audited_model"] == f"hybrid(lookup,{model_dir}+choice(k=2))"
    wm = summary["world_model"]
    assert wm["choice"]["k"] == 2 and wm["choice"]["file"] == str(files["train"])
    assert sum(wm["choice"]["chosen"].values()) == wm["hybrid"]["answered_by_model"] > 0
    refused = subprocess.run([*base, "--out", str(tmp_path / "no"), "--choose",
                              str(files["dev"])], capture_output=True, text=True)
    assert refused.returncode == 2 and "train split" in refused.stderr
    assert not (tmp_path / "no").exists()
    endpoint = subprocess.run([*base, "--out", str(tmp_path / "no"), "--endpoint",
                               "http://127.0.0.1:9/v1", "--choose", str(files["train"])],
                              capture_output=True, text=True)
    assert endpoint.returncode == 2 and "--choose needs a local model" in endpoint.stderr
    lone = subprocess.run([*base, "--out", str(tmp_path / "no"), "--choose-among", "memory"],
                          capture_output=True, text=True)
    assert lone.returncode == 2 and "--choose-among needs --choose" in lone.stderr
    lone = subprocess.run([*base, "--out", str(tmp_path / "no"), "--choose-edits"],
                          capture_output=True, text=True)
    assert lone.returncode == 2 and "--choose-edits needs --choose" in lone.stderr
