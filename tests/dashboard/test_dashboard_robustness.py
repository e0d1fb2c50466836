"""The dashboard against hostile or broken run files (#15): a dead run reads "died", one bad
metrics line costs one point (not the charts, not the last reward), content from trajectory
and report files is shown as text (no markdown image a browser would fetch: a tracking pixel),
and streamlit's own server options pass through ``envace-dashboard``.

The pixel is checked three ways: the escaping helpers through a markdown renderer, every
markdown string the pages emit (AppTest) through the same renderer, and a real Chromium that
opens the pages while a local server counts the requests made to the planted host.
"""

from __future__ import annotations

import http.server
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import markdown
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import launch, readers, runs
from dashboard.safe import JOINER, code, md
from tests.fixtures_dashboard import shared_root

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "dashboard" / "app.py")
STALE = time.time() - 3600


def _pixel(host: str, what: str) -> str:
    return f"![px]({host}/{what}.png)"


# ---------------------------------------------------------------- status


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _marker(d: Path, pid: int, host: str | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.yaml").write_text("steps: 5\n")
    (d / "RUNNING").write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                           "started": time.time()}))


def _age(d: Path, *names: str) -> None:
    for n in names:
        if (d / n).exists():
            os.utime(d / n, (STALE, STALE))


def test_a_crashed_run_reads_died_not_running(tmp_path):
    crashed = tmp_path / "crashed"  # RUNNING left behind, its process gone, files still fresh
    _marker(crashed, _dead_pid())
    (crashed / "metrics.jsonl").write_text('{"step": 0}\n')
    (crashed / "heartbeat").write_text("now")
    assert runs.run_status(crashed) == "died"
    live = tmp_path / "live"  # this process, beating
    _marker(live, os.getpid())
    (live / "heartbeat").write_text("now")
    assert runs.run_status(live) == "running"
    _age(live, "heartbeat", "RUNNING", "config.yaml")  # alive but silent for an hour: hung
    assert runs.run_status(live) == "died"
    elsewhere = tmp_path / "elsewhere"  # another host: the heartbeat decides
    _marker(elsewhere, 1, host="some-other-host")
    (elsewhere / "heartbeat").write_text("now")
    assert runs.run_status(elsewhere) == "running"
    _age(elsewhere, "heartbeat", "RUNNING")
    assert runs.run_status(elsewhere) == "died"
    old = tmp_path / "old"  # an older trainer's marker (a time stamp), long silent
    old.mkdir()
    (old / "RUNNING").write_text("1700000000.0")
    (old / "metrics.jsonl").write_text('{"step": 0}\n')
    _age(old, "RUNNING", "metrics.jsonl")
    assert runs.run_status(old) == "died"
    (old / "report.md").write_text("# done")
    assert runs.run_status(old) == "finished"


# ---------------------------------------------------------------- one bad metrics line


def test_one_bad_metrics_line_costs_one_point(tmp_path):
    p = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "reward/mean": 0.1}, {"step": 1, "reward/mean": 0.2},
            {"step": "two", "reward/mean": 0.9}, {"step": 3, "reward/mean": 0.4},
            {"step": 4, "reward/mean": float("inf"), "loss": 1.0}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))  # Infinity, as json writes it
    got = readers.metrics_frame(p)
    f = got.frame
    assert f["step"].tolist() == [0, 1, 3, 4] and str(f["step"].dtype).startswith("int")
    assert f["reward/mean"].tolist()[:3] == [0.1, 0.2, 0.4] and f["reward/mean"].isna().iloc[3]
    assert f["loss"].tolist()[3] == 1.0  # the row's other figures stay
    assert any("line 3" in n and "'two'" in n for n in got.notes), got.notes


# ---------------------------------------------------------------- escaping helpers


@pytest.mark.parametrize("text", [
    "![px](http://evil.example/p.png)", "[link](http://evil.example)", "<http://evil.example>",
    "www.evil.example/x.png", "<img src='http://evil.example/p.png'>",
    ":red[boom] :smile: $x^2$", "# heading\n![px](http://evil.example/p.png)", "a*b*_c_ `d`",
])
def test_md_leaves_no_image_or_link(text):
    html = markdown.markdown(f"before {md(text)} after")
    assert "<img" not in html and "<a " not in html and "<em>" not in html, html
    assert "<code>" not in html and "<h1>" not in html
    assert not _autolinks(md(text)), md(text)


# what GFM turns into a link after escapes are resolved (Streamlit's markdown does this)
_AUTOLINK = re.compile(r"(?i)https?://|\bwww\.|[\w.+-]@[\w-]+\.|\b(?:mailto|xmpp):")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)*?\1")


def _autolinks(markdown_text: str) -> list[str]:
    """Autolink literals outside code spans, once backslash escapes are resolved."""
    plain = _CODE_SPAN.sub("", markdown_text)
    return _AUTOLINK.findall(re.sub(r"\\(.)", r"\1", plain))


@pytest.mark.parametrize("text", ["cd` ![px](http://evil.example/p.png) `", "a``b`c", "`",
                                  "x ```` y"])
def test_code_span_cannot_be_closed_from_inside(text):
    html = markdown.markdown(f"call {code(text)} done")
    assert "<img" not in html and html.count("<code>") == 1, html
    assert html.split("<code>")[1].split("</code>")[0].strip() == \
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").strip()


# ---------------------------------------------------------------- a hostile run


def hostile_root(base: Path, host: str) -> tuple[Path, str]:
    """The fixture's finished demo run, copied as ``evil`` and poisoned: a trajectory id, a
    tool name breaking out of backticks, a system message and report.md that plant images on
    ``host``; a metrics line whose step is "two" and one whose reward is Infinity.
    Returns (root, the poisoned trajectory id)."""
    root = base / f"hostile-{abs(hash(host))}"
    if root.exists():
        shutil.rmtree(root)
    run = root / "evil"
    shutil.copytree(shared_root(base) / "demo", run)
    audit = run / "audit" / "step_10"
    trajs = [json.loads(x) for x in (audit / "trajectories.jsonl").read_text().splitlines()]
    old = trajs[0]["trajectory_id"]
    tid = f"evil {_pixel(host, 'id')}"
    tool = f"cd` {_pixel(host, 'tool')} `"
    trajs[0]["trajectory_id"] = tid
    (audit / "trajectories.jsonl").write_text("".join(json.dumps(t) + "\n" for t in trajs))
    steps = [json.loads(x) for x in (audit / "steps.jsonl").read_text().splitlines()]
    for s in steps:
        if s["trajectory_id"] == old:
            s["trajectory_id"] = tid
            s["tool"] = tool
            s["scores"] = {f"exact {_pixel(host, 'scorer')}": 1.0, **(s.get("scores") or {})}
    (audit / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    rolls = [json.loads(x) for x in (run / "rollouts" / "step_10.jsonl").read_text()
             .splitlines()]
    t = next(r for r in rolls if r["id"] == old)
    t["id"] = tid
    t["messages"].insert(0, {"role": "system", "content": f"Be brief. {_pixel(host, 'system')}"
                                                          f" <img src='{host}/raw.png'>"})
    for m in t["messages"]:
        for c in m.get("tool_calls") or []:
            c["function"]["name"] = tool
        if m.get("role") == "tool":
            m["name"] = tool
    (run / "rollouts" / "step_10.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rolls))
    (run / "report.md").write_text((run / "report.md").read_text()
                                   + f"\n{_pixel(host, 'report')}\n[click]({host}/link)\n"
                                     "![depth](audit/step_10/depth.png)\n")
    rows = (run / "metrics.jsonl").read_text().splitlines()
    rows += [json.dumps({"step": "two", "reward/mean": 0.9}),
             json.dumps({"step": len(rows), "reward/mean": float("inf"), "loss": 0.1})]
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return root, tid


def _page(monkeypatch, root: Path, page: str, **query: str) -> AppTest:
    monkeypatch.setenv("ENVACE_DASHBOARD_ROOT", str(root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update({"run": "evil", **query})
    at.run()
    if page != "runs":
        at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _markdown_strings(at: AppTest) -> list[str]:
    """Every string a page hands to Streamlit's markdown renderer."""
    out = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "subheader",
                 "title", "header"):
        out += [str(e.value) for e in at.get(kind)]
    out += [str(e.label) for e in at.get("expandable")] + [str(m.label) for m in at.metric]
    return out


HOST = "http://pixel.invalid:9"


def test_trajectory_content_is_text_not_markdown(tmp_path_factory, monkeypatch):
    base = tmp_path_factory.getbasetemp()
    root, tid = hostile_root(base, HOST)
    at = _page(monkeypatch, root, "trajectories", traj=tid)
    strings = _markdown_strings(at)
    assert any("pixel" in s for s in strings), "the poisoned trajectory was not shown"
    for s in strings:
        html = markdown.markdown(s)
        assert "<img" not in html and "<a " not in html and not _autolinks(s), (s, html)
    shown = " ".join(str(e.value) for e in at.get("text"))
    assert f"Be brief. {_pixel(HOST, 'system')}" in shown  # the system message, as text
    at = _page(monkeypatch, root, "runs")
    for s in _markdown_strings(at):
        html = markdown.markdown(s)
        assert "<img" not in html and "<a " not in html and not _autolinks(s), (s, html)
    report = [c.value for c in at.code if "pixel.invalid" in c.value]
    assert report and _pixel(HOST, "report") in report[0]  # report.md shown as its text
    assert len(at.get("image")) == 1  # its own plot, served by the dashboard


def test_a_bad_metrics_line_keeps_the_charts_and_a_finite_last_reward(tmp_path_factory,
                                                                     monkeypatch):
    base = tmp_path_factory.getbasetemp()
    root, _ = hostile_root(base, HOST)
    rows = [json.loads(x) for x in (root / "evil" / "metrics.jsonl").read_text().splitlines()]
    good = [r for r in rows if isinstance(r["step"], int)]
    last_finite = [r["reward/mean"] for r in good if abs(r["reward/mean"]) != float("inf")][-1]
    at = _page(monkeypatch, root, "runs")
    table = at.table[0].value
    assert table.loc["evil", "last reward"] == f"{last_finite:.3f}"
    assert table.loc["evil", "steps logged"] == str(len(good))
    at = _page(monkeypatch, root, "training")
    assert at.get("vega_lite_chart"), "no chart drawn"
    notes = " ".join(w.value for w in at.warning)
    assert f"line {len(rows) - 1}" in notes and "two" in notes


# ---------------------------------------------------------------- launcher


def test_streamlit_server_options_pass_through(tmp_path, monkeypatch):
    seen = {}

    def execve(path, argv, env):
        seen["argv"] = argv
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        launch.main([str(tmp_path), "--server.port", "8600", "--server.headless=false",
                     "--theme.base", "dark"])
    argv = seen["argv"]

    def value(key: str) -> str:
        assert argv.count(f"--{key}") == 1, argv
        return argv[argv.index(f"--{key}") + 1]

    assert value("server.port") == "8600" and value("server.headless") == "false"
    assert value("theme.base") == "dark"
    assert value("server.address") == "127.0.0.1"  # still local unless asked
    assert argv[-2:] == ["--", str(tmp_path.resolve())]
    with pytest.raises(SystemExit):
        launch.main(["--server.address", "0.0.0.0", str(tmp_path)])
    assert seen["argv"][seen["argv"].index("--server.address") + 1] == "0.0.0.0"
    assert seen["argv"][-1] == str(tmp_path.resolve())


def test_launcher_refuses_unknown_or_valueless_streamlit_options(tmp_path, capsys):
    assert launch.main([str(tmp_path), "--server.prot", "8600"]) == 2
    assert "did you mean --server.port" in capsys.readouterr().err
    assert launch.main([str(tmp_path), "--server.port"]) == 2
    assert "needs a value" in capsys.readouterr().err
    assert launch.main([str(tmp_path), "--port", "1", "--server.port", "2"]) == 2
    assert "disagree" in capsys.readouterr().err


# ---------------------------------------------------------------- the real browser

_spec = importlib.util.spec_from_file_location("dashboard_screens",
                                               ROOT / "scripts" / "dashboard_screens.py")
screens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(screens)


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 — http.server's name
        _Counter.hits.append(self.path)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.browser
@pytest.mark.skipif(screens.have_browser() is not None, reason=str(screens.have_browser()))
def test_no_request_leaves_for_a_planted_host_in_chromium(tmp_path_factory):
    from selenium.webdriver.common.by import By

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"http://127.0.0.1:{server.server_address[1]}"
    _Counter.hits.clear()
    try:
        root, tid = hostile_root(tmp_path_factory.getbasetemp(), host)
        with screens.serve(root) as url, screens.browser() as driver:
            text = screens.open_page(
                driver, f"{url}/trajectories?run=evil&traj={urllib.parse.quote(tid)}",
                "Rehearsed (written by the policy)")
            text = text.replace(JOINER, "")
            assert _pixel(host, "id") in text  # shown, literally
            assert "cd`" in text and _pixel(host, "system") in text
            html = driver.page_source
            screens.open_page(driver, f"{url}/?run=evil", "Latest divergence rate")
            driver.find_element(By.XPATH, "//summary[contains(., 'report.md')]").click()
            time.sleep(2)
            html += driver.page_source
            assert _pixel(host, "report") in driver.find_element(By.TAG_NAME, "body").text
            links = [a.get_attribute("href") for a in driver.find_elements(By.TAG_NAME, "a")]
            resources = driver.execute_script(
                "return performance.getEntriesByType('resource').map(e => e.name)")
        assert f'src="{host}' not in html and f'href="{host}' not in html
        assert not [x for x in links if x and x.startswith(host)], links
        assert not [r for r in resources if r.startswith(host)], resources
        assert _Counter.hits == [], _Counter.hits
    finally:
        server.shutdown()
