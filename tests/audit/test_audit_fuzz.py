"""Fuzzing the audit CLI (#15): random damage to the spec examples, through `replay`,
`rescore` and `compare`.

Damage: byte flips, truncations, integers longer than Python converts, arguments nested 10 to
5,000 deep, NaN / Infinity / 1e400, duplicated lines, non-UTF-8 bytes, values of the wrong type,
a missing last newline, a lone surrogate (``"\\ud800"``) in any string (ids, tool names,
responses: issue 39). For every damaged file the real CLI (in-process, ``audit.cli.main``, and
a few times as a subprocess) must: exit 0, 2 or 3; print no traceback; audit every record that
parses and validates on its own (first of its id), or skip it with a replay reason; account for
every line (read = audited + skipped); leave its inputs byte for byte as they were. `rescore`
must keep every line it cannot use verbatim.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import main
from envace.core.schema import parse_line

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "spec_examples"
LINES = [ln for f in sorted(EXAMPLES.glob("*.jsonl"))
         for ln in f.read_bytes().splitlines(keepends=True) if ln.strip()]
WRONG = [5, -1.5, "x", None, [], {}, True, [1, {"a": None}]]
NONFINITE = ["NaN", "Infinity", "-Infinity", "1e400"]
REPLAY_REASONS = ("cannot replay:", "replay failed: nested too deeply")


def _nodes(data, path=()):  # every (path, value) of parsed JSON
    yield path, data
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _nodes(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _nodes(v, (*path, i))


def _set(data, path, value):
    for p in path[:-1]:
        data = data[p]
    data[path[-1]] = value


def _call_paths(data) -> list[tuple]:
    return [p for p, _ in _nodes(data) if p and p[-1] == "arguments"]


def _with_placeholder(line: bytes, rnd: random.Random, text: str) -> bytes:
    """Put ``text`` (raw JSON) as some call's arguments, or as a new top-level field."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return line
    if not isinstance(data, dict):
        return line
    paths = _call_paths(data)
    if paths:
        _set(data, rnd.choice(paths), "@@PLACEHOLDER@@")
    else:
        data["extra"] = "@@PLACEHOLDER@@"
    try:
        dumped = json.dumps(data)
    except (ValueError, RecursionError):
        return line
    return dumped.replace('"@@PLACEHOLDER@@"', text, 1).encode() + b"\n"


def mutate(lines: list[bytes], rnd: random.Random) -> list[bytes]:
    lines = list(lines)
    i = rnd.randrange(len(lines))
    line = lines[i]
    kind = rnd.choice(["flip", "truncate", "huge", "huge_in_string", "deep", "nonfinite",
                       "duplicate", "non_utf8", "wrong_type", "no_newline", "surrogate"])
    if kind == "flip":
        pos = rnd.randrange(len(line))
        line = line[:pos] + bytes([rnd.randrange(256)]) + line[pos + 1:]
    elif kind == "truncate":
        line = line[: rnd.randrange(len(line))] + b"\n"
    elif kind == "huge":
        line = _with_placeholder(line, rnd, "1" + "0" * rnd.choice([4300, 5000, 20000]))
    elif kind == "huge_in_string":
        line = _with_placeholder(line, rnd, json.dumps('{"n": 1' + "0" * 5000 + "}"))
    elif kind == "deep":
        d = rnd.choice([10, 150, 300, 1200, 5000])
        line = _with_placeholder(line, rnd, '{"k": ' * d + "1" + "}" * d)
    elif kind == "nonfinite":
        line = _with_placeholder(line, rnd, '{"x": ' + rnd.choice(NONFINITE) + "}")
    elif kind == "duplicate":
        lines.insert(i, line)
    elif kind == "non_utf8":
        pos = rnd.randrange(len(line))
        line = line[:pos] + rnd.choice([b"\xff", b"\xc3", b"\xed\xa0\x80"]) + line[pos:]
    elif kind == "wrong_type":
        with contextlib.suppress(ValueError, RecursionError):
            data = json.loads(line)
            nodes = [p for p, _ in _nodes(data) if p]
            if nodes:
                _set(data, rnd.choice(nodes), rnd.choice(WRONG))
                line = json.dumps(data).encode() + b"\n"
    elif kind == "surrogate":  # valid JSON: "\ud800" decodes to a lone surrogate (issue 39)
        with contextlib.suppress(ValueError, RecursionError):
            data = json.loads(line)
            strings = [p for p, v in _nodes(data) if p and isinstance(v, str)]
            if strings:
                where = rnd.choice(strings)
                node = data
                for p in where[:-1]:
                    node = node[p]
                node[where[-1]] = node[where[-1]] + rnd.choice(["\ud800", "\udfff", "\udc00x"])
                line = json.dumps(data).encode() + b"\n"
    elif kind == "no_newline" and i == len(lines) - 1:
        line = line.rstrip(b"\n")
    lines[i] = line
    return lines


def damaged_file(rnd: random.Random) -> bytes:
    lines = [rnd.choice(LINES) for _ in range(rnd.randint(1, 6))]
    for _ in range(rnd.randint(0, 3)):
        lines = mutate(lines, rnd)
    return b"".join(ln if ln.endswith(b"\n") or k == len(lines) - 1 else ln + b"\n"
                    for k, ln in enumerate(lines))


def expected(path: Path) -> tuple[int, dict[str, int]]:
    """(non-blank lines, id -> line of the first valid record with that id), as a reader
    that knows nothing of the audit would count them."""
    n, first = 0, {}
    for k, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        if not raw.strip():
            continue
        n += 1
        try:
            traj, _ = parse_line(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        if traj is not None and traj.id not in first:
            first[traj.id] = k
    return n, first


def digest(paths: list[Path]) -> list[str]:
    out = []
    for p in paths:
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        out += [f"{f}:{hashlib.sha256(f.read_bytes()).hexdigest()}" for f in files if f.is_file()]
    return out


def cli(*args: object) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["--quiet", *map(str, args)])
    return rc, err.getvalue()


def clean_exit(rc: int, err: str) -> None:
    assert rc in (0, 2, 3), err
    assert "Traceback" not in err and "internal error" not in err, err


def check_replay(src: Path, out: Path) -> None:
    before = digest([src])
    rc, err = cli("replay", src, "--out", out)
    clean_exit(rc, err)
    assert digest([src]) == before
    assert rc != 2  # an existing, readable file: something is always written
    n, first = expected(src)
    s = json.loads((out / "summary.json").read_text())
    assert s["counts"]["records_read"] == n and s["reconciles"]
    audited = {json.loads(t)["line"] for t in (out / "trajectories.jsonl").read_text().split("\n")
               if t.strip()}
    skipped = {r["line"]: r["reason"] for r in s["skipped_records"]}
    for tid, line in first.items():  # every valid record: audited, or it could not be replayed
        assert line in audited or skipped[line].startswith(REPLAY_REASONS), (tid, skipped[line])
    assert audited <= set(first.values())
    assert s["counts"]["trajectories"] == len(audited)
    assert (rc == 3) == bool(s["skipped_records"])


def check_rescore_and_compare(audit: Path, work: Path, rnd: random.Random) -> None:
    bad = work / "bad"
    shutil.copytree(audit, bad)
    steps = (bad / "steps.jsonl").read_bytes().splitlines(keepends=True)
    if steps:
        for _ in range(rnd.randint(1, 3)):
            steps = mutate(steps, rnd)
        (bad / "steps.jsonl").write_bytes(b"".join(steps))
    if rnd.random() < 0.3:
        text = (bad / "summary.json").read_bytes()
        (bad / "summary.json").write_bytes(mutate([text], rnd)[0])
    nonblank = [ln for ln in (bad / "steps.jsonl").read_bytes().split(b"\n") if ln.strip()]
    before = digest([audit, bad])
    rc, err = cli("compare", audit, bad)
    clean_exit(rc, err)
    rc, err = cli("rescore", bad, "--scorers", "exact", "json_f1", "--out", work / "re")
    clean_exit(rc, err)
    assert digest([audit, bad]) == before
    if rc == 2:
        assert not (work / "re").exists()
        return
    kept = work / "re" / "steps.unreadable.jsonl"
    n_kept = len(kept.read_bytes().splitlines()) if kept.exists() else 0
    new = [ln for ln in (work / "re" / "steps.jsonl").read_text().split("\n") if ln.strip()]
    assert len(new) + n_kept == len(nonblank)  # no line dropped
    rc, err = cli("rescore", work / "re")  # in place, over its own earlier output
    clean_exit(rc, err)
    assert rc != 2


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rnd=st.randoms(use_true_random=False))
def test_damaged_inputs_never_crash_the_audit(rnd: random.Random) -> None:
    with tempfile.TemporaryDirectory() as d, \
            mock.patch("audit.store.report.plot_all", return_value=[]), \
            mock.patch("audit.stats.summary.N_BOOT", 50), \
            mock.patch("audit.stats.summary.LOGISTIC_BOOT", 0):
        work = Path(d)
        src = work / "in.jsonl"
        src.write_bytes(damaged_file(rnd))
        later = random.Random(rnd.getrandbits(32))  # the audit's bytes vary (paths, seconds)
        check_replay(src, work / "audit")
        check_rescore_and_compare(work / "audit", work, later)


def test_damaged_inputs_through_the_real_process(tmp_path) -> None:
    """A few damaged files through `envace-audit` as a process: exit codes, no traceback; the
    report's real plots drawn from what survived (the in-process fuzz above mocks plotting for
    speed: this is where plotting meets damaged input)."""
    drawn = 0
    for seed in range(3):
        rnd = random.Random(seed)
        src = tmp_path / f"in{seed}.jsonl"
        src.write_bytes(damaged_file(rnd) + damaged_file(rnd))
        before = digest([src])
        r = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "replay", str(src),
                            "--out", str(tmp_path / f"a{seed}"), "--workers", "2"],
                           capture_output=True, text=True, timeout=300)
        clean_exit(r.returncode, r.stderr)
        assert digest([src]) == before
        n, _ = expected(src)
        s = json.loads((tmp_path / f"a{seed}" / "summary.json").read_text())
        assert s["counts"]["records_read"] == n and s["reconciles"]
        png = tmp_path / f"a{seed}" / "depth.png"
        assert png.exists() == bool(s.get("by_depth"))  # drawn exactly when there is a curve
        if png.exists():
            assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
            drawn += 1
        r = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "compare",
                            str(tmp_path / f"a{seed}"), str(tmp_path / f"a{seed}")],
                           capture_output=True, text=True, timeout=300)
        clean_exit(r.returncode, r.stderr)
    assert drawn, "no seed left a rehearsed step to plot: the plotting was not exercised"
