"""The likelihood audit's plumbing (audit.likelihood_probe) on real BFCL dev trajectories, with
*fake* scorers of pure logic (named as such: their figures are the known answers): rows carry
the figures, the summary's block, `rescore` keeps it, `compare` pairs two audits on the same
calls, and a step the scorer refuses is named."""

from __future__ import annotations

import json
import math

import pytest

from audit.compare import compare_audits, render_compare
from audit.likelihood_probe import run_likelihood_probe
from audit.rescore import summary_from_steps
from audit.scoring.settings import AuditOptions
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real


def fake_scorer(bits_per_byte: float, refuse_step: int | None = None):
    """Fake (pure logic): every response costs exactly `bits_per_byte` per UTF-8 byte."""

    def score(scorings):
        out = []
        for sc in scorings:
            per = {}
            for step, i in sc.targets.items():
                nbytes = len(sc.messages[i]["content"].encode())
                per[step] = ("refused by the fake" if step == refuse_step
                             else (bits_per_byte * nbytes * math.log(2), 3))
            out.append(per)
        return out

    return score


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    path = tmp_path_factory.mktemp("lkp") / "dev.jsonl"
    path.write_text("".join(t.to_json() + "\n" for t in export_real(split_tasks("dev")[:4])))
    return path


def test_rows_summary_rescore_and_compare(dev, tmp_path, monkeypatch):
    import audit.stats.summary

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    opts = AuditOptions(progress=False, plots=False)
    a = run_likelihood_probe([str(dev)], tmp_path / "a", fake_scorer(1.0), opts)
    b = run_likelihood_probe([str(dev)], tmp_path / "b", fake_scorer(3.0, refuse_step=0), opts)
    assert a["probe"] == "likelihood"
    assert a["likelihood"]["bits_per_byte"]["point"] == pytest.approx(1.0)
    assert a["likelihood"]["mean_step_bits_per_byte"]["point"] == pytest.approx(1.0)
    assert b["likelihood"]["not_scored"] == {"refused by the fake": 4}  # step 0 of 4 trajectories
    rows = [json.loads(x) for x in (tmp_path / "b" / "steps.jsonl").read_text().splitlines()]
    assert sum("likelihood_skipped" in r for r in rows) == 4
    again = summary_from_steps(tmp_path / "a")  # rescore's recomputation keeps the block
    assert again["likelihood"]["bits_per_byte"]["point"] == pytest.approx(1.0)
    c = compare_audits(tmp_path / "a", tmp_path / "b")
    lk = c["likelihood"]
    assert lk["pairs"] == a["likelihood"]["steps"] - 4
    assert lk["diff"] == pytest.approx(2.0)
    assert lk["ci"] is None and lk["method"] == "no_spread"  # the same 2 bits everywhere
    assert "bits per byte (likelihood)" in render_compare(c)


def test_fidelity_page_shows_the_likelihood(dev, tmp_path, monkeypatch):
    """The dashboard's Fidelity page on a likelihood audit (a real Streamlit AppTest): the
    tab's figures are the summary's block."""
    import audit.stats.summary
    from tests.dashboard.test_dashboard import charts, metrics, open_page

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    train = tmp_path / "train.jsonl"
    train.write_text("".join(t.to_json() + "\n" for t in export_real(split_tasks("train")[:4])))
    s = run_likelihood_probe([str(dev)], tmp_path / "lk", fake_scorer(1.5),
                             AuditOptions(progress=False, plots=False, reference=str(train)))
    at = open_page(monkeypatch, tmp_path / "lk", "fidelity")
    m = metrics(at)
    lk = s["likelihood"]
    assert m["Bits per byte, model"] == "1.500"
    assert m["Bits per byte, primed deflate"] == f"{lk['compressor']['bits_per_byte']['point']:.3f}"
    drawn = charts(at)["Bits per byte by call index"][0]
    assert len(drawn) == len(lk["by_depth"])


def test_compare_page_on_two_likelihood_audits(dev, tmp_path, monkeypatch):
    """The Compare page on two likelihood audits (tester D2): it failed with a KeyError drawing
    an empty divergence-by-depth chart; now it says why there is none and shows the rest."""
    import audit.stats.summary
    from tests.dashboard.test_dashboard import open_page

    monkeypatch.setattr(audit.stats.summary, "N_BOOT", 50)
    root = tmp_path / "root"
    for name, bpb in (("step_0", 1.5), ("step_1", 1.2)):
        run_likelihood_probe([str(dev)], root / "lk" / "audit" / name, fake_scorer(bpb),
                             AuditOptions(progress=False, plots=False))
    at = open_page(monkeypatch, root, "compare", run="lk")
    options = at.selectbox(key="cmp_Audit_a").options
    assert len(options) == 2, options
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any("likelihood audit generates nothing" in i.value for i in at.info)
