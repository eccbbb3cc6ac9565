"""PPO with a learned critic: token rewards, GAE advantages and returns, whitening and
explained variance (its value loss: `reasonrl.algo.value_loss`). Pure functions on [N, T]
tensors with a `mask` [N, T] of valid completion tokens (row i's tokens are positions
0..len_i - 1).

The completion is the episode: state s_t is the prompt plus tokens 0..t-1, action a_t is
token t, and the critic's value V_t = V(s_t) is read at the position that predicts token t
(the same hidden state as the token's log-prob). The task reward comes at the last token;
a per-token KL penalty (KL in the reward) at every token. After the last token the episode
ends (V = 0): a completion cut at `rollout.max_new_tokens` is scored like any other and
treated as terminal, as verl (`compute_gae_advantage_return`) and OpenRLHF do;
bootstrapping from V(s_T) would credit a reward the episode never receives.
"""

from __future__ import annotations

import torch

from reasonrl.algo.advantages import AdvantageInputs
from reasonrl.registry import ADVANTAGES


def token_rewards(scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None = None,
                  beta: float = 0.0) -> torch.Tensor:
    """r_t [N, T]: -beta * KL_t at every valid token, plus the sequence's score at its last
    valid token (the sparse outcome reward; PPO-RLHF, Ouyang et al. 2022, eq. 2; verl's
    `token_level_rewards`). `kl` [N, T] is the per-token KL estimate to the reference."""
    mask = mask.to(torch.float32)
    rewards = torch.zeros_like(mask)
    if kl is not None and beta:
        rewards = -beta * kl.to(torch.float32) * mask
    last = (mask.sum(-1).long() - 1).clamp(min=0)
    has_tokens = mask.sum(-1) > 0
    rows = torch.arange(mask.size(0))
    rewards[rows[has_tokens], last[has_tokens]] += scores.to(torch.float32)[has_tokens]
    return rewards


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [N, T] by generalised advantage estimation (Schulman et al. 2016,
    "High-Dimensional Continuous Control Using Generalized Advantage Estimation", eq. 16):

        delta_t = r_t + gamma * V_{t+1} - V_t          (V after the last valid token = 0)
        A_t     = delta_t + gamma * lam * A_{t+1}      (A after the last valid token = 0)
        R_t     = A_t + V_t                            (the critic's regression target)

    computed backwards over each row's valid tokens; padded positions get 0. gamma = lam = 1
    (the default of verl's and OpenRLHF's reasoning recipes) makes A_t the outcome minus V_t.
    """
    mask = mask.to(torch.float32)
    rewards, values = rewards.to(torch.float32) * mask, values.to(torch.float32) * mask
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.size(0))
    next_advantage = torch.zeros(rewards.size(0))
    for t in reversed(range(rewards.size(1))):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        # a padded position passes nothing back: the next valid token sees V = A = 0 beyond it
        advantages[:, t] = advantage * valid
        next_value = values[:, t] * valid
        next_advantage = advantage * valid
    return advantages, (advantages + values) * mask


@ADVANTAGES.register("gae", needs_groups=False, critic=True)
def gae_advantages(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) [N, T]: `gae` over the token rewards and the critic's values, the
    estimator of PPO with a critic (`algo.advantage=gae`)."""
    return gae(x.token_rewards, x.values, x.mask, x.gamma, x.lam)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over the valid tokens of the whole batch, 0 elsewhere:
    the advantage normalisation of PPO implementations (verl's `masked_whiten`, OpenRLHF's
    advantage normalisation; Engstrom et al. 2020 on its effect). var is the unbiased
    estimate over the valid tokens. Exactly 0 when every valid value is equal (their float32
    mean may be an ulp off, which rsqrt(var + eps) would magnify 1e4-fold), as a flat group's
    advantage (`reasonrl.algo.advantages.flat_groups`)."""
    valid = x[mask.bool()]
    if valid.numel() == 0 or bool((valid.max() == valid.min()).item()):
        return torch.zeros_like(x, dtype=torch.promote_types(x.dtype, torch.float32))
    mask = mask.to(torch.float32)
    count = mask.sum()
    mean = (x * mask).sum() / count.clamp(min=1)
    var = (((x - mean) * mask) ** 2).sum() / (count - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(R - V) / Var(R) over the valid tokens: 1 for a perfect critic, 0 for one that
    predicts the mean, negative for worse (the diagnostic of the PPO baselines)."""
    mask = mask.to(torch.float32)
    count = mask.sum().clamp(min=1)

    def var(x: torch.Tensor) -> torch.Tensor:
        mean = (x * mask).sum() / count
        return (((x - mean) * mask) ** 2).sum() / count

    var_returns = var(returns)
    if var_returns <= 0:
        return 0.0
    return (1.0 - var(returns - values) / var_returns).item()
