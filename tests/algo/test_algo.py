"""Hand-computed values for every formula in reasonrl.algo and the LR schedule."""

import dataclasses
import math

import pytest
import torch

from reasonrl.algo import (
    aggregate,
    group_advantages,
    informative_groups,
    kl_estimate,
    kl_penalised_rewards,
    overlong_penalty,
    zero_variance_groups,
)
from reasonrl.config import AlgoConfig, OptimConfig, load_config
from reasonrl.errors import ConfigError
from reasonrl.learn.schedules import constant, cosine, lr_multiplier
from reasonrl.registry import (
    ADVANTAGES,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LR_SCHEDULES,
    POLICY_LOSSES,
    RATIO_LEVELS,
)

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
GROUP = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])


def test_raw_advantage_is_the_reward():
    assert group_advantages(REWARDS, GROUP, "raw").tolist() == REWARDS.tolist()


def test_grpo_advantage_hand_computed():
    # group 0: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = 0.57735; group 1: std 0 -> 0
    adv = group_advantages(REWARDS, GROUP, "grpo", std_eps=0.0)
    a = 0.5 / math.sqrt(1 / 3)  # 0.866025
    expected = [a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_grpo_advantage_eps_in_denominator():
    adv = group_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]), "grpo", std_eps=0.5)
    # mean 2, std 1 -> (r - 2) / 1.5
    torch.testing.assert_close(adv, torch.tensor([-2 / 3, 0.0, 2 / 3]))


def test_grpo_no_std_advantage_hand_computed():
    adv = group_advantages(REWARDS, GROUP, "grpo_no_std")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]))


def test_groups_need_not_be_contiguous():
    rewards = torch.tensor([1.0, 5.0, 3.0, 5.0])
    group = torch.tensor([0, 1, 0, 1])
    torch.testing.assert_close(group_advantages(rewards, group, "grpo_no_std"),
                               torch.tensor([-1.0, 0.0, 1.0, 0.0]))


def test_dr_grpo_advantage_is_the_centred_reward():
    # Dr. GRPO: r - mean(group), no std: group 0 mean 0.5, group 1 mean 2
    adv = group_advantages(REWARDS, GROUP, "dr_grpo")
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]))


def test_rloo_advantage_hand_computed():
    # row 0: r=1, others in its group {0, 0, 1} -> baseline 1/3 -> 2/3
    # row 1: r=0, others {1, 0, 1} -> baseline 2/3 -> -2/3; group 1 is flat -> 0
    adv = group_advantages(REWARDS, GROUP, "rloo")
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0, 0.0]))
    # uneven group sizes: group 0 = {3, 1, 2} -> row 0: 3 - (1 + 2) / 2 = 1.5; group 1 = {5} alone -> 0
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0, 5.0]), torch.tensor([0, 0, 0, 1]), "rloo")
    torch.testing.assert_close(adv, torch.tensor([1.5, -1.5, 0.0, 0.0]))


def test_reinforce_pp_normalises_over_the_batch():
    # batch mean 10/8 = 1.25; deviations -0.25, -1.25, -1.25, -0.25, 0.75 x4;
    # squares sum 0.0625 * 2 + 1.5625 * 2 + 0.5625 * 4 = 5.5; unbiased std sqrt(5.5 / 7) = 0.886405
    adv = group_advantages(REWARDS, GROUP, "reinforce_pp", std_eps=0.0)
    std = math.sqrt(5.5 / 7)
    expected = [-0.25 / std, -1.25 / std, -1.25 / std, -0.25 / std] + [0.75 / std] * 4
    torch.testing.assert_close(adv, torch.tensor(expected))
    # the flat group 1 is NOT zero here: no per-prompt baseline
    assert adv[4:].min().item() > 0.8
    # a flat batch gives 0, not NaN, even with std_eps = 0
    assert group_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), "reinforce_pp",
                            std_eps=0.0).tolist() == [0.0] * 4


def test_reinforce_pp_baseline_centres_per_group_then_normalises_over_the_batch():
    # centred: 0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0 (batch mean 0); squares sum 1 -> std sqrt(1/7) = 0.377964
    # -> +-0.5 / 0.377964 = +-1.322876
    adv = group_advantages(REWARDS, GROUP, "reinforce_pp_baseline", std_eps=0.0)
    a = 0.5 / math.sqrt(1 / 7)
    torch.testing.assert_close(adv, torch.tensor([a, -a, -a, a, 0.0, 0.0, 0.0, 0.0]))
    # eps sits in the denominator: 0.5 / (0.377964 + 0.1) = 1.046104
    adv = group_advantages(REWARDS, GROUP, "reinforce_pp_baseline", std_eps=0.1)
    assert adv[0].item() == pytest.approx(0.5 / (math.sqrt(1 / 7) + 0.1))


def test_reinforce_baseline_subtracts_the_batch_mean():
    # mean of REWARDS = (1 + 0 + 0 + 1 + 2 * 4) / 8 = 1.25, whatever the groups
    expected = [-0.25, -1.25, -1.25, -0.25, 0.75, 0.75, 0.75, 0.75]
    assert group_advantages(REWARDS, GROUP, "reinforce_baseline").tolist() == expected


def test_unknown_advantage_mode():
    with pytest.raises(ValueError, match="allowed: raw, grpo, grpo_no_std, dr_grpo, rloo"):
        group_advantages(REWARDS, GROUP, "ppo")


def test_config_choices_are_the_registries():
    """The config's allowed values and the functions that implement them are one list: a
    value the registry lacks is refused at load time, every registered one is accepted."""
    from reasonrl.config import load_config
    from reasonrl.errors import ConfigError

    for key, registry in (("advantage", ADVANTAGES), ("loss_agg", LOSS_AGGREGATIONS),
                          ("ratio_level", RATIO_LEVELS), ("policy_loss", POLICY_LOSSES),
                          ("kl_estimator", KL_ESTIMATORS)):
        assert dataclasses.fields(AlgoConfig)[[f.name for f in dataclasses.fields(AlgoConfig)].index(key)] \
            .metadata["choices"] is registry
        for name in registry.names():
            overrides = [f"algo.{key}={name}", "rollout.n=2", "trainer.batch_size=4"]
            assert getattr(load_config(None, overrides).algo, key) == name
        with pytest.raises(ConfigError, match=f"algo.{key}: 'nope' is not allowed; allowed values: "
                           + ", ".join(registry.names())):
            load_config(None, [f"algo.{key}=nope"])


def test_informative_groups_drops_flat_groups_with_a_float_tolerance():
    # group 0 mixed -> kept; group 1 all 2.0 -> dropped;
    # group 2 differs by 1e-7 (std 7.07e-8 <= 1e-6) -> dropped as flat; group 3 by 1e-3 -> kept
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0, 0.3, 0.3 + 1e-7, 0.5, 0.501], dtype=torch.float64)
    group = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    keep = informative_groups(rewards, group, tol=1e-6)
    assert keep.tolist() == [True, True, False, False, False, False, True, True]
    assert informative_groups(rewards, group, tol=0.0)[4:6].tolist() == [True, True]


def test_zero_variance_groups_counts_flat_groups():
    assert zero_variance_groups(REWARDS, GROUP) == 1
    assert zero_variance_groups(torch.tensor([1.0, 1.0 + 1e-9, 0.0, 1.0]), torch.tensor([0, 0, 1, 1])) == 1


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_token_aggregation():
    # (1 + 2 + 3 + 4 + 5) / 5 valid tokens; the masked 99 never counts
    assert aggregate(PER_TOKEN, MASK, "token", 5, 2).item() == pytest.approx(3.0)
    # as one micro-batch of a step with 10 tokens: 15 / 10
    assert aggregate(PER_TOKEN, MASK, "token", 10, 4).item() == pytest.approx(1.5)


def test_sequence_aggregation():
    # sequence means 2 and 4.5, mean over 2 sequences = 3.25; over a 4-sequence step = 1.625
    assert aggregate(PER_TOKEN, MASK, "sequence", 5, 2).item() == pytest.approx(3.25)
    assert aggregate(PER_TOKEN, MASK, "sequence", 5, 4).item() == pytest.approx(1.625)


def test_seq_mean_token_sum_aggregation():
    # sequence sums 6 and 9, mean over 2 sequences = 7.5; over a 4-sequence step = 3.75
    assert aggregate(PER_TOKEN, MASK, "seq_mean_token_sum", 5, 2).item() == pytest.approx(7.5)
    assert aggregate(PER_TOKEN, MASK, "seq_mean_token_sum", 5, 4).item() == pytest.approx(3.75)


def test_dr_grpo_constant_normaliser():
    # (6 + 9) / (2 sequences x max length 4) = 1.875, whatever the padded width (3 here)
    assert aggregate(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 5, 2, 4).item() == pytest.approx(1.875)
    # a 4-sequence step with budget 10: 15 / 40
    assert aggregate(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 5, 4, 10).item() == pytest.approx(0.375)
    # the same rows padded wider give the same value: the normaliser is not the width
    wide = torch.cat([PER_TOKEN, torch.full((2, 2), 7.0)], 1)
    wide_mask = torch.cat([MASK, torch.zeros(2, 2, dtype=MASK.dtype)], 1)
    assert aggregate(wide, wide_mask, "seq_mean_token_sum_norm", 5, 2, 4).item() == pytest.approx(1.875)
    with pytest.raises(ValueError, match="max_response_length"):
        aggregate(PER_TOKEN, MASK, "seq_mean_token_sum_norm", 5, 2)


@pytest.mark.parametrize("mode", LOSS_AGGREGATIONS.names())
def test_aggregation_split_sums_to_whole(mode):
    whole = aggregate(PER_TOKEN, MASK, mode, 5, 2, 4)
    # row 1 as its own micro-batch, padded only to its own length
    parts = (aggregate(PER_TOKEN[:1], MASK[:1], mode, 5, 2, 4)
             + aggregate(PER_TOKEN[1:, :2], MASK[1:, :2], mode, 5, 2, 4))
    torch.testing.assert_close(whole, parts)


def test_unknown_aggregation():
    with pytest.raises(ValueError, match="allowed: token, sequence, seq_mean_token_sum"):
        aggregate(PER_TOKEN, MASK, "mean", 5, 2)


LOGP = torch.tensor([math.log(0.5)])
REF = torch.tensor([math.log(0.25)])


def test_kl_estimators_hand_computed():
    # r = pi_ref / pi = 0.5; k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r
    assert kl_estimate(LOGP, REF, "k1").item() == pytest.approx(math.log(2))
    assert kl_estimate(LOGP, REF, "k2").item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimate(LOGP, REF, "k3").item() == pytest.approx(0.5 - 1 + math.log(2))


def test_kl_is_zero_when_equal_and_k3_nonnegative():
    x = torch.tensor([-0.3, -2.0, -5.0])
    for est in ("k1", "k2", "k3"):
        assert kl_estimate(x, x, est).abs().max().item() == 0.0
    assert (kl_estimate(x, x.flip(0), "k3") >= 0).all()
    with pytest.raises(ValueError, match="allowed: k1, k2, k3"):
        kl_estimate(x, x, "k4")


def test_k3_plus_has_the_value_of_k3_and_the_gradient_of_k2():
    # value: k3 = r - 1 - log r with r = 0.5 (as above); gradient: d k2 / d logp = logp - ref = log 2
    logp = LOGP.clone().requires_grad_(True)
    value = kl_estimate(logp, REF, "k3+")
    assert value.item() == kl_estimate(LOGP, REF, "k3").item()
    value.backward()
    assert logp.grad.item() == pytest.approx(math.log(2))
    k3 = LOGP.clone().requires_grad_(True)
    kl_estimate(k3, REF, "k3").backward()  # k3's own gradient: 1 - r = 0.5, not log 2
    assert k3.grad.item() == pytest.approx(0.5)


def test_kl_penalised_rewards():
    kl = torch.tensor([[0.1, 0.2, 5.0], [0.3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    out = kl_penalised_rewards(torch.tensor([1.0, 0.0]), kl, mask, beta=0.5)
    torch.testing.assert_close(out, torch.tensor([1.0 - 0.5 * 0.3, -0.5 * 0.3]))
    # per-completion sums must come as [N, 1]: a 1-D tensor would be summed over completions
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        kl_penalised_rewards(torch.tensor([1.0, 0.0]), torch.tensor([0.3, 0.3]), torch.ones(2), beta=0.5)


def test_overlong_penalty_hand_computed():
    # budget 10, buffer 4 -> no penalty up to 6 tokens, then -(len - 6) / 4, -1 at 10, capped at -1
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4),
                               torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    # factor scales it; buffer 0 turns it off
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, factor=0.5),
                               torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]))
    assert overlong_penalty(lengths, 10, 0).tolist() == [0.0] * 6


@pytest.mark.parametrize(("step", "expected"), [(0, 0.5), (1, 1.0), (2, 1.0), (9, 1.0)])
def test_lr_constant_with_warmup(step, expected):
    assert lr_multiplier(step, 10, "constant", 0.2, 0.0) == pytest.approx(expected)


@pytest.mark.parametrize(("step", "expected"), [(0, 1.0), (5, 0.1 + 0.9 * 0.5), (10, 0.1), (12, 0.1)])
def test_lr_cosine_to_min_ratio(step, expected):
    # no warmup, 11 steps: progress = step / 10
    assert lr_multiplier(step, 11, "cosine", 0.0, 0.1) == pytest.approx(expected)


@pytest.mark.parametrize(("step", "expected"), [
    (1, 1.0),  # the first step after a warm-up of 1: p = 0
    (3, 0.4),  # p = 2 / (5 - 1 - 1), cos(2 pi / 3) = -1/2: 0.2 + 0.8 * (1 - 1/2) / 2
    (4, 0.2),  # the last step: the floor
    (9, 0.2),  # past the last step (a run extended without trainer.steps): still the floor
])
def test_the_cosine_entry_hand_computed(step, expected):
    assert cosine(step, 1, 5, 0.2) == pytest.approx(expected, abs=1e-15)


def test_lr_schedules_are_a_registry_and_the_config_s_values_come_from_it(monkeypatch):
    from helpers import patch_entry

    assert LR_SCHEDULES.names() == ("constant", "cosine")
    assert constant(7, 2, 10, 0.3) == 1.0
    field = {f.name: f for f in dataclasses.fields(OptimConfig)}["schedule"]
    assert field.metadata["choices"] is LR_SCHEDULES
    assert all(entry.doc for entry in LR_SCHEDULES)
    with pytest.raises(ConfigError, match=r"^optim.schedule: 'cosin' is not allowed \(did you mean "
                                          r"'cosine'\?\); allowed values: constant, cosine$"):
        load_config(None, ["optim.schedule=cosin"])
    # a schedule is one registered function: the config accepts it, the warm-up comes before it
    patch_entry(monkeypatch, LR_SCHEDULES, "halving",
                lambda step, warmup, total, floor: 0.5 ** (step - warmup))
    assert load_config(None, ["optim.schedule=halving"]).optim.schedule == "halving"
    assert [lr_multiplier(s, 10, "halving", 0.2, 0.0) for s in range(5)] == [0.5, 1.0, 1.0, 0.5, 0.25]
