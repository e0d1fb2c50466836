"""report_to sinks: TensorBoard event files and an offline W&B run carry the logged numbers."""

from __future__ import annotations

import time

import pytest

from envace.training.reporting import Reporter, _Guarded, make_reporter, scalars

RECORDS = [{"step": 0, "reward/mean": 0.25, "loss": -0.5, "label_zz": "text-qq", "flag_zz": True,
            "missing": None, "bad": float("nan")},
           {"step": 1, "reward/mean": 0.5, "loss": -0.25}]


def test_scalars_keep_finite_numbers_only():
    assert scalars(RECORDS[0]) == {"reward/mean": 0.25, "loss": -0.5}


def test_tensorboard_sink_writes_every_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rep = make_reporter("tensorboard", tmp_path, {})
    for r in RECORDS:
        rep.log(r, r["step"])
    rep.close()
    ev = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    assert set(ev.Tags()["scalars"]) == {"reward/mean", "loss"}
    assert [(e.step, e.value) for e in ev.Scalars("loss")] == [(0, -0.5), (1, -0.25)]


def test_wandb_sink_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rep = make_reporter("wandb", tmp_path, {"lr": 1e-3})
    for r in RECORDS:
        rep.log(r, r["step"])
    rep.close()
    logs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1  # one offline run, named after the run directory
    # protobuf history records: keys and JSON values as text. wandb's service process writes
    # the file; on a loaded machine the last records land after finish() returns
    needles = (b"reward/mean", b"loss", b"-0.25", b"0.25")
    deadline = time.monotonic() + 60
    data = logs[0].read_bytes()
    while not all(n in data for n in needles) and time.monotonic() < deadline:
        time.sleep(0.5)
        data = logs[0].read_bytes()
    for needle in needles:
        assert needle in data
    assert b"label_zz" not in data and b"flag_zz" not in data


def test_a_failing_sink_is_reported_once_and_training_goes_on(capsys):
    class Broken(Reporter):  # a stand-in sink that fails, for the guard's logic
        calls = 0

        def log(self, record, step):
            Broken.calls += 1
            raise OSError("disk full")

    rep = _Guarded(Broken())
    rep.log(RECORDS[0], 0)
    rep.log(RECORDS[1], 1)
    rep.close()
    assert Broken.calls == 1
    assert capsys.readouterr().err.count("disk full") == 1


def test_unknown_sink_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="report_to"):
        make_reporter("mlflow", tmp_path, {})
