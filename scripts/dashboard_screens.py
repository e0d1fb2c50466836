"""Serve the dashboard and screenshot every page in Debian's Chromium (selenium + chromedriver).

    .venv/bin/python scripts/dashboard_screens.py [ROOT] [--run demo] [--out DIR]

Screenshots go to test-artifacts/dashboard/ by default. Without ROOT it builds the fixture runs
(``tests/fixtures_dashboard.py``) in a temporary directory. Needs ``bash scripts/setup.sh
--browser`` (chromium, chromium-driver). The browser test
(``tests/dashboard/test_dashboard_browser.py``) uses the same helpers: :func:`serve`,
:func:`browser`, :func:`open_page`. """

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# url path, file name, texts of which one says the page's content is there: a page shows one of
# them whatever the run holds (a real run may have no identical calls in the two audits compare
# picks, and no test-time rehearsal evaluation)
PAGES = [("", "runs", ("Latest divergence rate",)),
         ("training", "training", ("steps logged, last step",)),
         ("fidelity", "fidelity", ("Median first divergence",)),
         ("trajectories", "trajectories", ("Rehearsed (written by the policy)",
                                           "Recorded (written by the real environment)")),
         ("compare", "compare", ("Paired on", "Rehearsed steps: A", "Comparing needs two")),
         ("rehearsal", "rehearsal", ("Rehearsal memory", "No rehearsal evaluations"))]
CHROME_FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--window-size=1400,2200", "--hide-scrollbars"]


def have_browser() -> str | None:
    """None when chromium, chromedriver and selenium are all there, else what is missing."""
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not Path(exe).exists():
            return f"{exe} is absent (bash scripts/setup.sh --browser installs it)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(root: Path, port: int | None = None, timeout: float = 90,
          plain: bool = False) -> Iterator[str]:
    """Run ``envace-dashboard ROOT --port P`` (the console script's code) until the block ends;
    ``plain``: ``streamlit run dashboard/app.py ... -- ROOT`` instead (the root from argv)."""
    port = port or free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115
    env = {k: v for k, v in os.environ.items() if k != "ENVACE_DASHBOARD_ROOT"}
    cmd = [sys.executable, "-m", "dashboard.launch", str(root), "--port", str(port)]
    if plain:
        cmd = [sys.executable, "-m", "streamlit", "run", "dashboard/app.py", "--server.port",
               str(port), "--server.address", "127.0.0.1", "--server.headless", "true",
               "--browser.gatherUsageStats", "false", "--", str(root)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                log.seek(0)
                raise RuntimeError(f"dashboard server did not start: {log.read()[-2000:]}")
            time.sleep(0.5)
        yield url
    finally:  # stop the server and anything it started (its own process group)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()
        Path(log.name).unlink(missing_ok=True)


@contextlib.contextmanager
def browser() -> Iterator[object]:
    """Headless Chromium with a fresh profile, driven through chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="envace-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in [*CHROME_FLAGS, f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_page(driver, url: str, wait_for: str | tuple[str, ...], timeout: float = 90) -> str:
    """Load a page and wait until ``wait_for`` (or one of several texts) is visible and the app
    has stopped running; returns the visible text."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    wanted = (wait_for,) if isinstance(wait_for, str) else wait_for

    def ready(d) -> bool:
        body = d.find_element(By.TAG_NAME, "body").text
        running = d.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]')
        return any(w in body for w in wanted) and not any(
            e.is_displayed() and "Running" in e.text for e in running)

    # Streamlit re-renders while it runs: an element found one moment may be gone the next
    wait = WebDriverWait(driver, timeout, poll_frequency=0.5,
                         ignored_exceptions=(StaleElementReferenceException,))
    wait.until(ready)
    time.sleep(1.5)  # let the charts draw
    return wait.until(lambda d: d.find_element(By.TAG_NAME, "body").text)


def capture(root: Path, out: Path, run: str = "demo") -> list[Path]:
    """Screenshot every page of ``run`` into ``out``; returns the files."""
    out.mkdir(parents=True, exist_ok=True)
    shots = []
    with serve(root) as url, browser() as driver:
        for path, name, wait_for in PAGES:
            open_page(driver, f"{url}/{path}?run={run}", wait_for)
            shot = out / f"{name}.png"
            driver.save_screenshot(str(shot))
            shots.append(shot)
    return shots


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("root", nargs="?", type=Path)
    ap.add_argument("--run", default="demo")
    ap.add_argument("--out", type=Path, default=ROOT / "test-artifacts" / "dashboard")
    args = ap.parse_args()
    missing = have_browser()
    if missing:
        print(f"dashboard_screens: {missing}", file=sys.stderr)
        return 2
    root = args.root
    if root is None:
        sys.path.insert(0, str(ROOT))
        from tests.fixtures_dashboard import build

        root = build(Path(tempfile.mkdtemp(prefix="envace-dash-")) / "runs")
    for shot in capture(root, args.out, args.run):
        print(shot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
