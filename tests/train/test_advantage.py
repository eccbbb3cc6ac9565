"""The advantage stage (reasonrl/train/advantage_stage.py) and the estimators' one signature: hand-computed
advantages, returns and KL in the reward, on multi-turn rows whose environment tokens are not
actions. The estimators' own formulas: test_algo.py (group), test_gae.py (GAE)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reasonrl.algo import AdvantageInputs, estimate, group_advantages
from reasonrl.batch import Example, Rollouts, Scores, StepBatch
from reasonrl.config import AlgoConfig
from reasonrl.registry import ADVANTAGES, needs_critic
from reasonrl.train.advantage_stage import estimate_advantages

EXAMPLES = [Example("What is 2 + 3?", "5"), Example("What is 4 + 4?", "8")]
TRAINABLE = torch.tensor([True, True])


def episode_batch() -> StepBatch:
    """Two rows scored 1 and 0; row 0 is a two-turn episode whose tokens 1 and 2 are the
    environment's (mask 0)."""
    r = Rollouts(prompt_ids=[[1], [1]], completion_ids=[[5, 6, 7, 8], [9, 10]], texts=["a", "b"],
                 group=torch.tensor([0, 1]), truncated=torch.tensor([False, False]), examples=EXAMPLES,
                 token_mask=[[1, 0, 0, 1], [1, 1]])
    scores = Scores(torch.tensor([1.0, 0.0]), {"correct": torch.tensor([1.0, 0.0])})
    return StepBatch(r, scores, scores.total.clone(), TRAINABLE)


# the critic's values and the reference stage's KL per completion token; 9.0 on environment tokens
VALUES = [torch.tensor([0.1, 9.0, 9.0, 0.3]), torch.tensor([0.5, 0.25])]
KL = [torch.tensor([0.2, 9.0, 9.0, 0.4]), torch.tensor([0.1, 0.3])]


def algo(**changes) -> AlgoConfig:
    return dataclasses.replace(AlgoConfig(), **changes)


def test_every_estimator_takes_the_one_record_and_returns_advantages_and_returns():
    mask = torch.ones(4, 3)
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0, 0.5, 0.5]), torch.tensor([0, 0, 1, 1]),
                             token_rewards=torch.zeros(4, 3), values=torch.full((4, 3), 0.25), mask=mask)
    for entry in ADVANTAGES:
        advantages, returns = entry.fn(inputs)
        if needs_critic(entry.name):
            assert advantages.shape == returns.shape == (4, 3), entry.name
        else:
            assert advantages.shape == (4,) and returns is None, entry.name
    assert [e.name for e in ADVANTAGES if needs_critic(e.name)] == ["gae"]


def test_a_critic_estimator_without_values_is_refused():
    with pytest.raises(ValueError, match="needs a critic's values"):
        estimate("gae", AdvantageInputs(torch.tensor([1.0]), torch.tensor([0])))
    with pytest.raises(ValueError, match="not groups"):
        group_advantages(torch.tensor([1.0]), torch.tensor([0]), "gae")


def test_gae_runs_over_the_model_tokens_of_an_episode():
    """PPO on multi-turn rows: the critic's values at environment positions are skipped (the
    state after a turn's last token is the next turn's first), advantages and returns go back
    to the completion positions with 0 on environment tokens. gamma = lam = 1, no whitening:
    A_t = R - V_t on model tokens (hand-computed)."""
    batch = episode_batch()
    advantages, critic_batch, _ = estimate_advantages(batch, None, VALUES, TRAINABLE,
                                                      algo(advantage="gae", whiten_advantages=False))
    torch.testing.assert_close(advantages, torch.tensor([[0.9, 0.0, 0.0, 0.7], [-0.5, -0.25, 0.0, 0.0]]))
    torch.testing.assert_close(critic_batch.returns[0], torch.tensor([1.0, 0.0, 0.0, 1.0]))
    torch.testing.assert_close(critic_batch.returns[1], torch.tensor([0.0, 0.0]))
    assert critic_batch.token_mask == batch.rollouts.token_mask and critic_batch.old_values is VALUES


def test_gae_with_kl_in_the_reward_hand_computed():
    """beta 0.5, gamma = lam = 1, KL on the model tokens only. Row 0 (model tokens 0 and 3):
    r = [-0.1, -0.2 + 1], V = [0.1, 0.3]: A_3 = 0.8 - 0.3 = 0.5, A_0 = -0.1 + 0.3 - 0.1 + 0.5
    = 0.6, R = A + V = [0.7, 0.8]. Row 1: r = [-0.05, -0.15], V = [0.5, 0.25]: A_1 = -0.4,
    A_0 = -0.05 + 0.25 - 0.5 - 0.4 = -0.7, R = [-0.2, -0.15]. KL summed per row: 0.6 and 0.4."""
    cfg = algo(advantage="gae", whiten_advantages=False, beta=0.5, kl_in="reward")
    advantages, critic_batch, metrics = estimate_advantages(episode_batch(), KL, VALUES, TRAINABLE, cfg)
    torch.testing.assert_close(advantages, torch.tensor([[0.6, 0.0, 0.0, 0.5], [-0.7, -0.4, 0.0, 0.0]]))
    torch.testing.assert_close(critic_batch.returns[0], torch.tensor([0.7, 0.0, 0.0, 0.8]))
    torch.testing.assert_close(critic_batch.returns[1], torch.tensor([-0.2, -0.15]))
    assert metrics["train/kl_in_reward"] == pytest.approx(0.5)


def test_a_group_estimator_sees_the_kl_penalised_reward():
    """raw, beta 0.5: r_i - beta * sum_t KL_t over model tokens = [1 - 0.3, 0 - 0.2]; the
    batch's own rewards are not changed."""
    batch = episode_batch()
    cfg = algo(advantage="raw", beta=0.5, kl_in="reward")
    advantages, critic_batch, metrics = estimate_advantages(batch, KL, None, TRAINABLE, cfg)
    torch.testing.assert_close(advantages, torch.tensor([0.7, -0.2]))
    assert critic_batch is None and metrics["train/kl_in_reward"] == pytest.approx(0.5)
    assert batch.rewards.tolist() == [1.0, 0.0]
    advantages, _, metrics = estimate_advantages(batch, None, None, TRAINABLE, algo(advantage="raw"))
    assert advantages.tolist() == [1.0, 0.0] and metrics == {}  # without KL: the rewards
