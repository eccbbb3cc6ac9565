"""The clipped policy-gradient loss, its importance ratio, and aggregation over tokens.

Shapes: per-token tensors are [N, T] (N completions, T completion positions) with a
`mask` [N, T] of valid tokens; advantages are [N] (one per completion) or [N, T] (per token,
from a critic's GAE).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from reasonrl.registry import LOSS_AGGREGATIONS, RATIO_LEVELS


class PolicyLoss(NamedTuple):
    loss: torch.Tensor  # [N, T] per-token loss (lower is better)
    ratio: torch.Tensor  # [N, T] the importance ratio used (detached)
    clipped: torch.Tensor  # [N, T] bool: the clip (either one) removed this token's gradient
    dual_clipped: torch.Tensor  # [N, T] bool: the dual clip (negative advantages) did


def log_importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None,
                         level: str) -> torch.Tensor:
    """log of the importance ratio pi_theta / pi_old per token [N, T], at `level` (a
    `RATIO_LEVELS` entry)."""
    return RATIO_LEVELS.get(level)(logp, old_logp, mask)


@RATIO_LEVELS.register("token")
def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log r_t = logp_t - old_logp_t (PPO, Schulman et al. 2017, r_t(theta) of eq. 6; GRPO)."""
    return logp - old_logp


@RATIO_LEVELS.register("sequence")
def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """GSPO's length-normalised sequence ratio (Zheng et al. 2025, "Group Sequence Policy
    Optimization", arXiv:2507.18071, definition of s_i(theta)):
    s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t(logp_it - old_logp_it)), the
    geometric mean of the token ratios. It is written in the GSPO-token form
    log s_it = sg[log s_i] + logp_it - sg[logp_it]: the value is s_i at every token and
    d s_it / d logp_it = s_i, so with `sequence` aggregation (mean over the |y_i| tokens) the
    gradient is exactly d s_i, as in the paper."""
    if mask is None:
        raise ValueError("ratio_level=sequence needs the token mask")
    mask = mask.to(logp.dtype)
    seq = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return logp - logp.detach() + seq.detach().unsqueeze(-1)


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        clip_low: float, clip_high: float, clip_ratio_c: float = 0.0,
                        mask: torch.Tensor | None = None, ratio_level: str = "token") -> PolicyLoss:
    """Per-token PPO clipped surrogate, negated so that lower is better.

    loss_t = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)
    with ratio_t from `log_importance_ratio`: PPO (Schulman et al. 2017, eq. 7) as used
    per token by GRPO (Shao et al. 2024, eq. 3); separate lower and upper bounds are
    DAPO's "clip-higher" (Yu et al. 2025, sec. 3.1).

    Dual clip (`clip_ratio_c` > 1; 0 = off): for A < 0 the loss is also capped at
    -A * clip_ratio_c, so a token whose ratio exploded cannot dominate the batch:
    loss_t = min(loss_t, -A * c) where A < 0 (Ye et al. 2020, "Mastering Complex Control
    in MOBA Games with Deep RL", AAAI, dual-clip PPO; verl's `clip_ratio_c`, default 3).
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages  # [N] or per token [N, T]
    ratio = torch.exp(log_importance_ratio(logp, old_logp, mask, ratio_level))
    unclipped = -adv * ratio
    clipped_loss = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    dual = torch.zeros_like(clipped)
    if clip_ratio_c > 0:
        cap = -adv * clip_ratio_c
        dual = (adv < 0) & (cap < loss)
        loss = torch.where(dual, cap.expand_as(loss), loss)
    return PolicyLoss(loss, ratio.detach(), (clipped | dual).detach(), dual.detach())


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, num_tokens: float,
              num_sequences: float, max_response_length: float = 0.0) -> torch.Tensor:
    """Reduce a per-token quantity of one micro-batch to its share of the step's scalar, by
    `mode` (a `LOSS_AGGREGATIONS` entry).

    `num_tokens`, `num_sequences` and `max_response_length` are fixed for the whole
    optimizer step, not the micro-batch: summing the returned values over micro-batches
    then gives exactly the full-batch value, so the gradient does not depend on the
    micro-batch size.
    """
    return LOSS_AGGREGATIONS.get(mode)(per_token * mask, mask.to(per_token.dtype), num_tokens,
                                       num_sequences, max_response_length)


@LOSS_AGGREGATIONS.register("token")
def token_mean(masked: torch.Tensor, mask: torch.Tensor, num_tokens: float, num_sequences: float,
               max_response_length: float) -> torch.Tensor:
    """Sum over all valid tokens / number of valid tokens in the whole step (DAPO's
    token-level loss, Yu et al. 2025 sec. 3.3; TRL `loss_type="dapo"`)."""
    return masked.sum() / max(num_tokens, 1.0)


@LOSS_AGGREGATIONS.register("sequence")
def sequence_mean(masked: torch.Tensor, mask: torch.Tensor, num_tokens: float, num_sequences: float,
                  max_response_length: float) -> torch.Tensor:
    """Each sequence's mean over its tokens, then the mean over the step's sequences (the
    original GRPO objective, Shao et al. 2024 eq. 3)."""
    per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.sum() / max(num_sequences, 1.0)


@LOSS_AGGREGATIONS.register("seq_mean_token_sum")
def seq_mean_token_sum(masked: torch.Tensor, mask: torch.Tensor, num_tokens: float, num_sequences: float,
                       max_response_length: float) -> torch.Tensor:
    """Each sequence's sum over its tokens, then the mean over the step's sequences (verl
    `seq-mean-token-sum`): long completions weigh more."""
    return masked.sum() / max(num_sequences, 1.0)


@LOSS_AGGREGATIONS.register("seq_mean_token_sum_norm")
def seq_mean_token_sum_norm(masked: torch.Tensor, mask: torch.Tensor, num_tokens: float,
                            num_sequences: float, max_response_length: float) -> torch.Tensor:
    """The sum over all valid tokens / (sequences in the step x `max_response_length`), a
    constant normaliser independent of the lengths: Dr. GRPO (Liu et al. 2025,
    "Understanding R1-Zero-Like Training", arXiv:2503.20783, removing the 1/|o_i| length
    bias; TRL `loss_type="dr_grpo"`). `max_response_length` is the generation budget
    (rollout.max_new_tokens), never the micro-batch's padded width."""
    if max_response_length <= 0:
        raise ValueError("loss aggregation seq_mean_token_sum_norm needs max_response_length > 0")
    return masked.sum() / (max(num_sequences, 1.0) * max_response_length)
