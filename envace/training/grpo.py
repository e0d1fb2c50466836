"""Role-wise GRPO: advantages, the clipped policy loss, KL and entropy. Pure torch, no model.

Every generated token has a role: ACT (assistant turns: tool calls, final answers) or REHEARSE
(tool responses written by the policy). CONTEXT tokens (system, user, real tool output, template
scaffolding) are never trained. A role tensor `roles[B, T]` holds one of these ids per token.

Per-role tensors `[B, R]` have one column per trained role, in the order of TRAINED_ROLES:
column 0 is ACT, column 1 is REHEARSE (column = role id - 1).

The update, as in the EnvACE paper's reference (verl):
  1. `role_advantages`: within each group (a task's G rollouts), each role has its own baseline,
     the mean reward of the members that produced tokens of that role; advantage = reward -
     baseline (no std division unless asked).
  2. `token_advantages`: broadcast each member's per-role advantage onto its tokens.
  3. `policy_loss`: token-level PPO clipped surrogate (asymmetric clip, dual clip for negative
     advantages), aggregated by token mean, plus an optional k3 KL to a reference policy.
  4. `merge_stats`: the statistics of the micro-batches (and ranks) of one step, as one batch's.

Besides the policy loss, `real_obs_loss` is a supervised next-token loss on the tokens the real
environment wrote (CONTEXT tokens flagged by the rollout, `Episode.real_obs`): the world learns
what reality says (`real_obs_coef`).

Run the tests: `.venv/bin/pytest tests/training/test_grpo.py`.
"""

import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Literal

import torch
from torch import Tensor

# -----------------------------------------------------------------------------
# Roles

CONTEXT, ACT, REHEARSE = 0, 1, 2
TRAINED_ROLES: tuple[int, ...] = (ACT, REHEARSE)
ROLE_NAMES: dict[int, str] = {CONTEXT: "context", ACT: "act", REHEARSE: "rehearse"}

Aggregation = Literal["token_mean", "seq_mean", "seq_mean_token_sum"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean", "seq_mean_token_sum")


def role_masks(roles: Tensor, mask: Tensor | None = None) -> dict[str, Tensor]:
    """Boolean masks `{"act": [B, T], "rehearse": [B, T]}`, optionally ANDed with `mask`."""
    out = {}
    for role in TRAINED_ROLES:
        m = roles == role
        out[ROLE_NAMES[role]] = m if mask is None else m & mask.bool()
    return out


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of `x` over positions where `mask` is true; 0 where nothing is selected.

    Masked-out positions contribute neither value nor gradient (even if they hold inf or nan).
    """
    mask = mask.bool()
    total = torch.where(mask, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / mask.sum().clamp(min=1)
    return total.sum(dim) / mask.sum(dim).clamp(min=1)


def _group_index(group_ids: Tensor | Sequence[Hashable], device: torch.device) -> Tensor:
    """Map arbitrary group keys (task ids, ints) to 0..n_groups-1, in order of first appearance."""
    if isinstance(group_ids, Tensor):
        group_ids = group_ids.tolist()
    index: dict[Hashable, int] = {}
    ids = [index.setdefault(g, len(index)) for g in group_ids]
    return torch.tensor(ids, dtype=torch.long, device=device)


# -----------------------------------------------------------------------------
# Advantages


def role_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    has_role: Tensor,
    scale_by_std: bool = False,
    eps: float = 1e-6,
    weights: Tensor | None = None,
) -> Tensor:
    """Per-member, per-role advantages `[B, R]` with a separate baseline per (group, role).

    rewards: `[B]` (one task reward shared by both roles) or `[B, R]` (a reward per role, e.g. the
        grounded variant where the rehearse reward mixes task success and measured fidelity).
    group_ids: `[B]` group key per member (a tensor, or a list of task ids).
    has_role: `[B, R]` bool, whether the member produced any tokens of that role.
    scale_by_std: divide by the (unbiased) std of the role's rewards in the group, plus eps.
    weights: optional `[B, R]` frequency weights for the baseline (and std). Passing each member's
        number of generations (messages) of the role reproduces the reference, which pools every
        generation as its own row. Default: every member with the role counts once.

    A member without tokens of a role gets 0 for that role; a (group, role) with a single member
    gets 0 (nothing to compare against).
    """
    B, R = has_role.shape
    has_role = has_role.bool()
    if rewards.dim() == 1:
        rewards = rewards.unsqueeze(1).expand(B, R)
    if rewards.shape != (B, R):
        raise ValueError(f"rewards must be [B] or [B, R]={B, R}, got {tuple(rewards.shape)}")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    r = torch.where(has_role, rewards.double(), 0.0)  # a missing role's reward may be nan
    w = has_role.double() if weights is None else weights.double() * has_role

    group = _group_index(group_ids, rewards.device)
    if group.numel() != B:
        raise ValueError(f"group_ids has {group.numel()} entries for {B} members")
    n_groups = int(group.max()) + 1 if B else 0

    def per_group(x: Tensor) -> Tensor:  # [B, R] -> per-member sum over its group, [B, R]
        sums = torch.zeros(n_groups, R, dtype=x.dtype, device=x.device).index_add_(0, group, x)
        return sums[group]

    members = per_group(has_role.double())  # members of the group having the role
    weight_sum = per_group(w)
    baseline = per_group(w * r) / weight_sum.clamp(min=1e-12)
    adv = r - baseline
    if scale_by_std:
        var = per_group(w * adv**2) / (weight_sum - 1).clamp(min=1e-12)
        adv = adv / (var.sqrt() + eps)
    adv = torch.where(has_role & (members > 1) & (weight_sum > 0), adv, torch.zeros_like(adv))
    return adv.to(out_dtype)


def token_advantages(adv_by_role: Tensor, roles: Tensor) -> Tensor:
    """Broadcast per-role advantages `[B, R]` onto tokens `[B, T]`; CONTEXT tokens get 0."""
    R = adv_by_role.shape[1]
    if roles.numel() and int(roles.max()) > R:
        raise ValueError(f"roles hold an id above {R}, but adv_by_role has only {R} columns")
    column = (roles.long() - 1).clamp(min=0)
    adv = torch.gather(adv_by_role, 1, column)
    return torch.where(roles == CONTEXT, torch.zeros_like(adv), adv)


# -----------------------------------------------------------------------------
# Policy loss


def aggregate(
    loss_tokens: Tensor,
    mask: Tensor,
    aggregation: Aggregation = "token_mean",
    normalizer: float | None = None,
) -> Tensor:
    """Reduce a per-token loss `[B, T]` to a scalar.

    token_mean: sum over all masked tokens / number of masked tokens (the paper's choice; long
        sequences weigh more).
    seq_mean: mean over tokens within each sequence, then mean over sequences.
    seq_mean_token_sum: sum over tokens within each sequence, then mean over sequences.
    Sequences without masked tokens are left out of the sequence means.
    normalizer: replaces the denominator (token count, or sequence count): pass the global count
        when one optimizer step accumulates several micro-batches or ranks.
    """
    mask = mask.bool()
    x = torch.where(mask, loss_tokens, torch.zeros_like(loss_tokens))
    if aggregation == "token_mean":
        denom = mask.sum().clamp(min=1) if normalizer is None else normalizer
        return x.sum() / denom
    tokens = mask.sum(-1)
    if aggregation == "seq_mean":
        per_seq = x.sum(-1) / tokens.clamp(min=1)
    elif aggregation == "seq_mean_token_sum":
        per_seq = x.sum(-1)
    else:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    denom = (tokens > 0).sum().clamp(min=1) if normalizer is None else normalizer
    return per_seq.sum() / denom


def clipped_surrogate(
    ratio: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO loss and where each clip was active: `(loss, clipped, dual_clipped)`.

    loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)); for A < 0 the dual clip further
    caps it at -A * dual_clip, so a huge ratio on a bad token cannot blow up the update.
    """
    unclipped = -advantages * ratio
    clipped_loss = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    dual = torch.zeros_like(clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None to disable), got {dual_clip}")
        cap = -advantages * dual_clip
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
    return loss, clipped, dual


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    aggregation: Aggregation = "token_mean",
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    normalizer: float | None = None,
    named_masks: Mapping[str, Tensor] | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Token-level PPO clipped objective. All tensors are `[B, T]`; returns `(loss, stats)`.

    logprobs: log-probs of the sampled tokens under the policy being trained (with grad).
    old_logprobs: the same under the policy that sampled them (no grad).
    advantages: per-token advantages (see `token_advantages`); mask: tokens that are trained.
        Masked-out positions may hold anything (padding, nan): no loss, no gradient.
    clip_low / clip_high: ratio clip range [1 - clip_low, 1 + clip_high] (DAPO's clip-higher when
        clip_high > clip_low). dual_clip: cap for negative advantages (None disables).
    ref_logprobs, kl_coef: adds kl_coef * aggregate(k3 KL to the reference) when kl_coef > 0.
    normalizer: see `aggregate`.
    named_masks: optional masks by name (`role_masks(roles, mask)`, or per tool); the stats then
        also hold `{name}/clip_frac`, `{name}/dual_clip_frac`, `{name}/approx_kl`,
        `{name}/tokens` for each.

    stats: loss terms, clip fractions (overall, high side, low side, dual), approx_kl (k3 estimate
    of KL(old || new) on the sampled tokens), ratio mean and max, token count.
    """
    mask = mask.bool()
    # neutralise masked-out positions first, so padding garbage (even nan) cannot reach a gradient
    advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
    ratio = torch.exp(torch.where(mask, logprobs - old_logprobs, torch.zeros_like(logprobs)))
    per_token, clipped, dual = clipped_surrogate(ratio, advantages, clip_low, clip_high, dual_clip)
    pg_loss = aggregate(per_token, mask, aggregation, normalizer)
    loss = pg_loss

    stats: dict[str, float] = {"pg_loss": pg_loss.item()}
    if ref_logprobs is not None and kl_coef > 0:
        ref_logprobs = torch.where(mask, ref_logprobs, logprobs.detach())
        kl = aggregate(kl_k3(logprobs, ref_logprobs), mask, aggregation, normalizer)
        loss = loss + kl_coef * kl
        stats["kl_ref"] = kl.item()
    stats["loss"] = loss.item()

    with torch.no_grad():
        new = torch.where(mask, logprobs, old_logprobs)
        approx_kl = kl_k3(old_logprobs, new)  # tokens sampled from old: estimates KL(old || new)
        named = {"": mask, **{f"{k}/": m.bool() & mask for k, m in (named_masks or {}).items()}}
        for prefix, m in named.items():
            stats[f"{prefix}clip_frac"] = masked_mean(clipped.float(), m).item()
            stats[f"{prefix}dual_clip_frac"] = masked_mean(dual.float(), m).item()
            stats[f"{prefix}approx_kl"] = masked_mean(approx_kl, m).item()
            stats[f"{prefix}tokens"] = float(m.sum())
        stats["clip_frac_high"] = masked_mean((clipped & (advantages > 0)).float(), mask).item()
        stats["clip_frac_low"] = masked_mean((clipped & (advantages < 0)).float(), mask).item()
        stats["ratio_mean"] = masked_mean(ratio, mask).item()
        stats["ratio_max"] = ratio[mask].max().item() if mask.any() else 1.0
    return loss, stats


SUMMED_STATS: tuple[str, ...] = ("loss", "pg_loss", "kl_ref")


def merge_stats(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The statistics of a whole batch from those of its parts (`policy_loss`'s stats of each
    micro-batch, from every rank), as if `policy_loss` had seen the batch at once.

    - the loss terms (`loss`, `pg_loss`, `kl_ref`) are summed: each part's is already divided
      by the batch's normalizer;
    - `ratio_max` is the largest of the parts' (1.0 when no part has a token, as in
      `policy_loss`);
    - token counts (`tokens`, `{name}/tokens`) are summed;
    - every other figure is a token mean: `{name}/x` weighted by the part's `{name}/tokens`
      (that name's tokens, e.g. a role's), the others by its `tokens`; 0 over no token.
    A non-finite value (an overflowing ratio) is left out, with its weight.
    """
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    maxima: list[float] = []
    for part in parts:
        tokens = float(part.get("tokens", 0.0))
        for k, v in part.items():
            if k.endswith("tokens") or k in SUMMED_STATS:
                if math.isfinite(v):
                    sums[k] = sums.get(k, 0.0) + v
            elif k == "ratio_max":
                if tokens > 0 and math.isfinite(v):
                    maxima.append(v)
            elif math.isfinite(v):
                name = k.rsplit("/", 1)[0] if "/" in k else ""
                w = float(part.get(f"{name}/tokens", tokens) if name else tokens)
                sums[k] = sums.get(k, 0.0) + v * w
                weights[k] = weights.get(k, 0.0) + w
    out = {k: (v / weights[k] if weights[k] > 0 else 0.0) if k in weights else v
           for k, v in sums.items()}
    if maxima:
        out["ratio_max"] = max(maxima)
    elif any("ratio_max" in p for p in parts) and not sums.get("tokens"):
        out["ratio_max"] = 1.0  # no token anywhere
    return out


# -----------------------------------------------------------------------------
# Supervised loss on real observations


def real_obs_loss(logits: Tensor, targets: Tensor, normalizer: float | None = None) -> Tensor:
    """Summed next-token cross-entropy of `targets [N]` under `logits [N, V]` (fp32, the
    model's own distribution: no temperature), divided by `normalizer` (default N: the token
    mean; pass the global count of real-response tokens when micro-batches and ranks share one
    step). Gather the rows first: `logits[mask]`, `tokens[mask]`. 0 (with a gradient path) for
    no token."""
    total = torch.nn.functional.cross_entropy(logits.float(), targets.long(), reduction="sum")
    denom = max(int(targets.numel()), 1) if normalizer is None else normalizer
    return total / denom


# -----------------------------------------------------------------------------
# KL, entropy, log-probs


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator exp(ref - lp) - (ref - lp) - 1 of KL(pi || ref); always >= 0.

    Unbiased for tokens sampled from pi, low variance (Schulman's "k3", verl's "low_var_kl").
    The log-ratio is clamped to +-20 so a wild token cannot overflow to inf.
    """
    d = (ref_logprobs - logprobs).clamp(-20.0, 20.0)
    return (torch.expm1(d) - d).clamp(min=0.0)  # expm1: exact near 0 where exp(d) - 1 cancels


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy `[B, T]` of the categorical distributions given by logits `[B, T, V]` (in fp32).

    Banned tokens (logit -inf) are allowed: they have probability 0 and contribute nothing.
    """
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    finite = torch.where(torch.isinf(logits), torch.zeros_like(logits), logits)
    return torch.logsumexp(logits, dim=-1) - (p * finite).sum(-1)


def logprobs_from_logits(logits: Tensor, tokens: Tensor) -> Tensor:
    """Log-probabilities `[B, T]` of `tokens [B, T]` under logits `[B, T, V]` (in fp32).

    Align before calling: the logits at position t predict the token at t + 1.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(logp, -1, tokens.long().unsqueeze(-1)).squeeze(-1)


# -----------------------------------------------------------------------------
# Logging


def per_role_stats(
    roles: Tensor,
    advantages: Tensor,
    mask: Tensor | None = None,
    clipped: Tensor | None = None,
) -> dict[str, float]:
    """Floats by role name: `{role}/tokens`, `{role}/adv_mean`, `{role}/adv_std`, and
    `{role}/clip_frac` when `clipped` (from `clipped_surrogate`) is given. All `[B, T]`.

    Token-level statistics: a long sequence weighs as much as its token count, as in the loss.
    A role without tokens reports 0 tokens and zeros, so every step logs the same keys.
    """
    out: dict[str, float] = {}
    for name, m in role_masks(roles, mask).items():
        mean = masked_mean(advantages, m)
        var = masked_mean((advantages - mean) ** 2, m)
        out[f"{name}/tokens"] = float(m.sum())
        out[f"{name}/adv_mean"] = mean.item()
        out[f"{name}/adv_std"] = var.sqrt().item()
        if clipped is not None:
            out[f"{name}/clip_frac"] = masked_mean(clipped.float(), m).item()
    return out
