"""audit.store.records.read_summary (what rescore and the dashboard read an audit's summary
with): a FIFO or a device in place of summary.json is one skipped-record entry, at once, never
a read that waits or fills memory."""

from __future__ import annotations

import os

from audit.store.records import read_summary


def test_a_fifo_summary_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "summary.json")  # nobody writes it: a blocking read waits for ever
    data, problems = read_summary(tmp_path)
    assert data == {} and "not a regular file" in problems[0]["reason"]


def test_a_device_summary_is_refused(tmp_path):
    os.symlink("/dev/zero", tmp_path / "summary.json")
    data, problems = read_summary(tmp_path)
    assert data == {} and "not a regular file" in problems[0]["reason"]
