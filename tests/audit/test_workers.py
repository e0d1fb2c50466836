"""audit.workers: a pool's workers read their own lines (issue 44), and the audit they give is
the one-process audit, line for line: duplicates (within a file, across files), blank,
unreadable, non-UTF-8, over-long and truncated lines, a missing file, and shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from envace.core.envs.bfcl.tasks import split_tasks
from envace.core.export import export_real
from envace.core.schema import TrajectoryWriter


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    d = tmp_path_factory.mktemp("mixed")
    good = d / "good.jsonl"
    with TrajectoryWriter(good, mode="w") as w:
        for t in export_real(split_tasks("dev")[:14]):
            t.messages[2].rehearsed = True
            w.write(t)
    lines = good.read_bytes().splitlines(keepends=True)
    a = d / "a.jsonl"
    a.write_bytes(b"".join([*lines[:4], b"\n", b"   \n", b"{not json\n", lines[1],
                            b"\xff\xfe bad bytes\n", b'{"schema": "other"}\n', *lines[4:9],
                            lines[2][:-40] + b"\n", lines[3]]))
    b = d / "b.jsonl"
    b.write_bytes(b"".join([lines[0], *lines[9:], lines[5][: len(lines[5]) // 2]]))
    return [str(a), str(d / "missing.jsonl"), str(b)]


def _audit(inputs: list[str], out: Path, **kw) -> tuple[dict, str, str]:
    s = run_audit(inputs, out, AuditOptions(progress=False, plots=False, **kw))
    s.pop("seconds")
    return s, (out / "steps.jsonl").read_text(), (out / "trajectories.jsonl").read_text()


@pytest.mark.parametrize("shard", [None, (0, 2), (1, 2)])
def test_two_workers_give_the_one_process_audit(inputs, tmp_path, shard):
    if shard is not None:  # a shard's inputs must all be readable (audit.shard)
        inputs = [p for p in inputs if Path(p).exists()]
    one = _audit(inputs, tmp_path / "w1", shard=shard)
    two = _audit(inputs, tmp_path / "w2", shard=shard, workers=2)
    assert two == one
    s = one[0]
    if shard is None:  # the mix is what it claims: each kind of bad line is there
        reasons = " | ".join(r["reason"] for r in s["skipped_records"])
        for kind in ("duplicate trajectory id", "invalid JSON", "not UTF-8", "schema is",
                     "file not found", "truncated last line"):
            assert kind in reasons, kind
        assert s["counts"]["trajectories"] == 14 and s["reconciles"]
