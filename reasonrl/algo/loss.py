"""The clipped policy-gradient loss and its aggregation over tokens.

Shapes: per-token tensors are [N, T] (N completions, T completion positions) with a
`mask` [N, T] of valid tokens; advantages are [N].
"""

from __future__ import annotations

import torch

LOSS_AGGREGATIONS = ("token", "sequence")


def clipped_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        clip_low: float, clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped surrogate, negated so that lower is better.

    loss_t = -min(ratio_t * A, clip(ratio_t, 1 - clip_low, 1 + clip_high) * A)
    with ratio_t = exp(logp_t - old_logp_t): PPO (Schulman et al. 2017, eq. 7) as used
    per token by GRPO (Shao et al. 2024, eq. 3); separate lower and upper bounds are
    DAPO's "clip-higher" (Yu et al. 2025, eq. 10). Returns (loss [N, T], clipped [N, T]),
    where `clipped` marks tokens whose gradient the clip removed.
    """
    adv = advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped = -adv * clipped_ratio
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).detach()
    return loss, was_clipped


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str,
              num_tokens: float, num_sequences: float) -> torch.Tensor:
    """Reduce a per-token quantity of one micro-batch to its share of the step's scalar.

    - `token`: sum over all valid tokens / number of valid tokens in the whole step
      (DAPO's token-level loss, Yu et al. 2025 eq. 12; TRL `loss_type="dapo"`);
    - `sequence`: each sequence's mean over its tokens, then the mean over the step's
      sequences (the original GRPO objective, Shao et al. 2024 eq. 3).
    `num_tokens` and `num_sequences` are totals over the whole optimizer step, not the
    micro-batch: summing the returned values over micro-batches then gives exactly the
    full-batch value, so the gradient does not depend on the micro-batch size.
    """
    mask = mask.to(per_token.dtype)
    if mode == "token":
        return (per_token * mask).sum() / max(num_tokens, 1.0)
    if mode == "sequence":
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / max(num_sequences, 1.0)
    raise ValueError(f"unknown loss aggregation {mode!r}; allowed: {', '.join(LOSS_AGGREGATIONS)}")
