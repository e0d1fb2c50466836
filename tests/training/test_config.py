"""Tests for envace.training.config: YAML + overrides, error messages, validation, atomic dump."""

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from envace.training.config import (
    ConfigError,
    TrainConfig,
    check_types,
    config_help,
    dump_yaml,
    load_config,
    opt,
    parse_cli,
    require,
    to_dict,
    valid_keys,
)


@dataclasses.dataclass
class Optim:
    lr: float = opt(1e-3, "learning rate")
    betas: list[float] = opt([0.9, 0.999], "Adam betas")


@dataclasses.dataclass
class Toy:
    """A config with a nested section, to exercise dotted keys and __post_init__ checks."""

    name: str = opt("toy", "a name")
    steps: int = opt(10, "steps")
    flag: bool = opt(False, "a flag")
    optim: Optim = opt(Optim(), "optimizer section")

    def __post_init__(self) -> None:
        check_types(self)
        require(self.steps >= 0, f"steps={self.steps}: set steps>=0")


def write(tmp_path: Path, data: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_yaml_then_overrides_precedence(tmp_path):
    path = write(tmp_path, {"lr": 1e-4, "steps": 7, "seed": 3})
    cfg = load_config(TrainConfig, path, ["lr=1e-5", "mode=grpo", "scale_by_std=true"])
    assert cfg.lr == 1e-5  # override beats file; `1e-5` (a string to PyYAML) still parses
    assert cfg.steps == 7 and cfg.seed == 3  # from the file
    assert cfg.mode == "grpo" and cfg.scale_by_std is True
    assert cfg.group_size == 4  # default
    assert load_config(TrainConfig, path, ["steps=1", "steps=2"]).steps == 2  # last one wins


def test_override_value_parsing():
    cfg = load_config(
        TrainConfig,
        None,
        ["--audit_scorers=[exact, json_f1]", "run_name=007", "dual_clip=null", "lr=1"],
    )
    assert cfg.audit_scorers == ["exact", "json_f1"]
    assert cfg.run_name == "007"  # a string field keeps the text as typed
    assert cfg.dual_clip is None
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert load_config(TrainConfig, None, ["audit_scorers=exact,fuzzy"]).audit_scorers == [
        "exact",
        "fuzzy",
    ]


def test_nested_dotted_keys(tmp_path):
    path = write(tmp_path, {"optim": {"lr": 0.5}, "name": "from-file"})
    cfg = load_config(Toy, path, ["optim.betas=[0.5, 0.6]", "flag=true"])
    assert cfg == Toy(name="from-file", flag=True, optim=Optim(lr=0.5, betas=[0.5, 0.6]))
    assert valid_keys(Toy) == ["name", "steps", "flag", "optim.lr", "optim.betas"]
    with pytest.raises(ConfigError, match=r"'optim\.lrr'.*did you mean optim\.lr"):
        load_config(Toy, None, ["optim.lrr=1"])
    with pytest.raises(ConfigError, match="section"):
        load_config(Toy, None, ["optim=3"])


def test_unknown_key_names_suggestion_and_source(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["lrr=1e-6"])
    msg = str(e.value)
    assert "'lrr'" in msg and "did you mean lr" in msg and "override 'lrr=1e-6'" in msg

    path = write(tmp_path, {"grup_size": 8})
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, path, [])
    msg = str(e.value)
    assert "'grup_size'" in msg and "group_size" in msg and str(path) in msg


def test_bad_type_message():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["steps=many"])
    msg = str(e.value)
    assert "steps" in msg and "expects int" in msg and "'many'" in msg
    with pytest.raises(ConfigError, match="scale_by_std.*expects bool.*write true or false"):
        load_config(TrainConfig, None, ["scale_by_std=1"])
    with pytest.raises(ConfigError, match=r"audit_scorers\[1\].*expects str"):
        load_config(TrainConfig, None, ["audit_scorers=[exact, 3]"])


def test_bad_mode_message():
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, ["mode=grp"])
    msg = str(e.value)
    assert "one of 'envace', 'split', 'simulator', 'grpo'" in msg and "did you mean 'grpo'" in msg
    with pytest.raises(ConfigError, match="mode"):
        TrainConfig(mode="rl")  # direct construction is checked too


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["mode=simulator"], "simulator_model="),
        (["simulator_model=gpt"], "simulator_model=null or mode=simulator"),
        (["world_model=tiny"], "mode=split"),
        (["group_size=1"], "group_size >= 2"),
        (["grounded_lambda=1.5"], "[0, 1]"),
        (["mode=grpo", "grounded_lambda=0.5"], "grounded_lambda=0 or mode=envace/split"),
        (["dual_clip=0.5"], "dual_clip > 1"),
        (["max_new_tokens=30000"], "max_context_tokens"),
        (["verdict_scorer=fuzzy"], "audit_scorers"),
        (["top_p=0"], "top_p"),
    ],
)
def test_post_init_rejects_bad_combinations(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config(TrainConfig, None, overrides)
    assert needle in str(e.value)
    assert overrides[-1] in str(e.value)  # says where the config came from


def test_valid_combinations():
    cfg = load_config(TrainConfig, None, ["mode=simulator", "simulator_model=http://h:8000/v1"])
    assert cfg.simulator_model == "http://h:8000/v1"
    assert load_config(TrainConfig, None, ["mode=split", "world_model=smollm2"]).world_model
    assert load_config(TrainConfig, None, ["grounded_lambda=0.5"]).grounded_lambda == 0.5
    assert TrainConfig().run_dir == Path("runs/envace-tiny-s0")


def test_malformed_override_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="key=value"):
        load_config(TrainConfig, None, ["lr"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(TrainConfig, tmp_path / "missing.yaml", [])
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(TrainConfig, path, [])
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(TrainConfig, empty, []) == TrainConfig()


def test_round_trip_dump_load(tmp_path):
    cfg = load_config(
        TrainConfig,
        None,
        ["lr=3e-6", "dual_clip=null", "mode=split", "world_model=smollm2", "audit_scorers=[exact]"],
    )
    path = tmp_path / "sub" / "config.yaml"
    dump_yaml(cfg, path)
    assert load_config(TrainConfig, path, []) == cfg
    assert yaml.safe_load(path.read_text()) == to_dict(cfg)
    toy = Toy(optim=Optim(lr=0.25))
    dump_yaml(toy, tmp_path / "toy.yaml")
    assert load_config(Toy, tmp_path / "toy.yaml", []) == toy


def test_atomic_write_leaves_no_temp_files(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    dump_yaml(TrainConfig(), path)
    dump_yaml(TrainConfig(seed=5), path)  # overwrite
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]
    assert load_config(TrainConfig, path, []).seed == 5

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        dump_yaml(TrainConfig(seed=9), path)
    assert sorted(os.listdir(tmp_path)) == ["config.yaml"]  # temp removed, old file intact
    assert yaml.safe_load(path.read_text())["seed"] == 5


def test_parse_cli(tmp_path):
    path = write(tmp_path, {"steps": 3})
    cfg = parse_cli(TrainConfig, ["--config", str(path), "lr=2e-6"])
    assert cfg.steps == 3 and cfg.lr == 2e-6
    assert parse_cli(TrainConfig, [f"--config={path}"]).steps == 3


def test_every_field_has_default_and_help():
    for f in dataclasses.fields(TrainConfig):
        assert f.metadata.get("help"), f"{f.name} has no help"
    text = config_help(TrainConfig)
    assert "group_size (int, default 4, >= 2)" in text and "top_p (float, default 1.0, in (0, 1])" \
        in text
    assert "mode (one of 'envace', 'split', 'simulator', 'grpo', default 'envace')" in text
    assert "optim.lr (float, default 0.001)" in config_help(Toy)


def test_resume_check_treats_keys_added_since_as_their_default(tmp_path):
    """A run directory written before a config key existed resumes (the key had its default
    then); a real difference, old key or new, is refused and named."""
    from envace.training.config import ConfigError, TrainConfig, to_dict
    from envace.training.train_setup import check_same_config

    old = to_dict(TrainConfig(lr=3e-4))
    del old["sharding"]  # a key this run directory predates
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    check_same_config(tmp_path, TrainConfig(lr=3e-4, steps=500))  # steps may change
    with pytest.raises(ConfigError, match="sharding"):
        check_same_config(tmp_path, TrainConfig(lr=3e-4, sharding="fsdp"))
    with pytest.raises(ConfigError, match="lr"):
        check_same_config(tmp_path, TrainConfig(lr=1e-4))


def test_every_bound_declared_on_a_field_is_enforced_and_named():
    """Each opt(ge/gt/le/lt) bound: the value just past it is refused with a message naming the
    key and the admitted range; the bound itself (where admitted) is accepted."""
    from envace.training.config_base import range_text

    checked = 0
    for f in dataclasses.fields(TrainConfig):
        bounds = f.metadata.get("bounds") or {}
        for kind, edge in bounds.items():
            past = edge - 1 if kind in ("ge", "gt") else edge + 1
            if kind == "gt" or kind == "lt":
                past = edge
            value = int(past) if f.type in ("int", int) else float(past)
            with pytest.raises(ConfigError) as e:
                load_config(TrainConfig, None, [f"{f.name}={value}"])
            assert f"{f.name}={value}: set {f.name} {range_text(bounds)}" in str(e.value)
            checked += 1
    assert checked >= 30


@pytest.mark.parametrize("bounds, inside, outside, text", [
    ({"ge": 0, "le": 1}, [0, 0.5, 1], [-0.01, 1.01], "in [0, 1]"),
    ({"gt": 0, "le": 1}, [1e-9, 1], [0, 2], "in (0, 1]"),
    ({"ge": 0, "lt": 1}, [0, 0.99], [1, -1], "in [0, 1)"),
    ({"ge": 2}, [2, 10**9], [1, -5], ">= 2"),
    ({"gt": 1}, [1.0001], [1, 0], "> 1"),
])
def test_range_known_answers(bounds, inside, outside, text):
    from envace.training.config_base import _within, range_text

    assert range_text(bounds) == text
    assert all(_within(v, bounds) for v in inside)
    assert not any(_within(v, bounds) for v in outside)
