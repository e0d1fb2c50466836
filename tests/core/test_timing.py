"""Step timing (envace.core.timing): exclusive sections that add up to the whole, and instrumented
rollouts and updates that time themselves without changing what they compute."""

from __future__ import annotations

import pytest

from envace.core.timing import NULL_TIMER, STEP_SECTIONS, StepTimer, shares
from tests.conftest import ROOT


class Clock:
    """A clock the test advances by hand; counts its readings."""

    def __init__(self) -> None:
        self.now, self.reads = 0.0, 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def test_nested_sections_are_exclusive_and_add_up_to_the_whole():
    clock = Clock()
    timer = StepTimer(clock=clock)
    clock.now += 1  # outside: other
    with timer.section("rollout"):
        clock.now += 2  # rollout's own time
        with timer.section("rollout/decode"):
            clock.now += 3
        with timer.section("weight_sync"):  # a top-level section run from inside the rollout
            clock.now += 4
        with timer.section("rollout/decode"):  # sections accumulate
            clock.now += 5
    with timer.section("update"), timer.section("update/backward"):
        clock.now += 6
    with timer.section("unlisted"):
        clock.now += 7
    clock.now += 8
    assert timer.stop() == 36
    m = timer.metrics(("rollout/decode", "rollout", "weight_sync", "update/backward", "update",
                       "eval"))
    assert m == {"time/rollout/decode": 8, "time/rollout/other": 2, "time/weight_sync": 4,
                 "time/update/backward": 6, "time/update/other": 0, "time/eval": 0,
                 "time/other": 1 + 7 + 8, "time/step": 36}
    assert sum(v for k, v in m.items() if k != "time/step") == m["time/step"]
    assert timer.stop() == 36  # idempotent
    with pytest.raises(RuntimeError), timer.section("late"):
        pass


def test_real_clock_sections_sum_exactly_and_an_exception_closes_its_section():
    timer = StepTimer()
    with pytest.raises(KeyError), timer.section("reward"):
        with timer.section("fidelity"):
            sum(range(10_000))
        raise KeyError("boom")
    with timer.section("update/forward"):  # the stack was unwound: this one is top-level
        sum(range(10_000))
    total = timer.stop()
    m = timer.metrics()
    assert set(m) == {f"time/{n}/other" if any(x.startswith(n + "/") for x in STEP_SECTIONS)
                      else f"time/{n}" for n in STEP_SECTIONS} | {"time/other", "time/step"}
    assert m["time/step"] == total > 0 and m["time/fidelity"] > 0 and m["time/reward"] >= 0
    assert sum(v for k, v in m.items() if k != "time/step") == pytest.approx(total, abs=1e-9)


def test_sync_runs_at_every_reading_and_wrap_at_every_section():
    calls: list[str] = []

    class Wrap:
        def __init__(self, name: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            calls.append(f"enter {self.name}")

        def __exit__(self, *exc: object) -> None:
            calls.append(f"exit {self.name}")

    timer = StepTimer(sync=lambda: calls.append("sync"), wrap=Wrap)
    with timer.section("a"), timer.section("b"):
        pass
    timer.stop()
    assert calls == ["sync", "sync", "enter a", "sync", "enter b", "exit b", "sync", "exit a",
                     "sync", "sync"]
    with pytest.raises(RuntimeError):  # stop inside a section is a bug of the caller
        t = StepTimer()
        with t.section("x"):
            t.stop()


def test_shares_are_of_all_steps_time():
    rows = [{"step": 0, "time/a": 1.0, "time/b": 3.0, "time/step": 4.0},
            {"step": 1, "time/a": 2.0, "time/b": 2.0, "time/step": 4.0},
            {"step": 2, "loss": 1.0}]  # restored from a checkpoint: no times
    mean, share = shares(rows)
    assert mean == 4.0 and share == {"a": 3 / 8, "b": 5 / 8}
    assert shares([{"loss": 1.0}]) == (0.0, {})


def test_report_line_gives_mean_seconds_and_shares():
    from envace.training.train_report import time_line

    rows = [{"time/rollout/decode": 3.0, "time/update/backward": 1.0, "time/eval": 0.0,
             "time/step": 4.0}] * 2
    line = time_line(rows, eval_seconds=12.0)
    assert line == ("- time: 4.0 s per step (mean of 2): rollout/decode 75%, "
                    "update/backward 25%; final evaluation 12.0 s")
    assert time_line([]) == "- time: no timed steps"


# -- instrumented code computes what it computed before ------------------------------------


@pytest.fixture(scope="module")
def tiny_sft():
    from envace.model.models import load_model

    return load_model(ROOT / "data" / "models" / "tiny-sft")


def test_timed_rollouts_are_the_same_episodes_and_fill_the_rollout_sections(tiny_sft):
    from envace.core.envs.bfcl.tasks import get_task
    from envace.core.envs.bfcl.turns import derive_turn_task
    from envace.model.rollout import RolloutConfig, run_episodes

    model, tok = tiny_sft
    tasks = [derive_turn_task(get_task("multi_turn_base_0"), 1)] * 2
    cfg = RolloutConfig(mode="rehearse", max_new_tokens=24, max_turns=2, max_context=3000,
                        desc_chars=40, seed=3)
    plain = run_episodes(model, tok, tasks, cfg)
    timer = StepTimer()
    with timer.section("rollout"):
        timed = run_episodes(model, tok, tasks, cfg, timer=timer)
    timer.stop()
    for a, b in zip(plain, timed, strict=True):
        assert (a.ids, a.roles, a.logprobs, a.end_reason) == (b.ids, b.roles, b.logprobs,
                                                              b.end_reason)
    m = timer.metrics()
    assert m["time/rollout/prefill"] > 0 and m["time/rollout/decode"] > 0
    assert m["time/rollout/other"] > 0  # the engine's own bookkeeping and parsing
    if any(r == 2 for e in timed for r in e.roles):  # a rehearsal: its header was forced
        assert m["time/rollout/forced"] > 0


def test_timed_update_is_the_same_update_and_fills_its_sections():
    from envace.training.config import TrainConfig
    from envace.training.update import update
    from tests.training.test_train import _episodes, _policy, _qwen

    eps, adv = _episodes(5)
    cfg = TrainConfig(micro_batch_size=2, lr=1e-3, group_size=2, prompts_per_step=3)
    plain_model, timed_model = _qwen(0), _qwen(0)
    plain = update(_policy(cfg, plain_model), eps, adv, cfg)
    timer = StepTimer()
    with timer.section("update"):
        timed = update(_policy(cfg, timed_model), eps, adv, cfg, timer=timer)
    timer.stop()
    assert plain == timed
    for p, q in zip(plain_model.parameters(), timed_model.parameters(), strict=True):
        assert p.equal(q)
    m = timer.metrics()
    for key in ("forward", "backward", "optimizer", "other"):
        assert m[f"time/update/{key}"] > 0, key
    assert update(_policy(cfg, _qwen(0)), eps, adv, cfg, timer=NULL_TIMER) == plain


def test_message_level_rollouts_time_each_request_as_decode(tiny_sft):
    from envace.core.envs.bfcl.tasks import get_task
    from envace.core.envs.bfcl.turns import derive_turn_task
    from envace.model.backends.base import HFBackend, run_episodes_backend
    from envace.model.rollout import RolloutConfig

    model, tok = tiny_sft
    cfg = RolloutConfig(mode="rehearse", max_new_tokens=8, max_turns=1, max_context=3000,
                        desc_chars=40, seed=0)
    tasks = [derive_turn_task(get_task("multi_turn_base_0"), 1)]
    backend = HFBackend(model, tok.pad_token_id or 0)
    plain = run_episodes_backend(backend, tok, tasks, cfg)
    timer = StepTimer()
    timed = run_episodes_backend(backend, tok, tasks, cfg, timer=timer)
    timer.stop()
    assert [e.ids for e in plain] == [e.ids for e in timed]
    seconds = timer.seconds()
    assert seconds["rollout/decode"] > 0 and "rollout/prefill" not in seconds


def test_vllm_weight_sync_is_its_own_section_and_only_when_weights_changed():
    import torch

    from envace.model.backends.vllm_backend import VLLMRollouts

    class Engine:  # stands in for a started VLLMBackend (no vLLM needed)
        syncs = 0

        def update_weights(self, state_dict):
            self.syncs += 1

    model = torch.nn.Linear(2, 2)
    rollouts = VLLMRollouts()
    rollouts.backends["policy"] = engine = Engine()
    timer = StepTimer()
    with timer.section("rollout"):
        rollouts.backend("policy", model, None, timer)
        rollouts.backend("policy", model, None, timer)  # unchanged weights: no second sync
    timer.stop()
    assert engine.syncs == 1 and "weight_sync" in timer.seconds()
    assert timer.metrics()["time/weight_sync"] == timer.seconds()["weight_sync"]


def test_the_timer_is_torch_free():
    import subprocess
    import sys

    code = ("import sys, envace.core.timing; "
            "sys.exit(1 if {'torch', 'transformers'} & set(sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
