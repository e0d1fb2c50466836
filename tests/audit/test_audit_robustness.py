"""Issue #15, the audit side: every case a hostile tester found, reproduced, and what now holds.

Rules (README, "Formats and exit codes"): no command writes over its inputs or another run's
files (a locked, checked output directory renamed into place); one bad record costs one record
(file, line, reason; exit 3); exit codes 0 / 3 / 2 / 130, 1 only for a bug; workers die with
their parent.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

import psutil
import pytest

from audit.cli import main
from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.store.output import OutputDir, OutputRefused
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

AUDIT = [sys.executable, "-m", "audit.cli", "--quiet"]


def cli(*args: object) -> tuple[int, str, str]:
    """The real CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["--quiet", *map(str, args)])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(autouse=True)
def _no_plots():
    """PNGs are not what these tests are about (and cost seconds each)."""
    with mock.patch("audit.store.report.plot_all", return_value=[]):
        yield


def tree(d: Path) -> dict[str, str]:
    """Every file under d (hidden included) -> sha256 of its bytes."""
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def lines(p: Path) -> list[str]:
    return [x for x in p.read_text().splitlines() if x.strip()]


def good_line(examples: Path, k: int = 0) -> str:
    return (examples / "real.jsonl").read_text().splitlines()[k]


def variant(examples: Path, new_id: str) -> str:
    rec = json.loads(good_line(examples))
    rec["id"] = new_id
    return json.dumps(rec)


@pytest.fixture
def audited(tmp_path, examples) -> Path:
    """An earlier, complete audit of real.jsonl."""
    out = tmp_path / "audit"
    assert cli("replay", examples / "real.jsonl", "--out", out)[0] == 0
    return out


# ---------------------------------------------------------------- inputs and outputs


def test_an_input_inside_the_output_is_refused(audited, tmp_path):
    before = tree(audited)
    for name in ("trajectories.jsonl", "steps.jsonl"):
        rc, _, err = cli("replay", audited / name, "--out", audited)
        assert rc == 2 and "inside the output directory" in err and "Traceback" not in err
    # the same file by another name: a symlink, and a hard link elsewhere (same inode)
    (tmp_path / "link.jsonl").symlink_to(audited / "trajectories.jsonl")
    os.link(audited / "trajectories.jsonl", tmp_path / "hard.jsonl")
    for name in ("link.jsonl", "hard.jsonl"):
        rc, _, err = cli("replay", tmp_path / name, "--out", audited)
        assert rc == 2, err
    # a --reference inside the output is an input too
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "train.jsonl").write_text("")
    rc, _, err = cli("replay", tmp_path / "hard.jsonl", "--out", tmp_path / "x",
                     "--reference", tmp_path / "x" / "train.jsonl")
    assert rc == 2 and "inside the output directory" in err
    assert tree(audited) == before


def test_a_directory_of_another_tools_files_is_refused(tmp_path, examples):
    evals = tmp_path / "eval"
    evals.mkdir()
    (evals / "trajectories.jsonl").write_text(good_line(examples) + "\n")
    (evals / "summary.json").write_text(json.dumps({"schema": "envace.eval/1"}))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("mine")
    for d in (evals, notes):
        before = tree(d)
        rc, _, err = cli("replay", examples / "real.jsonl", "--out", d)
        assert rc == 2 and "refusing to write into" in err
        assert tree(d) == before
    # an earlier audit, or an empty directory, is fine
    (tmp_path / "empty").mkdir()
    assert cli("replay", examples / "real.jsonl", "--out", tmp_path / "empty")[0] == 0


def test_reauditing_replaces_the_whole_directory(audited, tmp_path, examples):
    (audited / "tools.png").write_bytes(b"stale plot")  # a plot the new audit will not make
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    rc, _, _ = cli("replay", bad, "--out", audited)
    assert rc == 3
    assert not (audited / "tools.png").exists()
    s = json.loads((audited / "summary.json").read_text())
    assert s["counts"]["trajectories"] == 0 and lines(audited / "steps.jsonl") == []
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no partial, aside or lock file stays


def test_bad_out_values_are_usage_errors(tmp_path, examples, monkeypatch):
    f = tmp_path / "file"
    f.write_text("x")
    monkeypatch.chdir(tmp_path)
    for out in (f, "", "/proc/envace_audit", "/proc/self/x"):
        rc, _, err = cli("replay", examples / "real.jsonl", "--out", out)
        assert rc == 2 and "Traceback" not in err and "internal error" not in err, (out, err)
    assert f.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing in the cwd
    rc, _, err = cli("rescore", tmp_path, "--out", "")
    assert rc == 2


NOBODY = 65534


def unprivileged(fn):
    """fn() as a user the permissions apply to: itself when the suite is not root; as root
    (where every directory is writable) in a forked child that drops to nobody first. The
    child inherits every module already imported (the stdlib under a private /root may not
    be readable once it has dropped), so call fn once as root before, where it can succeed.
    Returns what fn returns (JSON-able)."""
    if os.geteuid() != 0:
        return fn()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        code = 1
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(w, json.dumps(fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0 and data, "the unprivileged child failed"
    return json.loads(data)


def test_an_unwritable_out_is_a_usage_error(tmp_path, examples):
    """Runs as root too: then the command runs in a child that has dropped to nobody, on a
    copy of the input it can read (pytest's own temporary folder is root's alone)."""
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="envace-unwritable-"))
    try:
        shared.chmod(0o755)
        src = shared / "real.jsonl"
        src.write_text((examples / "real.jsonl").read_text())
        src.chmod(0o644)
        assert cli("replay", src, "--out", tmp_path / "warm")[0] == 0  # imports everything
        ro = shared / "ro"
        ro.mkdir()
        ro.chmod(0o555)

        def attempt():
            rc, _, err = cli("replay", src, "--out", ro / "a")
            return [os.access(ro, os.W_OK), rc, err]

        writable, rc, err = unprivileged(attempt)
        assert not writable  # the case is real: this user cannot write there
        assert rc == 2 and "internal error" not in err and f"cannot write in {ro}" in err
        assert list(ro.iterdir()) == []
    finally:
        for p in (shared / "ro", shared):
            p.chmod(0o755)
        import shutil

        shutil.rmtree(shared, ignore_errors=True)


def test_a_second_writer_is_refused(tmp_path, examples):
    out = tmp_path / "a"
    with OutputDir(out, [], kind="audit"):
        rc, _, err = cli("replay", examples / "real.jsonl", "--out", out)
        assert rc == 2 and "another envace-audit command is writing" in err
        with pytest.raises(OutputRefused):
            run_audit([str(examples / "real.jsonl")], out, AuditOptions(progress=False))
    assert cli("replay", examples / "real.jsonl", "--out", out)[0] == 0  # released


def test_two_audits_at_once_leave_one_whole_audit(tmp_path, examples):
    """Two real processes into one --out: each finishes or is refused; never a mix."""
    out = tmp_path / "shared"
    inputs = [examples / "real.jsonl", examples / "rehearsed.jsonl"]
    procs = [subprocess.Popen([*AUDIT, "replay", str(i), "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in inputs]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    for rc, err in results:
        assert rc in (0, 2) and "Traceback" not in err, err
        if rc == 2:
            assert "another envace-audit command is writing" in err
    assert any(rc == 0 for rc, _ in results)
    s = json.loads((out / "summary.json").read_text())
    steps = [json.loads(x) for x in lines(out / "steps.jsonl")]
    trajs = [json.loads(x) for x in lines(out / "trajectories.jsonl")]
    assert len(steps) == s["counts"]["steps"] and len(trajs) == s["counts"]["trajectories"]
    assert {t["file"] for t in trajs} == set(s["inputs"])


def test_a_crash_midway_leaves_the_earlier_audit_alone(audited, tmp_path, examples):
    before = tree(audited)
    with mock.patch("audit.pipeline.SummaryAggregator.summary",
                    side_effect=RuntimeError("boom")), \
            pytest.raises(RuntimeError):
        run_audit([str(examples / "rehearsed.jsonl")], audited, AuditOptions(progress=False))
    assert tree(audited) == before
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_killed_audit_is_cleaned_up_by_the_next(audited, tmp_path, examples):
    """SIGKILL between the two renames: the next command puts the earlier audit back."""
    before = tree(audited)
    aside = tmp_path / ".audit.old-deadbeef"
    audited.rename(aside)
    (tmp_path / ".audit.partial-cafecafe").mkdir()
    with OutputDir(audited, [], kind="audit"):
        assert tree(audited) == before
        assert not aside.exists() and not (tmp_path / ".audit.partial-cafecafe").exists()


# ---------------------------------------------------------------- one bad record, one record


def _mixed_file(tmp_path: Path, examples: Path) -> Path:
    good = good_line(examples)
    huge = good.replace('"meta": {', '"meta": {"n": 1' + "0" * 5000 + ", ", 1)
    rec = json.loads(good)
    deep: dict = {}
    node = deep
    for _ in range(300):
        node["k"] = {}
        node = node["k"]
    rec["id"] = "deep-300"
    rec["messages"][1]["tool_calls"][0]["function"]["arguments"] = deep
    deep_line = json.dumps(rec)
    too_deep = good.replace('"meta": {', '"meta": {"d": ' + "[" * 100_000 + "]" * 100_000 + ", ",
                            1).replace(json.loads(good)["id"], "too-deep")
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join([good, huge, deep_line, too_deep, variant(examples, "last")]) + "\n")
    return p


@pytest.mark.parametrize("workers", [1, 2])
def test_huge_integers_and_deep_nesting_cost_one_record(tmp_path, examples, workers):
    p = _mixed_file(tmp_path, examples)
    rc, _, err = cli("replay", p, "--out", tmp_path / "o", "--workers", workers)
    assert rc == 3, err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["counts"]["records_read"] == 5 and s["reconciles"]
    ids = [json.loads(x)["trajectory_id"] for x in lines(tmp_path / "o" / "trajectories.jsonl")]
    assert ids[0] == json.loads(good_line(examples))["id"] and "last" in ids
    reasons = {r["line"]: r["reason"] for r in s["skipped_records"]}
    assert "4300 digits" in reasons[2] and "nested too deeply" in reasons[4]
    assert f"{p}:2:" in err and f"{p}:4:" in err
    # 300 deep is audited, or skipped with its own reason; never the whole audit
    assert "deep-300" in ids or 3 in reasons


def test_huge_integers_in_the_reference_are_skipped_and_reported(tmp_path, examples):
    ref = tmp_path / "train.jsonl"
    good = good_line(examples, 1)
    ref.write_text(good + "\n" + good.replace('"meta": {', '"meta": {"n": 1' + "0" * 5000 + ", ")
                   + "\n")
    rc, _, err = cli("replay", examples / "rehearsed.jsonl", "--reference", ref,
                     "--out", tmp_path / "o")
    assert rc == 3 and f"{ref}:2" in err and "4300 digits" in err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["reference_counts"]["records_read"] == 2
    assert [r["line"] for r in s["reference_skipped_records"]] == [2]


def test_a_garbage_reference_is_a_usage_error(tmp_path, examples, audited):
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_bytes(b"\n".join([b"{oops", b"\xff\xfe", b"[1, 2]"] * 134) + b"\n")
    for ref in (garbage, audited / "steps.jsonl"):
        rc, _, err = cli("replay", examples / "real.jsonl", "--reference", ref,
                         "--out", tmp_path / "o")
        assert rc == 2 and "no usable record" in err, err
        assert not (tmp_path / "o").exists()
    assert "402 read, 402 unreadable" in cli("replay", examples / "real.jsonl", "--reference",
                                             garbage, "--out", tmp_path / "o")[2]


def test_duplicate_ids_are_audited_once_and_reported(tmp_path, examples):
    real = examples / "real.jsonl"
    n = len(lines(real))
    rc, _, err = cli("replay", real, real, "--out", tmp_path / "o")
    assert rc == 3 and "duplicate trajectory id" in err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["counts"]["trajectories"] == n and s["counts"]["skipped"] == n and s["reconciles"]
    assert len(lines(tmp_path / "o" / "trajectories.jsonl")) == n
    assert s["statistics"]["trajectories"] == n  # counted once everywhere
    dups = [r for r in s["skipped_records"] if "duplicate" in r["reason"]]
    assert [r["line"] for r in dups] == list(range(1, n + 1)) and dups[0]["file"] == str(real)


def test_non_finite_numbers_are_replayed_as_they_are_and_reported(tmp_path, examples):
    rec = json.loads(good_line(examples))
    text = json.dumps(rec).replace('{"folder": "Drafts"}',
                                   '{"folder": "Drafts", "x": NaN, "y": Infinity, "z": 1e400}')
    p = tmp_path / "nan.jsonl"
    p.write_text(text + "\n")
    rc, _, err = cli("replay", p, "--out", tmp_path / "o")
    assert rc == 0
    assert f"{p}:1:" in err and "arguments.x = nan" in err and "arguments.z = inf" in err
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["warnings"][0]["line"] == 1 and "non-finite" in s["warnings"][0]["message"]
    first = json.loads(lines(tmp_path / "o" / "steps.jsonl")[0])
    assert first["arguments"]["y"] == float("inf") and first["arguments"]["x"] != 0  # not null


# ---------------------------------------------------------------- damaged audits


def _damage(src: Path, dst: Path, how: str) -> None:
    import shutil

    shutil.copytree(src, dst)
    steps = (dst / "steps.jsonl").read_bytes().splitlines(keepends=True)
    rec = json.loads(steps[1])
    if how == "string score":
        rec["scores"]["exact"] = "1.0"
        steps[1] = (json.dumps(rec) + "\n").encode()
    elif how == "missing key":
        del rec["diverged"]
        steps[1] = (json.dumps(rec) + "\n").encode()
    elif how == "non-utf8":
        steps[1] = steps[1][:20] + b"\xff" + steps[1][21:]
    elif how == "truncated":
        steps[-1] = steps[-1][:40]
    if how == "bad summary":
        (dst / "summary.json").write_text('{"counts": "many", "schema": "envace.audit/2"')
    else:
        (dst / "steps.jsonl").write_bytes(b"".join(steps))


@pytest.mark.parametrize("how", ["string score", "missing key", "non-utf8", "truncated",
                                 "bad summary"])
def test_damaged_audits_are_reported_by_file_and_line(audited, tmp_path, how):
    bad = tmp_path / "bad"
    _damage(audited, bad, how)
    where = f"{bad / 'summary.json'}" if how == "bad summary" else f"{bad / 'steps.jsonl'}:"
    before = tree(bad)
    rc, out, err = cli("compare", audited, bad)
    assert rc == 3 and where in err and "Traceback" not in err, err
    rc, _, err = cli("rescore", bad, "--out", tmp_path / "re")
    assert rc == 3 and where in err and "Traceback" not in err, err
    assert tree(bad) == before
    s = json.loads((tmp_path / "re" / "summary.json").read_text())
    n_old = len(lines(audited / "steps.jsonl"))
    kept = (tmp_path / "re" / "steps.unreadable.jsonl")
    n_kept = len(kept.read_bytes().splitlines()) if kept.exists() else 0
    assert len(lines(tmp_path / "re" / "steps.jsonl")) + n_kept == n_old  # nothing dropped
    assert s["counts"]["steps"] == n_old - n_kept


def test_rescore_in_place_keeps_unreadable_lines(audited):
    steps = (audited / "steps.jsonl").read_bytes()
    garbage = b'{"trajectory_id": "x", "scores": \xff broken\n'
    (audited / "steps.jsonl").write_bytes(steps + garbage)
    rc, _, err = cli("rescore", audited)
    assert rc == 3 and f"{audited / 'steps.jsonl'}:" in err
    assert (audited / "steps.jsonl").read_bytes() == steps  # rescored, same scorers: same
    assert (audited / "steps.unreadable.jsonl").read_bytes() == garbage
    skipped = json.loads((audited / "summary.json").read_text())["skipped_records"]
    assert skipped[-1]["kept_in"] == "steps.unreadable.jsonl:1"
    rc, _, _ = cli("rescore", audited, "--scorers", "exact")  # again: carried, not doubled
    assert rc == 3 and (audited / "steps.unreadable.jsonl").read_bytes() == garbage


def test_nothing_usable_is_a_usage_error(audited, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "steps.jsonl").write_bytes(b"\xff\n{oops\n[]\n")
    (bad / "summary.json").write_text("{}")
    before = tree(bad)
    assert cli("compare", audited, bad)[0] == 2
    rc, _, err = cli("rescore", bad)
    assert rc == 2 and "no usable step record" in err
    assert tree(bad) == before


def test_compare_out_is_checked_like_any_output(audited, tmp_path):
    rc, _, err = cli("compare", audited, audited, "--out", audited)
    assert rc == 2
    rc, _, _ = cli("compare", audited, audited, "--out", tmp_path / "cmp")
    assert rc == 0 and (tmp_path / "cmp" / "compare.json").exists()
    assert cli("compare", audited, audited, "--out", tmp_path / "cmp")[0] == 0  # its own: fine


# ---------------------------------------------------------------- signals


@pytest.fixture(scope="module")
def long_input(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("long") / "long.jsonl"
    trajs = list(export_real(split_tasks("dev")[:10]))
    with TrajectoryWriter(p, mode="w") as w:
        for i in range(300):
            for t in trajs:
                w.write(t.model_copy(update={"id": f"{t.id}-{i}"}))
    return p


def _wait_for(cond, timeout: float = 60.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it (a suite started in the background by a
    non-interactive shell inherits SIGINT ignored, and Python never raises KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_exits_130_with_one_line(long_input, tmp_path, audited, workers):
    before = tree(audited)
    p = subprocess.Popen([*AUDIT, "replay", str(long_input), "--out", str(audited),
                          "--workers", str(workers)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True,
                         preexec_fn=default_sigint)
    started = _wait_for(lambda: any(".partial-" in q.name for q in tmp_path.iterdir())
                        and len(psutil.Process(p.pid).children()) >= (workers if workers > 1
                                                                       else 0))
    assert started
    time.sleep(0.3)
    assert p.poll() is None, "the audit finished before it could be interrupted"
    os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    rc = p.wait(timeout=120)
    err = p.stderr.read()
    assert rc == 130 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().count("\n") == 0 and "interrupted" in err
    assert tree(audited) == before
    assert not [q for q in tmp_path.iterdir() if ".partial-" in q.name]


def default_stops() -> None:
    """In the child: the stop signals as a terminal's shell leaves them (a suite started with
    nohup inherits SIGHUP ignored, and an ignored signal is left ignored, by design)."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)


@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGTERM, 143, "SIGTERM"),
                                                   (signal.SIGHUP, 129, "SIGHUP")])
def test_sigterm_and_sighup_stop_as_ctrl_c_does(long_input, tmp_path, audited, sig, code, word):
    """`kill PID` or a closed terminal: the parent cleans up as for Ctrl-C (they once left the
    partial directory and the lock behind), exits 128 + signal with one line."""
    before = tree(audited)
    p = subprocess.Popen([*AUDIT, "replay", str(long_input), "--out", str(audited),
                          "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=default_stops)
    assert _wait_for(lambda: any(".partial-" in q.name for q in tmp_path.iterdir())
                     and len(psutil.Process(p.pid).children()) >= 2)
    time.sleep(0.3)
    assert p.poll() is None, "the audit finished before it could be stopped"
    p.send_signal(sig)
    rc = p.wait(timeout=120)
    err = p.stderr.read()
    assert rc == code and "Traceback" not in err and err.strip().count("\n") == 0, err
    assert word in err and "nothing written" in err
    assert tree(audited) == before
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".")] == []  # nor lock


@pytest.fixture
def python_handlers():
    """Ctrl-C and SIGTERM as a command line's process starts with them (a suite started in the
    background may inherit SIGINT ignored); the handlers before are restored afterwards."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, h in before.items():
        signal.signal(s, h)


def test_a_stop_between_the_commits_renames_waits_for_them(examples, tmp_path, audited,
                                                           monkeypatch, python_handlers):
    """A stop that came after the earlier output was renamed aside and before the new one was
    moved in once left neither (only .old and .partial siblings) while saying the earlier was
    unchanged. Now the renames finish first and the line says the new output is complete."""
    one = tmp_path / "one.jsonl"
    one.write_text(good_line(examples) + "\n")
    real = os.rename

    def rename(a, b):
        real(a, b)
        if ".old-" in str(b):
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "rename", rename)
    rc, _, err = cli("replay", one, "--out", audited)
    assert rc == 143 and err.strip().count("\n") == 0, err
    assert "after its output was complete" in err and str(audited) in err
    assert len(lines(audited / "trajectories.jsonl")) == 1  # the new audit, complete
    assert [q.name for q in tmp_path.iterdir() if q.name.startswith(".")] == []


def test_workers_die_with_their_parent(long_input, tmp_path):
    p = subprocess.Popen([*AUDIT, "replay", str(long_input), "--out", str(tmp_path / "o"),
                          "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    parent = psutil.Process(p.pid)
    assert _wait_for(lambda: len(parent.children()) >= 2)
    workers = [c.pid for c in parent.children()]
    time.sleep(1.0)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    try:
        assert _wait_for(lambda: not any(_alive(w) for w in workers), timeout=10)
    finally:
        for w in workers:  # never leave a failed test's orphans running
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(w).kill()
    assert not (tmp_path / "o").exists()  # only a partial directory, cleaned by the next run
