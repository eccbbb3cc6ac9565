"""Pure functions on tensors: advantages, policy loss, aggregation, KL estimators, shaping.

Each choice a config key makes (`algo.advantage`, `algo.ratio_level`, `algo.loss_agg`,
`algo.kl_estimator`) is an entry of a registry in `reasonrl.registry`, filled here.
"""

from reasonrl.algo.advantages import (
    AdvantageInputs,
    estimate,
    group_advantages,
    informative_groups,
    zero_variance_groups,
)
from reasonrl.algo.gae import clipped_value_loss, explained_variance, gae, masked_whiten, token_rewards
from reasonrl.algo.importance import truncated_importance_weights
from reasonrl.algo.kl import kl_estimate, kl_penalised_rewards
from reasonrl.algo.loss import PolicyLoss, aggregate, clipped_policy_loss, log_importance_ratio
from reasonrl.algo.shaping import overlong_penalty

__all__ = [
    "AdvantageInputs", "PolicyLoss", "aggregate", "clipped_policy_loss", "clipped_value_loss", "estimate",
    "explained_variance", "gae", "group_advantages", "informative_groups", "masked_whiten", "token_rewards",
    "kl_estimate", "kl_penalised_rewards", "log_importance_ratio", "overlong_penalty",
    "truncated_importance_weights", "zero_variance_groups",
]
