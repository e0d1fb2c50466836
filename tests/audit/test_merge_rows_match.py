"""`envace-audit merge` checks each shard's rows against the shard itself (issue 39, the hostile
tester's relabelled and trimmed shards): every trajectory of shard I hashes to I
(`audit.shard.shard_of`), no id is given twice, and the counts a shard's `summary.json` states
(trajectories, steps, skipped, records read) are what its files hold. A shard that breaks any of
these is refused (exit 2, nothing written, the file and line named), never merged into an audit
with duplicated or missing trajectories.

The shards are made the way a user makes them: `envace data export-real --split dev`, four lines
of it (and one line that is no record, which shard 0 reports as skipped), then
`envace-audit replay ... --shard I/2`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from audit.shard import shard_of

ENVACE = [sys.executable, "-m", "envace.cli"]
AUDIT = [sys.executable, "-m", "audit.cli", "--quiet"]
N = 2


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("rows_match")
    dev = d / "dev.jsonl"
    r = _run([*ENVACE, "data", "export-real", "--split", "dev", "--out", str(dev)])
    assert r.returncode == 0, r.stderr
    inp = d / "in.jsonl"
    lines = dev.read_text().splitlines(keepends=True)[:4]
    inp.write_text("".join(lines) + '{"not": "a trajectory"}\n')
    outs = [d / f"s{i}" for i in range(N)]
    for i, out in enumerate(outs):
        r = _run([*AUDIT, "replay", str(inp), "--shard", f"{i}/{N}", "--out", str(out)])
        assert r.returncode in (0, 3), r.stderr
    return outs


def _rows(d: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (d / name).read_text().splitlines()]


def _big(shards: list[Path]) -> int:
    """The shard holding the most trajectories (the one edited)."""
    return max(range(N), key=lambda i: len(_rows(shards[i], "trajectories.jsonl")))


def _copy(shards: list[Path], where: Path) -> list[Path]:
    dirs = [where / s.name for s in shards]
    for s, d in zip(shards, dirs, strict=True):
        shutil.copytree(s, d)
    return dirs


def _summary(d: Path, edit: Callable[[dict], None]) -> None:
    s = json.loads((d / "summary.json").read_text())
    edit(s)
    (d / "summary.json").write_text(json.dumps(s))


def _merge(dirs: list[Path], out: Path) -> subprocess.CompletedProcess:
    return _run([*AUDIT, "merge", *map(str, dirs), "--out", str(out)])


def _refused(r: subprocess.CompletedProcess, out: Path, *words: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "nothing written" in r.stderr and "internal error" not in r.stderr, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)
    assert not out.exists()


def test_the_shards_as_made_merge(shards, tmp_path):
    big = _rows(shards[_big(shards)], "trajectories.jsonl")
    assert len(big) >= 2  # the edits below have a trajectory to drop and one to keep
    out = tmp_path / "m"
    r = _merge(shards, out)
    assert r.returncode == 3, r.stderr  # the line that is no record, skipped as in one run
    assert len(_rows(out, "trajectories.jsonl")) == 4


def test_a_relabelled_shard_is_refused(shards, tmp_path):
    """The tester's t_dup: shard I's directory copied and its index set to another shard's."""
    i = _big(shards)
    j = 1 - i
    dup = tmp_path / "dup"
    shutil.copytree(shards[i], dup)
    _summary(dup, lambda s: s["shard"].__setitem__("index", j))
    out = tmp_path / "m"
    first = _rows(shards[i], "trajectories.jsonl")[0]["trajectory_id"]
    assert shard_of(first, N) == i
    r = _merge([dup, shards[i]], out)
    _refused(r, out, f"{dup / 'trajectories.jsonl'}:1", f"shard {i}/{N}", f"not {j}/{N}")


def test_a_repeated_trajectory_in_one_shard_is_refused(shards, tmp_path):
    """The same trajectory row (and its steps) twice in its own shard, the counts raised to
    match: the id is refused on its second line."""
    dirs = _copy(shards, tmp_path)
    d = dirs[_big(shards)]
    trajs = (d / "trajectories.jsonl").read_text().splitlines(keepends=True)
    steps = (d / "steps.jsonl").read_text().splitlines(keepends=True)
    n0 = json.loads(trajs[0])["steps"]
    (d / "trajectories.jsonl").write_text(trajs[0] + "".join(trajs))
    (d / "steps.jsonl").write_text("".join(steps[:n0]) + "".join(steps))

    def more(s: dict) -> None:
        for k, v in (("trajectories", 1), ("steps", n0), ("records_read", 1)):
            s["counts"][k] += v
    _summary(d, more)
    out = tmp_path / "m"
    _refused(_merge(dirs, out), out, f"{d / 'trajectories.jsonl'}:2", "twice")


def _drop_second(d: Path) -> None:
    """The tester's t_drop: a trajectory's row and its steps removed, summary.json untouched."""
    trajs = (d / "trajectories.jsonl").read_text().splitlines(keepends=True)
    steps = (d / "steps.jsonl").read_text().splitlines(keepends=True)
    gone = json.loads(trajs[1])["trajectory_id"]
    (d / "trajectories.jsonl").write_text("".join(t for k, t in enumerate(trajs) if k != 1))
    (d / "steps.jsonl").write_text("".join(s for s in steps
                                           if json.loads(s)["trajectory_id"] != gone))


def _set_count(key: str, value: object) -> Callable[[Path], None]:
    return lambda d: _summary(d, lambda s: s["counts"].__setitem__(key, value))


def _drop_skipped(d: Path) -> None:
    _summary(d, lambda s: s.__setitem__("skipped_records", []))


EDITS = {  # the edit: words the refusal says
    "t_drop a trajectory removed": (_drop_second, "counts.trajectories"),
    "t_big trajectories 10**40": (_set_count("trajectories", 10 ** 40), "counts.trajectories"),
    "trajectories one more": (_set_count("trajectories", 5), "counts.trajectories"),
    "steps one fewer": (_set_count("steps", 1), "counts.steps"),
    "steps 10**40": (_set_count("steps", 10 ** 40), "counts.steps"),
    "skipped 10**40": (_set_count("skipped", 10 ** 40), "counts.skipped"),
    "records_read 10**40": (_set_count("records_read", 10 ** 40), "counts.records_read"),
    "records_read below the trajectories": (_set_count("records_read", 0),
                                            "counts.records_read"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_counts_that_disagree_with_the_rows_are_refused(case, shards, tmp_path):
    edit, words = EDITS[case]
    dirs = _copy(shards, tmp_path)
    d = dirs[_big(shards)]
    edit(d)
    out = tmp_path / "m"
    r = _merge(dirs, out)
    _refused(r, out, words, str(d))
    assert "1" * 20 not in r.stderr and "0" * 20 not in r.stderr  # no 10**40 printed back


def test_a_skipped_record_removed_from_its_summary_is_refused(shards, tmp_path):
    """Shard 0 reports the line that is no record; its list emptied, counts.skipped left."""
    dirs = _copy(shards, tmp_path)
    s0 = json.loads((dirs[0] / "summary.json").read_text())
    assert s0["counts"]["skipped"] == 1 and len(s0["skipped_records"]) == 1
    _drop_skipped(dirs[0])
    out = tmp_path / "m"
    _refused(_merge(dirs, out), out, "counts.skipped", str(dirs[0]))
