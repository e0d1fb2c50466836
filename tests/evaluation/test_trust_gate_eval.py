"""`envace eval --trust-above C`, through the CLI entry: the committed tiny model, real BFCL
backends, two dev tasks. The gate sends the plans' unconfident rehearsals to reality and the
summary's `calls` block counts them; a threshold below every confidence is plain rehearsal; a
threshold that is not a finite log-probability is a usage error."""

from __future__ import annotations

import json

import pytest

from envace import cli
from tests.conftest import ROOT

MODEL = ROOT / "data" / "models" / "tiny-sft"
ARGS = ["eval", "--model", str(MODEL), "--device", "cpu", "--tasks", "2", "--rehearsal",
        "parallel", "--n", "2", "--max-new-tokens", "64", "--seed", "1"]


def _run(out, *extra):
    assert cli.main([*ARGS, "--out", str(out), *extra]) == 0
    summary = json.loads((out / "summary.json").read_text())
    plans = [json.loads(x) for x in (out / "plans.jsonl").read_text().splitlines()]
    return summary, plans


def _tools(plans):
    """The plans' own tool messages: after the task's history (a per-turn task replays its
    earlier turns, real responses), i.e. after the first message the policy generated."""
    out = []
    for p in plans:
        ms = p["messages"]
        first = next((i for i, m in enumerate(ms) if "logprob" in m), len(ms))
        out += [m for m in ms[first:] if m["role"] == "tool"]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("trust")
    return {"plain": _run(d / "plain"), "low": _run(d / "low", "--trust-above=-1e9"),
            "zero": _run(d / "zero", "--trust-above", "0")}


def test_gate_at_zero_sends_the_plans_calls_to_reality_and_counts_them(runs):
    summary, plans = runs["zero"]
    c = summary["calls"]
    tools = _tools(plans)
    gated = [m for m in tools if m.get("gated")]
    assert gated and c["plans_gated_real"] == len(gated) > 0
    assert all(m["rehearsed"] is False and m["rehearsal_confidence"] < 0 for m in gated)
    # the counts add up: every plan call is rehearsed or real; real total = commits' + plans'
    assert c["plans_rehearsed"] + c["plans_real"] == len(tools)
    assert c["plans_real"] == sum(m["rehearsed"] is False for m in tools)
    assert c["real_total"] == c["commit_real"] + c["plans_real"] and c["trust_above"] == 0.0
    # every rehearsal that stayed had confidence 0 (each of its tokens at probability 1)
    assert all(m["logprob"] == 0.0 for m in tools if m["rehearsed"] and "logprob" in m)


def test_a_threshold_below_every_confidence_is_plain_rehearsal(runs):
    (plain, p_plans), (low, l_plans) = runs["plain"], runs["low"]
    assert [p["messages"] for p in p_plans] == [p["messages"] for p in l_plans]
    assert low["calls"]["plans_gated_real"] == 0 and low["calls"]["plans_real"] == 0
    assert low["calls"]["plans_rehearsed"] == plain["calls"]["plans_rehearsed"] == len(
        _tools(l_plans))
    assert low["reward_mean"] == plain["reward_mean"] and plain["calls"]["trust_above"] is None


@pytest.mark.parametrize("value, said", [("0.5", "<= 0"), ("nan", "finite"), ("inf", "finite"),
                                         ("-inf", "finite"), ("lots", "not a number")])
def test_a_bad_threshold_is_a_usage_error(value, said, capsys, tmp_path):
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as e:
        cli.main([*ARGS, "--out", str(out), f"--trust-above={value}"])
    assert e.value.code == 2 and said in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("extra", [["--rehearsal", "none"], ["--world", "oracle"]])
def test_the_gate_needs_plans_the_policy_answers(extra, capsys, tmp_path):
    out = tmp_path / "never"
    assert cli.main([*ARGS, "--out", str(out), "--trust-above", "-1", *extra]) == 2
    assert "trust gate" in capsys.readouterr().err and not out.exists()
