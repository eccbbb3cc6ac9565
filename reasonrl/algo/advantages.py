"""Advantages: how much better each completion (or token) was than expected.

Every estimator of the `ADVANTAGES` registry has one signature, as verl's
`register_adv_est`: it takes one `AdvantageInputs` record and returns (advantages, returns).
The group estimators here read each completion's reward and its group and give one advantage
per completion, returns None; a critic estimator (`gae`, `reasonrl.algo.gae`; `critic=True`
on its entry, read by `reasonrl.registry.needs_critic`) reads the critic's values and the
token rewards and gives token advantages and the critic's regression targets. Pure functions
on tensors: no models, no config objects.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasonrl.registry import ADVANTAGES, needs_critic


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator reads. `rewards` and `group` are always there; the token
    fields ([N, T] over each row's model tokens, row i's at positions 0..len_i - 1) only for a
    critic estimator."""

    rewards: torch.Tensor  # [N] float: each completion's reward (KL in the reward: penalised)
    group: torch.Tensor  # [N] long: the prompt (0..B-1) each completion answers
    std_eps: float = 1e-4  # added to a std before dividing by it (algo.std_eps)
    std_ddof: int = 1  # grpo's group std divides by n - std_ddof: 1 unbiased, 0 population (algo.std_ddof)
    token_rewards: torch.Tensor | None = None  # [N, T] r_t: -beta KL_t, plus the score at the last token
    values: torch.Tensor | None = None  # [N, T] the critic's V(s_t)
    mask: torch.Tensor | None = None  # [N, T] 1 on a row's tokens, 0 on padding
    gamma: float = 1.0  # discount (algo.gamma)
    lam: float = 1.0  # GAE's lambda (algo.lam)


def estimate(mode: str, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(advantages, returns) of estimator `mode` (an `ADVANTAGES` entry): [N] and None for a
    group estimator, [N, T] each for a critic estimator."""
    if needs_critic(mode) and inputs.values is None:
        raise ValueError(f"algo.advantage={mode} needs a critic's values (AdvantageInputs.values)")
    return ADVANTAGES[mode].fn(inputs)


def _group_stats(rewards: torch.Tensor, group: torch.Tensor, ddof: int = 1
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group count, mean and std: sqrt(sum (r - mean)^2 / (n - ddof)); ddof 1 the unbiased
    std (torch.std, TRL; 0 for a group of one), 0 the population std (np.std, ReasonRL, EasyRL)."""
    num_groups = int(group.max().item()) + 1
    count = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, torch.ones_like(rewards))
    mean = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, rewards) / count
    sq = torch.zeros(num_groups, dtype=rewards.dtype).index_add_(0, group, (rewards - mean[group]) ** 2)
    return count, mean, (sq / (count - ddof).clamp(min=1)).sqrt()


def flat_groups(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """[N] bool: rows whose group's rewards are all exactly equal (max == min).

    Such a group carries no signal and its advantage is 0 by definition, but the float32 mean
    of equal values need not be the value itself: mean([0.1] * 8) is one ulp off 0.1, so
    r - mean is ~7e-9, the std ~1e-8, and (r - mean) / (std + eps) is -0.935 at eps = 0 and
    -7.4e-3 at 1e-6. Every group estimator sets these rows to exactly 0 instead of trusting
    the rounding (exact equality: rewards that differ by an ulp are different rewards; NaN is
    never flat)."""
    num_groups = int(group.max().item()) + 1
    start = torch.zeros(num_groups, dtype=rewards.dtype)
    high = start.scatter_reduce(0, group, rewards, "amax", include_self=False)
    low = start.scatter_reduce(0, group, rewards, "amin", include_self=False)
    return (high == low)[group]


def _flat_batch(x: torch.Tensor) -> bool:
    """Whether every value of `x` is exactly equal (a batch-level estimator's flat case)."""
    return bool((x.max() == x.min()).item()) if len(x) else True


def group_mean_std(rewards: torch.Tensor, group: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's group mean and std, broadcast back to rows."""
    _, mean, std = _group_stats(rewards, group)
    return mean[group], std[group]


def _batch_normalise(x: torch.Tensor, std_eps: float) -> torch.Tensor:
    """(x - mean(x)) / (std(x) + eps) over the whole batch; exactly 0 where the batch is flat
    (all values equal: their float32 mean may be an ulp off, `flat_groups`)."""
    std = x.std() if len(x) > 1 else torch.zeros((), dtype=x.dtype)
    if std <= 0 or _flat_batch(x):
        return torch.zeros_like(x)
    return (x - x.mean()) / (std + std_eps)


def group_advantages(rewards: torch.Tensor, group: torch.Tensor, mode: str,
                     std_eps: float = 1e-4) -> torch.Tensor:
    """Advantage [N] of each completion under group estimator `mode`, from its reward and the
    rewards around it (`estimate` without the record). Std is the unbiased estimate; a group
    whose rewards are all equal gets advantage exactly 0 in every group mode, whatever std_eps
    (0 included, where 0/0 would be NaN); the batch modes (`reinforce_baseline`,
    `reinforce_pp`) give exactly 0 to a batch whose rewards are all equal; `raw` is the
    reward itself."""
    if needs_critic(mode):
        raise ValueError(f"algo.advantage={mode} needs a critic's values (reasonrl.algo.gae), not groups")
    return estimate(mode, AdvantageInputs(rewards.float(), group, std_eps))[0]


def _centred(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """r_i - mean(r_group); exactly 0 in a flat group (`flat_groups`)."""
    _, mean, _ = _group_stats(rewards, group)
    return torch.where(flat_groups(rewards, group), torch.zeros_like(rewards), rewards - mean[group])


@ADVANTAGES.register("raw", needs_groups=False)
def raw(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = r_i: REINFORCE without a baseline (Williams 1992)."""
    return x.rewards.clone(), None


@ADVANTAGES.register("grpo", needs_groups=True)
def grpo(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = (r_i - mean(r_group)) / (std(r_group) + eps): GRPO's group-normalised advantage
    (Shao et al. 2024, DeepSeekMath, eq. 3 / sec. 4.1.2). The std's divisor is n - std_ddof
    (algo.std_ddof: 1 unbiased as TRL, 0 the population std as ReasonRL's np.std)."""
    _, mean, std = _group_stats(x.rewards, x.group, x.std_ddof)
    std = std[x.group]
    informative = (std > 0) & ~flat_groups(x.rewards, x.group)
    return torch.where(informative, (x.rewards - mean[x.group]) / (std + x.std_eps),
                       torch.zeros_like(x.rewards)), None


@ADVANTAGES.register("grpo_no_std", needs_groups=True)
def grpo_no_std(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = r_i - mean(r_group): the group mean as baseline, no std division."""
    return _centred(x.rewards, x.group), None


@ADVANTAGES.register("dr_grpo", needs_groups=True)
def dr_grpo(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = r_i - mean(r_group), as `grpo_no_std`: Dr. GRPO (Liu et al. 2025, "Understanding
    R1-Zero-Like Training", arXiv:2503.20783) drops the std division, which favours too-easy
    and too-hard questions; its other half, no length normalisation, is the loss
    aggregation `seq_mean_token_sum_norm`."""
    return _centred(x.rewards, x.group), None


@ADVANTAGES.register("rloo", needs_groups=True)
def rloo(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = r_i - mean_{j != i, j in group} r_j = G / (G - 1) * (r_i - mean(r_group)): the
    leave-one-out baseline (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for
    Free!"; Ahmadian et al. 2024, "Back to Basics", the RLOO estimator). A group of one has
    no other sample: its advantage is 0."""
    count, mean, _ = _group_stats(x.rewards, x.group)
    g = count[x.group]
    informative = (g > 1) & ~flat_groups(x.rewards, x.group)
    return torch.where(informative, (x.rewards - mean[x.group]) * g / (g - 1).clamp(min=1),
                       torch.zeros_like(x.rewards)), None


@ADVANTAGES.register("reinforce_baseline", needs_groups=False)
def reinforce_baseline(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = r_i - mean(r_batch): REINFORCE with the batch's mean reward as the baseline
    (Williams 1992, "Simple Statistical Gradient-Following Algorithms", sec. 4, the
    reinforcement baseline b); no per-prompt groups needed, no normalisation. Exactly 0 for a
    batch whose rewards are all equal."""
    if _flat_batch(x.rewards):
        return torch.zeros_like(x.rewards), None
    return x.rewards - x.rewards.mean(), None


@ADVANTAGES.register("reinforce_pp", needs_groups=False)
def reinforce_pp(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """A_i = (r_i - mean(r_batch)) / (std(r_batch) + eps): REINFORCE++ (Hu et al. 2025,
    arXiv:2501.03262, "global advantage normalization"): no per-prompt baseline, one
    normalisation over the whole batch. (The paper whitens per token; with one reward per
    completion and gamma = 1 we normalise per completion.)"""
    return _batch_normalise(x.rewards, x.std_eps), None


@ADVANTAGES.register("reinforce_pp_baseline", needs_groups=True)
def reinforce_pp_baseline(x: AdvantageInputs) -> tuple[torch.Tensor, None]:
    """r_i - mean(r_group), then normalised over the batch as in `reinforce_pp` (REINFORCE++
    w/ baseline, same paper; OpenRLHF/verl `reinforce_plus_plus_baseline`). A flat group's
    centred values are 0 and so is the batch mean of the centred values, in exact arithmetic;
    its rows get exactly 0 (the float32 batch mean is rounding noise, which the other groups
    keep as verl's does)."""
    centred = _centred(x.rewards, x.group)
    return torch.where(flat_groups(x.rewards, x.group), torch.zeros_like(centred),
                       _batch_normalise(centred, x.std_eps)), None


def gdpo_rewards(components: torch.Tensor, weights: list[float], group: torch.Tensor,
                 std_eps: float = 1e-4, std_ddof: int = 1) -> torch.Tensor:
    """r_i = sum_k w_k * (c_ik - mean(c_k,group)) / (std(c_k,group) + eps): GDPO's
    reward-decoupled normalisation (Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization
    Policy Optimization for Multi-reward RL Optimization", arXiv:2601.05242; TRL's
    multi_objective_aggregation="normalize_then_sum").

    `components` [N, K]: each completion's K reward components, `weights` their K weights. Each
    component is normalised within each prompt's group exactly as `grpo` normalises a reward (the
    std's divisor n - `std_ddof`, `std_eps` added to the std), so a component that is constant in
    a group contributes exactly 0 to that group's rows, and a component's scale does not matter:
    a 0/1 correctness and a 0-100 quality score count by their weights alone, where their plain
    sum would let the larger scale drown the other (GRPO's "advantage collapse"). The paper then
    normalises the sum over the whole batch; that is the advantage estimator `reinforce_pp` run on
    these rewards (reasonrl.source.collect calls this for reward.combine=gdpo)."""
    if components.dim() != 2 or components.shape[1] != len(weights):
        raise ValueError(f"components must be [N, {len(weights)}] (one column per weight), "
                         f"got {list(components.shape)}")
    total = torch.zeros(components.shape[0], dtype=components.dtype)
    for k, weight in enumerate(weights):
        normalised, _ = grpo(AdvantageInputs(components[:, k], group, std_eps, std_ddof=std_ddof))
        total += weight * normalised
    return total


def flat_group_count(values: torch.Tensor, group: torch.Tensor) -> int:
    """How many groups hold one value only (`flat_groups`: exact equality): under GDPO, the
    groups to which this component contributes nothing."""
    return len(torch.unique(group[flat_groups(values, group)]))


def informative_groups(rewards: torch.Tensor, group: torch.Tensor, tol: float = 1e-6) -> torch.Tensor:
    """[N] bool: rows whose group's reward std is above `tol`.

    DAPO's dynamic sampling (Yu et al. 2025, sec. 3.2, the constraint of eq. 11) keeps only
    prompts whose samples are neither all right nor all wrong: a flat group has group
    advantage 0 and only dilutes the batch. `tol` absorbs float noise (0.1 + 0.2 vs 0.3).
    """
    _, _, std = _group_stats(rewards.float(), group)
    return std[group] > tol


def zero_variance_groups(rewards: torch.Tensor, group: torch.Tensor, tol: float = 1e-6) -> int:
    """How many groups have (numerically) identical rewards: they carry no GRPO signal."""
    _, _, std = _group_stats(rewards.float(), group)
    return int((std <= tol).sum().item())
