"""Pure functions on tensors: advantages, policy loss, aggregation, KL estimators."""

from reasonrl.algo.advantages import ADVANTAGE_MODES, group_advantages, zero_variance_groups
from reasonrl.algo.kl import KL_ESTIMATORS, kl_estimate, kl_penalised_rewards
from reasonrl.algo.loss import LOSS_AGGREGATIONS, aggregate, clipped_policy_loss

__all__ = [
    "ADVANTAGE_MODES", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "aggregate", "clipped_policy_loss",
    "group_advantages", "kl_estimate", "kl_penalised_rewards", "zero_variance_groups",
]
