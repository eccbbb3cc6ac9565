"""Supervised fine-tuning's objective: the negative log-likelihood of the trained tokens
(`reasonrl sft`), and the perplexity it is reported as.

Shapes as in `reasonrl.algo.objective`: `logp` [M, T] the log-probs of one micro-batch's
completion tokens, `mask` [M, T] 1 on the tokens the loss is on (a completion's, or an
assistant turn's; 0 on padding, on prompts and on the user and tool turns of a conversation).
"""

from __future__ import annotations

import math

import torch

from reasonrl.algo.objective import Metric, Totals


def sft_objective(logp: torch.Tensor, mask: torch.Tensor,
                  totals: Totals) -> tuple[torch.Tensor, dict[str, Metric]]:
    """(this micro-batch's share of the step's loss, its metrics): the token-mean negative
    log-likelihood over every trained token of the optimizer step,

        L = -(1 / N) sum_{i, t: mask_it = 1} log p(y_it | x_i, y_i,<t),   N = totals.tokens

    so every trained token of the step weighs the same, and a sequence weighs as many tokens as
    it has trained (a 40-token completion 4x a 10-token one). This is the maximum-likelihood
    objective of SFT (TRL's SFTTrainer docs, "Computing the loss": token-level cross-entropy)
    with TRL's default normalisation: `loss_type="nll"`, transformers' causal-LM loss divided by
    `num_items_in_batch`, the label tokens of the whole (gradient-accumulated) batch, not each
    micro-batch's; verl's `fsdp_sft_trainer` likewise divides the summed masked losses by the
    batch's loss-mask tokens. N is the step's, not the micro-batch's, so the shares add up to
    the step's loss and the gradient is the same whatever the micro-batch split
    (`reasonrl.algo.objective`'s rule)."""
    share = -(logp * mask).sum() / max(totals.tokens, 1.0)
    return share, {"loss": Metric(share.item(), "sum")}


def perplexity(mean_nll: float) -> float:
    """exp(token-mean negative log-likelihood, in nats): the perplexity of a language model over
    the tokens it was averaged on (Jelinek et al. 1977; the geometric mean of 1 / p over those
    tokens). Infinite past float's range rather than an OverflowError."""
    try:
        return math.exp(mean_nll)
    except OverflowError:
        return math.inf
