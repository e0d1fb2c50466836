"""The dashboard's readers never open what is not a regular file (the hostile tester: a FIFO
blocked read_jsonl, /dev/zero filled memory)."""

from __future__ import annotations

import os

from dashboard import readers


def test_readers_refuse_fifos_devices_and_directories(tmp_path):
    fifo = tmp_path / "steps.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/zero", tmp_path):
        data = readers.read_jsonl(path)
        assert data.not_regular and not data.records
        assert "not a regular file" in " ".join(data.notes("steps.jsonl"))
        assert readers.read_json(path)[0] is None
        assert readers.read_text(path) is None
        assert readers.line_offsets(path) == []


def test_a_regular_file_still_reads(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text('{"step": 0}\n{"step": 1}\n')
    assert [r["step"] for r in readers.read_jsonl(p).records] == [0, 1]
    assert readers.line_offsets(p) == [0, 12]
