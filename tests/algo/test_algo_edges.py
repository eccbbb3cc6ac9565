"""The algorithms at the edges (hand-computed, gradients included): exact zeros for groups whose
rewards are all equal, every loss / KL estimator / importance correction finite at any log-ratio
(the bounds of reasonrl.algo.bounds, counted as train/clamped_frac), what an empty row counts in
`loss_agg=sequence`, and the dual clip's tie."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from helpers import loss_settings, policy_settings

from reasonrl.algo import (
    Metric,
    Totals,
    aggregate,
    group_advantages,
    masked_whiten,
    policy_objective,
)
from reasonrl.algo.advantages import flat_groups, group_mean_std
from reasonrl.algo.bounds import SEQUENCE_BOUNDS, TOKEN_BOUNDS, clamp_log_ratio
from reasonrl.algo.importance import importance_weights
from reasonrl.algo.kl import kl_clamped, kl_estimate
from reasonrl.algo.policy_loss import bounded_log_ratio
from reasonrl.batch import TrainBatch
from reasonrl.model.load import build_tiny_model
from reasonrl.registry import (
    ADVANTAGES,
    IMPORTANCE_CORRECTIONS,
    IMPORTANCE_LEVELS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    RATIO_LEVELS,
    needs_critic,
)
from reasonrl.workers.policy import PolicyWorker

GROUP_ESTIMATORS = [e.name for e in ADVANTAGES if e.needs_groups]
BATCH_ESTIMATORS = [e.name for e in ADVANTAGES
                    if not e.needs_groups and not needs_critic(e.name) and e.name != "raw"]
AWKWARD = [0.1, 1 / 3, 1e6 + 0.1]
EPS = [0.0, 1e-6, 1e-4]
E20 = math.exp(20.0)  # 485165195.4: exp of the token bound, the largest ratio a loss sees


def test_the_estimator_lists_cover_the_registry():
    """Every advantage estimator is tested below: the group ones, the batch ones, raw, and gae
    (which reads no groups: its whitening is tested instead)."""
    assert set(GROUP_ESTIMATORS) == {"grpo", "grpo_no_std", "dr_grpo", "rloo", "reinforce_pp_baseline"}
    assert set(BATCH_ESTIMATORS) == {"reinforce_baseline", "reinforce_pp"}
    assert set(ADVANTAGES.names()) == {*GROUP_ESTIMATORS, *BATCH_ESTIMATORS, "raw", "gae"}


# ---- exact zeros: a group whose rewards are all equal -----------------------------------------

def test_the_float32_mean_of_equal_rewards_is_not_the_reward():
    """Why the zeros need a rule: the group mean of 8 x 0.1, 8 x 1/3 and 8 x (1e6 + 0.1) in
    float32 is off the value (by 7.5e-9, 3e-8 and 0.0625), so r - mean and the std are not 0,
    and (r - mean) / (std + eps) was -0.935 for 8 x 0.1 at eps = 0."""
    group = torch.zeros(8, dtype=torch.long)
    for value, off in zip(AWKWARD, [7.450580596923828e-09, 2.9802322387695312e-08, 0.0625], strict=True):
        rewards = torch.full((8,), value)
        mean, std = group_mean_std(rewards, group)
        assert (rewards - mean).abs().max().item() == off and std.max().item() > 0
    assert flat_groups(torch.full((8,), 0.1), group).all()


@pytest.mark.parametrize("std_eps", EPS)
@pytest.mark.parametrize("value", AWKWARD)
@pytest.mark.parametrize("size", [3, 8])
@pytest.mark.parametrize("mode", GROUP_ESTIMATORS + BATCH_ESTIMATORS)
def test_equal_rewards_give_exactly_zero(mode, size, value, std_eps):
    rewards = torch.full((size,), value)
    advantages = group_advantages(rewards, torch.zeros(size, dtype=torch.long), mode, std_eps)
    assert (advantages == 0).all(), advantages.tolist()


@pytest.mark.parametrize("value", AWKWARD)
def test_raw_is_the_reward_itself(value):
    rewards = torch.full((8,), value)
    assert torch.equal(group_advantages(rewards, torch.zeros(8, dtype=torch.long), "raw"), rewards)


@pytest.mark.parametrize("std_eps", EPS)
@pytest.mark.parametrize("mode", ["grpo", "grpo_no_std", "dr_grpo", "rloo"])
def test_a_flat_group_beside_an_informative_one(mode, std_eps):
    """Groups 0 and 2 are flat (8 x 0.1 and 3 x (1e6 + 0.1), rows interleaved): exactly 0. Group 1
    (0.1, 0.2, 0.3, 0.7): mean 0.325, deviations -0.225, -0.125, -0.025, 0.375, squares sum
    0.2075, unbiased std sqrt(0.2075 / 3) = 0.262996; its values are bitwise those it gets alone."""
    rewards = torch.cat([torch.full((8,), 0.1), torch.tensor([0.1, 0.2, 0.3, 0.7]),
                         torch.full((3,), 1e6 + 0.1)])
    group = torch.tensor([0] * 8 + [1] * 4 + [2] * 3)
    order = torch.randperm(15, generator=torch.Generator().manual_seed(0))  # groups need not be contiguous
    shuffled = group_advantages(rewards[order], group[order], mode, std_eps)
    advantages = torch.empty(15)
    advantages[order] = shuffled
    assert (advantages[:8] == 0).all() and (advantages[12:] == 0).all()
    deviation = torch.tensor([-0.225, -0.125, -0.025, 0.375])
    expected = {"grpo": deviation / (math.sqrt(0.2075 / 3) + std_eps), "grpo_no_std": deviation,
                "dr_grpo": deviation, "rloo": deviation * 4 / 3}[mode]
    torch.testing.assert_close(advantages[8:12], expected)
    varied_rows = group[order] == 1  # the same rewards in the same order, without the flat groups
    alone = group_advantages(rewards[order][varied_rows], torch.zeros(4, dtype=torch.long), mode, std_eps)
    assert torch.equal(shuffled[varied_rows], alone)


@pytest.mark.parametrize("std_eps", EPS)
def test_reinforce_pp_baseline_gives_a_flat_group_exactly_zero(std_eps):
    """Group 0 flat (8 x 1/3), group 1 (0, 1, 0, 1): centred x = 0 x 8, -0.5, 0.5, -0.5, 0.5;
    batch mean 0, squares sum 1 over 12 rows: std sqrt(1 / 11) = 0.301511; group 1 gets
    +-0.5 / (0.301511 + eps), group 0 exactly 0 (in float32 the batch mean of x is rounding
    noise, which would leave it -mean / std otherwise)."""
    rewards = torch.tensor([1 / 3] * 8 + [0.0, 1.0, 0.0, 1.0])
    group = torch.tensor([0] * 8 + [1] * 4)
    advantages = group_advantages(rewards, group, "reinforce_pp_baseline", std_eps)
    assert (advantages[:8] == 0).all()
    a = 0.5 / (math.sqrt(1 / 11) + std_eps)
    torch.testing.assert_close(advantages[8:], torch.tensor([-a, a, -a, a]))


@pytest.mark.parametrize("mode", BATCH_ESTIMATORS)
def test_batch_estimators_have_no_groups(mode):
    """reinforce_baseline and reinforce_pp read no groups: a flat group in a varied batch keeps
    r - mean(batch) (here 1/3 - 0.4 = -0.066667 of batch mean (4/3 + 0.4 + 0.8) / 6 = 0.422222...)
    and is not 0; only a flat batch is."""
    rewards = torch.tensor([1 / 3] * 4 + [0.4, 0.8])
    advantages = group_advantages(rewards, torch.tensor([0, 0, 0, 0, 1, 1]), mode, 0.0)
    centred = torch.tensor([1 / 3 - 0.422222] * 4 + [0.4 - 0.422222, 0.8 - 0.422222])
    expected = centred if mode == "reinforce_baseline" else centred / centred.std()
    torch.testing.assert_close(advantages, expected, atol=1e-5, rtol=1e-5)
    assert (advantages[:4] != 0).all()


def test_flat_means_exactly_equal():
    """One ulp apart is not flat (those rewards differ; `informative_groups` is the tolerant
    filter); NaN never is."""
    one = torch.tensor(1.0)
    ulp = torch.nextafter(one, torch.tensor(2.0)).item()
    rewards = torch.tensor([1.0, ulp, 2.0, 2.0, float("nan"), float("nan")])
    assert flat_groups(rewards, torch.tensor([0, 0, 1, 1, 2, 2])).tolist() == [False, False, True, True,
                                                                               False, False]


def test_whitening_equal_token_advantages_gives_exactly_zero():
    """PPO's whitening (gae's advantages): 6 valid tokens of 0.1 (padding 9) -> 0, where
    (x - mean) * rsqrt(var + 1e-8) magnified the ulp of the mean 1e4-fold."""
    x = torch.tensor([[0.1, 0.1, 0.1, 9.0], [0.1, 0.1, 0.1, 0.1]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    assert (masked_whiten(x, mask) == 0).all()
    assert (masked_whiten(torch.full((1, 7), 0.1), torch.ones(1, 7)) == 0).all()


# ---- finite at any log-ratio ------------------------------------------------------------------

LOG_RATIOS = [1.0, -1.0, 30.0, -30.0, 100.0, -100.0, 1e4, -1e4]


def logprobs(log_ratio: float, shape=(1, 1)) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp with gradient, old_logp): both <= 0, logp - old_logp = log_ratio."""
    logp = torch.full(shape, min(log_ratio, 0.0), requires_grad=True)
    return logp, torch.full(shape, min(-log_ratio, 0.0))


def test_clamp_log_ratio_is_the_identity_inside_the_bounds():
    x = torch.tensor([-25.0, -20.0, -3.5, 0.0, 1e-7, 19.999998, 20.0, 20.5, 1e30, float("nan")],
                     requires_grad=True)
    y, clamped = clamp_log_ratio(x, TOKEN_BOUNDS)
    y.sum().backward()
    assert torch.equal(y[1:7], x[1:7]) and y[0].item() == -20.0 and y[7].item() == y[8].item() == 20.0
    assert math.isnan(y[9].item())
    assert clamped.tolist() == [True] + [False] * 6 + [True, True, False]
    assert x.grad.tolist() == [0.0] + [1.0] * 6 + [0.0, 0.0, 0.0]
    assert SEQUENCE_BOUNDS == (-20.0, 10.0) and TOKEN_BOUNDS == (-20.0, 20.0)
    assert {e.name: e.bounds for e in RATIO_LEVELS} == {"token": TOKEN_BOUNDS,
                                                                 "sequence": SEQUENCE_BOUNDS}


@pytest.mark.parametrize("agg", LOSS_AGGREGATIONS.names())
@pytest.mark.parametrize("clip_ratio_c", [0.0, 3.0])
@pytest.mark.parametrize("level", RATIO_LEVELS.names())
@pytest.mark.parametrize("loss_name", POLICY_LOSSES.names())
def test_every_loss_is_finite_in_value_and_gradient_at_any_log_ratio(loss_name, level, clip_ratio_c, agg):
    """Every loss x ratio level x dual clip x aggregation, at log-ratios +-1, +-30, +-100, +-1e4
    and A = +-1 (one row each, two tokens, one of them padding)."""
    ctx = loss_settings(policy_loss=loss_name, ratio_level=level, clip_ratio_c=clip_ratio_c, loss_agg=agg)
    mask = torch.tensor([[1.0, 0.0]])
    for log_ratio in LOG_RATIOS:
        for adv in (1.0, -1.0):
            logp, old = logprobs(log_ratio, (1, 2))
            loss, stats = POLICY_LOSSES.get(loss_name)(logp, old, torch.tensor([[adv]]), mask, ctx)
            total = aggregate(loss, mask, agg, 1.0, 1.0, 2.0)
            total.backward()
            what = f"{loss_name} {level} c={clip_ratio_c} {agg} log-ratio {log_ratio} A={adv}"
            assert torch.isfinite(loss).all() and torch.isfinite(logp.grad).all(), what
            assert torch.isfinite(stats["ratio"]).all(), what
            low, high = TOKEN_BOUNDS if level == "token" or loss_name == "gmpo" else SEQUENCE_BOUNDS
            assert stats["clamped"][0, 0].item() == (not low <= log_ratio <= high), what


def test_inside_the_bounds_every_value_and_gradient_is_bitwise_the_unclamped_one(monkeypatch):
    """On ordinary inputs (log-ratios of a few tenths) the objective with the bounds is the one
    without, bitwise: loss, gradient and every metric, for every loss x ratio level x
    aggregation x KL estimator (in the loss) x dual clip, with an entropy bonus and TIS."""
    import reasonrl.algo.kl
    import reasonrl.algo.policy_loss

    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 6, generator=gen) * 4
    inputs = {name: old + torch.randn(4, 6, generator=gen) * sd
              for name, sd in (("logp", 0.3), ("ref", 0.5), ("engine", 0.2))}
    inputs.update(entropy=torch.rand(4, 6, generator=gen), adv=torch.randn(4, generator=gen))
    mask = (torch.arange(6)[None] < torch.tensor([6, 4, 2, 1])[:, None]).float()

    def objectives() -> list:
        found = []
        for loss_name in POLICY_LOSSES.names():
            for level in RATIO_LEVELS.names():
                for agg in LOSS_AGGREGATIONS.names():
                    for kl in [None, *KL_ESTIMATORS.names()]:
                        for c in (0.0, 3.0):
                            ctx = loss_settings(policy_loss=loss_name, ratio_level=level, loss_agg=agg,
                                               beta=0.1 if kl else 0.0, kl_estimator=kl or "k3",
                                               clip_ratio_c=c, entropy_coef=0.01, importance_correction="tis")
                            logp = inputs["logp"].clone().requires_grad_(True)
                            loss, metrics = policy_objective(
                                logp, old, inputs["adv"], mask, ctx, Totals(13.0, 4.0, 6.0),
                                inputs["entropy"], inputs["ref"] if kl else None, inputs["engine"])
                            loss.backward()
                            found.append((loss.detach(), logp.grad, {k: m.value for k, m in metrics.items()}))
        return found

    bounded = objectives()

    def unbounded(x, bounds=TOKEN_BOUNDS):
        return x, torch.zeros_like(x, dtype=torch.bool)

    monkeypatch.setattr(reasonrl.algo.policy_loss, "clamp_log_ratio", unbounded)
    monkeypatch.setattr(reasonrl.algo.kl, "clamp_log_ratio", unbounded)
    plain = objectives()
    combinations = (len(POLICY_LOSSES.names()) * len(RATIO_LEVELS.names()) * len(LOSS_AGGREGATIONS.names())
                    * (len(KL_ESTIMATORS.names()) + 1) * 2)
    assert len(bounded) == len(plain) == combinations
    for (loss_a, grad_a, metrics_a), (loss_b, grad_b, metrics_b) in zip(bounded, plain, strict=True):
        assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b) and metrics_a == metrics_b


def one_token(loss_name: str, log_ratio: float, adv: float, **ctx) -> tuple[float, float, dict]:
    """(loss, d loss / d logp, stats) of one token at `log_ratio`, token level."""
    logp, old = logprobs(log_ratio)
    loss, stats = POLICY_LOSSES.get(loss_name)(logp, old, torch.tensor([[adv]]), torch.ones(1, 1),
                                               loss_settings(**ctx))
    loss.sum().backward()
    return loss.item(), logp.grad.item(), {k: v.float().item() for k, v in stats.items()}


def test_ppo_beyond_the_bound_hand_computed():
    """log-ratio +100 (clamped to 20, rho = e^20): A = 1 -> min(e^20, 1.2) -> -1.2; A = -1 ->
    max(e^20, 1.2) = e^20 = 4.85e8 (was 2.7e43 -> inf, and 1.07e13 at +30), with dual clip c = 3
    -> 3. Every gradient 0 (the clamp passes none; it was NaN). -100 (rho = e^-20 = 2.1e-9):
    A = 1 -> -2.1e-9, A = -1 -> max(-2.1e-9, 0.8) = 0.8."""
    for log_ratio in (30.0, 100.0, 1e4):
        loss, grad, stats = one_token("ppo", log_ratio, 1.0)
        assert (loss, grad, stats["clamped"], stats["clip_frac"]) == (pytest.approx(-1.2), 0.0, 1.0, 1.0)
        loss, grad, stats = one_token("ppo", log_ratio, -1.0)
        assert (loss, grad, stats["clamped"]) == (pytest.approx(E20, rel=1e-6), 0.0, 1.0)
        loss, grad, stats = one_token("ppo", log_ratio, -1.0, clip_ratio_c=3.0)
        assert (loss, grad, stats["dual_clip_frac"]) == (pytest.approx(3.0), 0.0, 1.0)
    loss, grad, stats = one_token("ppo", -100.0, 1.0)
    assert (loss, grad, stats["clamped"]) == (pytest.approx(-math.exp(-20), rel=1e-6), 0.0, 1.0)
    loss, grad, _ = one_token("ppo", -100.0, -1.0)
    assert (loss, grad) == (pytest.approx(0.8), 0.0)


def test_ppo_at_and_inside_the_bound_is_the_formula():
    """At log-ratio 20 exactly (not clamped) A = -1 gives loss e^20 and gradient e^20; at 1,
    e = 2.718282 both; at -1 with A = 1, -e^-1 = -0.367879 both."""
    loss, grad, stats = one_token("ppo", 20.0, -1.0)
    assert (loss, grad, stats["clamped"]) == (pytest.approx(E20, rel=1e-6), pytest.approx(E20, rel=1e-6), 0.0)
    loss, grad, _ = one_token("ppo", 1.0, -1.0)
    assert (loss, grad) == (pytest.approx(math.e), pytest.approx(math.e))
    loss, grad, _ = one_token("ppo", -1.0, 1.0)
    assert (loss, grad) == (pytest.approx(-math.exp(-1)), pytest.approx(-math.exp(-1)))


def test_gspo_sequence_bound_is_ten():
    """ratio_level=sequence, two tokens with log-ratios 40 and 20 (mean 30 > 10): s = e^10 =
    22026.47 at both, A = -1 -> loss 22026.47 at each, no gradient; mean 9 (log-ratios 8, 10):
    s = e^9 = 8103.08, gradient s / |y| = 4051.54 per token under `sequence` aggregation."""
    mask = torch.ones(1, 2)
    ctx = loss_settings(ratio_level="sequence")
    ppo = POLICY_LOSSES.get("ppo")
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, stats = ppo(logp, torch.tensor([[-40.0, -20.0]]), torch.tensor([[-1.0]]), mask, ctx)
    aggregate(loss, mask, "sequence", 2.0, 1.0).backward()
    torch.testing.assert_close(loss, torch.full((1, 2), math.exp(10)))
    assert logp.grad.tolist() == [[0.0, 0.0]] and stats["clamped"].tolist() == [[True, True]]
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, stats = ppo(logp, torch.tensor([[-8.0, -10.0]]), torch.tensor([[-1.0]]), mask, ctx)
    aggregate(loss, mask, "sequence", 2.0, 1.0).backward()
    torch.testing.assert_close(loss, torch.full((1, 2), math.exp(9)))
    torch.testing.assert_close(logp.grad, torch.full((1, 2), math.exp(9) / 2))
    assert not stats["clamped"].any()
    # below: a mean of -30 is clamped to -20 (s = 2.1e-9), A = 1: loss -s, no gradient
    logp = torch.full((1, 2), -30.0, requires_grad=True)
    loss, stats = ppo(logp, torch.zeros(1, 2), torch.tensor([[1.0]]), mask, ctx)
    torch.testing.assert_close(loss, torch.full((1, 2), -math.exp(-20)))
    assert stats["clamped"].all()


def test_sapo_cispo_gmpo_beyond_the_bound_hand_computed():
    # sapo, +100, A = 1 (tau 1): gate sigmoid(e^20 - 1) * 4 = 4 -> loss -4, gradient 0 (was NaN)
    loss, grad, stats = one_token("sapo", 100.0, 1.0)
    assert (loss, grad, stats["gate_mean"], stats["clamped"]) == (-4.0, 0.0, 4.0, 1.0)
    # sapo, -100, A = -1 (tau 1.05): gate sigmoid(1.05 * (e^-20 - 1)) * 4 / 1.05 = 0.987524
    loss, grad, _ = one_token("sapo", -100.0, -1.0)
    assert loss == pytest.approx(4 / 1.05 / (1 + math.exp(1.05)), rel=1e-6) and grad == 0.0
    # cispo keeps the REINFORCE gradient at any ratio: +100, A = 1: weight clip(e^20) = 1.2, logp = 0
    # -> loss -0.0, gradient -1.2; -1e4, A = -1: weight 0.8, logp = -1e4 -> loss -8000, gradient 0.8
    loss, grad, stats = one_token("cispo", 100.0, 1.0)
    assert (loss, grad, stats["clip_frac"], stats["clamped"]) == (0.0, pytest.approx(-1.2), 1.0, 1.0)
    loss, grad, _ = one_token("cispo", -1e4, -1.0)
    assert (loss, grad) == (pytest.approx(-8000.0), pytest.approx(0.8))
    # gmpo, +100, A = -1: l = 20 (bound), kept max(20, 0.4) = 20 -> loss e^20, no gradient (was inf);
    # A = 1: kept min(20, 0.4) = 0.4 -> loss -e^0.4 = -1.491825, no gradient
    loss, grad, stats = one_token("gmpo", 100.0, -1.0, clip_low=0.4, clip_high=0.4)
    assert (loss, grad, stats["clamped"]) == (pytest.approx(E20, rel=1e-6), 0.0, 1.0)
    loss, grad, _ = one_token("gmpo", 100.0, 1.0, clip_low=0.4, clip_high=0.4)
    assert (loss, grad) == (pytest.approx(-math.exp(0.4)), 0.0)


@pytest.mark.parametrize("estimator", KL_ESTIMATORS.names())
def test_every_kl_estimator_is_finite_at_any_log_ratio(estimator):
    for log_ratio in LOG_RATIOS:  # here log r = ref_logp - logp
        logp = torch.full((1, 1), min(-log_ratio, 0.0), requires_grad=True)
        ref = torch.full((1, 1), min(log_ratio, 0.0))
        kl = kl_estimate(logp, ref, estimator)
        kl.sum().backward()
        assert torch.isfinite(kl).all() and torch.isfinite(logp.grad).all(), (estimator, log_ratio)
        bounded = KL_ESTIMATORS[estimator].bounded
        assert kl_clamped(logp, ref, estimator).item() == (bounded and abs(log_ratio) > 20)


def test_k3_beyond_the_bound_hand_computed():
    """k3 = e^x - x - 1 with x = ref_logp - logp clamped to [-20, 20]: x = 100 -> e^20 - 21 =
    4.85e8 (was inf), gradient 0; x = -100 -> e^-20 + 19 = 19, gradient 0; x = 1 -> e - 2 =
    0.718282, gradient d/dlogp = -(e^x - 1) = -1.718282. k3+ has k3's value and k2's gradient,
    logp - ref = -x (finite at any x: -100, 100)."""
    def k(estimator: str, x: float) -> tuple[float, float]:
        logp = torch.full((1, 1), min(-x, 0.0), requires_grad=True)
        kl = kl_estimate(logp, torch.full((1, 1), min(x, 0.0)), estimator)
        kl.sum().backward()
        return kl.item(), logp.grad.item()
    assert k("k3", 100.0) == (pytest.approx(E20 - 21, rel=1e-6), 0.0)
    assert k("k3", -100.0) == (pytest.approx(19.0), 0.0)
    assert k("k3", 1.0) == (pytest.approx(math.e - 2), pytest.approx(-(math.e - 1)))
    assert k("k3+", 100.0) == (pytest.approx(E20 - 21, rel=1e-6), -100.0)
    assert k("k3+", -100.0) == (pytest.approx(19.0), 100.0)
    assert k("k1", 1e4) == (-1e4, 1.0) and k("k2", -1e4) == (5e7, 1e4)


@pytest.mark.parametrize("level", IMPORTANCE_LEVELS.names())
@pytest.mark.parametrize("correction", IMPORTANCE_CORRECTIONS.names())
def test_every_correction_is_finite_and_bounded_at_any_log_ratio(correction, level):
    """rho = exp(old - engine) overflows to inf or underflows to 0 at +-100 (sequence: +-200),
    +-1e4; the weight stays in [0, cap] (tis: the cap; mis, decoupled: 0 above it), detached, and
    composed with ppo in the objective the loss and gradient stay finite."""
    ctx = loss_settings(importance_correction=correction, importance_level=level, importance_cap=2.0,
                       importance_floor=0.5)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    for log_rho in LOG_RATIOS:
        old = torch.full((1, 3), min(log_rho, 0.0))
        engine = torch.full((1, 3), min(-log_rho, 0.0))
        weight, stats = importance_weights(old, engine, mask, ctx)
        assert torch.isfinite(weight).all() and (weight >= 0).all() and (weight <= 2.0).all()
        assert all(torch.isfinite(v.float()).all() for v in stats.values())
        logp = old.clone().requires_grad_(True)
        loss, metrics = policy_objective(logp, old, torch.tensor([-1.0]), mask, ctx, Totals(2.0, 1.0),
                                         engine_logp=engine)
        loss.backward()
        assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
        assert all(math.isfinite(m.value) for m in metrics.values()), metrics
    # hand values at +100 (token level: rho = inf): tis -> 2, mis and decoupled -> 0; at -100:
    # tis and decoupled keep rho = e^-100 = 3.8e-44, mis drops it (below the floor 0.5)
    if level == "token" and correction != "none":
        high, _ = importance_weights(torch.zeros(1, 1), torch.full((1, 1), -100.0), torch.ones(1, 1), ctx)
        low, _ = importance_weights(torch.full((1, 1), -100.0), torch.zeros(1, 1), torch.ones(1, 1), ctx)
        assert high.item() == {"tis": 2.0, "mis": 0.0, "decoupled": 0.0}[correction]
        assert low.item() == (0.0 if correction == "mis" else torch.exp(torch.tensor(-100.0)).item())


# ---- counted: train/clamped_frac --------------------------------------------------------------

def test_the_objective_counts_clamped_tokens():
    """4 tokens in the step (two rows of 2): token (0, 1) has log-ratio +50 (clamped), the rest
    0.1. clamped_frac = 1 / 4. With k3 in the loss and the reference 30 nats above the policy
    at token (1, 0), 2 / 4; with the same KL in the reward (not in this loss), still 1 / 4.
    Ordinary tokens' loss and gradient: those of the formula, bitwise as without any clamp."""
    mask = torch.ones(2, 2)
    old = torch.full((2, 2), -1.0)
    shift = torch.tensor([[0.1, 50.0], [0.1, 0.1]])
    ref = old.clone()
    ref[1, 0] = 29.0 + 0.1  # ref - logp = 30 at token (1, 0)
    step = Totals(4.0, 2.0)
    for settings, expected in ((loss_settings(), 0.25), (loss_settings(beta=0.1), 0.5),
                               (loss_settings(beta=0.1, kl_in="reward"), 0.25),
                               (loss_settings(beta=0.1, kl_estimator="k2"), 0.25)):
        logp = (old + shift).requires_grad_(True)
        loss, metrics = policy_objective(logp, old, torch.tensor([1.0, -1.0]), mask, settings, step,
                                         ref_logp=ref)
        loss.backward()
        assert metrics["clamped_frac"] == Metric(expected), settings
        assert torch.isfinite(logp.grad).all()
    # the unclamped tokens' loss is the formula: A = 1 at ratio e^0.1 = 1.105 -> -1.105171 / 4
    logp = (old + shift).requires_grad_(True)
    loss, _ = policy_objective(logp, old, torch.tensor([1.0, 0.0]), mask, loss_settings(), step)
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-math.exp(0.1) / 4, 0.0], [0.0, 0.0]]))
    assert loss.item() == pytest.approx((-math.exp(0.1) - 1.2) / 4)


def test_clamped_tokens_reach_the_step_metrics_and_the_update_is_not_skipped():
    """Through the worker: 2 mini-batches (the old log-probs are computed first), row 0's old
    log-probs shifted 100 nats down: its log-ratio is +100 at each of its 3 tokens. Update 1 (rows
    0 and 1, 4 tokens) has 3 / 4 clamped, update 2 none: train/clamped_frac = (0.75 + 0) / 2.
    Without the bound the update's gradient was NaN and the update skipped."""
    model, _ = build_tiny_model(seed=3)
    prompts = [[1, 5, 9, 11], [1, 7], [1, 5, 9, 11], [3, 4, 5, 6, 7, 8]]
    completions = [[20, 21, 2], [30], [40, 41, 42, 43, 44], [50, 51]]
    worker = PolicyWorker(model, pad_id=0, settings=policy_settings(mini_batches=2, lr=0.0))
    row_logprobs = worker.row_logprobs

    def shifted(*args, **kwargs):
        rows = row_logprobs(*args, **kwargs)
        return [rows[0] - 100.0, *rows[1:]]

    worker.row_logprobs = shifted
    metrics = worker.train_step(TrainBatch(prompts, completions, torch.tensor([-1.0, 1.0, 0.5, -0.5])))
    assert metrics["train/clamped_frac"] == pytest.approx(0.375)
    assert metrics["train/skipped_update"] == 0.0 and math.isfinite(metrics["train/grad_norm"])
    assert metrics["train/ratio_max"] == pytest.approx(E20, rel=1e-5)


# ---- loss_agg=sequence: an empty row is not a sequence of the step ---------------------------

def test_totals_count_the_rows_with_a_token_in_the_loss():
    assert Totals.of([2, 0, 1], 8.0) == Totals(3.0, 2.0, 8.0)
    assert Totals.of([]) == Totals(0.0, 0.0)


def test_sequence_aggregation_leaves_an_empty_row_out_hand_computed():
    """Rows of 2, 0 and 1 valid tokens, per-token losses [1, 3 | pad], [5, 5, 5 all masked],
    [4 | pad, pad]: per-row means 2, (none), 4 -> (2 + 4) / 2 = 3 (TRL's .mean() over rows would
    give (2 + 0 + 4) / 3 = 2). Gradient: 1 / (2 * 2) = 0.25 on row 0's tokens, 1 / 2 on row 2's,
    0 elsewhere. seq_mean_token_sum: (4 + 4) / 2 = 4; seq_mean_token_sum_norm with L = 3:
    (4 + 4) / (2 * 3) = 4 / 3."""
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    step = Totals.of([2, 0, 1], 3.0)
    per_token = torch.tensor([[1.0, 3.0, 9.0], [5.0, 5.0, 5.0], [4.0, 7.0, 7.0]], requires_grad=True)
    value = aggregate(per_token, mask, "sequence", step.tokens, step.sequences)
    value.backward()
    assert value.item() == 3.0
    assert per_token.grad.tolist() == [[0.25, 0.25, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]
    assert aggregate(per_token, mask, "seq_mean_token_sum", step.tokens, step.sequences).item() == 4.0
    assert aggregate(per_token, mask, "seq_mean_token_sum_norm", step.tokens, step.sequences,
                     step.max_response_length).item() == pytest.approx(4 / 3)


def test_the_worker_leaves_an_empty_row_out_of_the_sequence_mean():
    """A row whose every token is the environment's (token mask all 0) in `loss_agg=sequence`:
    on-policy the loss is -(1/2) sum over the two other rows of A_i mean_t logp_it, so its
    gradient is that of the rows alone, 2 of them (the empty row neither adds nor counts).

    Equal up to float32 rounding only: the 3-row and the 2-row batch are other matrix shapes,
    which BLAS splits into other partial sums (and otherwise on each CPU: AVX2, AMX, ARM; and at
    each thread count). Each gradient is a chain of float32 sums, the longest over the vocabulary
    (V = 49152: the softmax's normaliser and the tied head's backward W^T (p - y)); a sum of n
    products errs by at most n eps sum|a_i b_i| (eps = 2^-24), each |a_i b_i| here at most the
    tensor's largest gradient, so two roundings differ by at most V eps max|g| = 2.9e-3 max|g| per
    tensor (seen: 3e-6 max|g| at 2 threads, 0 at 1 here; 2.1e-6 of 0.72 on an AMD EPYC). The
    mistake it catches, the empty row counted (a mean over 3 rows, not 2), scales every gradient
    by 2/3: off by max|g| / 3, 100 times the tolerance. Each batch runs at 1 and at 2 threads,
    and every pair is compared: two kernels' roundings on this CPU too."""
    model, _ = build_tiny_model(seed=3)
    prompts, completions = [[1, 5, 9, 11], [1, 7], [3, 4, 5]], [[20, 21, 2], [30, 31], [50]]
    advantages = torch.tensor([1.0, 2.0, -0.5])

    def grads(masks, rows) -> dict[str, torch.Tensor]:
        copy_ = copy.deepcopy(model)
        worker = PolicyWorker(copy_, pad_id=0, settings=policy_settings(loss_agg="sequence", lr=0.0,
                                                                        max_grad_norm=0.0))
        captured = {}
        step = worker.learner.optimizer.step

        def capture(*args, **kwargs):
            captured.update({n: p.grad.clone() for n, p in copy_.named_parameters()})
            return step(*args, **kwargs)

        worker.learner.optimizer.step = capture
        worker.train_step(TrainBatch([prompts[i] for i in rows], [completions[i] for i in rows],
                                     advantages[rows], token_mask=[masks[i] for i in rows]))
        return captured

    masks = [[1, 1, 1], [0, 0], [1]]
    threads, with_empty, without = torch.get_num_threads(), [], []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            with_empty.append(grads(masks, [0, 1, 2]))
            without.append(grads(masks, [0, 2]))
    finally:
        torch.set_num_threads(threads)
    vocab = model.config.vocab_size
    for a, b in itertools.product(with_empty, without):
        for name, grad in b.items():
            bound = vocab * 2.0 ** -24 * grad.abs().max().item()
            torch.testing.assert_close(a[name], grad, rtol=0.0, atol=bound, msg=name)


# ---- the dual clip's tie ---------------------------------------------------------------------

def test_a_dual_clip_tie_keeps_the_surrogate_gradient():
    """rho = c = 3 exactly (float32(log 3) exponentiates to 3.0), A = -1: PPO's loss max(3, 1.2)
    = 3 equals the cap -A c = 3. The tie takes the surrogate's side: loss 3, gradient -A rho = 3
    (verl and AReaL's torch.min would give 1.5, half to each side), not counted as dual-clipped.
    One ulp above: the cap, gradient 0, counted. A = -2: loss 6, gradient 6."""
    log3 = torch.tensor(math.log(3.0))
    assert torch.exp(log3).item() == 3.0
    ppo, one, dual = POLICY_LOSSES.get("ppo"), torch.ones(1, 1), loss_settings(clip_ratio_c=3.0)
    for adv, expected in ((-1.0, 3.0), (-2.0, 6.0)):
        logp = log3.reshape(1, 1).clone().requires_grad_(True)
        loss, stats = ppo(logp, torch.zeros(1, 1), torch.tensor([[adv]]), one, dual)
        loss.sum().backward()
        assert (loss.item(), logp.grad.item()) == (expected, expected)
        assert not stats["dual_clip_frac"].any() and not stats["clip_frac"].any()
    above = torch.nextafter(log3, torch.tensor(2.0)).reshape(1, 1).requires_grad_(True)
    loss, stats = ppo(above, torch.zeros(1, 1), torch.tensor([[-1.0]]), one, dual)
    loss.sum().backward()
    assert (loss.item(), above.grad.item()) == (3.0, 0.0) and stats["dual_clip_frac"].all()


def test_bounded_log_ratio_is_the_one_place():
    """`bounded_log_ratio` clamps a log-ratio of 1e4 to 20 (token) or 10 (sequence), and every
    loss reads its log-ratio through it (gmpo at token level): each reports every token clamped
    and a finite ratio."""
    logp, old = torch.zeros(1, 2), torch.full((1, 2), -1e4)
    for level, bound in (("token", 20.0), ("sequence", 10.0)):
        log_ratio, clamped = bounded_log_ratio(logp, old, torch.ones(1, 2), level)
        assert log_ratio.tolist() == [[bound, bound]] and clamped.all()
    for name in POLICY_LOSSES.names():
        _, stats = POLICY_LOSSES.get(name)(logp, old, torch.ones(1, 1), torch.ones(1, 2), loss_settings())
        assert stats["clamped"].all() and torch.isfinite(stats["ratio"]).all(), name
