"""Bounds on log-ratios: the one place where the objective clamps a log-ratio before `exp`, so that
every loss and KL estimate is finite, in value and gradient, at any log-ratio.

A log-ratio such as logp - old_logp is ordinarily within a few tenths of 0; a stale or broken
batch can make it +100 or -1e4, where float32 `exp` gives inf or 0 and the backward then
multiplies inf by 0 (NaN). Clamping the log-ratio first keeps `exp` finite; beyond the bound the
gradient through it is 0 (the token says nothing more than "very far"), within the bound the
clamp returns its input unchanged, bitwise, in value and in gradient. The bounds are verl's
(`verl/trainer/ppo/core_algos.py`):

- a token's log-ratio: [-20, 20] (`compute_policy_loss_vanilla`, `compute_policy_loss_sapo`,
  `compute_policy_loss_cispo`: `torch.clamp(negative_approx_kl, min=-20.0, max=20.0)`; the
  log-ratio of k3, `kl_penalty_forward`'s `low_var_kl`); exp(20) = 4.85e8 is finite in float32
  and in the product with any advantage a loss sees;
- GSPO's sequence log-ratio: at most 10 (`compute_policy_loss_gspo`: `torch.clamp(
  log_seq_importance_ratio, max=10.0)`, since the one ratio multiplies every token of the
  completion), at least -20 as a token's (below it exp is 2e-9, 0 to every loss).

verl also caps k3's value at 10; reasonrl does not: k3 = 10 is reached at a log-ratio of about
2.6 (a token 14x less likely under the policy than under the reference), an ordinary input
whose value and gradient a cap would change. TRL's `GRPOTrainer` and AReaL's
`ppo_actor_loss_fn` clamp nothing (a NaN gradient at a log-ratio of 89 and more in float32).

The importance corrections (`reasonrl.algo.importance`) need no bound: their weight is detached
and never above its cap (an overflowing rho is truncated to the cap or masked to 0), so they are
finite at any log-ratio without changing a sequence weight's tiny values.
"""

from __future__ import annotations

import torch

TOKEN_BOUNDS = (-20.0, 20.0)  # a token's log-ratio (verl's policy losses and k3)
SEQUENCE_BOUNDS = (-20.0, 10.0)  # GSPO's sequence log-ratio (verl compute_policy_loss_gspo: <= 10)


def clamp_log_ratio(log_ratio: torch.Tensor, bounds: tuple[float, float] = TOKEN_BOUNDS
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the log-ratio clamped to `bounds`, [same shape] bool: where the clamp changed it).

    Inside the bounds (ends included) the value is the input, bitwise, and so is the gradient
    through it; outside, the bound, with gradient 0. A NaN stays NaN (not counted, gradient
    0): non-finite inputs are the learner's bad step, not a bound's."""
    low, high = bounds
    return log_ratio.clamp(low, high), ((log_ratio < low) | (log_ratio > high)).detach()
