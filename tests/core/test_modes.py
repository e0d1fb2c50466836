"""The one mode table (envace.core.modes) drives config checks, the trainer's roles, the rollout
mode and the dashboard; removed config keys are refused with their reason, or dropped from a
run's own older config.yaml on resume."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from envace.core.modes import (
    ROLLOUT_MODES,
    SOURCE,
    TRAINING_MODES,
    check_rollout_mode,
    training_mode,
)
from envace.training.config import ConfigError, TrainConfig, dump_yaml, load_config

EXTRA = {"simulator": ["simulator_model=tiny"]}  # what a mode needs besides its name


@pytest.mark.parametrize("name", list(TRAINING_MODES))
def test_every_mode_round_trips(name):
    from envace.model.rollout import ACT, REHEARSE, RolloutConfig
    from envace.training.train_setup import Policy

    mode = training_mode(name)
    cfg = load_config(TrainConfig, None, [f"mode={name}", *EXTRA.get(name, [])])
    assert cfg.mode == name
    assert RolloutConfig(mode=mode.rollout).mode == mode.rollout in ROLLOUT_MODES
    policy, world = object(), object()
    got = Policy(policy, None, None, world_model=world).trainees(name)  # type: ignore[arg-type]
    ids = {"act": ACT, "rehearse": REHEARSE}
    want = {model: tuple(ids[r] for r in roles) for model, roles in mode.models().items()}
    assert {n: roles for n, _, roles in got} == want
    assert {n: m for n, m, _ in got} == {n: {"policy": policy, "world_model": world}[n]
                                         for n in want}
    assert got[0][0] == "policy" and sorted(r for _, _, rs in got for r in rs) == sorted(
        ids[r] for r in mode.roles())  # each role trained by exactly one model


def test_table_says_what_the_paper_modes_are():
    assert training_mode("envace").models() == {"policy": ("act", "rehearse")}
    assert training_mode("split").models() == {"policy": ("act",), "world_model": ("rehearse",)}
    assert [training_mode(m).rollout for m in ("simulator", "grpo")] == ["simulator", "real"]
    assert {m.name for m in TRAINING_MODES.values() if m.trains_rehearsals} == {"envace", "split"}
    assert set(SOURCE) == set(ROLLOUT_MODES)


def test_unknown_modes_are_refused_clearly():
    with pytest.raises(ConfigError, match=r"mode .*expects one of 'envace', 'split'.*'grpo'"):
        load_config(TrainConfig, None, ["mode=rehearse"])
    with pytest.raises(ValueError, match="valid: envace, split, simulator, grpo"):
        training_mode("rehearse")
    from envace.model.rollout import RolloutConfig

    with pytest.raises(ValueError, match="mode must be one of"):
        RolloutConfig(mode="envace")  # a training mode is not a rollout mode
    assert check_rollout_mode("real") == "real"


def test_config_help_lists_every_mode():
    from envace.training.config import config_help

    text = " ".join(config_help(TrainConfig).split())
    for m in TRAINING_MODES.values():
        assert f"{m.name}: {m.help}" in text


@pytest.mark.parametrize("name", list(TRAINING_MODES))
def test_mode_checks_follow_the_table(name):
    mode, extra = training_mode(name), EXTRA.get(name, [])
    ok = {"grounded_lambda=0.5": mode.trains_rehearsals,
          "world_model=tiny": mode.separate_world_model}
    for setting, allowed in ok.items():
        if allowed:
            load_config(TrainConfig, None, [f"mode={name}", *extra, setting])
        else:
            with pytest.raises(ConfigError):
                load_config(TrainConfig, None, [f"mode={name}", *extra, setting])
    if mode.rollout != "simulator":
        with pytest.raises(ConfigError, match="simulator_model is only used"):
            load_config(TrainConfig, None, [f"mode={name}", "simulator_model=tiny"])
    else:
        with pytest.raises(ConfigError, match="needs simulator_model"):
            load_config(TrainConfig, None, [f"mode={name}"])


@pytest.mark.parametrize("key", sorted(TrainConfig.REMOVED))
def test_removed_keys_are_named_as_removed(tmp_path, key):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"steps": 3, key: 50 if key != "resume_from" else None}))
    with pytest.raises(ConfigError, match=rf"config key '{key}' \(from .*old.yaml\) was removed"):
        load_config(TrainConfig, path, [])
    with pytest.raises(ConfigError, match="was removed"):
        load_config(TrainConfig, None, [f"{key}=1"])
    assert load_config(TrainConfig, path, [], drop_removed=True).steps == 3
    with pytest.raises(ConfigError, match="was removed"):  # an override still says so
        load_config(TrainConfig, path, [f"{key}=1"], drop_removed=True)


def test_an_older_run_config_still_resumes_its_check(tmp_path):
    from envace.training.train_setup import check_same_config

    cfg = TrainConfig(run_name="r", output_dir=str(tmp_path))
    cfg.run_dir.mkdir(parents=True)
    dump_yaml(cfg, cfg.run_dir / "config.yaml")
    old = yaml.safe_load((cfg.run_dir / "config.yaml").read_text())
    old.update(eval_every=50, log_every=1, resume_from=None)  # as the trainer wrote them before
    (cfg.run_dir / "config.yaml").write_text(yaml.safe_dump(old))
    check_same_config(cfg.run_dir, cfg)
    again = load_config(TrainConfig, cfg.run_dir / "config.yaml", [], drop_removed=True)
    assert again == cfg


def test_resume_cli_reads_an_older_run_config(tmp_path, monkeypatch, capsys):
    """`envace train --resume` on a run whose config.yaml still has removed keys hands the
    trainer its config; `--config` with that file is refused with the reason."""
    import argparse
    import types

    from envace.training.command import add_parser

    got: list[TrainConfig] = []
    fake = types.SimpleNamespace(train=lambda cfg, **kw: got.append(cfg))
    monkeypatch.setitem(sys.modules, "envace.training.train", fake)  # no trainer is started
    run = tmp_path / "old-run"
    run.mkdir()
    (run / "config.yaml").write_text("steps: 1\neval_every: 50\nlog_every: 1\n")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(), "train")
    args = parser.parse_args(["train", "--quiet", "--resume", str(run)])
    assert args.func(args) == 0 and got[0].steps == 1 and got[0].run_dir == run
    args = parser.parse_args(["train", "--quiet", "--config", str(run / "config.yaml")])
    assert args.func(args) == 2 and len(got) == 1
    err = capsys.readouterr().err
    assert "config key 'eval_every'" in err and "was removed" in err


@pytest.mark.parametrize("name", list(TRAINING_MODES))
def test_dashboard_describes_each_mode(name):
    from dashboard.ui import mode_line

    line = mode_line(f"steps: 3\nmode: {name}\n")
    assert line is not None and f"`{name}`" in line and training_mode(name).rollout in line


def test_dashboard_mode_line_ignores_what_it_cannot_read():
    from dashboard.ui import mode_line

    for text in (None, "", "mode: rl\n", "mode: [envace]\n", "- a\n- b\n", "mode: {\n"):
        assert mode_line(text) is None


def test_modes_module_imports_nothing_from_envace():
    code = ("import sys, envace.core.modes; print(sorted(m for m in sys.modules "
            "if m.startswith(('envace.', 'torch'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['envace.core', 'envace.core.modes']"
