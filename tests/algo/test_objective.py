"""reasonrl.algo.objective and reasonrl.algo.value_loss: the policy and value objectives of one
micro-batch, hand-computed, with their metrics' shares and reductions."""

import math

import pytest
import torch
from helpers import loss_settings, value_loss_settings

from reasonrl.algo import Metric, Totals, policy_objective, value_objective
from reasonrl.config import CriticConfig
from reasonrl.registry import VALUE_LOSSES

# one row of two tokens and a padding position, in a step of 4 tokens and 2 sequences
LOGP = [[-1.0, -2.0, 0.0]]
MASK = torch.tensor([[1.0, 1.0, 0.0]])
STEP = Totals(tokens=4.0, sequences=2.0)


def test_the_objective_composes_tis_entropy_and_kl_around_the_loss():
    """On-policy PPO (ratio 1) with A = 2, TIS capped at 1.5, an entropy bonus 0.1 and k1 KL in
    the loss with beta 0.5, `token` aggregation over the step's 4 tokens:
    w = min(exp(old - engine), 1.5) = [min(e^0.5, 1.5), e^-1] = [1.5, 0.367879];
    pg = sum(-A w) / 4 = -2 (1.867879) / 4 = -0.933940; entropy (1 + 3) / 4 = 1;
    KL = (0.5 + 0.5) / 4 = 0.25; loss = pg - 0.1 * 1 + 0.5 * 0.25 = -0.908940."""
    logp = torch.tensor(LOGP, requires_grad=True)
    entropy = torch.tensor([[1.0, 3.0, 9.0]])
    settings = loss_settings(entropy_coef=0.1, beta=0.5, kl_estimator="k1", importance_correction="tis",
                            importance_cap=1.5)
    loss, m = policy_objective(logp, logp.detach(), torch.tensor([2.0]), MASK, settings, STEP, entropy,
                               ref_logp=torch.tensor([[-1.5, -2.5, 7.0]]),
                               engine_logp=torch.tensor([[-1.5, -1.0, 3.0]]))
    assert loss.item() == pytest.approx(-0.908940, abs=1e-6)
    values = {k: v.value for k, v in m.items()}
    assert values == pytest.approx({
        "loss": -0.908940, "pg_loss": -0.933940, "entropy": 1.0, "kl": 0.25,
        "logprob_diff_mean": (0.5 + 1.0) / 4, "logprob_diff_max": 1.0,
        "is_weight_mean": (1.5 + math.exp(-1)) / 4, "is_capped_frac": 0.25,
        "clip_frac": 0.0, "dual_clip_frac": 0.0, "ratio_mean": 0.5, "ratio_max": 1.0, "ratio_min": 1.0,
        "clamped_frac": 0.0}, abs=1e-6)
    # shares add over micro-batches and ranks; extremes are extremes
    assert {k: v.reduce for k, v in m.items() if v.reduce != "sum"} == {
        "logprob_diff_max": "max", "ratio_max": "max", "ratio_min": "min"}
    # gradient: -A w_t / 4 + beta * d k1 / d logp / 4 = [-0.75 + 0.125, -0.183940 + 0.125]
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.625, -0.058940, 0.0]]))


def test_kl_is_logged_with_a_reference_and_in_the_loss_only_with_kl_in_loss():
    logp = torch.tensor(LOGP, requires_grad=True)
    ref = torch.tensor([[-1.5, -2.5, 0.0]])
    plain, m = policy_objective(logp, logp.detach(), torch.tensor([2.0]), MASK, loss_settings(), STEP)
    assert "kl" not in m and "entropy" not in m and "logprob_diff_mean" not in m
    for settings in (loss_settings(beta=0.5, kl_in="reward"), loss_settings(beta=0.0)):
        loss, m = policy_objective(logp, logp.detach(), torch.tensor([2.0]), MASK, settings, STEP,
                                   ref_logp=ref)
        assert loss.item() == plain.item() and m["kl"].value > 0


def test_k3_plus_in_the_loss_pushes_with_the_gradient_of_k2():
    """beta = 1, A = 0: the gradient is the KL term's alone, (logp - ref) / 4 per token for k3+
    (k2's), (1 - exp(ref - logp)) / 4 for k3; the logged value is k3's for both."""
    ref = torch.tensor([[-1.5, -2.5, 0.0]])
    grads, kls = {}, {}
    for est in ("k3", "k3+"):
        logp = torch.tensor(LOGP, requires_grad=True)
        loss, m = policy_objective(logp, logp.detach(), torch.zeros(1), MASK,
                                   loss_settings(beta=1.0, kl_estimator=est), STEP, ref_logp=ref)
        loss.backward()
        grads[est], kls[est] = logp.grad, m["kl"].value
    assert kls["k3+"] == kls["k3"] == pytest.approx(2 * (math.exp(-0.5) - 1 + 0.5) / 4)
    torch.testing.assert_close(grads["k3+"], torch.tensor([[0.125, 0.125, 0.0]]))
    torch.testing.assert_close(grads["k3"], torch.tensor([[(1 - math.exp(-0.5)) / 4] * 2 + [0.0]]))


def test_the_micro_batches_shares_add_up_to_the_whole_batch():
    """Two rows as one micro-batch or as two: the same loss and metrics (each share is over the
    step's totals), extremes combined by max / min."""
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.7, -0.9]])
    old = logp + torch.tensor([[0.1, -0.3, 0.0], [0.2, 0.0, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv, totals = torch.tensor([1.0, -2.0]), Totals(5.0, 2.0)
    s = loss_settings(clip_low=0.15, clip_high=0.15)
    whole_loss, whole = policy_objective(logp, old, adv, mask, s, totals)
    parts = [policy_objective(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1], s, totals)
             for i in range(2)]
    assert parts[0][0].item() + parts[1][0].item() == pytest.approx(whole_loss.item())
    reduce = {"sum": lambda a, b: a + b, "max": max, "min": min}
    for name, metric in whole.items():
        combined = reduce[metric.reduce](parts[0][1][name].value, parts[1][1][name].value)
        assert combined == pytest.approx(metric.value), name
    # log-ratios 0.3 (A > 0) and -0.2 (A < 0) leave the range
    assert whole["clip_frac"].value == pytest.approx(2 / 5)


def test_ratio_extremes_of_a_micro_batch_without_tokens_are_empty():
    _, m = policy_objective(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1), torch.zeros(1, 2),
                            loss_settings(), STEP)
    assert m["ratio_max"] == Metric(-math.inf, "max", 1.0) and m["ratio_min"] == Metric(math.inf, "min", 1.0)


# ---- the critic's value loss ---------------------------------------------------------------------

def test_every_value_loss_is_a_config_choice():
    import dataclasses

    field = {f.name: f for f in dataclasses.fields(CriticConfig)}["value_loss"]
    assert field.metadata["choices"] is VALUE_LOSSES and field.default == "clipped"


def test_clipped_value_loss():
    """c = 0.2, old V = 0.5, R = 2: V = 1.0 moved +0.5 -> clipped to 0.7: max(1, 1.69) / 2 =
    0.845 (clipped); V = 0.0 moved -0.5 -> 0.3: max(4, 2.89) / 2 = 2 (not clipped)."""
    clipped_value_loss, c = VALUE_LOSSES.get("clipped"), value_loss_settings(cliprange_value=0.2)
    loss, stats = clipped_value_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]),
                                     torch.tensor([2.0, 2.0]), torch.ones(2), c)
    assert loss.tolist() == pytest.approx([0.845, 2.0], rel=1e-6, abs=1e-6)
    assert stats["vf_clipfrac"].tolist() == [True, False]
    plain, stats = clipped_value_loss(torch.tensor([1.0]), torch.tensor([0.5]), torch.tensor([2.0]),
                                      torch.ones(1), value_loss_settings(cliprange_value=0.0))
    assert plain.tolist() == [0.5] and stats["vf_clipfrac"].tolist() == [False]


def test_value_objective_is_a_token_mean_over_the_step():
    """The same two tokens as above, padding ignored, in a step of 4 tokens: (0.845 + 2) / 4."""
    values = torch.tensor([[1.0, 0.0, 50.0]], requires_grad=True)
    loss, m = value_objective(values, torch.full((1, 3), 0.5), torch.full((1, 3), 2.0), MASK,
                              value_loss_settings(cliprange_value=0.2), STEP)
    assert loss.item() == pytest.approx(2.845 / 4) and m["vf_loss"].value == pytest.approx(2.845 / 4)
    assert m["vf_clipfrac"] == Metric(0.25)
    loss.backward()  # the clipped token has no gradient; V = 0: d 0.5 (V - R)^2 / 4 = (0 - 2) / 4
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.5, 0.0]]))
