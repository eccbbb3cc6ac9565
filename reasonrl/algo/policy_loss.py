"""Policy losses: one function per `algo.policy_loss`, all with one signature (verl's
`register_policy_loss`, without its config plumbing):

    loss(logp, old_logp, advantages, mask, ctx) -> (per_token_loss, stats)

`logp` [N, T] are the current policy's log-probs of the sampled tokens (with gradient),
`old_logp` [N, T] those of the policy that sampled them (detached), `advantages` [N, 1] (one
per completion) or [N, T] (per token, a critic's GAE), `mask` [N, T] 1 on the tokens that
count, `ctx` the `LossSettings` (the whole `algo` section by its keys' names: `ctx.clip_low`).
`per_token_loss` [N, T] is the negated objective (lower is
better), aggregated by `algo.loss_agg` afterwards; `stats` are detached per-token diagnostics,
each logged as its token mean, and always hold `ratio`, the importance ratio pi / pi_old as the
loss used it (also logged as its max and min), and `clamped`, the tokens whose log-ratio was
clamped to its level's bounds (`reasonrl.algo.bounds`; logged as `clamped_frac`). The entropy
bonus, the KL term and the importance corrections compose around the loss in
`reasonrl.algo.objective`.

The importance ratio of the ratio-based losses is taken at `algo.ratio_level` (a
`RATIO_LEVELS` entry): per token, or GSPO's per sequence, and always through
`bounded_log_ratio`, which clamps it to the level's bounds (each entry's `bounds`): every loss
is finite, in value and gradient, at any log-ratio, and unchanged, bitwise, inside the bounds.

A loss's hyper-parameters are keys of the `algo` section, read from `ctx` by their config names
(`ctx.sapo_tau_pos`): adding a loss with a new one is its decorated function here, its field in
the schema's `AlgoConfig` and its test, nothing else. An out-of-tree loss (`algo.loss_fn`) has
the same signature, plus `algo.loss_kwargs` as keyword arguments (`reasonrl.workers.policy`).
"""

from __future__ import annotations

import torch

from reasonrl.algo.bounds import SEQUENCE_BOUNDS, TOKEN_BOUNDS, clamp_log_ratio
from reasonrl.algo.settings import SectionValues
from reasonrl.registry import POLICY_LOSSES, RATIO_LEVELS


class LossSettings(SectionValues):
    """The `algo` section as the objective and its losses read it (the `ctx` of every loss):
    each key by its config name, read-only; `LossSettings.of(algo)` takes every field of the
    section (`reasonrl.algo.settings`)."""

    __slots__ = ()
    section = "algo"


Stats = dict[str, torch.Tensor]


def bounded_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None,
                      level: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(log of the importance ratio pi_theta / pi_old per token [N, T] at `level` (a
    `RATIO_LEVELS` entry), clamped to the entry's `bounds`; [N, T] bool: where it was clamped).
    The one place a policy loss's log-ratio is bounded (`reasonrl.algo.bounds`)."""
    entry = RATIO_LEVELS[level]
    return clamp_log_ratio(entry.fn(logp, old_logp, mask), entry.bounds)


def log_importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None,
                         level: str) -> torch.Tensor:
    """log of the importance ratio pi_theta / pi_old per token [N, T], at `level` (a
    `RATIO_LEVELS` entry), clamped to its bounds (`bounded_log_ratio`)."""
    return bounded_log_ratio(logp, old_logp, mask, level)[0]


@RATIO_LEVELS.register("token", bounds=TOKEN_BOUNDS)
def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """log r_t = logp_t - old_logp_t (PPO, Schulman et al. 2017, r_t(theta) of eq. 6; GRPO)."""
    return logp - old_logp


@RATIO_LEVELS.register("sequence", bounds=SEQUENCE_BOUNDS)
def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """GSPO's length-normalised sequence ratio (Zheng et al. 2025, "Group Sequence Policy
    Optimization", arXiv:2507.18071, definition of s_i(theta)):
    s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|) = exp(mean_t(logp_it - old_logp_it)), the
    geometric mean of the token ratios. It is written in the GSPO-token form
    log s_it = sg[log s_i] + logp_it - sg[logp_it]: the value is s_i at every token and
    d s_it / d logp_it = s_i, so with `sequence` aggregation (mean over the |y_i| tokens) the
    gradient is exactly d s_i, as in the paper. Its bounds are GSPO's in verl
    (`compute_policy_loss_gspo` clamps this log-ratio to at most 10), clamped on the whole
    expression as there: a clamped completion has no gradient."""
    if mask is None:
        raise ValueError("ratio_level=sequence needs the token mask")
    mask = mask.to(logp.dtype)
    seq = ((logp - old_logp) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return logp - logp.detach() + seq.detach().unsqueeze(-1)


def ratio_at_level(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor,
                   ctx: LossSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """(rho [N, T] = exp(the bounded log-ratio at `ctx.ratio_level`), where it was clamped)."""
    log_ratio, clamped = bounded_log_ratio(logp, old_logp, mask, ctx.ratio_level)
    return torch.exp(log_ratio), clamped


@POLICY_LOSSES.register("ppo")
def ppo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
        ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """PPO's clipped surrogate, per token (the default):

        loss_t = -min(rho_t * A, clip(rho_t, 1 - clip_low, 1 + clip_high) * A)

    PPO (Schulman et al. 2017, eq. 7) as GRPO uses it per token (Shao et al. 2024, eq. 3);
    separate lower and upper bounds are DAPO's "clip-higher" (Yu et al. 2025, sec. 3.1); with
    `ratio_level=sequence` it is GSPO's objective. Dual clip (`clip_ratio_c` > 1; 0 = off): for
    A < 0 the loss is also capped at -A * clip_ratio_c, so a token whose ratio exploded cannot
    dominate the batch (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
    RL", AAAI, dual-clip PPO; verl's `clip_ratio_c`, default 3). `clip_frac`: tokens whose
    gradient a clip (either one) removed; `dual_clip_frac`: the dual clip's.

    A tie, rho = clip_ratio_c exactly (so -A rho = -A c), keeps the surrogate's gradient,
    -A c grad logp_t, not the cap's 0, and is not counted in `dual_clip_frac`: the cap acts only
    where it is strictly lower, as PPO's own clip keeps the gradient at rho = 1 + clip_high
    exactly (torch.clamp passes it at its bounds), so the gradient is continuous from below.
    verl (`torch.min(pg_losses3, clip_pg_losses1)`) and AReaL (`torch.min(pg_loss, pg_loss3)`)
    split a tie's gradient in half between the two sides (torch.min's rule for equal inputs)."""
    ratio, clamped = ratio_at_level(logp, old_logp, mask, ctx)
    unclipped = -advantages * ratio
    clipped_loss = -advantages * torch.clamp(ratio, 1.0 - ctx.clip_low, 1.0 + ctx.clip_high)
    loss = torch.maximum(unclipped, clipped_loss)
    clipped = clipped_loss > unclipped
    dual = torch.zeros_like(clipped)
    if ctx.clip_ratio_c > 0:
        cap = -advantages * ctx.clip_ratio_c
        dual = (advantages < 0) & (cap < loss)
        loss = torch.where(dual, cap.expand_as(loss), loss)
    return loss, {"ratio": ratio.detach(), "clamped": clamped, "clip_frac": (clipped | dual).detach(),
                  "dual_clip_frac": dual.detach()}


@POLICY_LOSSES.register("cispo")
def cispo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
          ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """CISPO, the clipped importance-sampling-weight objective of MiniMax-M1 (MiniMax 2025,
    arXiv:2506.13585, sec. 3.1; verl `compute_policy_loss_cispo`):

        loss_t = -sg[clip(rho_t, 1 - clip_low, 1 + clip_high)] * A * logp_t

    The weight is clipped and its gradient stopped, so every token keeps the REINFORCE
    gradient A * grad logp_t, scaled by the bounded weight: unlike PPO's clip, no token (the
    rare "However", "Wait" tokens the paper names) loses its gradient. The paper bounds only
    the upper side (a large clip_low, e.g. 1, leaves the lower one open). `clip_frac`: tokens
    whose weight the clip changed."""
    ratio, clamped = ratio_at_level(logp, old_logp, mask, ctx)
    weight = torch.clamp(ratio, 1.0 - ctx.clip_low, 1.0 + ctx.clip_high).detach()
    return -weight * advantages * logp, {"ratio": ratio.detach(), "clamped": clamped,
                                         "clip_frac": (ratio != weight).detach()}


@POLICY_LOSSES.register("gmpo")
def gmpo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv:2507.20673;
    verl `compute_policy_loss_geo_mean`): the sequence's ratio is the geometric mean of its
    token ratios, each clipped in log space, so one outlier token cannot dominate it:

        l_t = sgn(A) * min(sgn(A) * log rho_t, sgn(A) * clip(log rho_t, -clip_low, clip_high))
        loss_i = -A_i * exp(mean_t l_t)        (at every token of completion i)

    with log rho_t = logp_t - old_logp_t, bounded as a token's (`bounded_log_ratio` at `token`
    level; verl's `compute_policy_loss_geo_mean` has that clamp commented out, so for A < 0 its
    ratio overflows once the mean kept log-ratio passes 88.7), the ratio per sequence by
    definition (no `ratio_level`), clip_low / clip_high bounds on the LOG ratio (the paper uses
    0.4), and A_i the completion's advantage (a token advantage's mean over the completion).
    The paper's objective is the mean over completions: `algo.loss_agg=sequence`. `clip_frac`:
    tokens where the clipped log ratio was the one kept and differed."""
    log_ratio, clamped = bounded_log_ratio(logp, old_logp, mask, "token")
    sign = torch.sign(advantages)
    bounded = torch.clamp(log_ratio, -ctx.clip_low, ctx.clip_high)
    kept = sign * torch.minimum(sign * log_ratio, sign * bounded)
    mask = mask.to(logp.dtype)
    count = mask.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = torch.exp((kept * mask).sum(-1, keepdim=True) / count)  # [N, 1]
    adv = advantages if advantages.size(-1) == 1 else (advantages * mask).sum(-1, keepdim=True) / count
    loss = (-adv * ratio).expand_as(logp)
    return loss, {"ratio": ratio.detach().expand_as(logp), "clamped": clamped,
                  "clip_frac": (sign * bounded < sign * log_ratio).detach()}


@POLICY_LOSSES.register("sapo")
def sapo(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
         ctx: LossSettings) -> tuple[torch.Tensor, Stats]:
    """SAPO, Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv:2511.20347;
    verl `compute_policy_loss_sapo`): a smooth gate instead of the hard clip,

        f(rho, tau) = sigmoid(tau * (rho - 1)) * 4 / tau,   loss_t = -f(rho_t, tau) * A

    with tau = sapo_tau_pos for A > 0 and sapo_tau_neg otherwise (the paper: 1.0 and 1.05,
    tau_neg > tau_pos because negative updates spread to many unsampled tokens). On-policy
    (rho = 1) the gradient is A * grad logp_t, as PPO's; as rho leaves 1 it decays smoothly
    (f' = 4 sigmoid(1 - sigmoid)), by a token's own ratio rather than the whole sequence's.
    The paper aggregates per sequence (`algo.loss_agg=sequence`). `gate_mean`: the token mean
    of f."""
    ratio, clamped = ratio_at_level(logp, old_logp, mask, ctx)
    tau = torch.where(advantages > 0, ctx.sapo_tau_pos, ctx.sapo_tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {"ratio": ratio.detach(), "clamped": clamped, "gate_mean": gate.detach()}
