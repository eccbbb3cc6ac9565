"""Value losses of the critic: one function per `critic.value_loss`, one signature (as the
policy losses, `reasonrl.algo.policy_loss`):

    loss(values, old_values, returns, mask, ctx) -> (per_token_loss, stats)

`values` [N, T] are the critic's V(s_t) (with gradient), `old_values` [N, T] those the step's
advantages were computed from, `returns` [N, T] the regression targets (GAE's returns),
`mask` [N, T] 1 on the tokens that count, `ctx` the `ValueLossSettings`. `stats` are detached
per-token diagnostics, each logged as its token mean (`reasonrl.algo.objective`).
"""

from __future__ import annotations

import torch

from reasonrl.algo.settings import SectionValues
from reasonrl.registry import VALUE_LOSSES

Stats = dict[str, torch.Tensor]


class ValueLossSettings(SectionValues):
    """The `critic` section as the value objective and its losses read it (the `ctx` of every
    value loss): each key by its config name, read-only; `ValueLossSettings.of(critic)` takes
    every field of the section (`reasonrl.algo.settings`)."""

    __slots__ = ()
    section = "critic"


@VALUE_LOSSES.register("clipped")
def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor, ctx: ValueLossSettings) -> tuple[torch.Tensor, Stats]:
    """The PPO clipped value loss (Schulman et al. 2017, the value-function clipping of the PPO
    baselines implementation; verl's `compute_value_loss`), the default:

        V_clip = old_V + clip(V - old_V, -c, c)
        loss_t = 0.5 * max((V - R)^2, (V_clip - R)^2)

    with c = `critic.cliprange_value`; c = 0 turns the clip off (plain 0.5 (V - R)^2).
    `vf_clipfrac`: tokens where the clipped term is the larger one (its gradient is 0)."""
    unclipped = (values - returns) ** 2
    if ctx.cliprange_value <= 0:
        return 0.5 * unclipped, {"vf_clipfrac": torch.zeros_like(unclipped, dtype=torch.bool)}
    value_clipped = old_values + (values - old_values).clamp(-ctx.cliprange_value, ctx.cliprange_value)
    clipped = (value_clipped - returns) ** 2
    return 0.5 * torch.maximum(unclipped, clipped), {"vf_clipfrac": (clipped > unclipped).detach()}
