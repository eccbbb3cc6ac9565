"""Correcting for the rollout engine's own numerics: truncated importance sampling.

A fast rollout engine (vLLM) samples from pi_engine, which differs slightly from the
trainer's pi_old although both hold the same weights (other kernels, other precision,
batch-dependent reductions). The policy gradient then uses off-policy samples without
knowing it. Shapes: per-token tensors are [N, T] with a `mask` [N, T] of valid tokens.
"""

from __future__ import annotations

import torch


def truncated_importance_weights(old_logp: torch.Tensor, engine_logp: torch.Tensor,
                                 cap: float) -> torch.Tensor:
    """Per-token weight w_t = min(pi_old(y_t) / pi_engine(y_t), cap), detached [N, T].

    Truncated importance sampling (TIS) from Yao et al. 2025, "Your Efficient RL Framework
    Secretly Brings You Off-Policy RL Training" (Feng Yao, Liyuan Liu, et al., blog post,
    Aug. 2025): the samples come from the engine's distribution, so the per-token
    policy-gradient loss is multiplied by the importance weight pi_old / pi_engine,
    truncated at `cap` (their C; 2 in their experiments) to bound the variance. As in
    verl (`tis_imp_ratio_cap`) and TRL (`vllm_importance_sampling_cap`) the weight is a
    constant for the gradient (computed from log-probs without gradient) and multiplies
    the per-token loss before aggregation; only the upper side is truncated.
    """
    if cap <= 0:
        raise ValueError(f"truncated_importance_weights: cap must be > 0, got {cap}")
    return torch.exp(old_logp.detach().float() - engine_logp.detach().float()).clamp(max=cap)

