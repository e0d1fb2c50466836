"""`envace-audit merge` on tampered or hostile shards: every one is refused with exit 2 and a
line naming the file (and line), nothing is written at --out, and no input makes it an internal
error (exit 1) or a hang (the hostile tester's M7, M8, M11-M14, M17-M19, M21, M25)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from audit.cli import main
from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.shard import MAX_SHARDS, parse_shard
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter

N = 3


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    """Three shards of an audit of six BFCL dev trajectories (rehearsed, some altered)."""
    d = tmp_path_factory.mktemp("hostile")
    trajs = list(export_real(split_tasks("dev")[:6]))
    for k, t in enumerate(trajs):
        for s in t.tool_steps():
            s.response.rehearsed = True
            if (s.step + k) % 3 == 0:
                s.response.content = json.dumps({"rehearsed": f"wrong {s.step}"})
    inp = d / "in.jsonl"
    with TrajectoryWriter(inp, mode="w") as w:
        for t in trajs:
            w.write(t)
    outs = [d / f"s{i}" for i in range(N)]
    for i, out in enumerate(outs):
        run_audit([str(inp)], out, AuditOptions(progress=False, plots=False, shard=(i, N)))
    return outs


def _target(shards: list[Path]) -> int:
    """The shard holding the most trajectories (the one tampered)."""
    return max(range(N), key=lambda i: (shards[i] / "trajectories.jsonl").stat().st_size)


def _copy(shards: list[Path], where: Path) -> list[Path]:
    dirs = [where / s.name for s in shards]
    for s, d in zip(shards, dirs, strict=True):
        shutil.copytree(s, d)
    return dirs


def _merge(dirs: list[Path], out: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["--quiet", "merge", *map(str, dirs), "--out", str(out)])
    return rc, capsys.readouterr().err


def _edit_summary(edit: Callable[[dict], object]) -> Callable[[Path], None]:
    def run(d: Path) -> None:
        s = json.loads((d / "summary.json").read_text())
        edit(s)
        (d / "summary.json").write_text(json.dumps(s))
    return run


def _edit_line(name: str, n: int, text: str | Callable[[dict], object]) -> Callable[[Path], None]:
    """Replace line ``n`` (1-based) of ``name`` by ``text``, or edit its decoded object."""
    def run(d: Path) -> None:
        lines = (d / name).read_text().splitlines(keepends=True)
        if callable(text):
            row = json.loads(lines[n - 1])
            text(row)
            lines[n - 1] = json.dumps(row) + "\n"
        else:
            lines[n - 1] = text + "\n"
        (d / name).write_text("".join(lines))
    return run


def _set(path: str, value: object) -> Callable[[dict], None]:
    *above, last = path.split(".")

    def run(s: dict) -> None:
        for k in above:
            s = s[k]
        s[last] = value
    return run


def _del(key: str) -> Callable[[dict], None]:
    return lambda s: s.pop(key)


CASES = {  # the tester's id: (the tampering, words the refusal says)
    "M8 index a list": (_edit_summary(_set("shard.index", [1])), "shard.index"),
    "M11 no counts": (_edit_summary(_del("counts")), "counts"),
    "M12 trajectories a string": (_edit_summary(_set("counts.trajectories", "3")),
                                  "counts.trajectories"),
    "M13 skipped record": (_edit_summary(_set("skipped_records", [{"file": 1, "line": "x"}])),
                           "skipped_records"),
    "M14 seconds": (_edit_summary(_set("seconds", "fast")), "seconds"),
    "seconds past a float": (_edit_summary(_set("seconds", 10 ** 400)), "seconds"),
    "count past the limit": (_edit_summary(_set("shard.count", 10 ** 23)), "shard.count"),
    "index past the count": (_edit_summary(_set("shard.index", 7)), "shard.index"),
    "settings scorer": (_edit_summary(_set("shard.settings.verdict_scorer", 5)),
                        "shard.settings.verdict_scorer"),
    "summary a list": (lambda d: (d / "summary.json").write_text("[]"), "not a shard"),
    "M17 steps not JSON": (_edit_line("steps.jsonl", 2, "{not json"), "steps.jsonl:2"),
    "M18 steps a list": (_edit_line("steps.jsonl", 2, "[1,2]"), "steps.jsonl:2"),
    "steps row typed wrong": (_edit_line("steps.jsonl", 2, _set("step", "two")),
                              "steps.jsonl:2"),
    "steps not UTF-8": (lambda d: (d / "steps.jsonl").write_bytes(b"\xff\xfe\n"),
                        "steps.jsonl:1"),
    "M19 steps many": (_edit_line("trajectories.jsonl", 1, _set("steps", "many")),
                       "trajectories.jsonl:1"),
    "trajectory line a string": (_edit_line("trajectories.jsonl", 1, _set("line", "x")),
                                 "trajectories.jsonl:1"),
    "M21 trajectory row a list": (_edit_line("trajectories.jsonl", 1, "[]"),
                                  "trajectories.jsonl:1"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_tampered_shard_is_refused_with_its_place(case, shards, tmp_path, capsys):
    edit, words = CASES[case]
    dirs = _copy(shards, tmp_path)
    edit(dirs[_target(shards)])
    out_parent = tmp_path / "o"
    out_parent.mkdir()
    rc, err = _merge(dirs, out_parent / "m", capsys)
    assert rc == 2, (case, err)
    assert words in err and "nothing written" in err, (case, err)
    assert "internal error" not in err
    assert list(out_parent.iterdir()) == [], case  # no output, no partial, no lock


def test_the_untampered_copies_merge(shards, tmp_path, capsys):
    """The cases above fail for their tampering alone: the same copies, untouched, merge."""
    out = tmp_path / "m"
    rc, err = _merge(_copy(shards, tmp_path), out, capsys)
    assert rc == 0, err
    assert (out / "summary.json").is_file()


def test_a_fifo_summary_is_refused_not_waited_on(shards, tmp_path):
    dirs = _copy(shards, tmp_path)
    fifo = dirs[_target(shards)] / "summary.json"
    fifo.unlink()
    os.mkfifo(fifo)
    out = tmp_path / "m"
    r = subprocess.run([sys.executable, "-m", "audit.cli", "--quiet", "merge", *map(str, dirs),
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "not a regular file" in r.stderr and str(fifo) in r.stderr
    assert not out.exists()


def test_a_summary_past_the_size_limit_is_refused_unread(shards, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("audit.merge.MAX_SUMMARY_BYTES", 100)  # the real cap is 256 MiB
    rc, err = _merge(_copy(shards, tmp_path), tmp_path / "m", capsys)
    assert rc == 2 and "past the limit of 100" in err, err
    assert not (tmp_path / "m").exists()


def test_a_huge_shard_count_is_refused_by_replay_and_merge(shards, tmp_path, capsys):
    """M7: replay refuses N past MAX_SHARDS; merge of a shard claiming a huge (allowed) count
    says how many are missing without listing them all."""
    for text in ("0/99999999999999999999999", f"0/{MAX_SHARDS + 1}"):
        with pytest.raises(ValueError, match="at most"):
            parse_shard(text)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(["--quiet", "replay", "in.jsonl", "--shard", text, "--out", str(tmp_path / "x")])
        assert exc.value.code == 2 and "at most" in capsys.readouterr().err
    assert parse_shard(f"0/{MAX_SHARDS}") == (0, MAX_SHARDS)
    d = _copy(shards[:1], tmp_path)[0]
    _edit_summary(_set("shard.count", MAX_SHARDS))(d)
    rc, err = _merge([d], tmp_path / "m", capsys)
    assert rc == 2 and f"{MAX_SHARDS - 1} of {MAX_SHARDS}" in err and "1/1000000" in err, err
    assert len(err) < 600 and not (tmp_path / "m").exists()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.text(max_size=5), kids, max_size=3), max_leaves=8)
SUMMARY_FIELDS = ["shard.index", "shard.count", "shard.inputs", "counts", "counts.trajectories",
                  "counts.records_read", "seconds", "skipped_records", "warnings", "inputs",
                  "reference_counts", "reference_skipped_records", "shard.settings",
                  "shard.settings.scorers", "shard.settings.verdict_scorer",
                  "shard.settings.verdict_threshold", "shard.settings.cluster_by",
                  "shard.settings.reference", "shard.settings.plots"]
ROW_FIELDS = ["steps", "line", "file", "trajectory_id"]
#: few examples each (a merge that succeeds recomputes every interval); run with more once
#: after a change here (400 each found nothing)
FAST = settings(max_examples=15, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _merged_or_refused(dirs: list[Path], out: Path, capsys, why: object) -> None:
    rc, err = _merge(dirs, out, capsys)
    assert rc in (0, 2, 3), (why, err)
    if rc == 2:
        assert "nothing written" in err and not out.exists(), (why, err)


@FAST
@given(field=st.sampled_from(SUMMARY_FIELDS), value=JSON)
def test_any_json_in_a_summary_field_is_merged_or_refused_never_a_crash(
        shards, tmp_path_factory, capsys, field, value):
    """Every shard gets the same value (one shard's alone would mostly be refused early, as
    shards that differ), so the value reaches the merge itself."""
    where = tmp_path_factory.mktemp("hyp")
    dirs = _copy(shards, where)
    for d in dirs:
        _edit_summary(_set(field, value))(d)
    _merged_or_refused(dirs, where / "m", capsys, (field, value))


@FAST
@given(field=st.sampled_from(ROW_FIELDS), value=JSON)
def test_any_json_in_a_trajectory_row_is_merged_or_refused_never_a_crash(
        shards, tmp_path_factory, capsys, field, value):
    where = tmp_path_factory.mktemp("hyp")
    dirs = _copy(shards, where)
    _edit_line("trajectories.jsonl", 1, _set(field, value))(dirs[_target(shards)])
    _merged_or_refused(dirs, where / "m", capsys, (field, value))
