"""One optimizer update of the EnvACE trainer: the clipped role-wise GRPO loss over micro-batches.

`update` takes a step's episodes and their token advantages and, per model that trains (the
policy; in mode ``split`` also the rehearser), runs the micro-batches (right-padded tensors:
`_micro_batch`), reads logits only at the selected rows (trained tokens, and the real responses
the model learns with ``real_obs_coef``), accumulates the policy loss (plus the optional KL and
real-observation losses), sums gradients across ranks and takes one optimizer step; it returns
the step's statistics. The step around it (rollouts, rewards, audit, records) is
``envace.training.train``.
"""

from __future__ import annotations

from typing import Any

import torch

from envace.core.modes import training_mode
from envace.core.timing import NULL_TIMER, Timer
from envace.model.rollout import CONTEXT, Episode
from envace.model.trained_logits import scatter_rows, selected_logits
from envace.training import grpo
from envace.training.config import TrainConfig
from envace.training.distributed import Dist
from envace.training.fsdp import grad_norm_value
from envace.training.train_setup import Policy


def _pad(seqs: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    out = torch.full((len(seqs), width), value, dtype=dtype)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s, dtype=dtype)
    return out


def _micro_batch(mb: list[Episode], pad_id: int, roles_trained: tuple[int, ...], learns: bool,
                 dev: torch.device) -> tuple[torch.Tensor, ...]:
    """A micro-batch's right-padded tensors: ``(ids, roles, old log-probs, attention, trained
    mask, real-observation mask, selected rows)``; the last four are over targets (``ids[:,
    1:]``); ``obs`` is all False unless the model learns the real responses, and the selected
    rows are where logits are read: trained tokens, and the real ones the model learns."""
    ids = _pad([e.ids for e in mb], pad_id, torch.long).to(dev)
    roles = _pad([e.roles for e in mb], CONTEXT, torch.long)[:, 1:].to(dev)
    old = _pad([e.logprobs for e in mb], 0.0, torch.float32)[:, 1:].to(dev)
    attn = _pad([[1] * len(e.ids) for e in mb], 0, torch.long).to(dev)
    mask = torch.zeros_like(roles, dtype=torch.bool)
    for r in roles_trained:
        mask |= roles == r
    obs = (_pad([e.real_obs or [False] * len(e.ids) for e in mb], False, torch.bool)[:, 1:]
           .to(dev) if learns else torch.zeros_like(mask))
    return ids, roles, old, attn, mask, obs, (mask | obs) if learns else mask


def update(policy: Policy, episodes: list[Episode], adv: torch.Tensor, cfg: TrainConfig,
           dist: Dist = Dist(), timer: Timer = NULL_TIMER) -> dict[str, float]:
    """One optimizer step per model on the clipped role-wise loss; returns its statistics.

    Under data parallelism ``episodes`` are this rank's share: the loss is normalised by the
    count over all ranks and the gradients are summed across ranks before the step. ``timer``
    sections: ``update/forward`` (forwards, log-probabilities, loss, entropy),
    ``update/backward``, ``update/optimizer`` (gradient reduction, clipping, the optimizer and
    scheduler steps); batching and statistics stay in ``update`` itself.

    With ``real_obs_coef > 0`` the model that learns the world (``world_learner`` of the mode
    table) also takes ``real_obs_coef`` times the token-mean cross-entropy of the real tool
    responses (``Episode.real_obs``), reported apart: ``loss/real_obs``, ``real_obs/tokens``."""
    stats: dict[str, float] = {}
    learner = training_mode(cfg.mode).world_learner
    for name, model, roles_trained in policy.trainees(cfg.mode):
        def trained(e: Episode, roles_trained: tuple[int, ...] = roles_trained) -> int:
            return sum(r in roles_trained for r in e.roles[1:])

        learns = cfg.real_obs_coef > 0 and name == learner

        def observed(e: Episode, learns: bool = learns) -> int:  # targets only: ids[1:]
            return sum(e.real_obs[1:]) if learns else 0

        # only episodes with trained tokens; similar lengths together (less padding)
        order = sorted((i for i, e in enumerate(episodes) if trained(e) or observed(e)),
                       key=lambda i: len(episodes[i].ids))
        total = dist.sum(sum(trained(episodes[i]) for i in order))
        n_obs = dist.sum(sum(observed(episodes[i]) for i in order)) if learns else 0.0
        if learns:
            stats["loss/real_obs"], stats["real_obs/tokens"] = 0.0, n_obs
        if total == 0 and n_obs == 0:
            continue
        # the loss is a sum over micro-batches (and ranks): divide by the global count
        norm = (total if cfg.aggregation == "token_mean"
                else dist.sum(sum(1 for i in order if trained(episodes[i])))) or 1.0
        obs_sum = 0.0
        opt, sched = policy.optimizers[name], policy.schedulers[name]
        opt.zero_grad(set_to_none=True)
        parts: list[dict[str, float]] = []  # each micro-batch's statistics
        ent_sum = 0.0
        reference = policy.references.get(name) if cfg.kl_coef > 0 else None
        # FSDP averages gradients over ranks: scale the backward so that they are summed
        sharded = name in policy.sharded
        scale = float(dist.world) if sharded else 1.0
        mine = -(-len(order) // cfg.micro_batch_size)
        # every sharded forward/backward is collective: ranks with fewer micro-batches run
        # zero-weight ones until the busiest rank is done (agreed on before any of them)
        idle = dist.max(mine) - mine if sharded else 0
        for k in range(0, len(order), cfg.micro_batch_size):
            idx = order[k:k + cfg.micro_batch_size]
            dev = next(model.parameters()).device
            ids, roles, old, attn, mask, obs, sel = _micro_batch(
                [episodes[i] for i in idx], policy.pad_id, roles_trained, learns, dev)
            targets = ids[:, 1:][sel]
            with timer.section("update/forward"):
                tok_adv = grpo.token_advantages(adv[idx].to(dev), roles)
                out = selected_logits(model, ids, attn, sel, whole=sharded)  # [N, V]
                logits = out.float() / cfg.temperature
                obs_logits = out[obs[sel]] if learns else None  # the real tokens' rows
                del out
                lp = scatter_rows(grpo.logprobs_from_logits(logits, targets), sel)
                ref_lp = None
                if reference is not None:  # this trainee's own anchor: its initial weights
                    with torch.no_grad():
                        ref_logits = selected_logits(reference, ids, attn, sel)
                        ref_lp = scatter_rows(grpo.logprobs_from_logits(
                            ref_logits.float() / cfg.temperature, targets), sel)
                loss, st = grpo.policy_loss(
                    lp, old, tok_adv, mask, cfg.clip_low, cfg.clip_high,
                    cfg.dual_clip, cfg.aggregation, ref_lp, cfg.kl_coef,
                    normalizer=norm,
                    named_masks=grpo.role_masks(roles, mask))
                if learns:  # apart from the policy loss: its own coefficient and figure
                    obs_loss = grpo.real_obs_loss(obs_logits, ids[:, 1:][obs], n_obs)
                    loss = loss + cfg.real_obs_coef * obs_loss
                    obs_sum += float(obs_loss.detach())
            with timer.section("update/backward"):
                (loss * scale).backward()
            with timer.section("update/forward"), torch.no_grad():
                ent_sum += float(grpo.entropy_from_logits(logits)[mask[sel]].sum())
            parts.append(st)
        if sharded:  # FSDP reduced the gradients in each backward
            # lazy: FSDP only under a sharded launch (torch.distributed.fsdp)
            from envace.training.fsdp import idle_backward

            with timer.section("update/backward"):
                for _ in range(idle):
                    idle_backward(model, policy.pad_id)
        else:
            with timer.section("update/optimizer"):
                dist.sum_grads(model.parameters())
        if dist.active:  # statistics of the whole batch
            parts = [p for rank_parts in dist.gather(parts) for p in rank_parts]
            ent_sum = dist.sum(ent_sum)
        if learns:
            stats["loss/real_obs"] = dist.sum(obs_sum)
        acc = {k: v for k, v in grpo.merge_stats(parts).items() if not k.endswith("tokens")}
        with timer.section("update/optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(
                model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            opt.step()
            sched.step()
            policy.after_step(name)
        prefix = "" if name == "policy" else f"{name}/"
        stats.update({f"{prefix}{k}": v for k, v in acc.items()})
        stats[f"{prefix}entropy"] = ent_sum / total if total else 0.0
        stats[f"{prefix}grad_norm"] = grad_norm_value(grad_norm)
        stats[f"{prefix}lr"] = sched.get_last_lr()[0]
    return stats

