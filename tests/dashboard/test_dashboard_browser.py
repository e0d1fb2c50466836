"""The dashboard in a real browser: the test starts the server (``envace-dashboard``'s code) on a
free port, drives Debian's Chromium through selenium and chromedriver, waits for each page's
content, asserts on the visible text and saves a screenshot of each page in
``test-artifacts/dashboard/``. Skipped (cleanly) only when Chromium or chromedriver is absent.

    .venv/bin/pytest -m browser tests/dashboard/test_dashboard_browser.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.fixtures_dashboard import shared_root

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "dashboard"
_spec = importlib.util.spec_from_file_location("dashboard_screens",
                                               ROOT / "scripts" / "dashboard_screens.py")
screens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(screens)

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(screens.have_browser() is not None,
                                 reason=str(screens.have_browser()))]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = shared_root(tmp_path_factory.getbasetemp())
    (root / "live" / "heartbeat").write_text("now")  # a live run beats every 20 s
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with screens.serve(root) as url, screens.browser() as driver:
        yield root, url, driver


def _pct(x: float) -> str:
    return f"{x:.1%}"


def _summary(p: Path) -> dict:
    return json.loads((p / "summary.json").read_text())


# The real `envace train` run of the fixture, and the synthetic one for the pages that need a
# case it does not give (two audits pairing call by call; a test-time rehearsal that succeeds).
RUN_OF = {"compare": "demo", "rehearsal": "demo"}
REAL = "tiny"


def _last_audit(run: Path) -> Path:
    return max((run / "audit").glob("step_*"), key=lambda d: int(d.name.split("_")[1]))


def _expected(root: Path) -> dict[str, list[str]]:
    """Per page: strings that must be visible, taken from the files the page reads."""
    last = _last_audit(root / REAL)
    s_last = _summary(last)
    rows = [json.loads(x) for x in (root / REAL / "metrics.jsonl").read_text().splitlines()]
    ev = json.loads((root / "demo" / "eval" / "rehearsal_dev" / "summary.json").read_text())
    trajs = [json.loads(x) for x in (last / "trajectories.jsonl").read_text().splitlines()]
    first = trajs[0]
    return {
        "runs": ["Runs", f"{REAL} · finished", "demo", "live", "running", "died",
                 "lookup_dev", _pct(s_last["divergence_rate"])],
        "training": ["Reward", f"{rows[-1]['reward/mean']:.3f}", f"{len(rows)} steps logged"],
        "fidelity": ["Divergence rate", _pct(s_last["divergence_rate"]),
                     str(s_last["counts"]["scored_steps"]), "Over training", "By depth"],
        # (no "Aligned with difflib against": the real run has no second trajectory of a task
        # to align with; tests/dashboard/test_dashboard.py checks the alignment on the synthetic
        # demo)
        "trajectories": [first["trajectory_id"], "Rehearsed (written by the policy)",
                         "Actual (the real environment)"],
        "compare": ["demo/step_0", "demo/step_10", "Paired on",
                    _pct(_summary(root / "demo" / "audit" / "step_0")["divergence_rate"])],
        "rehearsal": ["Rehearsal memory", "Committed run", "Outcome: success",
                      _pct(ev["success_rate"])],
    }


@pytest.mark.parametrize("path,name,wait_for", screens.PAGES, ids=[p[1] for p in screens.PAGES])
def test_page_in_chromium(site, path, name, wait_for):
    root, url, driver = site
    query = f"run={RUN_OF.get(name, REAL)}"
    if name == "trajectories":  # the trajectory _expected names
        first = (_last_audit(root / REAL) / "trajectories.jsonl").read_text().splitlines()[0]
        query += f"&traj={json.loads(first)['trajectory_id']}"
    text = screens.open_page(driver, f"{url}/{path}?{query}", wait_for)
    shot = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    plain = text.replace("\u2060", "")  # the word joiners dashboard.safe.md puts in ids
    missing = [s for s in _expected(root)[name] if s not in plain]
    assert not missing, f"{name}: not visible: {missing}"
    assert "Traceback" not in text and "Could not show" not in text
    if name in ("training", "fidelity", "compare"):
        from selenium.common.exceptions import TimeoutException
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        try:  # the text arrives before vega has embedded the charts, later on a loaded machine
            WebDriverWait(driver, 60).until(
                lambda d: d.find_elements(By.CSS_SELECTOR, ".vega-embed"))
        except TimeoutException:
            pytest.fail(f"{name}: no chart drawn within 60 s")


def test_first_divergence_and_diff_highlights_in_chromium(site):
    from selenium.webdriver.common.by import By

    root, url, driver = site
    trajs = [json.loads(x) for x in (_last_audit(root / REAL) / "trajectories.jsonl")
             .read_text().splitlines()]
    t = next(r for r in trajs if r["first_divergence"] is not None)
    tid = t["trajectory_id"]
    text = screens.open_page(driver, f"{url}/trajectories?run={REAL}&traj={tid}",
                             "First divergence")
    mark = driver.find_element(By.XPATH, "//*[contains(text(), 'First divergence')]")
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", mark)
    driver.save_screenshot(str(ARTIFACTS / "trajectory_detail.png"))
    assert f"First divergence — step {t['first_divergence']}" in text
    assert f"first divergence at step {t['first_divergence']}" in text
    marks = driver.find_elements(By.XPATH, "//pre//span[contains(@style, 'background')]")
    assert marks, "no highlighted leaf in the diffs"


def test_a_path_outside_the_root_is_refused_in_chromium(site):
    _, url, driver = site
    text = screens.open_page(driver, f"{url}/fidelity?run=../../etc", "Refused")
    driver.save_screenshot(str(ARTIFACTS / "refused.png"))
    assert "outside the dashboard root" in text


def test_streamlit_run_takes_the_root_after_the_dashes(site):
    """``streamlit run dashboard/app.py -- DIR`` on one plain audit directory."""
    root, _, driver = site
    s = _summary(root / "lookup_dev")
    with screens.serve(root / "lookup_dev", plain=True) as url:
        text = screens.open_page(driver, f"{url}/fidelity", "Median first divergence")
    assert _pct(s["divergence_rate"]) in text and str(s["counts"]["scored_steps"]) in text
