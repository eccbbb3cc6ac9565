"""reasonrl.algo.policy_loss: every `algo.policy_loss` entry and ratio level, hand-computed.
Each case is one token (or one completion) with a known ratio rho = exp(logp - old_logp), its
loss value and its gradient d loss / d logp."""

import copy
import dataclasses
import math
import pickle

import pytest
import torch
from helpers import loss_settings, patch_entry

from reasonrl.algo import (
    LossSettings,
    Totals,
    ValueLossSettings,
    aggregate,
    log_importance_ratio,
    policy_objective,
)
from reasonrl.config import AlgoConfig
from reasonrl.registry import POLICY_LOSSES


def loss_of(name: str, logp: torch.Tensor, old: torch.Tensor, adv: list[float], mask=None, **ctx):
    """(per-token loss, stats) of policy loss `name` with advantages [N] laid out as [N, 1]."""
    mask = torch.ones_like(logp) if mask is None else mask
    return POLICY_LOSSES.get(name)(logp, old, torch.tensor(adv)[:, None], mask, loss_settings(**ctx))


def one_token(name: str, ratio: float, adv: float, **ctx) -> tuple[float, dict, float]:
    """(loss, stats as floats, gradient) of one token with importance ratio `ratio`."""
    logp = torch.full((1, 1), math.log(ratio), requires_grad=True)
    loss, stats = loss_of(name, logp, torch.zeros(1, 1), [adv], **ctx)
    loss.sum().backward()
    assert stats["ratio"].item() == pytest.approx(ratio)
    return loss.item(), {k: v.float().item() for k, v in stats.items()}, logp.grad.item()


def test_every_loss_is_a_config_choice():
    field = {f.name: f for f in dataclasses.fields(AlgoConfig)}["policy_loss"]
    assert field.metadata["choices"] is POLICY_LOSSES and field.default == "ppo"
    assert set(POLICY_LOSSES.names()) >= {"ppo", "cispo", "gmpo", "sapo"}


# ---- ppo: the clipped surrogate (the default) -------------------------------------------------

def test_ppo_positive_advantage_above_upper_clip():
    # ratio 1.5 > 1 + 0.2: objective min(1.5, 1.2) * 1 -> loss -1.2, no gradient
    loss, stats, grad = one_token("ppo", 1.5, 1.0)
    assert loss == pytest.approx(-1.2) and stats["clip_frac"] == 1.0 and grad == 0.0


def test_ppo_positive_advantage_below_lower_clip_is_not_clipped():
    # ratio 0.5: min(0.5, 0.8) = 0.5 -> loss -0.5, gradient -A * ratio = -0.5
    loss, stats, grad = one_token("ppo", 0.5, 1.0)
    assert loss == pytest.approx(-0.5) and stats["clip_frac"] == 0.0 and grad == pytest.approx(-0.5)


def test_ppo_negative_advantage_below_lower_clip():
    # ratio 0.5 < 1 - 0.2 with A = -1: min(-0.5, -0.8) = -0.8 -> loss 0.8, no gradient
    loss, stats, grad = one_token("ppo", 0.5, -1.0)
    assert loss == pytest.approx(0.8) and stats["clip_frac"] == 1.0 and grad == 0.0


def test_ppo_negative_advantage_above_upper_is_not_clipped():
    loss, stats, grad = one_token("ppo", 1.5, -1.0)
    assert loss == pytest.approx(1.5) and stats["clip_frac"] == 0.0 and grad == pytest.approx(1.5)


def test_ppo_asymmetric_bounds():
    # clip_high 0.28 (DAPO): ratio 1.25 is inside, 1.3 is clipped to 1.28
    assert one_token("ppo", 1.25, 2.0, clip_high=0.28)[0] == pytest.approx(-2.5)
    loss, stats, _ = one_token("ppo", 1.3, 2.0, clip_high=0.28)
    assert loss == pytest.approx(-2.56) and stats["clip_frac"] == 1.0


def test_ppo_on_policy_ratio_gives_reinforce_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, stats = loss_of("ppo", logp, logp.detach(), [3.0])
    loss.sum().backward()
    assert loss.tolist() == [[-3.0, -3.0]] and not stats["clip_frac"].any()
    assert logp.grad.tolist() == [[-3.0, -3.0]]


def test_ppo_dual_clip_caps_negative_advantage_loss():
    # A = -1, ratio 5, c = 3: PPO gives max(5, 1.2) = 5; the dual clip caps it at -A * c = 3, no gradient
    loss, stats, grad = one_token("ppo", 5.0, -1.0, clip_ratio_c=3.0)
    assert loss == pytest.approx(3.0) and stats["clip_frac"] == 1.0 and grad == 0.0
    # ratio 2 < c: max(2, 1.2) = 2 < 3, unchanged; gradient d(-A r)/dlogp = r = 2
    loss, stats, grad = one_token("ppo", 2.0, -1.0, clip_ratio_c=3.0)
    assert loss == pytest.approx(2.0) and stats["clip_frac"] == 0.0 and grad == pytest.approx(2.0)
    # positive advantages are never dual-clipped: ratio 5, A = 1 -> min(5, 1.2) -> loss -1.2
    assert one_token("ppo", 5.0, 1.0, clip_ratio_c=3.0)[0] == pytest.approx(-1.2)
    # off (c = 0): the A < 0 ratio-5 loss stays 5
    assert one_token("ppo", 5.0, -1.0)[0] == pytest.approx(5.0)
    _, stats = loss_of("ppo", torch.tensor([[math.log(5.0), math.log(2.0)]]), torch.zeros(1, 2), [-1.0],
                       clip_ratio_c=3.0)
    assert stats["dual_clip_frac"].tolist() == [[True, False]]


# ---- ratio levels: per token, or GSPO's per sequence --------------------------------------------

GSPO_MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_sequence_ratio_is_the_geometric_mean_of_token_ratios():
    # token log-ratios 0.1 and 0.3 (the third token is padding, log-ratio 5 ignored):
    # s = exp((0.1 + 0.3) / 2) = exp(0.2) = 1.221403 at every token
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    logp = old + torch.tensor([[0.1, 0.3, 5.0]])
    log_s = log_importance_ratio(logp, old, GSPO_MASK, "sequence")
    torch.testing.assert_close(log_s[0, :2], torch.tensor([0.2, 0.2]))
    assert (ratio := math.exp(0.2)) == pytest.approx(1.221403, abs=1e-6)
    # token level keeps each token's own ratio
    torch.testing.assert_close(log_importance_ratio(logp, old, GSPO_MASK, "token"), logp - old)
    # clip at 1 + 0.2: A = 1 -> objective min(1.2214, 1.2) = 1.2, every valid token clipped
    loss, stats = loss_of("ppo", logp, old, [1.0], GSPO_MASK, ratio_level="sequence")
    torch.testing.assert_close(loss[0, :2], torch.tensor([-1.2, -1.2]))
    assert stats["clip_frac"][0, :2].tolist() == [True, True]
    assert stats["ratio"][0, 0].item() == pytest.approx(ratio)
    # token level: ratios e^0.1 = 1.105 (inside) and e^0.3 = 1.350 (clipped)
    _, stats = loss_of("ppo", logp, old, [1.0], GSPO_MASK)
    assert stats["clip_frac"][0, :2].tolist() == [False, True]


def test_sequence_ratio_gradient_is_gspo():
    """GSPO: J_i = A_i * s_i, grad = A_i * s_i * mean_t grad logp_it. With `sequence`
    aggregation (mean over tokens) our per-token form must give exactly that."""
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    logp = (old + torch.tensor([[0.05, -0.15, 0.0]])).requires_grad_(True)
    # s = exp((0.05 - 0.15) / 2) = exp(-0.05) = 0.951229: inside [0.8, 1.2], unclipped
    loss, _ = loss_of("ppo", logp, old, [2.0], GSPO_MASK, ratio_level="sequence")
    aggregate(loss, GSPO_MASK, "sequence", 2, 1).backward()
    s = math.exp(-0.05)
    # d/dlogp_t of -A * s = -A * s / |y| = -2 * 0.951229 / 2 = -0.951229 for both tokens, 0 on padding
    torch.testing.assert_close(logp.grad, torch.tensor([[-s, -s, 0.0]]))
    # the same from the paper's sequence-level formula, written directly
    logp2 = logp.detach().clone().requires_grad_(True)
    s_direct = torch.exp(((logp2 - old) * GSPO_MASK).sum() / 2)
    (-2.0 * s_direct).backward()
    torch.testing.assert_close(logp.grad, logp2.grad)


def test_unknown_ratio_level():
    with pytest.raises(ValueError, match="allowed: token, sequence"):
        log_importance_ratio(torch.zeros(1, 1), torch.zeros(1, 1), GSPO_MASK[:, :1], "group")


# ---- cispo: the clipped IS weight, gradient stopped, on every token -----------------------------

def test_cispo_keeps_the_gradient_of_a_token_ppo_clips():
    # ratio 1.5, A = 1: weight sg(clip(1.5, 0.8, 1.2)) = 1.2; loss = -1.2 * 1 * log 1.5 = -0.486558;
    # gradient -w A = -1.2 (PPO's is 0 here)
    loss, stats, grad = one_token("cispo", 1.5, 1.0)
    assert loss == pytest.approx(-1.2 * math.log(1.5)) and loss == pytest.approx(-0.486558, abs=1e-6)
    assert grad == pytest.approx(-1.2) and stats["clip_frac"] == 1.0
    assert one_token("ppo", 1.5, 1.0)[2] == 0.0
    # ratio 0.5, A = -1: weight 0.8 -> loss -0.8 * -1 * log 0.5 = -0.554518, gradient 0.8
    loss, stats, grad = one_token("cispo", 0.5, -1.0)
    assert loss == pytest.approx(-0.554518, abs=1e-6) and grad == pytest.approx(0.8)
    # inside the range the weight is the ratio: 1.1 -> gradient -A * 1.1, nothing clipped
    loss, stats, grad = one_token("cispo", 1.1, 2.0)
    assert grad == pytest.approx(-2.2) and stats["clip_frac"] == 0.0


def test_cispo_on_policy_is_reinforce_and_an_open_lower_side_never_clips_below():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = loss_of("cispo", logp, logp.detach(), [3.0])
    loss.sum().backward()
    assert logp.grad.tolist() == [[-3.0, -3.0]]  # weight 1: A * grad logp
    # clip_low = 1 (MiniMax-M1's setting: no lower bound): ratio 0.1 keeps its weight 0.1
    _, stats, grad = one_token("cispo", 0.1, 1.0, clip_low=1.0, clip_high=0.28)
    assert grad == pytest.approx(-0.1) and stats["clip_frac"] == 0.0


# ---- gmpo: the geometric mean of log-clipped token ratios ---------------------------------------

def test_gmpo_clips_in_log_space_per_token_then_takes_the_geometric_mean():
    # log-ratios 0.1 and 0.5 (padding: 5, ignored), bounds +-0.4 on the log ratio.
    # A = 1: min(0.1, 0.1) = 0.1, min(0.5, 0.4) = 0.4 -> ratio exp(0.25) = 1.284025 on every token
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    logp = (old + torch.tensor([[0.1, 0.5, 5.0]])).requires_grad_(True)
    loss, stats = loss_of("gmpo", logp, old, [1.0], GSPO_MASK, clip_low=0.4, clip_high=0.4)
    torch.testing.assert_close(loss[0, :2], torch.tensor([-1.284025, -1.284025]))
    assert stats["ratio"][0, 0].item() == pytest.approx(1.284025, abs=1e-6)
    assert stats["clip_frac"][0, :2].tolist() == [False, True]
    # the paper's mean over completions is the `sequence` aggregation: d/dlogp_1 of
    # -A exp(mean l) = -A * 1.284025 / 2 = -0.642013; the clipped token gets none
    aggregate(loss, GSPO_MASK, "sequence", 2, 1).backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.642013, 0.0, 0.0]]))


def test_gmpo_negative_advantage_clips_the_other_side():
    # A = -1: sgn = -1 keeps max(l, clip(l)): 0.5 stays 0.5 (no clip), -0.6 becomes -0.4 (clipped)
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.1, 0.5]], requires_grad=True)
    loss, stats = loss_of("gmpo", logp, old, [-1.0], clip_low=0.4, clip_high=0.4)
    # ratio exp((0.1 + 0.5) / 2) = exp(0.3) = 1.349859, loss +1.349859, gradient +1.349859 / 2 each
    torch.testing.assert_close(loss, torch.full((1, 2), 1.349859))
    aggregate(loss, torch.ones(1, 2), "sequence", 2, 1).backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 2), 0.674929))
    assert not stats["clip_frac"].any()
    logp = torch.tensor([[0.1, -0.6]], requires_grad=True)
    loss, stats = loss_of("gmpo", logp, old, [-1.0], clip_low=0.4, clip_high=0.4)
    # kept log-ratios 0.1 and -0.4: exp(-0.15) = 0.860708; only the first token has a gradient
    torch.testing.assert_close(loss, torch.full((1, 2), 0.860708))
    aggregate(loss, torch.ones(1, 2), "sequence", 2, 1).backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.430354, 0.0]]))
    assert stats["clip_frac"].tolist() == [[False, True]]


# ---- sapo: a soft, temperature-controlled gate instead of the hard clip -------------------------

def test_sapo_gate_is_the_policy_gradient_on_policy_and_decays_off_policy():
    # rho = 1: gate sigmoid(0) * 4 / tau = 2 / tau, gradient -A * 4 sigmoid'(0) * rho = -A
    loss, stats, grad = one_token("sapo", 1.0, 1.0)
    assert loss == pytest.approx(-2.0) and grad == pytest.approx(-1.0) and stats["gate_mean"] == 2.0
    loss, _, grad = one_token("sapo", 1.0, -1.0)
    assert loss == pytest.approx(2.0 / 1.05) and grad == pytest.approx(1.0)
    # rho = 1.5, A = 1, tau_pos = 1: gate 4 sigmoid(0.5) = 2.489837; gradient
    # -A * 4 sigmoid(0.5) (1 - sigmoid(0.5)) * 1.5 = -1.410022 (PPO's would be 0: clipped)
    loss, _, grad = one_token("sapo", 1.5, 1.0)
    assert loss == pytest.approx(-2.489837, abs=1e-6) and grad == pytest.approx(-1.410022, abs=1e-6)
    # A = -1 uses tau_neg = 1.05: gate sigmoid(0.525) * 4 / 1.05 = 2.393585, gradient 1.401210
    loss, _, grad = one_token("sapo", 1.5, -1.0)
    assert loss == pytest.approx(2.393585, abs=1e-6) and grad == pytest.approx(1.401210, abs=1e-6)
    # rho = 0.5, A = -1: gate 1.415938, gradient 0.467070
    loss, _, grad = one_token("sapo", 0.5, -1.0)
    assert loss == pytest.approx(1.415938, abs=1e-6) and grad == pytest.approx(0.467070, abs=1e-6)


def test_sapo_temperatures_are_the_config_keys():
    # tau_pos = 2: gate at rho = 1.5 is sigmoid(1) * 2 = 1.462117
    loss, _, _ = one_token("sapo", 1.5, 1.0, sapo_tau_pos=2.0)
    assert loss == pytest.approx(-1.462117, abs=1e-6)


def test_the_settings_are_the_algo_section_by_its_keys(monkeypatch):
    """`LossSettings.of(algo)` holds every key of the section, so a key added to the schema reaches
    every loss with nothing else to edit: a loss registered here reads, by its name, a key no
    built-in loss reads (`std_eps`), through the objective."""
    algo = AlgoConfig(std_eps=0.5)
    s = LossSettings.of(algo)
    assert s.as_dict() == dataclasses.asdict(algo)
    seen = []

    def reads_a_key(logp, old_logp, advantages, mask, ctx):
        seen.append(ctx.std_eps)
        return -advantages * logp, {}

    patch_entry(monkeypatch, POLICY_LOSSES, "reads_a_key", reads_a_key)
    logp = torch.tensor([[-1.0, -3.0]], requires_grad=True)
    loss, metrics = policy_objective(logp, logp.detach(), torch.tensor([2.0]), torch.ones(1, 2),
                                     s.replace(policy_loss="reads_a_key"), Totals(2.0, 1.0))
    assert seen == [0.5] and loss.item() == 4.0  # -2 x (-1 - 3) / 2 tokens
    assert metrics["clamped_frac"].value == 0.0 and "ratio_mean" not in metrics  # no ratio returned
    with pytest.raises(AttributeError, match="^LossSettings has no algo.tau: it is not a key of the algo "
                                             "section$"):
        _ = s.tau
    with pytest.raises(AttributeError, match="read-only"):
        s.clip_low = 1.0
    with pytest.raises(TypeError, match="tau not in the algo section"):
        LossSettings.of(algo, tau=1.0)
    assert pickle.loads(pickle.dumps(s)) == s and copy.deepcopy(s) == s  # to Ray actors, across processes
    assert s.replace(clip_low=0.3).clip_low == 0.3 and s.clip_low == 0.2
    assert s != ValueLossSettings(**s.as_dict())  # another section's settings
