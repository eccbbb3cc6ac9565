"""Pure functions on tensors: advantages, policy loss, aggregation, KL estimators, shaping."""

from reasonrl.algo.advantages import (
    ADVANTAGE_MODES,
    GROUP_ADVANTAGE_MODES,
    group_advantages,
    informative_groups,
    zero_variance_groups,
)
from reasonrl.algo.importance import truncated_importance_weights
from reasonrl.algo.kl import KL_ESTIMATORS, kl_estimate, kl_penalised_rewards
from reasonrl.algo.loss import (
    LOSS_AGGREGATIONS,
    RATIO_LEVELS,
    PolicyLoss,
    aggregate,
    clipped_policy_loss,
    log_importance_ratio,
)
from reasonrl.algo.shaping import overlong_penalty

__all__ = [
    "ADVANTAGE_MODES", "GROUP_ADVANTAGE_MODES", "KL_ESTIMATORS", "LOSS_AGGREGATIONS", "RATIO_LEVELS",
    "PolicyLoss", "aggregate", "clipped_policy_loss", "group_advantages", "informative_groups",
    "kl_estimate", "kl_penalised_rewards", "log_importance_ratio", "overlong_penalty",
    "truncated_importance_weights", "zero_variance_groups",
]
