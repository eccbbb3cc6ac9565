"""Off-policy corrections: one function per `algo.importance_correction`, all with one signature
(the `IMPORTANCE_CORRECTIONS` registry):

    correction(old_logp, engine_logp, mask, ctx) -> (weight, stats)

The tokens were sampled by the rollout engine's policy pi_behav (`engine_logp` [N, T], the
behaviour policy), while the loss takes its ratio against pi_old (`old_logp` [N, T], the policy's
log-probs recomputed at the start of the update: the "proximal" policy in AReaL's terms). The
two differ by numerics (another engine, kernels, precision) and, with asynchronous training, by
whole optimizer steps (stale rollouts). Each correction turns the importance ratio

    rho = pi_old / pi_behav = exp(old_logp - engine_logp)

taken at `algo.importance_level` (an `IMPORTANCE_LEVELS` entry: per token, or one per
completion) into a `weight` [N, T] that multiplies the per-token policy loss before
aggregation (`reasonrl.algo.objective`). The weight is detached, a constant for the gradient,
as in verl, AReaL and TRL. `mask` [N, T] marks the valid tokens: padding never enters a
sequence-level rho (its weight there is arbitrary: the aggregation masks it). `ctx` is the
`LossSettings` (`importance_level`, `importance_cap`, `importance_floor`). `stats` are detached
per-token diagnostics, each logged as its token mean: `is_weight_mean` (the weight) and
`is_capped_frac` or `is_masked_frac`.

A masked token keeps its place in the aggregation's denominator (its weight is 0): the step's
normalisers do not depend on the correction, as in AReaL's `ppo_actor_loss_fn` (verl instead
drops masked tokens from the denominator through its `response_mask`).
"""

from __future__ import annotations

import torch

from reasonrl.algo.policy_loss import LossSettings
from reasonrl.registry import IMPORTANCE_CORRECTIONS, IMPORTANCE_LEVELS

Stats = dict[str, torch.Tensor]


@IMPORTANCE_LEVELS.register("token")
def token_log_rho(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_t = old_logp_t - engine_logp_t, one per token (verl `rollout_is_level=token`)."""
    return old_logp.detach().float() - engine_logp.detach().float()


@IMPORTANCE_LEVELS.register("sequence")
def sequence_log_rho(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_i = sum_t mask_it (old_logp_it - engine_logp_it), the completion's likelihood ratio
    pi_old(y_i) / pi_behav(y_i), at every token of row i (verl `rollout_is_level=sequence`, the
    product of the token ratios: unbiased, high variance)."""
    log_rho = torch.where(mask.bool(), token_log_rho(old_logp, engine_logp, mask), 0.0)
    return log_rho.sum(-1, keepdim=True).expand_as(log_rho)


@IMPORTANCE_LEVELS.register("geometric")
def geometric_log_rho(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log rho_i = mean over row i's valid tokens of (old_logp_it - engine_logp_it), at every token
    of the row: the geometric mean of the token ratios (verl `rollout_is_level=geometric`), a
    length-normalised sequence ratio that rarely leaves [floor, cap]; 0 (rho = 1) for a row
    without valid tokens."""
    log_rho = torch.where(mask.bool(), token_log_rho(old_logp, engine_logp, mask), 0.0)
    mean = log_rho.sum(-1, keepdim=True) / mask.float().sum(-1, keepdim=True).clamp(min=1.0)
    return mean.expand_as(log_rho)


def importance_ratio(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                     level: str) -> torch.Tensor:
    """rho [N, T] = pi_old / pi_behav at `level` (an `IMPORTANCE_LEVELS` entry), detached, float32.
    A sequence rho may overflow to inf or underflow to 0; every correction bounds its weight."""
    return torch.exp(IMPORTANCE_LEVELS.get(level)(old_logp, engine_logp, mask))


@IMPORTANCE_CORRECTIONS.register("none", off=True)
def no_correction(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                  ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """No correction: w = 1 (the default). The objective skips it altogether (`off`), so the loss
    is the policy loss as it is, bitwise; the engine's log-probs only feed the mismatch metrics."""
    return torch.ones_like(old_logp, dtype=torch.float32), {}


@IMPORTANCE_CORRECTIONS.register("tis")
def truncated_is(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                 ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """Truncated importance sampling (TIS): w = min(rho, cap), cap = `importance_cap`.

    Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
    (Feng Yao, Liyuan Liu, et al., blog post, Aug. 2025): the samples come from the engine's
    distribution, so the per-token loss is multiplied by pi_old / pi_engine, truncated at their
    C (2 in their experiments) to bound the variance; only the upper side is truncated. verl:
    `compute_rollout_importance_weights` with `rollout_is_mode=truncate` (earlier
    `tis_imp_ratio_cap`); TRL: `vllm_importance_sampling_correction` with
    `vllm_importance_sampling_mode=token_truncate` / `sequence_truncate` and
    `vllm_importance_sampling_cap`. `is_capped_frac`: tokens whose rho exceeded the cap (rho >
    cap; at rho = cap the weight is cap either way)."""
    rho = importance_ratio(old_logp, engine_logp, mask, ctx.importance_level)
    weight = rho.clamp(max=ctx.importance_cap)
    return weight, {"is_weight_mean": weight, "is_capped_frac": rho > ctx.importance_cap}


@IMPORTANCE_CORRECTIONS.register("mis")
def masked_is(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
              ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """Masked importance sampling (MIS, IcePop): w = rho if floor <= rho <= cap, else 0, with
    floor = `importance_floor` (IcePop's alpha) and cap = `importance_cap` (its beta), both
    bounds kept (inclusive).

    IcePop (inclusionAI / Ant Group Ling Team, "Small Leak Can Sink a Great Ship: Boost RL
    Training on MoE with IcePop", blog post, Sep. 2025; used to train Ring-1T, "Every Step
    Evolves: Scaling Reinforcement Learning for Trillion-Scale Thinking Model", arXiv:2510.18855):
    the masking function M(k; alpha, beta) = k if k in [alpha, beta] else 0 applied to the
    training / inference probability ratio, so a token whose two probabilities disagree too much
    gives no gradient at all instead of a truncated one. verl: `compute_rollout_importance_weights`
    with `rollout_is_mode=mask` (`rollout_is_threshold_lower` / `rollout_is_threshold`; kept
    when lower <= rho <= upper) at `token`, `sequence` or `geometric` level; TRL:
    `vllm_importance_sampling_mode=token_mask` / `sequence_mask`. `is_masked_frac`: tokens whose
    weight is 0."""
    rho = importance_ratio(old_logp, engine_logp, mask, ctx.importance_level)
    keep = (rho >= ctx.importance_floor) & (rho <= ctx.importance_cap)
    weight = torch.where(keep, rho, torch.zeros_like(rho))
    return weight, {"is_weight_mean": weight, "is_masked_frac": ~keep}


@IMPORTANCE_CORRECTIONS.register("decoupled")
def decoupled(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
              ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """AReaL's decoupled PPO weight: w = rho if rho <= cap, else 0, rho = pi_prox / pi_behav.

    Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for
    Language Reasoning", arXiv:2505.24298, the decoupled PPO objective:

        J(theta) = E[ pi_prox / pi_behav * min(r A, clip(r, 1 - eps, 1 + eps) A) ],
        r = pi_theta / pi_prox

    Rollouts of a policy up to K versions old are sampled by pi_behav; the trust region is
    taken around the proximal policy pi_prox, the policy at the start of the update (here
    `old_logp`, which every policy loss already takes its ratio against), and the behaviour
    weight pi_prox / pi_behav corrects for the sampling. AReaL's `ppo_actor_loss_fn`
    (`use_decoupled_loss`, `behav_imp_weight = exp(proximal_logprobs - old_logprobs)`, tokens
    with `behav_imp_weight > behav_imp_weight_cap` masked out: weight 0 and still counted in the
    denominator) is `algo.policy_loss=ppo` with `algo.importance_correction=decoupled` here, cap =
    `importance_cap`, at `importance_level=token` (AReaL's weight is per token). The weight
    multiplies whatever `algo.policy_loss` gives, so it composes with the other losses (cispo,
    gmpo, sapo) and ratio levels the same way. Without stale rollouts it is a masked IS with no
    lower bound. `is_masked_frac`: tokens whose rho exceeded the cap (weight 0)."""
    rho = importance_ratio(old_logp, engine_logp, mask, ctx.importance_level)
    keep = rho <= ctx.importance_cap
    weight = torch.where(keep, rho, torch.zeros_like(rho))
    return weight, {"is_weight_mean": weight, "is_masked_frac": ~keep}


def importance_weights(old_logp: torch.Tensor, engine_logp: torch.Tensor, mask: torch.Tensor,
                       ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """(weight [N, T], stats) of the correction `ctx.importance_correction` selects."""
    return IMPORTANCE_CORRECTIONS.get(ctx.importance_correction)(old_logp, engine_logp, mask, ctx)
