"""Hand-computed values for every formula in reasonrl.algo and the LR schedule."""

import math

import pytest
import torch

from reasonrl.algo import (
    aggregate,
    clipped_policy_loss,
    group_advantages,
    kl_estimate,
    kl_penalised_rewards,
    zero_variance_groups,
)
from reasonrl.policy.worker import lr_multiplier

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
GROUP = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_raw_advantage_is_the_reward():
    assert group_advantages(REWARDS, GROUP, "raw").tolist() == REWARDS.tolist()


def test_grpo_advantage_hand_computed():
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; group 1: std 0 -> 0
    adv = group_advantages(REWARDS, GROUP, "grpo", std_eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # 0.866025
    expected = [a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_grpo_advantage_eps_in_denominator():
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]), "grpo", std_eps=0.5)
    # mean 2, std 1 -> (r - 2) / 1.5
    torch.testing.assert_close(adv, torch.tensor([-2 / 3, 0.0, 2 / 3]))


def test_grpo_no_std_advantage_hand_computed():
    adv = group_advantages(REWARDS, GROUP, "grpo_no_std")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]))


def test_groups_need_not_be_contiguous():
    rewards = torch.tensor([1.0, 5.0, 3.0, 5.0])
    group = torch.tensor([0, 1, 0, 1])
    torch.testing.assert_close(group_advantages(rewards, group, "grpo_no_std"),
                               torch.tensor([-1.0, 0.0, 1.0, 0.0]))


def test_unknown_advantage_mode():
    with pytest.raises(ValueError, match="allowed: raw, grpo, grpo_no_std"):
        group_advantages(REWARDS, GROUP, "ppo")


def test_zero_variance_groups_counts_flat_groups():
    assert zero_variance_groups(REWARDS, GROUP) == 1
    assert zero_variance_groups(torch.tensor([1.0, 1.0 + 1e-9, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])) == 1


def _ratio_case(ratio: float, adv: float, clip_low=0.2, clip_high=0.2):
    old = torch.zeros(1, 1)
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    loss, clipped = clipped_policy_loss(logp, old, torch.tensor([adv]), clip_low, clip_high)
    loss.sum().backward()
    return loss.item(), bool(clipped.item()), logp.grad.item()


def test_clipped_loss_positive_advantage_above_upper_clip():
    # ratio 1.5 > 1 + 0.2: objective min(1.5, 1.2) * 1 -> loss -1.2, no gradient
    loss, clipped, grad = _ratio_case(1.5, 1.0)
    assert loss == pytest.approx(-1.2) and clipped and grad == 0.0


def test_clipped_loss_positive_advantage_below_lower_clip_is_not_clipped():
    # ratio 0.5: min(0.5, 0.8) = 0.5 -> loss -0.5, gradient -A * ratio = -0.5
    loss, clipped, grad = _ratio_case(0.5, 1.0)
    assert loss == pytest.approx(-0.5) and not clipped and grad == pytest.approx(-0.5)


def test_clipped_loss_negative_advantage_below_lower_clip():
    # ratio 0.5 < 1 - 0.2 with A = -1: min(-0.5, -0.8) = -0.8 -> loss 0.8, no gradient
    loss, clipped, grad = _ratio_case(0.5, -1.0)
    assert loss == pytest.approx(0.8) and clipped and grad == 0.0


def test_clipped_loss_negative_advantage_above_upper_is_not_clipped():
    loss, clipped, grad = _ratio_case(1.5, -1.0)
    assert loss == pytest.approx(1.5) and not clipped and grad == pytest.approx(1.5)


def test_clipped_loss_asymmetric_bounds():
    # clip_high 0.28 (DAPO): ratio 1.25 is inside, 1.3 is clipped to 1.28
    assert _ratio_case(1.25, 2.0, 0.2, 0.28)[0] == pytest.approx(-2.5)
    loss, clipped, _ = _ratio_case(1.3, 2.0, 0.2, 0.28)
    assert loss == pytest.approx(-2.56) and clipped


def test_on_policy_ratio_gives_reinforce_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, clipped = clipped_policy_loss(logp, logp.detach(), torch.tensor([3.0]), 0.2, 0.2)
    loss.sum().backward()
    assert loss.tolist() == [[-3.0, -3.0]] and not clipped.any()
    assert logp.grad.tolist() == [[-3.0, -3.0]]


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_aggregation():
    # (1 + 2 + 3 + 4 + 5) / 5 valid tokens; the masked 99 never counts
    assert aggregate(PER_TOKEN, MASK, "token", 5, 2).item() == pytest.approx(3.0)
    # as one micro-batch of a step with 10 tokens: 15 / 10
    assert aggregate(PER_TOKEN, MASK, "token", 10, 4).item() == pytest.approx(1.5)


def test_sequence_aggregation():
    # sequence means 2 and 4.5, mean over 2 sequences = 3.25; over a 4-sequence step = 1.625
    assert aggregate(PER_TOKEN, MASK, "sequence", 5, 2).item() == pytest.approx(3.25)
    assert aggregate(PER_TOKEN, MASK, "sequence", 5, 4).item() == pytest.approx(1.625)


def test_aggregation_split_sums_to_whole():
    whole = aggregate(PER_TOKEN, MASK, "sequence", 5, 2)
    parts = aggregate(PER_TOKEN[:1], MASK[:1], "sequence", 5, 2) + aggregate(
        PER_TOKEN[1:], MASK[1:], "sequence", 5, 2)
    torch.testing.assert_close(whole, parts)


def test_unknown_aggregation():
    with pytest.raises(ValueError, match="allowed: token, sequence"):
        aggregate(PER_TOKEN, MASK, "mean", 5, 2)


LOGP = torch.tensor([math.log(0.5)])
REF = torch.tensor([math.log(0.25)])


def test_kl_estimators_hand_computed():
    # r = pi_ref / pi = 0.5; k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r
    assert kl_estimate(LOGP, REF, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(LOGP, REF, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(LOGP, REF, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))


def test_kl_is_zero_when_equal_and_k3_nonnegative():
    x = torch.tensor([-0.3, -2.0, -5.0])
    for est in ("k1", "k2", "k3"):
        assert kl_estimate(x, x, est).abs().max().item() == 0.0
    assert (kl_estimate(x, x.flip(0), "k3") >= 0).all()
    with pytest.raises(ValueError, match="allowed: k1, k2, k3"):
        kl_estimate(x, x, "k4")


def test_kl_penalised_rewards():
    kl = torch.tensor([[0.1, 0.2, 5.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = kl_penalised_rewards(torch.tensor([1.0, 0.0]), kl, mask, beta=0.5)
    torch.testing.assert_close(out, torch.tensor([1.0 - 0.5 * 0.3, -0.5 * 0.3]))


@pytest.mark.parametrize(("step", "expected"), [(0, 0.5), (1, 1.0), (2, 1.0), (9, 1.0)])
def test_lr_constant_with_warmup(step, expected):
    assert lr_multiplier(step, 10, "constant", 0.2, 0.0) == pytest.approx(expected)


@pytest.mark.parametrize(("step", "expected"), [(0, 1.0), (5, 0.1 + 0.9 * 0.5), (10, 0.1), (12, 0.1)])
def test_lr_cosine_to_min_ratio(step, expected):
    # no warmup, 11 steps: progress = step / 10
    assert lr_multiplier(step, 11, "cosine", 0.0, 0.1) == pytest.approx(expected)
