"""Advantages: one number per completion saying how much better it was than expected.

Pure functions on tensors: `rewards` is [N] and `group` is [N] (the prompt index of
each completion). No models, no config objects.
"""

from __future__ import annotations

import torch

ADVANTAGE_MODES = ("raw", "grpo", "grpo_no_std")


def _group_stats(rewards: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-group mean and unbiased std (as torch.std and TRL; 0 for a group of one)."""
    num_groups = int(group.max().item()) + 1
    count = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, torch.ones_like(rewards))
    mean = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, rewards) / count
    sq = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, (rewards - mean[group]) ** 2)
    return mean, (sq / (count - 1).clamp(min=1)).sqrt()


def group_mean_std(rewards: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's group mean and std, broadcast back to rows."""
    mean, std = _group_stats(rewards, group)
    return mean[group], std[group]


def group_advantages(rewards: torch.Tensor, group: torch.Tensor, mode: str,
                     std_eps: float = 1e-4) -> torch.Tensor:
    """Advantage of each completion relative to the other samples of its prompt.

    - `raw`: A_i = r_i (REINFORCE without a baseline; Williams 1992).
    - `grpo`: A_i = (r_i - mean(r_group)) / (std(r_group) + eps), the group-normalised
      advantage of GRPO (Shao et al. 2024, DeepSeekMath, eq. 3 / sec. 4.1.2).
    - `grpo_no_std`: A_i = r_i - mean(r_group), GRPO without the std division, which
      Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") shows removes a
      question-difficulty bias.
    A group whose rewards are all equal gets advantage 0 in `grpo`/`grpo_no_std`.
    """
    rewards = rewards.float()
    if mode == "raw":
        return rewards.clone()
    mean, std = group_mean_std(rewards, group)
    if mode == "grpo":
        # A flat group is exactly 0 (also with std_eps=0, where 0/0 would be NaN).
        return torch.where(std > 0, (rewards - mean) / (std + std_eps), torch.zeros_like(rewards))
    if mode == "grpo_no_std":
        return rewards - mean
    raise ValueError(f"unknown advantage mode {mode!r}; allowed: {', '.join(ADVANTAGE_MODES)}")


def zero_variance_groups(rewards: torch.Tensor, group: torch.Tensor, tol: float = 1e-6) -> int:
    """How many groups have (numerically) identical rewards: they carry no GRPO signal."""
    _, std = _group_stats(rewards.float(), group)
    return int((std <= tol).sum().item())
