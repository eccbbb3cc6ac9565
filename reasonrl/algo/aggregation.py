"""Loss aggregation: how per-token losses become one scalar per optimizer step
(`algo.loss_agg`, the `LOSS_AGGREGATIONS` registry).

Shapes: per-token tensors are [N, T] (N completions, T completion positions) with a `mask`
[N, T] of valid tokens.
"""

from __future__ import annotations

import torch

from reasonrl.registry import LOSS_AGGREGATIONS


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, num_tokens: float,
              num_sequences: float, max_response_length: float = 0.0) -> torch.Tensor:
    """Reduce a per-token quantity of one micro-batch to its share of the step's scalar, by
    `mode` (a `LOSS_AGGREGATIONS` entry).

    `num_tokens`, `num_sequences` and `max_response_length` are fixed for the whole
    optimizer step, not the micro-batch: summing the returned values over micro-batches
    then gives exactly the full-batch value, so the gradient does not depend on the
    micro-batch size. `num_sequences` counts the step's rows with at least one valid token
    (`reasonrl.algo.objective.Totals.of`): an empty row (every token masked) adds 0 to the
    sum and nothing to the count.
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
    original GRPO objective, Shao et al. 2024 eq. 3; verl `seq-mean-token-mean`). A row without
    valid tokens has mean 0 (no 0/0) and is not one of the step's sequences: `num_sequences`
    leaves it out, as verl's `agg_loss` does when it counts (`seq_mask = (seq_mask > 0)`)
    and unlike TRL's `loss_type="grpo"` (a `.mean()` over every row)."""
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
