"""Tests for the fidelity statistics (audit.stats.steps, depth_tables, survival, compounding,
summary.summarize): hand-computed answers and properties of every statistic."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.stats.compounding import compounding_ratio, logistic_divergence
from audit.stats.depth_tables import by_depth, strata
from audit.stats.intervals import wilson_ci
from audit.stats.steps import novelty, tokens
from audit.stats.summary import summarize
from audit.stats.survival import first_divergence_survival


def make_steps(flags_by_traj, tools=None, mutates=None, novel=None):
    """Step records from {trajectory id: [diverged at step 0, 1, ...]}."""
    steps = []
    for tid, flags in flags_by_traj.items():
        for t, d in enumerate(flags):
            steps.append(
                {
                    "trajectory_id": tid,
                    "step": t,
                    "tool": (tools or {}).get((tid, t), "ls"),
                    "diverged": d,
                    "scores": {"exact": 0.0 if d else 1.0},
                    "mutates_state": None if mutates is None else mutates(tid, t),
                    **({} if novel is None else {"novelty": novel(tid, t)}),
                }
            )
    return steps


# Hand-worked example for KM: first divergence at 1 (T1), censored at 2 (T2), event at 0 (T3),
# event at 3 (T4), censored at 0 (T5).
KM_STEPS = make_steps(
    {
        "T1": [False, True, False, False],
        "T2": [False, False, False],
        "T3": [True, True],
        "T4": [False, False, False, True, False],
        "T5": [False],
    }
)

# Hand-worked example for the compounding ratio (depths >= 1):
#   A: t1 no-prior diverged, t2 prior diverged, t3 prior matched
#   B: t1 no-prior matched, t2 no-prior diverged, t3 prior matched
#   C: t1 prior matched, t2 prior diverged
#   D: t1..t3 no-prior matched
# prior: 2 diverged, 3 matched; no prior: 2 diverged, 4 matched -> (2/5) / (2/6) = 1.2
CR_STEPS = make_steps(
    {
        "A": [False, True, True, False],
        "B": [False, False, True, False],
        "C": [True, False, True],
        "D": [False, False, False, False],
    }
)


def test_wilson_known_values():
    lo, hi = wilson_ci(5, 10)
    assert lo == pytest.approx(0.23659, abs=1e-4) and hi == pytest.approx(0.76341, abs=1e-4)
    lo, hi = wilson_ci(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.27753, abs=1e-4)
    assert wilson_ci(0, 0) == (None, None)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 2000).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))))
def test_wilson_contains_point_and_is_bounded(kn):
    k, n = kn
    lo, hi = wilson_ci(k, n)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_by_depth():
    rows = by_depth(KM_STEPS)
    assert [r["depth"] for r in rows] == [0, 1, 2, 3, 4]
    r0 = rows[0]
    assert (r0["n"], r0["diverged"], r0["divergence_rate"]) == (5, 1, 0.2)
    assert r0["scores"]["exact"]["mean"] == pytest.approx(0.8)
    lo, hi = r0["scores"]["exact"]["ci"]
    assert 0.0 <= lo <= 0.8 <= hi <= 1.0
    # one trajectory at depth 4, score 1: no bootstrap spread -> Wilson on 1 trajectory
    last = rows[4]["scores"]["exact"]
    assert (last["mean"], last["n"], last["method"]) == (1.0, 1, "wilson_trajectories")
    assert last["ci"] == pytest.approx(list(wilson_ci(1, 1)), rel=1e-4)


def test_kaplan_meier_by_hand():
    km = first_divergence_survival(KM_STEPS)
    rows = km["rows"]
    assert [(r["depth"], r["at_risk"], r["events"], r["censored"]) for r in rows] == [
        (0, 5, 1, 1),
        (1, 3, 1, 0),
        (2, 2, 0, 1),
        (3, 1, 1, 0),
    ]
    assert [r["survival"] for r in rows] == pytest.approx([0.8, 8 / 15, 8 / 15, 0.0])
    assert [r["hazard"] for r in rows] == pytest.approx([0.2, 1 / 3, 0.0, 1.0])
    # Greenwood sum at depth 1: 1/(5*4) + 1/(3*2); log(-log) interval
    assert rows[1]["greenwood_ci"] == pytest.approx([0.068327, 0.863075], abs=1e-5)
    assert rows[0]["greenwood_ci"] == pytest.approx([0.203798, 0.969181], abs=1e-5)
    # the interval itself resamples the clusters (here the trajectories) and holds the point
    assert all(r["ci"][0] <= r["survival"] <= r["ci"][1] for r in rows)
    assert km["median"] == 3
    assert (km["n_trajectories"], km["n_events"], km["n_censored"]) == (5, 3, 2)


def test_compounding_ratio_by_hand():
    cr = compounding_ratio(CR_STEPS, ci_method="delta")
    assert cr["table"] == {
        "prior_diverged": 2,
        "prior_matched": 3,
        "no_prior_diverged": 2,
        "no_prior_matched": 4,
    }
    assert cr["ratio"] == pytest.approx(1.2)
    assert cr["p_after_divergence"] == pytest.approx(0.4)
    assert cr["p_no_prior_divergence"] == pytest.approx(1 / 3)
    # se(log RR) = sqrt(1/2 - 1/5 + 1/2 - 1/6)
    assert cr["ci"] == pytest.approx([0.252211, 5.709512], abs=1e-5)
    assert cr["note"] is None
    depth2 = next(r for r in cr["by_depth"] if r["depth"] == 2)
    assert (depth2["prior_n"], depth2["prior_diverged"]) == (2, 2)


def test_compounding_ratio_bootstrap_is_seeded():
    a = compounding_ratio(CR_STEPS, n_boot=300, seed=1)
    b = compounding_ratio(CR_STEPS, n_boot=300, seed=1)
    assert a == b and a["ci_method"] == "bootstrap"
    assert a["ratio"] == pytest.approx(1.2)
    lo, hi = a["ci"]
    assert lo is not None and lo <= 1.2 and (hi is None or hi >= 1.2)


@pytest.mark.parametrize(
    "flags, reason",
    [
        ({"a": [False, False], "b": [False]}, "no step follows an earlier divergence"),
        ({"a": [True, True]}, "lacks an earlier divergence"),
        ({"a": [True, True], "b": [False, False]}, "unbounded"),
    ],
)
def test_compounding_ratio_empty_cells(flags, reason):
    cr = compounding_ratio(make_steps(flags))
    assert cr["ratio"] is None and cr["ci"] is None and reason in cr["note"]
    json.dumps(cr, allow_nan=False)


def test_compounding_ratio_zero_numerator_delta():
    cr = compounding_ratio(make_steps({"a": [True, False], "b": [False, True]}), ci_method="delta")
    assert cr["ratio"] == 0.0 and cr["ci"] is None and "delta-method" in cr["note"]


def test_strata():
    steps = make_steps(
        {"a": [False, True], "b": [True, False]},
        tools={("a", 1): "mv", ("b", 1): "mv"},
        mutates=lambda tid, t: t == 1 if tid == "a" else None,
        novel=lambda tid, t: [0.1, 1.0, 0.5, None][t + (2 if tid == "b" else 0)],
    )
    by_tool = strata(steps, "tool")
    assert list(by_tool) == ["ls", "mv"]
    assert by_tool["ls"]["divergence_rate"] == 0.5 and by_tool["mv"]["n"] == 2
    rw = strata(steps, "mutates_state")
    assert {k: v["n"] for k, v in rw.items()} == {"read": 1, "unknown": 2, "write": 1}
    nov = strata(steps, "novelty")
    assert {k: v["n"] for k, v in nov.items()} == {
        "0.00-0.25": 1,
        "0.50-0.75": 1,
        "0.75-1.00": 1,
        "unknown": 1,
    }
    assert strata(steps, lambda s: "all")["all"]["n"] == 4


def test_novelty():
    actual = '{"status": "ok", "count": 3}'
    assert novelty(actual, "the status and Count were") == pytest.approx(0.5)  # ok, 3 are new
    assert novelty(actual, "") == 1.0
    assert novelty("{}", "anything") == 0.0
    assert novelty("file_name 3.5", "file_name 3.5") == 0.0


def test_logistic_recovers_compounding():
    rng = np.random.default_rng(0)
    flags = {}
    for i in range(60):
        prior, row = False, []
        for _ in range(6):
            d = bool(rng.random() < (0.8 if prior else 0.15))
            row.append(d)
            prior = prior or d
        flags[f"t{i}"] = row
    out = logistic_divergence(make_steps(flags), n_boot=30, seed=0)
    assert out["features"] == ["depth", "prior_divergence"]
    assert out["odds_ratio_prior_divergence"] > 3
    lo, hi = out["odds_ratio_ci"]
    assert 1 < lo <= hi
    assert "mutates_state left out" in out["note"]


def test_logistic_single_class_is_a_note():
    out = logistic_divergence(make_steps({"a": [False, False], "b": [False]}))
    assert out["coefficients"] is None and "no step diverged" in out["note"]
    assert logistic_divergence([])["note"] == "no scored steps"


def test_summarize_keys_and_json():
    steps = make_steps(
        {"A": [False, True, True], "B": [False, False], "C": [True, False]},
        mutates=lambda tid, t: t % 2 == 0,
        novel=lambda tid, t: 0.3 * t,
    )
    for s in steps:  # numpy types in, plain JSON out
        s["diverged"] = np.bool_(s["diverged"])
        s["scores"]["exact"] = np.float64(s["scores"]["exact"])
    steps.append({"trajectory_id": "C", "step": 2, "tool": "ls", "diverged": None, "scores": {}})
    out = summarize(steps, n_boot=50, logistic_boot=10)
    assert list(out) == [
        "counts",
        "divergence_rate",
        "divergence_ci",
        "divergence_ci_method",
        "divergence_ci_mc_error",
        "scores",
        "by_depth",
        "by_tool",
        "by_mutates_state",
        "by_novelty",
        "first_divergence",
        "median_first_divergence",
        "compounding",
        "logistic",
        "interval",
    ]
    assert out["counts"] == {"trajectories": 3, "steps": 8, "scored_steps": 7, "diverged": 3}
    assert out["divergence_rate"] == pytest.approx(3 / 7)
    assert out["scores"]["exact"]["mean"] == pytest.approx(4 / 7)
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    empty = summarize([])
    json.dumps(empty, allow_nan=False)
    assert empty["divergence_rate"] is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=1, max_size=8), min_size=1, max_size=12))
def test_km_survival_non_increasing_and_bounded(trajs):
    km = first_divergence_survival(make_steps({str(i): f for i, f in enumerate(trajs)}))
    surv = [r["survival"] for r in km["rows"]]
    assert all(b <= a + 1e-12 for a, b in zip(surv, surv[1:], strict=False))
    for r in km["rows"]:
        lo, hi = r["ci"]
        assert 0.0 <= lo <= r["survival"] + 1e-12 and r["survival"] - 1e-12 <= hi <= 1.0
    cr = compounding_ratio(make_steps({str(i): f for i, f in enumerate(trajs)}), n_boot=20)
    json.dumps(cr, allow_nan=False)
    assert cr["ratio"] is None or cr["ratio"] >= 0 and not math.isnan(cr["ratio"])


def test_import_audit_modules_without_torch():
    code = (
        "import sys, audit.scoring.canonical, audit.scoring.scorers, audit.stats.compounding, "
        "audit.worlds.reference;"
        "from audit.stats.compounding import logistic_divergence;"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet=st.characters(max_codepoint=127), max_size=80),
                 st.text(max_size=80)))
def test_tokens_equal_the_unicode_pattern_on_any_text(text):
    """The ASCII fast path (issue 44) finds the tokens the Unicode classes find, in order."""
    import re

    assert tokens(text) == re.findall(r"\d+(?:\.\d+)?|[^\W\d]+", text.lower())


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="0123456789._-aZz \n\"{}:,", max_size=80))
def test_tokens_of_number_heavy_ascii_text_equal_the_unicode_pattern(text):
    """The ASCII pattern's lookahead (issue 44) changes no token: numbers, dots, underscores."""
    import re

    assert tokens(text) == re.findall(r"\d+(?:\.\d+)?|[^\W\d]+", text.lower())


def test_tokens_known_answer():
    assert tokens('Ab_c 12.5x, "ÉTÉ" 3..4 K') == ["ab_c", "12.5", "x", "été", "3", "4", "k"]
    assert tokens("\u212a9") == ["k", "9"]  # the Kelvin sign lower-cases to ASCII "k"
