"""The likelihood audit on the committed tiny model and real BFCL dev trajectories.

Known answer: each step's log-probability from the one-pass (or windowed) scorer equals an
independent forward over that step's own prompt (cut as the generation probe cuts it) and
response, to fp32 tolerance; the audit directory reads back and its summary is the rows' sums.
"""

from __future__ import annotations

import json
import math

import pytest

from audit.likelihood_probe import scoring_of
from audit.probe import probe_trajectory
from audit.scoring.settings import AuditOptions
from audit.store.step_rows import StepRow
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.evaluation.likelihood import TOO_LONG, ModelScorer, probe_likelihood
from envace.evaluation.model_probe import sequence_logprobs
from envace.model.chat import IM_END, encode_text
from envace.model.windows import prompt_ids

MODEL = "data/models/tiny-sft"


@pytest.fixture(scope="module")
def tiny():
    import torch

    from envace.model.models import load_model

    torch.set_num_threads(1)
    return load_model(MODEL)


@pytest.fixture(scope="module")
def trajectories():
    return list(export_real(split_tasks("dev")[:3]))


def _independent(model, tok, sc, step, budget):
    """Minus the log-probability of the step's response (and its end marker) after the
    probe's prompt for that call, computed on its own."""
    i = sc.targets[step]
    msgs = [dict(m, rehearsed=True) if k in sc.targets.values() else m
            for k, m in enumerate(sc.messages)]
    prompt = prompt_ids(tok, msgs[:i], sc.tools, "tool", budget)
    cont = encode_text(tok, sc.messages[i]["content"]) + [tok.convert_tokens_to_ids(IM_END)]
    return -sequence_logprobs(model, [(prompt, cont)])[0], len(cont)


@pytest.mark.parametrize("context", [2048, 500])
def test_each_step_equals_an_independent_forward(tiny, trajectories, context):
    model, tok = tiny
    scorings = [scoring_of(t, probe_trajectory(t, lambda *a: "x", AuditOptions()).steps)
                for t in trajectories]
    scorer = ModelScorer(model, tok, context, batch_size=2)
    got = scorer(scorings)
    passes = scorer.passes
    if context == 2048:  # every trajectory fits: one forward each
        assert passes.one_pass == passes.windows == len(trajectories)
    else:
        assert passes.windowed == len(trajectories) and passes.windows > len(trajectories)
    checked = 0
    for sc, per in zip(scorings, got, strict=True):
        assert set(per) == set(sc.targets)
        for step, (nats, tokens) in per.items():
            budget = 10**6 if context == 2048 else context - tokens
            want, n = _independent(model, tok, sc, step, budget)
            assert tokens == n
            assert nats == pytest.approx(want, rel=1e-5, abs=1e-3)
            checked += 1
    assert checked >= 10


def test_a_response_longer_than_the_context_is_named_not_scored(tiny, trajectories):
    model, tok = tiny
    sc = scoring_of(trajectories[0],
                    probe_trajectory(trajectories[0], lambda *a: "x", AuditOptions()).steps)
    per = ModelScorer(model, tok, 4)([sc])[0]
    assert per and set(per.values()) == {TOO_LONG}


def test_audit_directory_reads_back_and_sums(tiny, trajectories, tmp_path, monkeypatch):
    import audit.stats.summary

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    model, tok = tiny
    src = tmp_path / "dev.jsonl"
    src.write_text("".join(t.to_json() + "\n" for t in trajectories))
    train = tmp_path / "train.jsonl"
    train.write_text("".join(t.to_json() + "\n" for t in export_real(split_tasks("train")[:6])))
    s = probe_likelihood(model, tok, [str(src)], tmp_path / "lk",
                         AuditOptions(progress=False, plots=False, reference=str(train)), 2048,
                         label=MODEL)
    rows = [json.loads(x) for x in (tmp_path / "lk" / "steps.jsonl").read_text().splitlines()]
    for r in rows:
        StepRow.model_validate(r)
        assert r["probe"] == "likelihood" and r["rehearsed"] is None
        assert r["likelihood"]["compressor_bits"] > 0
    lk = s["likelihood"]
    assert s["probe"] == "likelihood" and lk["steps"] == len(rows) == s["counts"]["steps"]
    nats = sum(r["likelihood"]["nats"] for r in rows)
    nbytes = sum(r["likelihood"]["bytes"] for r in rows)
    assert lk["bits_per_byte"]["point"] == pytest.approx(nats / math.log(2) / nbytes)
    assert lk["compressor"]["bits_per_byte"]["point"] == pytest.approx(
        sum(r["likelihood"]["compressor_bits"] for r in rows) / nbytes)
    assert s["likelihood_scorer"]["passes"]["one_pass"] == len(trajectories)
    saved = json.loads((tmp_path / "lk" / "summary.json").read_text())
    assert saved["likelihood"]["bits_per_byte"]["point"] == lk["bits_per_byte"]["point"]


def test_confidence_is_the_log_probability_the_answer_was_generated_with(tiny, trajectories):
    """`with_confidence` scores each greedy answer after its prompt: its log-probability equals
    the sum of the generation's own token log-probabilities (transformers' scores), end marker
    included, to fp32 tolerance."""
    import torch

    from audit.stats.confidence import Rehearsal
    from envace.evaluation.likelihood import with_confidence
    from envace.evaluation.model_probe import model_answers

    model, tok = tiny
    traj = trajectories[0]
    st = traj.tool_steps()[1]
    messages = [m.dump() for m in traj.messages[: st.message_index + 1]]
    request = (messages, traj.tools, st.tool, dict(st.arguments or {}))
    answer = with_confidence(model, tok, 2048, 24, model_answers(model, tok, 2048, 24))
    got = answer([request])[0]
    assert isinstance(got, Rehearsal) and got.num_tokens >= 2
    prompt = prompt_ids(tok, messages, traj.tools, "tool", 2048 - 24)
    stop = tok.convert_tokens_to_ids(IM_END)
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=24,
                             do_sample=False, eos_token_id=stop, pad_token_id=stop,
                             output_scores=True, return_dict_in_generate=True)
    new = out.sequences[0, len(prompt):].tolist()
    lps = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, new,
                                                                          strict=True)]
    if stop in new:  # the answer and its end marker, as generated
        assert got.num_tokens == new.index(stop) + 1
        assert got.logprob == pytest.approx(sum(lps[:new.index(stop) + 1]), abs=1e-3)
    else:  # cut at the token limit: the scored end marker was never generated
        assert got.logprob < sum(lps) + 1e-3
    assert got.min_logprob <= got.logprob / got.num_tokens
