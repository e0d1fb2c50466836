"""The EnvACE trainer: role-wise GRPO on rehearsed rollouts, with fidelity logged every step.

    envace train                                   # the tiny preset, end to end, minutes on a CPU
    envace train --config configs/smollm2.yaml lr=2e-6 steps=50
    envace train --resume runs/<name>              # continue a killed run exactly

One step: sample tasks (seeded by step), run ``group_size`` episodes each (mode ``envace``: the
policy acts and rehearses; ``split``: a second model rehearses; ``simulator``: a frozen model
answers; ``grpo``: the real environment answers; with ``anchor_fraction`` a share of the
groups is rolled out with the real environment answering), score them with the verifier (never
seen by the policy), audit the rehearsed responses against reality, compute role-wise advantages
and take one optimizer step on the clipped loss (plus, with ``real_obs_coef``, a supervised loss
on the real tool responses for the model that learns the world). Everything lands in the run
directory (docs/spec/run_dir.md): metrics.jsonl, rollouts/, audit/, checkpoints/, eval/,
report.md, and with ``kl_coef > 0`` the KL anchors (initial_model/: the trainees' weights at the
start).

Launched on several processes (``accelerate launch``), each rank takes a share of the step's
groups and the gradients are summed: see ``envace.training.distributed``. Rank 0 writes the run
directory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from audit.scoring.settings import AuditOptions
from envace.core.layout import RUN
from envace.core.modes import training_mode
from envace.core.rewards import task_reward
from envace.core.schema import TrajectoryWriter
from envace.core.timing import NULL_TIMER, StepTimer, Timer
from envace.model.rollout import ACT, REHEARSE, Episode, RolloutConfig
from envace.model.trust import gate_counts
from envace.training import fidelity_nll, grpo
from envace.training.checkpoint import load_checkpoint, save_checkpoint, set_rng_state
from envace.training.config import ConfigError, TrainConfig, dump_yaml, to_dict
from envace.training.distributed import Dist, init
from envace.training.fidelity import (
    fidelity_metrics,
    rehearsed_fidelity,
    replay_rollouts,
    write_step_audit,
)
from envace.training.reporting import make_reporter
from envace.training.resume import (
    Heartbeat,
    RunLock,
    check_new_run_dir,
    keep_metrics,
    plan_resume,
    running_marker,
)
from envace.training.train_report import finish_run
from envace.training.train_setup import (
    Policy,
    build_policy,
    check_anchors,
    check_same_config,
    served_simulator,
    training_pool,
)
from envace.training.update import update


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()


ANCHOR_SEED = 10**12  # added to the step's rollout seed for its anchored groups


def anchored_groups(rng: random.Random, n: int, fraction: float) -> list[bool]:
    """Which of a step's ``n`` prompt groups are anchored in reality (``anchor_fraction``):
    ``floor(fraction * n + u)`` of them (``u`` uniform in [0, 1)), drawn from ``rng`` — exactly
    ``fraction * n`` when that is a whole number, that many in expectation otherwise. ``rng``
    is not touched when ``fraction`` is 0."""
    if fraction <= 0:
        return [False] * n
    chosen = set(rng.sample(range(n), min(n, int(fraction * n + rng.random()))))
    return [i in chosen for i in range(n)]


def rollout_groups(policy: Policy, groups: list[tuple[Any, bool]], group_size: int,
                   rcfg: RolloutConfig, timer: Timer = NULL_TIMER) -> list[Episode]:
    """``group_size`` episodes of each (task, anchored) group, in the groups' order. Groups
    rolled out as the mode says in one batch; anchored groups in another, in rollout mode
    ``real`` (the real environment answers; no world model, no simulator) with a seed of its
    own. A group is never mixed: its baseline compares rollouts answered alike."""
    batches: dict[bool, Any] = {}
    for anchored in (False, True):
        batch = [t for t, a in groups if a == anchored for _ in range(group_size)]
        if not batch:
            continue
        if anchored:
            real = dataclasses.replace(rcfg, mode="real", seed=rcfg.seed + ANCHOR_SEED)
            eps = policy.run_episodes(policy.model, policy.tokenizer, batch, real, None, None,
                                      timer=timer)
        else:
            eps = policy.run_episodes(policy.model, policy.tokenizer, batch, rcfg,
                                      policy.simulator, policy.world_model, timer=timer)
        batches[anchored] = iter(eps)
    return [next(batches[a]) for _, a in groups for _ in range(group_size)]


def rewards_for(episodes: list[Episode], cfg: TrainConfig, fidelity: list[float]
                ) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    """[B, 2] rewards (act, rehearse) and the verifier's verdicts."""
    verdicts = [task_reward(cfg.reward, e.task, e.calls_per_turn, e.final_text)
                for e in episodes]
    task = torch.tensor([v["reward"] for v in verdicts], dtype=torch.float64)
    rehearse = task.clone()
    if cfg.grounded_lambda > 0:
        fid = torch.tensor([0.0 if math.isnan(f) else f for f in fidelity], dtype=torch.float64)
        rehearse = (1 - cfg.grounded_lambda) * task + cfg.grounded_lambda * fid
    return torch.stack([task, rehearse], dim=1), verdicts


def step_timer(cfg: TrainConfig, policy: Policy | None = None, **kw: Any) -> StepTimer:
    """A timer for one step; with ``time_sync`` on a GPU it waits for queued kernels at every
    section boundary (``torch.cuda.synchronize``), otherwise it never touches the device."""
    sync = None
    if cfg.time_sync and torch.cuda.is_available() and policy is not None \
            and next(policy.model.parameters()).is_cuda:
        sync = torch.cuda.synchronize
    return StepTimer(sync=sync, **kw)


def step_record(step: int, st: dict[str, float], episodes: list[Episode], verdicts: list[dict],
                rewards: torch.Tensor, has: torch.Tensor, adv: torch.Tensor,
                rows: list[dict[str, Any]], cfg: TrainConfig, dist: Dist,
                times: tuple[float, float, float, float]) -> dict[str, Any]:
    """A step's row of ``metrics.jsonl`` (docs/spec/run_dir.md): the update's statistics,
    reward and success, each role's advantages, tokens by role, where the time went
    (``times``: start, after rollout, after audit and reward, after update), how episodes ended
    and the rehearsals' fidelity."""
    t0, t_roll, t_audit, t_end = times
    n_act = sum(e.tokens(ACT) for e in episodes)
    n_reh = sum(e.tokens(REHEARSE) for e in episodes)
    ends: dict[str, int] = {}
    for e in episodes:
        key = f"episodes/end_{e.end_reason.split(':')[0]}"
        ends[key] = ends.get(key, 0) + 1

    def role_adv(k: int, stat: str) -> float:
        mine = adv[:, k][has[:, k]]
        if stat == "mean":
            return float(mine.mean()) if has[:, k].any() else 0.0
        return float(mine.std()) if has[:, k].sum() > 1 else 0.0

    return {
        "step": step, "time": time.time(),
        **{k: v for k, v in st.items() if not k.startswith(("act/tokens", "rehearse/tokens"))},
        "reward/mean": float(rewards[:, 0].mean()), "reward/act": float(rewards[:, 0].mean()),
        "reward/rehearse": float(rewards[:, 1].mean()),
        "success/mean": sum(v["success"] for v in verdicts) / len(verdicts),
        "adv/act_mean": role_adv(0, "mean"), "adv/act_std": role_adv(0, "std"),
        "adv/rehearse_mean": role_adv(1, "mean"), "adv/rehearse_std": role_adv(1, "std"),
        "tokens/act": n_act, "tokens/rehearse": n_reh,
        "tokens/context": sum(len(e.ids) for e in episodes) - n_act - n_reh,
        "tokens_per_s": (n_act + n_reh) / (t_end - t0),
        "seconds/rollout": t_roll - t0, "seconds/audit": t_audit - t_roll,
        "seconds/update": t_end - t_audit, "ranks": dist.world, "calls/per_episode": sum(
            len(c) for e in episodes for c in e.calls_per_turn) / len(episodes),
        **ends, **fidelity_metrics(rows, cfg.audit_scorers),
    }


def train_step(step: int, policy: Policy, tasks: list, cfg: TrainConfig, run_dir: Path,
               dist: Dist = Dist(), timer: StepTimer | None = None) -> dict[str, Any] | None:
    """One step; returns its metrics record (on rank 0; None on the other ranks).

    Without ``timer`` the step times itself and its record carries the ``time/*`` sections
    (envace.core.timing); with one, the caller stops it and adds them (``_steps``: after the
    checkpoint, which belongs to the step)."""
    own = timer is None
    timer = step_timer(cfg, policy) if timer is None else timer
    t0 = time.perf_counter()
    rng = random.Random(cfg.seed * 1_000_003 + step)
    sampled = rng.sample(tasks, min(cfg.prompts_per_step, len(tasks)))
    groups = dist.shard(list(zip(sampled, anchored_groups(rng, len(sampled),
                                                          cfg.anchor_fraction), strict=True)))
    rcfg = RolloutConfig(mode=training_mode(cfg.mode).rollout, temperature=cfg.temperature,
                         top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                         max_turns=cfg.max_turns, max_context=cfg.max_context_tokens,
                         desc_chars=cfg.desc_chars,
                         seed=cfg.seed * 1_000_003 + step + 7_919_000 * dist.rank,
                         memory=policy.memory, memory_k=cfg.memory_k,
                         gen_dtype=cfg.rollout_dtype,
                         packed_linear=cfg.rollout_packed_linear,
                         rehearse_trust=cfg.rehearse_trust)
    with timer.section("rollout"):
        episodes = rollout_groups(policy, groups, cfg.group_size, rcfg, timer)
    t_roll = time.perf_counter()
    rollout_file = RUN.rollout_file(run_dir, step)
    with timer.section("fidelity"):
        audit_settings = AuditOptions(list(cfg.audit_scorers), cfg.verdict_scorer)
        audits = replay_rollouts([e.trajectory for e in episodes], audit_settings)
        rows, fid = rehearsed_fidelity(audits, cfg.verdict_scorer)
    with timer.section("reward"):
        rewards, verdicts = rewards_for(episodes, cfg, fid)
        has = torch.tensor([[e.tokens(ACT) > 0, e.tokens(REHEARSE) > 0] for e in episodes])
        adv = grpo.role_advantages(rewards, [e.task.id for e in episodes], has,
                                   cfg.scale_by_std)
    t_audit = time.perf_counter()
    with timer.section("update"):
        st = update(policy, episodes, adv.float(), cfg, dist, timer)
    t_end = time.perf_counter()
    if dist.active:  # rank 0 writes and logs the whole batch, groups in their sampled order
        g = cfg.group_size
        mine = [(episodes[k:k + g], verdicts[k:k + g], rewards[k:k + g], has[k:k + g],
                 adv[k:k + g], audits[k:k + g]) for k in range(0, len(episodes), g)]
        groups = dist.gather_ordered(mine)
        rows = [r for part in dist.gather(rows) for r in part]
        if not dist.is_main:
            if own:
                timer.stop()
            return None
        episodes = [e for grp in groups for e in grp[0]]
        verdicts = [v for grp in groups for v in grp[1]]
        audits = [a for grp in groups for a in grp[5]]
        rewards, has, adv = (torch.cat([grp[i] for grp in groups]) for i in (2, 3, 4))
    with TrajectoryWriter(rollout_file, mode="w") as w:
        for i, (e, v) in enumerate(zip(episodes, verdicts, strict=True)):
            e.trajectory.id = f"s{step}-{i}-{e.task.id}"
            e.trajectory.reward = v["reward"]
            e.trajectory.model = str(policy.path)
            e.trajectory.meta.update(train_step=step, group=e.task.id, success=v["success"],
                                     verifier=v["detail"], advantage=adv[i].tolist())
            w.write(e.trajectory)
    with timer.section("fidelity"):  # the step's audit, from the replays above
        write_step_audit(RUN.step_audit(run_dir, step), [e.trajectory for e in episodes],
                         audits, audit_settings, str(rollout_file))
    record = step_record(step, st, episodes, verdicts, rewards, has, adv, rows, cfg, dist,
                         (t0, t_roll, t_audit, t_end))
    if cfg.anchor_fraction > 0:  # episodes of groups anchored in reality
        record["episodes/anchored"] = sum(e.trajectory.meta["mode"] == "real" for e in episodes)
    if cfg.rehearse_trust is not None:  # the confidence gate: calls rehearsed vs sent to reality
        counts = [gate_counts(e.trajectory.messages) for e in episodes]
        record["calls/rehearsed"] = sum(c["rehearsed"] for c in counts)
        record["calls/gated_real"] = sum(c["gated_real"] for c in counts)
    if own:
        timer.stop()
        record.update(timer.metrics())
    return record


def train(cfg: TrainConfig, resume: bool = False, progress: bool = True,
          rollout: Any | None = None, restart: bool = False) -> Path:
    """Run (or resume) training; return the run directory. ``rollout``: run_episodes' signature
    on another backend (the vLLM engines); by default ``cfg.backend`` decides.

    Before anything is loaded or written (``envace.training.resume``): a new run refuses an existing
    directory; a resumed one continues exactly from a checkpoint or is refused; ``restart``
    (with ``resume``) starts a run that has no checkpoint over from step 0. A served simulator
    (``simulator_model=http://...``) is checked before anything is written too."""
    lock = RunLock(cfg.run_dir)  # released however this ends (the kernel does it on a kill)
    try:
        return _train(cfg, resume, progress, rollout, restart, lock)
    finally:
        lock.release()


def _train(cfg: TrainConfig, resume: bool, progress: bool, rollout: Any | None, restart: bool,
           lock: RunLock) -> Path:
    dist = init(cfg.sharding)
    if dist.fsdp and cfg.sharding != "fsdp":  # accelerate's FSDP config: say so in config.yaml
        cfg = dataclasses.replace(cfg, sharding="fsdp")
    if cfg.prompts_per_step < dist.world:
        raise ConfigError(f"prompts_per_step={cfg.prompts_per_step} is fewer than the "
                          f"{dist.world} processes: every rank needs at least one group")
    progress = progress and dist.is_main
    run_dir = cfg.run_dir
    if resume:
        if dist.is_main:
            lock.acquire()  # a second trainer of this run is refused before anything is read
        plan = plan_resume(run_dir, restart)
        for step, why in plan.damaged if dist.is_main else ():
            print(f"envace train: checkpoint step_{step} is damaged ({why}): resuming from "
                  f"step_{plan.step} (the steps after it are redone)", file=sys.stderr)
        state = load_checkpoint(run_dir, plan.step) if plan.step is not None else None
    else:
        check_new_run_dir(run_dir)
        state = None
    if resume and (run_dir / RUN.config).exists():
        check_same_config(run_dir, cfg)
    if state is not None:  # before anything is written: a run without its KL anchor is refused
        check_anchors(cfg, run_dir)
    simulator = served_simulator(cfg)  # before anything is written too: a server that is down
    dist.barrier()  # every rank has read the old config before rank 0 rewrites it
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not resume:
            lock.acquire()
        dump_yaml(cfg, run_dir / RUN.config)
        (run_dir / RUN.running).write_text(running_marker())  # removed by a clean end only
    beat = Heartbeat(run_dir, active=dist.is_main).start()
    policy = None
    try:
        policy = build_policy(cfg, run_dir, state, progress=progress, dist=dist,
                              simulator=simulator)
        if rollout is not None:
            policy.rollout = rollout
        tasks = training_pool(cfg, policy.tokenizer)
        start = 0
        metrics = run_dir / RUN.metrics
        if state is not None:
            start = state["step"] + 1
            set_rng_state(state["rng"])
            if dist.is_main:
                _truncate_metrics(metrics, state["step"])
                _restore_checkpoint_row(metrics, state)
        elif dist.is_main:  # --restart: the old rows are kept aside
            keep_metrics(metrics, None)
        torch.manual_seed(cfg.seed)
        _loop(cfg, policy, tasks, run_dir, start, metrics, progress, dist)
        if dist.is_main:  # the other ranks are done: evaluation runs on one process
            finish_run(cfg, policy, run_dir, progress=progress)
    finally:
        beat.stop()
        if rollout is None and policy is not None:  # engines we started; a caller's stay
            policy.close()
    return run_dir


def _loop(cfg: TrainConfig, policy: Policy, tasks: list, run_dir: Path, start: int,
          metrics: Path, progress: bool, dist: Dist = Dist()) -> None:
    reporter = make_reporter(cfg.report_to if dist.is_main else "none", run_dir, to_dict(cfg))
    try:
        _steps(cfg, policy, tasks, run_dir, start, metrics, progress, dist, reporter)
    finally:
        reporter.close()


def _steps(cfg: TrainConfig, policy: Policy, tasks: list, run_dir: Path, start: int,
           metrics: Path, progress: bool, dist: Dist, reporter: Any) -> None:
    # the world model's bits per byte on held-out real trajectories (rank 0; the whole models
    # are kept on every rank, FSDP included, so no other rank takes part)
    nll = fidelity_nll.curve(cfg, policy) if cfg.fidelity_nll_every and dist.is_main else None
    for step in range(start, cfg.steps):
        timer = step_timer(cfg, policy)
        last = step == cfg.steps - 1
        held: dict[str, Any] = {}
        if nll is not None and fidelity_nll.due(step, cfg.fidelity_nll_every, cfg.steps):
            with timer.section("fidelity_nll"):  # before the step's update: its rollouts' policy
                held = nll()
        record = train_step(step, policy, tasks, cfg, run_dir, dist, timer)
        if nll is not None and last:
            with timer.section("fidelity_nll"):  # and the trained model, after the last update
                held.update({k.replace("fidelity_bpb", "fidelity_bpb_end"): v
                             for k, v in nll().items()})
        if record is not None:
            record.update(held)
        if last or (cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0):
            # the checkpoint holds the step's row (without its times): a run killed before the
            # row reaches metrics.jsonl gets it back on resume
            extra = {"config": to_dict(cfg), "initial_model": str(policy.path)}
            if record is not None:
                extra["metrics"] = record
            with timer.section("checkpoint"):
                policy.save(run_dir, step, extra, dist)  # every rank: see save
        timer.stop()
        if record is not None:  # rank 0
            record.update(timer.metrics())
            _append_jsonl(metrics, record)
            reporter.log(record, step)
            if progress:
                print(progress_line(record, step, cfg.steps), flush=True)


def progress_line(record: dict[str, Any], step: int, steps: int) -> str:
    """The console line of one step, saying what a missing figure means instead of ``nan``:
    no rehearsed call to audit (``grpo`` rolls out in reality), or no update because every
    group's rewards were equal (GRPO's advantages are then all zero)."""
    div = record.get("fidelity/divergence_rate")
    fidelity = ("divergence - (no rehearsed call)" if div is None or div != div
                else f"divergence {div:.2f}")
    loss = record.get("loss")
    flat = all(record.get(f"adv/{r}_{m}", 0.0) == 0.0 for r in ("act", "rehearse")
               for m in ("mean", "std"))
    if loss is None or loss != loss:
        update = "loss -"
    elif loss == 0.0 and flat:
        update = "loss 0 (every group's rewards equal: no learning signal)"
    else:
        update = f"loss {loss:.4f}"
    return (f"[train] step {step + 1}/{steps} reward {record['reward/mean']:.3f} "
            f"success {record['success/mean']:.2f} {fidelity} {update} "
            f"({record['time/step']:.1f} s)")


def _truncate_metrics(path: Path, upto: int) -> None:
    """Drop metrics of steps after the checkpoint we resume from (they will be redone); a line
    that does not parse (torn by a kill) is kept in ``metrics.jsonl.truncated``."""
    keep_metrics(path, upto)


def _restore_checkpoint_row(path: Path, state: dict[str, Any]) -> None:
    """After ``_truncate_metrics``: when the run was killed between writing a checkpoint and
    appending that step's row, append the row the checkpoint holds (it has no ``time/*``:
    the checkpoint's own duration was not known when it was written)."""
    row = state.get("info", {}).get("metrics")
    if row is None:
        return
    steps = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except (json.JSONDecodeError, KeyError):
                continue
    if state["step"] not in steps:
        _append_jsonl(path, row)


__all__ = ["train", "train_step", "update", "save_checkpoint"]
