"""The world model's bits per byte on a fixed held-out batch of real trajectories, while training.

    held = held_out_batch(cfg)                      # once per run: fidelity_nll_batch real dev
    row.update(score_held_out(model, tok, held, ctx))  # {"fidelity_bpb": 0.87, ...}

``fidelity_nll_every=K`` (``TrainConfig``) logs, every K steps, how probable reality is under the
model that rehearses (the policy; mode ``split``: its world model): the likelihood audit's pooled
figure (``audit.stats.likelihood``: total bits / total UTF-8 bytes of the real responses,
``envace probe --likelihood``) on the same few real trajectories of ``eval_split`` for the whole
run. Nothing is generated: each trajectory is one teacher-forced forward (``ModelScorer``, the
likelihood audit's own scorer, windows where a trajectory does not fit the context), so the curve
costs a handful of forwards per point, beside the generation-based ``fidelity/*`` of the step's
rollouts.

The batch is drawn once, with a fixed seed (not the run's: every seed of a recipe is measured on
the same trajectories), from the split's whole tasks, and exported in the real environment
(``envace.core.export.export_real``: the ground truth's calls and their real responses, the
trajectories ``envace data export-real`` writes). The figure is the probe's: for the same model,
trajectories and context, ``fidelity_bpb`` equals ``probe_likelihood``'s pooled bits per byte
(tests/training/test_fidelity_nll.py).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audit.likelihood_probe import Scoring, scoring_of
from envace.core.schema import Trajectory

#: the seed that picks the held-out trajectories (the same for every run and seed)
BATCH_SEED = 0
LN2 = math.log(2.0)


@dataclass(frozen=True)
class HeldOut:
    """The fixed batch: its trajectories, what the scorer reads of them, and each scored
    step's response size in UTF-8 bytes (by trajectory, by step)."""

    trajectories: list[Trajectory]
    scorings: list[Scoring]
    nbytes: list[dict[int, int]]


def held_out_of(trajectories: list[Trajectory]) -> HeldOut:
    """The batch for real ``trajectories``: every answered call's recorded (real) response is
    a response to score, given the real history before it."""
    scorings, nbytes = [], []
    for traj in trajectories:
        records = [{"step": st.step, "actual": st.response.content}
                   for st in traj.tool_steps() if st.response is not None]
        scorings.append(scoring_of(traj, records))
        nbytes.append({int(r["step"]): len(str(r["actual"]).encode("utf-8", "surrogatepass"))
                       for r in records})
    return HeldOut(list(trajectories), scorings, nbytes)


def held_out_tasks(tasks: list[Any], n: int, seed: int = BATCH_SEED) -> list[Any]:
    """``n`` of ``tasks`` (all when fewer), drawn with ``seed``, in the split's order."""
    if n >= len(tasks):
        return list(tasks)
    keep = set(random.Random(seed).sample(range(len(tasks)), n))
    return [t for i, t in enumerate(tasks) if i in keep]


def held_out_batch(env: str, split: str, n: int) -> HeldOut:
    """``n`` real trajectories of ``split``'s whole tasks in ``env``, exported in the real
    environment (the same ones for every run)."""
    # lazy: loads the environment family (pydantic, the backends) only when the curve is on
    from envace.core.envs.family import family
    from envace.core.envs.limits import CallLimits
    from envace.core.export import export_real

    tasks = held_out_tasks(family(env).split_tasks(split, "task"), n)
    # under the call limits like every environment call; a task past them raises (the batch
    # must be the same for every run, so it is never silently smaller)
    return held_out_of(list(export_real(tasks, limits=CallLimits())))


def score_held_out(model: Any, tokenizer: Any, held: HeldOut, context: int,
                   batch_size: int = 4) -> dict[str, Any]:
    """``fidelity_bpb`` (pooled bits per byte of the batch's real responses, None when no
    response could be scored), ``fidelity_bpb_tokens`` (the tokens scored, end markers
    included) and ``fidelity_bpb_steps`` (the responses scored). The model runs in eval mode
    without gradients; its train/eval mode is restored."""
    # lazy: loads torch: the scorer's forwards
    from envace.evaluation.likelihood import ModelScorer

    was_training = model.training
    try:
        got = ModelScorer(model, tokenizer, context, batch_size)(held.scorings)
    finally:
        model.train(was_training)
    nats, nbytes, tokens, steps = 0.0, 0, 0, 0
    for per, sizes in zip(got, held.nbytes, strict=True):
        for step, value in per.items():
            if isinstance(value, tuple) and step in sizes:
                nats += float(value[0])
                tokens += int(value[1])
                nbytes += sizes[step]
                steps += 1
    bpb = nats / LN2 / nbytes if nbytes > 0 else None
    return {"fidelity_bpb": bpb, "fidelity_bpb_tokens": tokens, "fidelity_bpb_steps": steps}


def curve(cfg: Any, policy: Any) -> Callable[[], dict[str, Any]]:
    """The measurement of a run (``TrainConfig`` ``cfg``, ``envace.training.train_setup.Policy``
    ``policy``): its held-out batch, drawn once, scored on call under the model that rehearses
    (the world model where the run has one), within the context its probe uses
    (``envace.evaluation.model_probe.context_length`` of the model the run started from)."""
    # lazy: model_probe loads the decoding helpers; only a run with the curve on needs them
    from envace.evaluation.model_probe import context_length

    held = held_out_batch(cfg.env, cfg.eval_split, cfg.fidelity_nll_batch)
    model = policy.world_model if policy.world_model is not None else policy.model
    context = context_length(policy.path, model)
    return lambda: score_held_out(model, policy.tokenizer, held, context)


def due(step: int, every: int, steps: int) -> bool:
    """Whether the curve is measured at the start of ``step`` (before its update): every
    ``every`` steps from step 0, and on the last step."""
    return every > 0 and (step % every == 0 or step == steps - 1)


__all__ = ["HeldOut", "curve", "due", "held_out_batch", "held_out_of", "held_out_tasks",
           "score_held_out"]
