"""bench.rollout_engine's pure logic: where a position's logits sit when the backend projected
only some positions onto the vocabulary (`logits_to_keep`)."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from bench.rollout_engine import _kept_column


@given(st.integers(1, 64), st.data())
def test_kept_column_finds_the_position_in_the_kept_logits(width, data):
    position = data.draw(st.integers(0, width - 1))
    full = torch.arange(width)  # stand-in for a row of logits: one value per position
    # all positions kept
    assert full[_kept_column(0, width, position)] == position
    # the last k positions kept (prefill keeps 1)
    k = data.draw(st.integers(width - position, width))
    assert full[-k:][_kept_column(k, width, position)] == position
    # a sorted index set that holds the position (extend keeps each row's last position)
    others = data.draw(st.sets(st.integers(0, width - 1), max_size=8))
    keep = torch.tensor(sorted(others | {position}))
    assert full[keep][_kept_column(keep, width, position)] == position
