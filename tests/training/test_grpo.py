"""Known-answer and property tests for envace.training.grpo (role-wise advantages, PPO loss, KL)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.training.grpo import (
    ACT,
    CONTEXT,
    REHEARSE,
    aggregate,
    clipped_surrogate,
    entropy_from_logits,
    kl_k3,
    logprobs_from_logits,
    masked_mean,
    merge_stats,
    per_role_stats,
    policy_loss,
    role_advantages,
    role_masks,
    token_advantages,
)

# -----------------------------------------------------------------------------
# Advantages

# Two tasks x four rollouts, interleaved. Member 6 (task "b") wrote no tool responses.
GROUPS = ["a", "b", "a", "b", "a", "b", "a", "b"]
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0])
HAS_ROLE = torch.ones(8, 2, dtype=torch.bool)
HAS_ROLE[5, 1] = False


def test_role_advantages_hand_computed():
    adv = role_advantages(REWARDS, GROUPS, HAS_ROLE)
    # task a: members 0,2,4,6 rewards 1,0,1,0 -> both baselines 0.5
    # task b: members 1,3,5,7 rewards 0,0,1,1 -> act baseline 0.5;
    #         rehearse baseline over members 1,3,7 (rewards 0,0,1) = 1/3
    expected = torch.tensor(
        [
            [0.5, 0.5],
            [-0.5, -1 / 3],
            [-0.5, -0.5],
            [-0.5, -1 / 3],
            [0.5, 0.5],
            [0.5, 0.0],  # no rehearse tokens: 0
            [-0.5, -0.5],
            [0.5, 2 / 3],
        ]
    )
    torch.testing.assert_close(adv, expected)


def test_role_advantages_tensor_group_ids_match_list():
    ids = torch.tensor([7, 3, 7, 3, 7, 3, 7, 3])
    torch.testing.assert_close(
        role_advantages(REWARDS, ids, HAS_ROLE), role_advantages(REWARDS, GROUPS, HAS_ROLE)
    )


def test_role_advantages_scale_by_std():
    adv = role_advantages(REWARDS, GROUPS, HAS_ROLE, scale_by_std=True, eps=0.0)
    std_4 = torch.tensor([1.0, 0.0, 1.0, 0.0]).std().item()  # unbiased, as verl
    std_3 = torch.tensor([0.0, 0.0, 1.0]).std().item()
    assert adv[0, 0].item() == pytest.approx(0.5 / std_4)
    assert adv[7, 1].item() == pytest.approx((2 / 3) / std_3)
    assert adv[5, 1].item() == 0.0


def test_role_advantages_single_member_and_equal_rewards_give_zero():
    has_role = torch.tensor([[True, True], [True, False], [True, False]])
    adv = role_advantages(torch.tensor([1.0, 0.0, 1.0]), [0, 0, 0], has_role, scale_by_std=True)
    assert adv[0, 1].item() == 0.0  # only member with rehearse tokens
    assert adv[1:, 1].abs().sum().item() == 0.0
    same = role_advantages(torch.ones(4), [0] * 4, torch.ones(4, 2, dtype=torch.bool), True)
    assert same.abs().sum().item() == 0.0  # zero std does not divide by zero


def test_role_advantages_per_role_rewards():
    # grounded variant: rehearse reward differs from the task reward
    rewards = torch.tensor([[1.0, 0.2], [0.0, 0.8], [1.0, 0.5]])
    adv = role_advantages(rewards, [0, 0, 0], torch.ones(3, 2, dtype=torch.bool))
    torch.testing.assert_close(adv[:, 0], torch.tensor([1 / 3, -2 / 3, 1 / 3]))
    torch.testing.assert_close(adv[:, 1], torch.tensor([-0.3, 0.3, 0.0]))
    # a role's reward is ignored (even nan) for members without that role
    rewards[2, 1] = float("nan")
    has_role = torch.tensor([[True, True], [True, True], [True, False]])
    adv = role_advantages(rewards, [0, 0, 0], has_role, scale_by_std=True)
    assert torch.isfinite(adv).all() and adv[2, 1].item() == 0.0


def test_role_advantages_weights_pool_generations():
    # member 0 rehearsed 3 responses, member 1 one: the reference pools 4 rows -> mean 0.75
    weights = torch.tensor([[1.0, 3.0], [1.0, 1.0]])
    adv = role_advantages(
        torch.tensor([1.0, 0.0]), [0, 0], torch.ones(2, 2, dtype=torch.bool), weights=weights
    )
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.25], [-0.5, -0.75]]))


def test_role_advantages_rejects_bad_shapes():
    with pytest.raises(ValueError):
        role_advantages(torch.ones(3, 3), [0, 0, 0], torch.ones(3, 2, dtype=torch.bool))
    with pytest.raises(ValueError):
        role_advantages(torch.ones(3), [0, 0], torch.ones(3, 2, dtype=torch.bool))


def test_token_advantages_broadcast_by_role():
    adv_by_role = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    roles = torch.tensor([[CONTEXT, ACT, ACT, REHEARSE, CONTEXT], [ACT, REHEARSE, CONTEXT, 0, 0]])
    expected = torch.tensor([[0.0, 1.0, 1.0, -2.0, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(token_advantages(adv_by_role, roles), expected)
    with pytest.raises(ValueError):
        token_advantages(adv_by_role[:, :1], roles)


# -----------------------------------------------------------------------------
# Policy loss

# One token per case: unclipped, clipped high, clipped low, dual clip.
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
RATIO = torch.tensor([[1.1, 1.5, 0.5, 5.0]])
OLD = torch.full((1, 4), -1.0)
MASK = torch.ones(1, 4, dtype=torch.bool)


def test_policy_loss_hand_computed_cases():
    lp = (OLD + RATIO.log()).requires_grad_()
    loss, stats = policy_loss(lp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # -1.1 (unclipped), -1.2 (clip at 1.2), 0.8 (clip at 0.8), 3.0 (dual clip caps 5.0 at 3)
    assert loss.item() == pytest.approx((-1.1 - 1.2 + 0.8 + 3.0) / 4)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["clip_frac_high"] == pytest.approx(0.25)
    assert stats["clip_frac_low"] == pytest.approx(0.25)
    assert stats["dual_clip_frac"] == pytest.approx(0.25)
    assert stats["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 5.0) / 4, rel=1e-5)
    assert stats["ratio_max"] == pytest.approx(5.0, rel=1e-5)
    loss.backward()
    # only the unclipped token has a gradient: d/dlp (-A r) / 4 = -1.1 / 4
    torch.testing.assert_close(lp.grad, torch.tensor([[-1.1 / 4, 0.0, 0.0, 0.0]]))


def test_policy_loss_asymmetric_clip_and_no_dual_clip():
    lp = OLD + RATIO.log()
    loss, _ = policy_loss(lp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.28, dual_clip=None)
    assert loss.item() == pytest.approx((-1.1 - 1.28 + 0.8 + 5.0) / 4)


def test_dual_clip_must_exceed_one():
    with pytest.raises(ValueError):
        clipped_surrogate(RATIO, ADV, dual_clip=1.0)


def test_ratio_one_gives_minus_mean_advantage():
    torch.manual_seed(0)
    adv = torch.randn(3, 7)
    mask = torch.rand(3, 7) > 0.3
    lp = torch.randn(3, 7)
    loss, stats = policy_loss(lp, lp.clone(), adv, mask)
    assert loss.item() == pytest.approx(-adv[mask].mean().item(), rel=1e-5)
    assert stats["clip_frac"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)


def test_gradient_flows_only_through_masked_tokens():
    torch.manual_seed(0)
    lp = torch.randn(2, 5, requires_grad=True)
    old = lp.detach() + 0.01 * torch.randn(2, 5)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    ref = lp.detach() + 0.1
    # garbage in masked-out positions must not leak into loss or gradient
    nan = torch.tensor(float("nan"))
    adv = torch.where(mask, torch.randn(2, 5), nan)
    old = torch.where(mask, old, -torch.tensor(float("inf")))
    ref = torch.where(mask, ref, nan)
    loss, _ = policy_loss(lp, old, adv, mask, ref_logprobs=ref, kl_coef=0.1)
    loss.backward()
    assert torch.isfinite(loss)
    assert (lp.grad[~mask] == 0).all()
    assert (lp.grad[mask] != 0).all()


def test_aggregation_variants_on_unequal_lengths():
    per_token = torch.tensor([[4.0, 0.0, 0.0], [1.0, 2.0, 3.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)  # last: no tokens
    assert aggregate(per_token, mask, "token_mean").item() == pytest.approx((4 + 1 + 2 + 3) / 4)
    assert aggregate(per_token, mask, "seq_mean").item() == pytest.approx((4 + 2) / 2)
    assert aggregate(per_token, mask, "seq_mean_token_sum").item() == pytest.approx((4 + 6) / 2)
    assert aggregate(per_token, mask, "token_mean", normalizer=8).item() == pytest.approx(10 / 8)
    with pytest.raises(ValueError):
        aggregate(per_token, mask, "sum")


def test_policy_loss_aggregation_switch():
    adv = torch.tensor([[4.0, 0.0, 0.0], [1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    lp = torch.zeros(2, 3)
    tok, _ = policy_loss(lp, lp, adv, mask, aggregation="token_mean")
    seq, _ = policy_loss(lp, lp, adv, mask, aggregation="seq_mean")
    assert tok.item() == pytest.approx(-10 / 4)
    assert seq.item() == pytest.approx(-3.0)


def test_kl_term_added_when_coef_positive():
    lp = torch.zeros(1, 2)
    ref = torch.tensor([[0.5, -0.5]])
    adv = torch.zeros(1, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    off, stats_off = policy_loss(lp, lp, adv, mask, ref_logprobs=ref, kl_coef=0.0)
    on, stats_on = policy_loss(lp, lp, adv, mask, ref_logprobs=ref, kl_coef=1e-4)
    kl = ((math.exp(0.5) - 0.5 - 1) + (math.exp(-0.5) + 0.5 - 1)) / 2
    assert off.item() == 0.0 and "kl_ref" not in stats_off
    assert stats_on["kl_ref"] == pytest.approx(kl, rel=1e-5)
    assert on.item() == pytest.approx(1e-4 * kl, rel=1e-5)


def test_named_masks_give_per_role_stats():
    roles = torch.tensor([[ACT, ACT, REHEARSE, REHEARSE]])
    lp = OLD + RATIO.log()
    _, stats = policy_loss(lp, OLD, ADV, MASK, named_masks=role_masks(roles, MASK))
    assert stats["act/clip_frac"] == pytest.approx(0.5)  # token 2 clipped high
    assert stats["rehearse/clip_frac"] == pytest.approx(0.5)  # token 3 clipped low
    assert stats["rehearse/dual_clip_frac"] == pytest.approx(0.5)
    assert stats["act/tokens"] == 2.0 and stats["tokens"] == 4.0


def _micro_batch_stats() -> tuple[list[dict[str, float]], dict[str, float]]:
    """Two micro-batches' stats (normalised by the batch's 6 tokens) and the whole batch's.

    A: act x3 at ratio 1.5 (advantage +1: clipped high), rehearse x1 at ratio 1.0.
    B: act x1 at ratio 1.0, rehearse x1 at ratio 0.5 (advantage -1: clipped low)."""
    roles = torch.tensor([[ACT, ACT, ACT, REHEARSE], [ACT, REHEARSE, CONTEXT, CONTEXT]])
    ratio = torch.tensor([[1.5, 1.5, 1.5, 1.0], [1.0, 0.5, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 0.0, 0.0]])
    old = torch.full((2, 4), -1.0)
    lp, mask = old + ratio.log(), roles != CONTEXT
    parts = [policy_loss(lp[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], normalizer=6,
                         named_masks=role_masks(roles[i:i + 1], mask[i:i + 1]))[1]
             for i in range(2)]
    whole = policy_loss(lp, old, adv, mask, named_masks=role_masks(roles, mask))[1]
    return parts, whole


def test_merge_stats_known_answers():
    parts, _ = _micro_batch_stats()
    merged = merge_stats(parts)
    assert merged["ratio_max"] == pytest.approx(1.5)  # the maximum, not a mean of maxima (4/3)
    # each role's figures are weighted by that role's tokens in each micro-batch
    assert merged["act/clip_frac"] == pytest.approx(3 / 4)  # not 1 x 4/6 + 0 x 2/6
    assert merged["rehearse/clip_frac"] == pytest.approx(1 / 2)  # not 0 x 4/6 + 1 x 2/6
    assert merged["clip_frac"] == pytest.approx(4 / 6)
    assert merged["ratio_mean"] == pytest.approx((4.5 + 1.0 + 1.0 + 0.5) / 6)
    assert (merged["tokens"], merged["act/tokens"], merged["rehearse/tokens"]) == (6, 4, 2)
    # loss terms are already normalised by the batch: summed
    assert merged["loss"] == pytest.approx(parts[0]["loss"] + parts[1]["loss"])


def test_merge_stats_equal_the_whole_batch_and_ignore_the_split():
    parts, whole = _micro_batch_stats()
    for got in (merge_stats(parts), merge_stats(parts[::-1]), merge_stats([whole])):
        assert got.keys() == whole.keys()
        for k, v in whole.items():
            assert got[k] == pytest.approx(v, rel=1e-6, abs=1e-7), k


def test_merge_stats_edge_cases():
    # a role without tokens reports 0; a non-finite figure is left out with its weight
    parts = [{"tokens": 2.0, "act/tokens": 2.0, "act/clip_frac": 0.5, "rehearse/tokens": 0.0,
              "rehearse/clip_frac": 0.0, "ratio_mean": float("inf"), "ratio_max": float("inf")},
             {"tokens": 1.0, "act/tokens": 1.0, "act/clip_frac": 1.0, "rehearse/tokens": 0.0,
              "rehearse/clip_frac": 0.0, "ratio_mean": 2.0, "ratio_max": 3.0}]
    merged = merge_stats(parts)
    assert merged["act/clip_frac"] == pytest.approx(2 / 3)
    assert merged["rehearse/clip_frac"] == 0.0
    assert merged["ratio_mean"] == 2.0 and merged["ratio_max"] == 3.0
    # a micro-batch without tokens (ratio_max 1.0 by convention) cannot raise or lower the max
    empty = {"tokens": 0.0, "ratio_max": 1.0}
    assert merge_stats([empty, {"tokens": 3.0, "ratio_max": 0.5}])["ratio_max"] == 0.5
    assert merge_stats([empty])["ratio_max"] == 1.0


# -----------------------------------------------------------------------------
# KL, entropy, stats

logprob = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(logprob, logprob), min_size=1, max_size=32))
def test_k3_nonnegative_and_zero_when_equal(pairs):
    lp = torch.tensor([p[0] for p in pairs])
    ref = torch.tensor([p[1] for p in pairs])
    kl = kl_k3(lp, ref)
    assert torch.isfinite(kl).all()
    assert (kl >= 0).all()
    assert (kl_k3(lp, lp) == 0).all()


def test_k3_matches_formula():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -0.5])
    d = ref - lp
    torch.testing.assert_close(kl_k3(lp, ref), torch.exp(d) - d - 1)


def test_entropy_from_logits():
    logits = torch.zeros(2, 3, 4)
    torch.testing.assert_close(entropy_from_logits(logits), torch.full((2, 3), math.log(4)))
    banned = torch.tensor([[[0.0, 0.0, float("-inf")]]], requires_grad=True)
    h = entropy_from_logits(banned)
    assert h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert torch.isfinite(banned.grad).all()
    peaked = torch.tensor([[[0.0, -200.0]]], requires_grad=True)  # p underflows to 0
    entropy_from_logits(peaked).sum().backward()
    assert torch.isfinite(peaked.grad).all()


def test_logprobs_from_logits():
    logits = torch.log(torch.tensor([[[0.25, 0.75], [0.5, 0.5]]]))
    lp = logprobs_from_logits(logits, torch.tensor([[1, 0]]))
    torch.testing.assert_close(lp, torch.log(torch.tensor([[0.75, 0.5]])))


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, float("inf")], [3.0, 5.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    assert masked_mean(x, mask).item() == pytest.approx(1.5)
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 0.0]))


def test_per_role_stats():
    roles = torch.tensor([[CONTEXT, ACT, ACT, REHEARSE], [ACT, ACT, CONTEXT, CONTEXT]])
    adv = token_advantages(torch.tensor([[1.0, -1.0], [3.0, 0.0]]), roles)
    mask = roles != CONTEXT
    clipped = torch.tensor([[False, True, False, False], [False, False, False, False]])
    stats = per_role_stats(roles, adv, mask, clipped)
    assert stats["act/tokens"] == 4.0 and stats["rehearse/tokens"] == 1.0
    assert stats["act/adv_mean"] == pytest.approx(2.0)
    assert stats["act/adv_std"] == pytest.approx(1.0)
    assert stats["act/clip_frac"] == pytest.approx(0.25)
    assert stats["rehearse/adv_mean"] == pytest.approx(-1.0)
    empty = per_role_stats(torch.full((1, 3), ACT), torch.ones(1, 3))
    assert empty["rehearse/tokens"] == 0.0 and empty["rehearse/adv_mean"] == 0.0
