"""audit.pipeline: the garbage collector runs less often while the records stream (issue 44),
and its thresholds are what they were once the audit is done, whether it ended well or not."""

from __future__ import annotations

import gc
from unittest import mock

import pytest

from audit.pipeline import run_audit
from audit.scoring.settings import AuditOptions
from audit.store.output import AuditWriter
from audit.workers import GC_YOUNG


def test_collections_are_fewer_while_streaming_and_restored_after(tmp_path, examples):
    before = gc.get_threshold()
    seen = []
    write = AuditWriter.write_lines

    def spy(self, *a, **k):
        seen.append(gc.get_threshold())
        return write(self, *a, **k)

    with mock.patch.object(AuditWriter, "write_lines", spy):
        run_audit([str(examples / "real.jsonl")], tmp_path / "o",
                  AuditOptions(progress=False, plots=False))
    assert seen and all(t == (max(before[0], GC_YOUNG), *before[1:]) for t in seen)
    assert gc.get_threshold() == before


def test_thresholds_are_restored_when_the_audit_fails(tmp_path, examples):
    before = gc.get_threshold()

    def boom(self, *a, **k):
        raise RuntimeError("disk gone")

    with mock.patch.object(AuditWriter, "write_lines", boom), \
            pytest.raises(RuntimeError, match="disk gone"):
        run_audit([str(examples / "real.jsonl")], tmp_path / "o",
                  AuditOptions(progress=False, plots=False))
    assert gc.get_threshold() == before
