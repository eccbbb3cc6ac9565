"""From a step's batch to the advantages the policy trains on.

Two kinds of estimator (`algo.advantage`, the `ADVANTAGES` registry):
- group estimators (grpo, rloo, ...): one advantage per completion from the rewards of its
  group or batch (`reasonrl.algo.advantages`); KL in the reward is summed per sequence;
- critic estimators (gae, PPO): token advantages from the critic's values and the token
  rewards (the score at the last token, -beta * KL at every token), by GAE
  (`reasonrl.algo.gae`), whitened over the batch's tokens when `algo.whiten_advantages`;
  the critic's regression targets (the returns) come back as a `CriticBatch`.
"""

from __future__ import annotations

import torch

from reasonrl.algo import (
    explained_variance,
    gae,
    group_advantages,
    kl_penalised_rewards,
    masked_whiten,
    token_rewards,
)
from reasonrl.batch import CriticBatch, StepBatch
from reasonrl.config import Config
from reasonrl.registry import ADVANTAGES


def padded(rows: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [N, width], mask [N, width]) from per-row tensors of lengths <= width."""
    out, mask = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row.float()
        mask[i, : len(row)] = 1.0
    return out, mask


def estimate_advantages(batch: StepBatch, cfg: Config, policy, critic,
                        trainable: torch.Tensor) -> tuple[torch.Tensor, CriticBatch | None, dict[str, float]]:
    """(advantages [N] or [N, T], the critic's batch (critic estimators) or None, metrics).
    With KL in the reward (`algo.beta` > 0, `algo.kl_in=reward`) the group estimators see the
    KL-penalised sequence reward and GAE the per-token KL in its token rewards (the mean summed
    KL is `train/kl_in_reward`); `batch` is not changed."""
    algo, rollouts = cfg.algo, batch.rollouts
    kl_rows = None
    metrics: dict[str, float] = {}
    if algo.beta > 0 and algo.kl_in == "reward":
        kl_rows = policy.token_kl(rollouts.prompt_ids, rollouts.completion_ids)
        # the model's tokens only: an episode's environment tokens are context, not actions
        kl_rows = [k * torch.tensor(m, dtype=k.dtype)
                   for k, m in zip(kl_rows, rollouts.token_mask, strict=True)]
        metrics["train/kl_in_reward"] = torch.stack([k.sum() for k in kl_rows]).mean().item()
    if not ADVANTAGES[algo.advantage].info.get("critic"):
        rewards = batch.rewards
        if kl_rows is not None:
            kl, mask = padded(kl_rows, max(len(k) for k in kl_rows))
            rewards = kl_penalised_rewards(rewards, kl, mask, algo.beta)
        return group_advantages(rewards, rollouts.group, algo.advantage, algo.std_eps), None, metrics
    values = critic.values(rollouts.prompt_ids, rollouts.completion_ids)
    # GAE runs over each row's model tokens in order (an episode's environment tokens are not
    # actions: the state after a turn's last token is the next turn's first), then goes back to
    # the completion positions, 0 on environment tokens; single-turn rows are all model tokens
    picks = [torch.tensor(m, dtype=torch.bool).nonzero().squeeze(1) for m in rollouts.token_mask]
    width = max(max(len(p) for p in picks), 1)
    values_t, mask = padded([v[p] for v, p in zip(values, picks, strict=True)], width)
    kl_t = None if kl_rows is None else padded([k[p] for k, p in zip(kl_rows, picks, strict=True)], width)[0]
    rewards_t = token_rewards(batch.rewards, mask, kl_t, algo.beta)  # the task's score at the last token
    advantages, returns = gae(rewards_t, values_t, mask, algo.gamma, algo.lam)
    valid = mask * trainable[:, None].float()
    metrics.update(critic_metrics(values_t, returns, advantages, valid))
    if algo.whiten_advantages:
        advantages = masked_whiten(advantages, valid)
    full = torch.zeros(len(values), max(len(c) for c in rollouts.completion_ids))
    returns_full = []
    for i, (v, p) in enumerate(zip(values, picks, strict=True)):
        full[i, p] = advantages[i, : len(p)]
        row = torch.zeros(len(v))
        row[p] = returns[i, : len(p)]
        returns_full.append(row)
    critic_batch = CriticBatch(rollouts.prompt_ids, rollouts.completion_ids, returns_full, values, trainable,
                               rollouts.token_mask)
    return full, critic_batch, metrics


def critic_metrics(values: torch.Tensor, returns: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """critic/ statistics of the values, returns and (unwhitened) advantages over valid tokens."""
    count = mask.sum().clamp(min=1)

    def mean(x: torch.Tensor) -> float:
        return ((x * mask).sum() / count).item()

    return {"critic/value_mean": mean(values), "critic/returns_mean": mean(returns),
            "critic/advantages_mean": mean(advantages),
            "critic/advantages_abs_mean": mean(advantages.abs()),
            "critic/explained_variance": explained_variance(values, returns, mask)}
