"""GDPO's reward-decoupled normalisation (`reasonrl.algo.gdpo_rewards`; Liu et al. 2026,
arXiv:2601.05242): each reward component normalised within its prompt's group, then the weighted
sum, then the paper's batch normalisation (the estimator `reinforce_pp`). Expected values are
computed by hand in the docstrings."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo import AdvantageInputs, estimate, flat_group_count, gdpo_rewards, group_advantages

GROUP = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
CORRECT = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])  # 0/1
QUALITY = torch.tensor([0.0, 100.0, 0.0, 100.0, 20.0, 20.0, 20.0, 20.0])  # 0-100
WEIGHTS = [1.0, 0.5]


def test_two_components_of_different_scales_by_hand():
    """Two prompts, four completions each; correct in {0, 1} (weight 1), quality in 0..100
    (weight 0.5); std unbiased (std_ddof=1), std_eps=0.

    Group 0, correct [1, 1, 0, 0]: mean 1/2, deviations +-1/2, std sqrt((4 * 1/4) / 3) = 1/sqrt(3),
    normalised +-sqrt(3)/2 = [+, +, -, -] sqrt(3)/2. Quality [0, 100, 0, 100]: the same magnitudes,
    [-, +, -, +] sqrt(3)/2. Weighted sum: sqrt(3)/2 * [1 - 1/2, 1 + 1/2, -1 - 1/2, -1 + 1/2]
    = sqrt(3)/4 * [1, 3, -3, -1].
    Group 1, correct [0, 0, 0, 1]: mean 1/4, deviations [-1/4, -1/4, -1/4, 3/4], std
    sqrt((3/16 + 9/16) / 3) = 1/2, normalised [-1/2, -1/2, -1/2, 3/2]. Quality is 20 on every row:
    constant, so it contributes 0. Sum: [-1/2, -1/2, -1/2, 3/2].

    Then the paper's batch normalisation (`reinforce_pp`): each group's sum is 0, so the batch
    mean is 0; the squares add to 3/16 * 20 + (3 * 1/4 + 9/4) = 15/4 + 3 = 27/4, the unbiased
    variance is 27/4 / 7 = 27/28, so each value is multiplied by sqrt(28/27):
    group 0 -> sqrt(3)/4 * sqrt(28/27) * [1, 3, -3, -1] = sqrt(7)/6 * [1, 3, -3, -1];
    group 1 -> sqrt(28/27) * [-1/2, -1/2, -1/2, 3/2].

    The plain weighted sum c + q/2 under GRPO would be [1, 51, 0, 50] in group 0: quality's
    scale drowns correctness, and the correct completion 0 gets a negative advantage (-0.85)
    while the wrong completion 3 gets a positive one (+0.85); GDPO gives them +0.44 and -0.44.
    """
    rewards = gdpo_rewards(torch.stack([CORRECT, QUALITY], dim=1), WEIGHTS, GROUP, std_eps=0.0)
    s = math.sqrt(3) / 4
    torch.testing.assert_close(rewards, torch.tensor([s, 3 * s, -3 * s, -s, -0.5, -0.5, -0.5, 1.5]))

    advantages, _ = estimate("reinforce_pp", AdvantageInputs(rewards, GROUP, std_eps=0.0))
    r7, k = math.sqrt(7) / 6, math.sqrt(28 / 27)
    torch.testing.assert_close(advantages, torch.tensor([r7, 3 * r7, -3 * r7, -r7,
                                                         -k / 2, -k / 2, -k / 2, 3 * k / 2]))

    grpo_of_sum = group_advantages(CORRECT + 0.5 * QUALITY, GROUP, "grpo", std_eps=0.0)
    assert grpo_of_sum[0] < -0.8 and grpo_of_sum[3] > 0.8  # the collapse GDPO avoids
    assert advantages[0] > 0.4 and advantages[3] < -0.4


def test_std_eps_and_std_ddof_are_the_group_estimators():
    """std_eps is added to each component's group std, as `grpo` does: group 0's correct is
    (1 - 1/2) / (1/sqrt(3) + 0.1) = 0.73817. std_ddof=0 (the population std, np.std) makes
    group 0's correct std 1/2, so its normalised values are +-1, and quality's too: row 0 is
    1 - 1/2 = 0.5, row 1 is 1 + 1/2 = 1.5."""
    both = torch.stack([CORRECT, QUALITY], dim=1)
    with_eps = gdpo_rewards(both[:, :1], [1.0], GROUP, std_eps=0.1)
    assert with_eps[0].item() == pytest.approx(0.73817, abs=1e-5)
    population = gdpo_rewards(both, WEIGHTS, GROUP, std_eps=0.0, std_ddof=0)
    assert population[:2].tolist() == pytest.approx([0.5, 1.5])


def test_a_constant_component_contributes_nothing():
    """A component that is constant in every group (0.1 on every row: its float32 group mean is
    an ulp off 0.1, which `flat_groups` does not trust) adds exactly 0, whatever its weight and
    std_eps (0 included, where 0/0 would be NaN); one constant in group 1 only adds nothing there."""
    base = gdpo_rewards(torch.stack([CORRECT, QUALITY], dim=1), WEIGHTS, GROUP, std_eps=0.0)
    constant = torch.full((8,), 0.1)
    with_constant = gdpo_rewards(torch.stack([CORRECT, QUALITY, constant], dim=1), [*WEIGHTS, 3.0], GROUP,
                                 std_eps=0.0)
    assert torch.equal(with_constant, base)
    alone = gdpo_rewards(QUALITY[:, None], [0.5], GROUP, std_eps=0.0)
    assert alone[4:].tolist() == [0.0] * 4 and alone[:4].abs().min() > 0.4
    assert flat_group_count(QUALITY, GROUP) == 1 and flat_group_count(constant, GROUP) == 2
    assert flat_group_count(CORRECT, GROUP) == 0


def test_a_components_scale_does_not_matter():
    """Normalisation within a group removes a component's scale and offset: quality in 0..1 or
    in 0..10^4 (+ 7) gives the same rewards (std_eps=0); only the weights set its share."""
    small = gdpo_rewards(torch.stack([CORRECT, QUALITY / 100], dim=1), WEIGHTS, GROUP, std_eps=0.0)
    large = gdpo_rewards(torch.stack([CORRECT, QUALITY * 100 + 7], dim=1), WEIGHTS, GROUP, std_eps=0.0)
    torch.testing.assert_close(small, large)


def test_one_column_per_weight():
    with pytest.raises(ValueError, match=r"components must be \[N, 2\]"):
        gdpo_rewards(torch.zeros(8, 3), WEIGHTS, GROUP)
