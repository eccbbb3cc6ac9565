"""Pure functions on tensors: advantages, policy and value losses, the objective around them,
aggregation, KL estimators, importance weights, shaping.

Each choice a config key makes (`algo.advantage`, `algo.policy_loss`, `algo.ratio_level`,
`algo.loss_agg`, `algo.kl_estimator`, `algo.importance_correction`, `algo.importance_level`,
`critic.value_loss`) is an entry of a registry in `reasonrl.registry`, filled here.
"""

from reasonrl.algo.advantages import (
    AdvantageInputs,
    estimate,
    flat_group_count,
    gdpo_rewards,
    group_advantages,
    informative_groups,
    zero_variance_groups,
)
from reasonrl.algo.aggregation import aggregate
from reasonrl.algo.gae import explained_variance, gae, masked_whiten, token_rewards
from reasonrl.algo.importance import importance_ratio, importance_weights
from reasonrl.algo.kl import kl_estimate, kl_penalised_rewards
from reasonrl.algo.objective import Metric, Totals, policy_objective, value_objective
from reasonrl.algo.policy_loss import LossSettings, log_importance_ratio
from reasonrl.algo.shaping import overlong_penalty
from reasonrl.algo.value_loss import ValueLossSettings

__all__ = [
    "AdvantageInputs", "LossSettings", "Metric", "Totals", "ValueLossSettings", "aggregate", "estimate",
    "explained_variance", "flat_group_count", "gae", "gdpo_rewards", "group_advantages", "importance_ratio",
    "importance_weights",
    "informative_groups", "masked_whiten", "token_rewards", "kl_estimate", "kl_penalised_rewards",
    "log_importance_ratio", "overlong_penalty", "policy_objective", "value_objective", "zero_variance_groups",
]
