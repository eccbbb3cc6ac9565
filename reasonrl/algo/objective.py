"""The objective of one micro-batch: what the learner differentiates, on one screen.

The policy's is the chosen policy loss (`algo.policy_loss`, `reasonrl.algo.policy_loss`)
weighted by the off-policy correction (`algo.importance_correction`, `reasonrl.algo.importance`),
aggregated (`algo.loss_agg`), minus the entropy bonus, plus the KL term; the critic's the
chosen value loss, a token mean. As in nano-aha-moment's `compute_pg_loss` and OpenRLHF's
`loss.py`, the whole objective lives outside the worker, which only runs forward -> objective
-> backward.

Every normaliser is a total over the whole optimizer step (`Totals`), never the micro-batch:
each micro-batch returns its share, and the shares add up to the full-batch loss (and its
metrics), so neither depends on the micro-batch size. Metrics come back as `Metric`s that
say how they combine over micro-batches, data-parallel ranks and updates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from reasonrl.algo.aggregation import aggregate
from reasonrl.algo.importance import importance_weights
from reasonrl.algo.kl import kl_clamped, kl_estimate
from reasonrl.algo.policy_loss import LossSettings
from reasonrl.algo.value_loss import ValueLossSettings
from reasonrl.registry import IMPORTANCE_CORRECTIONS, POLICY_LOSSES, VALUE_LOSSES

# (logp, old_logp, advantages, mask, ctx) -> (per_token_loss, stats): `reasonrl.algo.policy_loss`
PolicyLoss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Metric:
    """One number of an update and how it combines with the others of its name:

    - `sum`: a share (a token mean over the step's token count, a normalised loss): added over
      micro-batches and data-parallel ranks; the step logs the mean over its updates;
    - `max` / `min`: the extreme over micro-batches, ranks and updates; `empty` is logged when
      no token gave a value (the value is then -inf / +inf);
    - `mean`: one value per update that every rank computes (a grad norm; a skip on any rank
      is the update's, so the ranks take the max); the step logs the mean over updates."""

    value: float
    reduce: str = "sum"
    empty: float | None = None


@dataclass(frozen=True)
class Totals:
    """The normalisers of one optimizer step: its rows' model tokens and sequences (on every
    rank together), and the generation budget (Dr. GRPO's constant). `sequences` counts the
    rows with at least one token in the loss (`of`): an empty row is in no aggregation's
    denominator, as its tokens are in none of `token`'s."""

    tokens: float
    sequences: float
    max_response_length: float = 0.0

    @classmethod
    def of(cls, row_tokens: list[int], max_response_length: float = 0.0) -> Totals:
        """The totals of a step whose rows have `row_tokens[i]` tokens in the loss: their sum, and
        the number of rows with at least one. A row with none (every token masked) adds 0 to a
        sequence aggregation's sum and is left out of its count too (verl `agg_loss`'s own count,
        `seq_mask = (loss_mask.sum(-1) > 0)`; TRL's `loss_type="grpo"` counts it: its `.mean()`
        runs over every row of the batch), so the other rows' weight does not depend on how many
        rows happened to be empty."""
        return cls(float(sum(row_tokens)), float(sum(1 for n in row_tokens if n > 0)), max_response_length)


def token_share(per_token: torch.Tensor, mask: torch.Tensor, totals: Totals) -> float:
    """This micro-batch's share of the step's token mean of `per_token`."""
    return ((per_token.detach().float() * mask).sum() / max(totals.tokens, 1.0)).item()


def extremes(name: str, per_token: torch.Tensor, mask: torch.Tensor) -> dict[str, Metric]:
    """`name`_max and `name`_min over the valid tokens (1 when there is none)."""
    valid = per_token[mask.bool()]
    some = valid.numel() > 0
    return {f"{name}_max": Metric(valid.max().item() if some else -float("inf"), "max", 1.0),
            f"{name}_min": Metric(valid.min().item() if some else float("inf"), "min", 1.0)}


def policy_objective(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, s: LossSettings, totals: Totals,
                     entropy: torch.Tensor | None = None, ref_logp: torch.Tensor | None = None,
                     engine_logp: torch.Tensor | None = None,
                     loss_fn: PolicyLoss | None = None) -> tuple[torch.Tensor, dict[str, Metric]]:
    """(this micro-batch's share of the step's loss, its metrics). `logp` [M, T] with gradient;
    `old_logp`, `ref_logp` (the reference model's, when there is one) and `engine_logp` (the
    rollout engine's, when it reports them) [M, T] detached; `advantages` [M] or [M, >= T];
    `entropy` [M, T] (with gradient only when the bonus is on).

        loss = agg(policy_loss * w) - entropy_coef * agg(H) + beta * agg(KL)   (kl_in=loss)

    w is the off-policy correction's weight of rho = pi_old / pi_engine (`algo.importance_correction`,
    an `IMPORTANCE_CORRECTIONS` entry: tis, mis, decoupled; with `none`, the default, or without
    engine log-probs there is no w at all, so the loss is bitwise the uncorrected one); the
    entropy bonus is the classic PPO one (Schulman et al. 2017, eq. 9); the KL term is GRPO's
    (Shao et al. 2024, eq. 3) with `algo.kl_estimator`. train/kl is logged whenever
    there is a reference, whatever `beta` and `kl_in` are. `loss_fn` is the policy loss
    (`reasonrl.algo.policy_loss`'s signature); None = `s.policy_loss`'s `POLICY_LOSSES` entry. An
    out-of-tree loss (`algo.loss_fn`) may leave out the `ratio` and `clamped` statistics every
    built-in one returns: no ratio metrics are logged then, and no token counts as clamped.

    `clamped_frac`: the share of the step's tokens whose log-ratio a bound clamped
    (`reasonrl.algo.bounds`): the policy loss's (every loss reports its `clamped` tokens) or,
    with the KL term in the loss, a bounded estimator's (k3, k3+). 0 on ordinary batches;
    above 0, some tokens' ratios exploded and gave no gradient."""
    def agg(per_token: torch.Tensor) -> torch.Tensor:
        return aggregate(per_token, mask, s.loss_agg, totals.tokens, totals.sequences,
                         totals.max_response_length)

    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages[:, : logp.size(1)]
    per_token, stats = (loss_fn or POLICY_LOSSES.get(s.policy_loss))(logp, old_logp, adv, mask, s)
    stats = dict(stats)
    clamped = stats.pop("clamped", None)
    if clamped is None:
        clamped = torch.zeros_like(mask, dtype=torch.bool)
    metrics: dict[str, Metric] = {}
    if engine_logp is not None:
        diff = (engine_logp - old_logp).abs()
        metrics["logprob_diff_mean"] = Metric(token_share(diff, mask, totals))
        metrics["logprob_diff_max"] = Metric((diff * mask).max().item(), "max")
        if not IMPORTANCE_CORRECTIONS[s.importance_correction].off:
            weight, is_stats = importance_weights(old_logp, engine_logp, mask, s)
            per_token = per_token * weight
            metrics.update({name: Metric(token_share(x, mask, totals)) for name, x in is_stats.items()})
    loss = pg_loss = agg(per_token)
    if s.entropy_coef != 0:
        loss = loss - s.entropy_coef * agg(entropy)
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp, s.kl_estimator)
        metrics["kl"] = Metric(token_share(kl, mask, totals))
        if s.beta > 0 and s.kl_in == "loss":
            loss = loss + s.beta * agg(kl)
            clamped = clamped | kl_clamped(logp, ref_logp, s.kl_estimator)
    metrics.update(loss=Metric(loss.item()), pg_loss=Metric(pg_loss.item()))
    if entropy is not None:
        metrics["entropy"] = Metric(token_share(entropy, mask, totals))
    ratio = stats.pop("ratio", None)
    metrics.update({name: Metric(token_share(x, mask, totals)) for name, x in stats.items()})
    if ratio is not None:
        metrics.update(ratio_mean=Metric(token_share(ratio, mask, totals)), **extremes("ratio", ratio, mask))
    metrics.update(clamped_frac=Metric(token_share(clamped, mask, totals)))
    return loss, metrics


def value_objective(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                    s: ValueLossSettings, totals: Totals) -> tuple[torch.Tensor, dict[str, Metric]]:
    """(this micro-batch's share of the critic's loss, its metrics): the chosen value loss
    (`critic.value_loss`), a token mean over the step's model tokens."""
    per_token, stats = VALUE_LOSSES.get(s.value_loss)(values, old_values, returns, mask, s)
    loss = (per_token * mask).sum() / max(totals.tokens, 1.0)
    metrics = {"vf_loss": Metric(loss.item())}
    metrics.update({name: Metric(token_share(x, mask, totals)) for name, x in stats.items()})
    return loss, metrics
