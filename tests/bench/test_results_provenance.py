"""Every result file is a figure of record (command, machine, load during the measurement) and
the docs cite only files there are (bench.provenance says what is accepted)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.provenance import DEFAULT_NAMES, cited_results, load_problems, problems, written_name

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
NAMES = {p.stem for p in RESULTS.glob("*.json")}
DOCS = [ROOT / "README.md", ROOT / "docs" / "results.md"]
MACHINE = {"platform": "Linux", "cpus": 2}


def good(**over):
    rec = {"machine": MACHINE, "command": "python -m experiments.ranker_cv",
           "load_average": {"start": [0.5, 0.4, 0.3], "end": [0.9, 0.5, 0.3]}}
    return {**rec, **over}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_result_file_records_command_machine_and_load(name):
    record = json.loads((RESULTS / f"{name}.json").read_text())
    assert problems(name, record, NAMES) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_cite_only_result_files_that_exist(doc):
    cited = cited_results(doc.read_text())
    assert cited, "the check would hold for a doc that cites nothing"
    assert sorted(cited - NAMES) == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_link_only_to_files_that_exist(doc):
    text = doc.read_text()
    targets = {t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)
               if not re.match(r"[a-z]+:", t) and not t.startswith("#")}
    assert sorted(t for t in targets if not (doc.parent / t).exists()) == []


@pytest.mark.parametrize("module", sorted(DEFAULT_NAMES))
def test_default_names_are_the_benches_own(module):
    home = next(d for d in ("bench", "experiments") if (ROOT / d / f"{module}.py").exists())
    source = (ROOT / home / f"{module}.py").read_text()
    name = DEFAULT_NAMES[module]
    if module == "references":  # <env>[_<domain>]_references, bfcl by default
        assert 'f"{name}_references"' in source and 'default="bfcl"' in source
        assert written_name("python -m experiments.references --env tau2 --domain retail"
                            ) == "tau2_retail_references"
        return
    forms = [f'"--name", default="{name}"', f'"--out", default="{name}"',
             f'write_result("{name}"', f'"{name}.json"']
    assert any(f in source for f in forms), f"{home}/{module}.py does not write {name}.json"


def test_written_name_reads_the_last_benchmark_and_its_options():
    assert written_name("python -m bench.rollout_engine --tiny x --name rollout_engine_bf16"
                        ) == "rollout_engine_bf16"
    assert written_name("python -m bench.rollout_engine --tiny x") == "rollout_engine"
    assert written_name("git worktree add /tmp/o HEAD && (cd /tmp/o && python -m "
                        "bench.decode_profile --name a); python -m experiments.ranker_cv"
                        ) == "ranker_cv"
    assert written_name("python -m experiments.claims --mode 'a b=runs/x' --name=c") == "c"
    assert written_name("python -m experiments.references --env agentdojo"
                        ) == "agentdojo_references"
    assert written_name("python -m experiments.clustered_intervals --env agentdojo"
                        ) == "clustered_intervals_agentdojo_dev"
    assert written_name("python -m experiments.clustered_intervals --name z") == "z"
    assert written_name(".venv-vllm/bin/python -m bench.vllm_rollout --only tiny --out q") == "q"
    assert written_name("python bench/dashboard_load.py --steps 10") == "dashboard_load"
    assert written_name("envace train steps=3") is None
    assert written_name("python -m bench.nosuch") is None


def test_a_file_lacking_any_field_or_naming_another_file_fails():
    assert problems("ranker_cv", good(), {"ranker_cv"}) == []
    assert problems("ranker_cv", {k: v for k, v in good().items() if k != "machine"}, set())
    assert problems("ranker_cv", good(command=["python", "-m", "experiments.ranker_cv"]), set())
    assert problems("ranker_cv", good(command="envace train"), set())
    assert problems("other", good(), set()) == [
        "the command writes ranker_cv.json, not other.json"]
    assert problems("other", good(assembled="by hand from ranker_cv.json"), set()) == []
    assert problems("ranker_cv", {k: v for k, v in good().items() if k != "load_average"},
                    set())
    assert problems("x", [1, 2], set()) == ["not a JSON object"]


def test_load_forms_accepted_and_refused():
    assert load_problems({"load_avg_1min": 0.4, "load_avg_1min_end": 1.0}, set()) == []
    assert load_problems({"load_avg_1min": [0.4, 0.5], "load_avg_1min_end": [1, 1]},
                         set()) == []
    assert load_problems({"load_avg_1min": 0.4}, set())  # no end
    assert load_problems({"load_average": {"start": [1, 1, 1]}}, set())
    assert load_problems({"load_average": {"start": [], "end": []}}, set())
    assert load_problems({"load_not_recorded": "the bench did not record it then"}, set()) == []
    assert load_problems({"load_not_recorded": "  "}, set())
    assert load_problems({"load_not_recorded": "why", "quiet_machine": True}, set())
    # quiet only below 1.5 at every recorded reading
    assert load_problems({"load_avg_1min": 1.2, "load_avg_1min_end": 1.4,
                          "quiet_machine": True}, set()) == []
    assert load_problems({"load_avg_1min": 1.2, "load_avg_1min_end": 1.6,
                          "quiet_machine": True}, set())
    assert load_problems({"load_average": {"start": [2.0, 0, 0], "end": [0.1, 0, 0]},
                          "quiet_machine": True}, set())


def test_an_aggregation_points_at_its_measurement():
    agg = {"load_scope": "aggregation", "load_average": {"start": [0.1] * 3, "end": [0.1] * 3}}
    assert load_problems(agg, set())  # its own load says nothing of the measurement
    assert load_problems({**agg, "measured_in": ["s0", "s1"]}, {"s0", "s1"}) == []
    assert load_problems({**agg, "measured_in": ["s0", "s9"]}, {"s0"}) == [
        "measured_in names s9, which is not in bench/results"]
    assert load_problems({**agg, "load_not_recorded": "runs record none"}, set()) == []
    assert load_problems({**agg, "measured_in": ["s0"], "quiet_machine": True}, {"s0"})
    assert load_problems({**agg, "measured_in": ["s0"], "quiet_machine": False}, {"s0"})


def test_cited_results_expands_braces_and_reads_links():
    text = ("see `bench/results/rehearsal_worlds_tiny{,_s0,_s1}.json` and "
            "[x](../bench/results/claims_tiny_dev.json), `bench/results/` alone, "
            "learning_{grpo,envace}.json without the folder")
    assert cited_results(text) == {"rehearsal_worlds_tiny", "rehearsal_worlds_tiny_s0",
                                   "rehearsal_worlds_tiny_s1", "claims_tiny_dev"}
