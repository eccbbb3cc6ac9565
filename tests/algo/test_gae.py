"""PPO with a critic: hand-computed values for every formula of reasonrl.algo.gae."""

import pytest
import torch

from reasonrl.algo.gae import explained_variance, gae, masked_whiten, token_rewards

APPROX = dict(rel=1e-6, abs=1e-6)


def test_gae_four_tokens_with_gamma_and_lambda_below_one():
    """gamma 0.9, lam 0.8, reward 1 at the last token, V = [0.5, 0.4, 0.6, 0.7]:
    delta_3 = 1 - 0.7 = 0.3                    A_3 = 0.3
    delta_2 = 0.9 * 0.7 - 0.6 = 0.03           A_2 = 0.03 + 0.72 * 0.3 = 0.246
    delta_1 = 0.9 * 0.6 - 0.4 = 0.14           A_1 = 0.14 + 0.72 * 0.246 = 0.31712
    delta_0 = 0.9 * 0.4 - 0.5 = -0.14          A_0 = -0.14 + 0.72 * 0.31712 = 0.0883264
    returns = A + V."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.4, 0.6, 0.7]])
    adv, ret = gae(rewards, values, torch.ones(1, 4), gamma=0.9, lam=0.8)
    assert adv[0].tolist() == pytest.approx([0.0883264, 0.31712, 0.246, 0.3], **APPROX)
    assert ret[0].tolist() == pytest.approx([0.5883264, 0.71712, 0.846, 1.0], **APPROX)


def test_gae_masked_padded_batch_ignores_what_is_past_a_row():
    """Row 1 has 2 tokens (score 2, V = [1, 0.5]) and garbage in its padding:
    A_1 = 2 - 0.5 = 1.5, A_0 = 0.9 * 0.5 - 1 + 0.72 * 1.5 = 0.53; padding gets 0."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 2.0, 7.0, 7.0]])
    values = torch.tensor([[0.5, 0.4, 0.6, 0.7], [1.0, 0.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert adv[1].tolist() == pytest.approx([0.53, 1.5, 0.0, 0.0], **APPROX)
    assert ret[1].tolist() == pytest.approx([1.53, 2.0, 0.0, 0.0], **APPROX)
    assert adv[0].tolist() == pytest.approx([0.0883264, 0.31712, 0.246, 0.3], **APPROX)  # row 0 alone


def test_a_truncated_completion_is_terminal():
    """Cut at the token limit with score 0: no bootstrap from V after the last token, so with
    gamma = lam = 1 each A_t = (sum of later rewards) - V_t = -V_t and the returns are 0."""
    adv, ret = gae(torch.zeros(1, 3), torch.tensor([[0.2, 0.3, 0.4]]), torch.ones(1, 3))
    assert adv[0].tolist() == pytest.approx([-0.2, -0.3, -0.4], **APPROX)
    assert ret[0].tolist() == pytest.approx([0.0, 0.0, 0.0], **APPROX)


def test_gamma_and_lambda_one_give_the_outcome_minus_the_value():
    rewards = token_rewards(torch.tensor([1.0]), torch.ones(1, 3))
    adv, ret = gae(rewards, torch.tensor([[0.25, 0.5, 0.75]]), torch.ones(1, 3))
    assert adv[0].tolist() == pytest.approx([0.75, 0.5, 0.25], **APPROX)
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 1.0], **APPROX)


def test_token_rewards_put_the_score_last_and_the_kl_everywhere():
    """beta 0.1: row 0 = -0.1 KL, + 1 at token 3; row 1 (2 tokens) = -0.1 KL, + 2 at token 1."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.5, 9.0, 9.0]])
    r = token_rewards(torch.tensor([1.0, 2.0]), mask, kl, beta=0.1)
    assert r[0].tolist() == pytest.approx([-0.01, -0.02, -0.03, 0.96], **APPROX)
    assert r[1].tolist() == pytest.approx([-0.05, 1.95, 0.0, 0.0], **APPROX)
    assert token_rewards(torch.tensor([3.0]), torch.zeros(1, 2)).tolist() == [[0.0, 0.0]]  # no token


def test_masked_whiten_over_the_valid_tokens():
    """Valid values 1..6: mean 3.5, unbiased var 17.5 / 5 = 3.5."""
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    w = masked_whiten(x, mask)
    std = 3.5 ** 0.5
    expected = [(v - 3.5) / std for v in (1, 2, 3, 4, 5, 6)]
    assert w[0].tolist() + w[1, :2].tolist() == pytest.approx(expected, rel=1e-5)
    assert w[1, 2:].tolist() == [0.0, 0.0]


def test_explained_variance():
    """R = [1, 2, 3, 4] (var 1.25), R - V = [0, 0, 0, 1] (var 0.1875): 1 - 0.15 = 0.85."""
    mask = torch.ones(1, 4)
    ev = explained_variance(torch.tensor([[1.0, 2.0, 3.0, 3.0]]), torch.tensor([[1.0, 2.0, 3.0, 4.0]]), mask)
    assert ev == pytest.approx(0.85, **APPROX)
    assert explained_variance(torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)) == 0.0  # flat returns
