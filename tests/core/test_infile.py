"""envace.core.infile: a small input file is read whole when it is a regular file within its
cap, and refused with a clear UsageError otherwise, never waited on (a FIFO) or read without
end (a device)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.errors import UsageError
from envace.core.infile import read_small_bytes, read_small_text


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=300), cap=st.integers(0, 400))
def test_a_regular_file_is_read_whole_within_its_cap(tmp_path_factory, data, cap):
    p = tmp_path_factory.mktemp("f") / "x"
    p.write_bytes(data)
    if len(data) <= cap:
        assert read_small_bytes(p, cap, "x") == data
    else:
        with pytest.raises(UsageError, match="past the limit"):
            read_small_bytes(p, cap, "x")


@pytest.mark.parametrize("kind", ["fifo", "dir", "device", "missing"])
def test_what_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    path = {"fifo": tmp_path / "fifo", "dir": tmp_path, "device": "/dev/zero",
            "missing": tmp_path / "none"}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes it: a blocking open would wait for ever
    with pytest.raises(UsageError, match="not a regular file" if kind != "missing"
                       else "cannot read --models"):
        read_small_text(path, 100, "--models")


def test_text_that_is_not_utf8_is_refused(tmp_path):
    (tmp_path / "b").write_bytes(b"ok\xff")
    with pytest.raises(UsageError, match="not UTF-8"):
        read_small_text(tmp_path / "b", 100, "x")
