"""KL divergence estimators between the policy and a reference model, per token.

All take `logp` (policy) and `ref_logp` (reference) log-probabilities of the sampled
tokens, shape [..., T], and return a per-token estimate of KL(pi || pi_ref) with the
same shape. Names and formulas follow John Schulman, "Approximating KL Divergence"
(2020), with r = pi_ref / pi:
- k1 = -log r = logp - ref_logp (unbiased, high variance, can be negative);
- k2 = (log r)^2 / 2 (biased, low variance, always >= 0);
- k3 = (r - 1) - log r (unbiased, low variance, always >= 0); the estimator GRPO puts
  in its loss (Shao et al. 2024, DeepSeekMath eq. 4);
- k3+ = k3 in value, k2 in gradient (verl's straight-through `kl_penalty` "k3+").

k3 takes `exp` of the log-ratio, so its log-ratio is clamped to a token's bounds, [-20, 20]
(`reasonrl.algo.bounds`, verl's `kl_penalty_forward` "low_var_kl"): finite in value (at most
exp(20) - 21 = 4.85e8) and gradient at any log-ratio, bitwise Schulman's inside the bounds.
Its entry says so (`bounded=True`) and `kl_clamped` names the clamped tokens. k1 and k2 are
polynomials of the log-ratio, finite wherever it is, and are not clamped (as in verl).
"""

from __future__ import annotations

import torch

from reasonrl.algo.bounds import TOKEN_BOUNDS, clamp_log_ratio
from reasonrl.registry import KL_ESTIMATORS


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k1 = logp - ref_logp (Schulman 2020)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (logp - ref_logp)^2 (Schulman 2020)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3", bounded=True)
def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1 (Schulman 2020; DeepSeekMath eq. 4),
    the log-ratio clamped to [-20, 20] (verl `kl_penalty_forward`, "low_var_kl")."""
    log_ratio, _ = clamp_log_ratio(ref_logp - logp, TOKEN_BOUNDS)
    return torch.exp(log_ratio) - log_ratio - 1


@KL_ESTIMATORS.register("k3+", bounded=True)
def kl_k3_plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3's value with k2's gradient, by a straight-through sum: k2 - sg[k2] + sg[k3] (verl
    `kl_penalty`, "k3+" / "low_var_kl+"). k3 is an unbiased, low-variance estimate of the KL's
    value, but in the loss its gradient is that of the forward KL(pi_ref || pi_theta); k2's
    gradient, (logp - ref_logp) grad logp, is the reverse KL's in expectation on-policy
    (Schulman 2020). So the logged value is k3's and the update follows the KL it names."""
    k2 = kl_k2(logp, ref_logp)
    return k2 - k2.detach() + kl_k3(logp, ref_logp).detach()


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate with `estimator` (a `KL_ESTIMATORS` entry)."""
    return KL_ESTIMATORS.get(estimator)(logp, ref_logp)


def kl_clamped(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str) -> torch.Tensor:
    """[..., T] bool: the tokens whose log-ratio `estimator` clamped (none for an unbounded one)."""
    if not KL_ESTIMATORS[estimator].bounded:
        return torch.zeros_like(logp, dtype=torch.bool)
    return clamp_log_ratio(ref_logp.detach() - logp.detach(), TOKEN_BOUNDS)[1]


def kl_penalised_rewards(rewards: torch.Tensor, kl_per_token: torch.Tensor, mask: torch.Tensor,
                         beta: float) -> torch.Tensor:
    """r_i - beta * sum_t KL_t: the KL-in-reward form (PPO-RLHF, Ouyang et al. 2022;
    used by Transparent GRPO with k1), summed over the completion's valid tokens.
    `kl_per_token` and `mask` are [N, T]; a 1-D input would be summed over completions."""
    if kl_per_token.dim() != 2 or mask.shape != kl_per_token.shape:
        raise ValueError(f"kl_per_token and mask must both be [N, T], got {tuple(kl_per_token.shape)} "
                         f"and {tuple(mask.shape)}")
    return rewards - beta * (kl_per_token * mask).sum(-1)
