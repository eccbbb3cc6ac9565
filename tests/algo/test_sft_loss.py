"""SFT's objective (`reasonrl.algo.sft`): the token-mean negative log-likelihood over a step's
trained tokens, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.algo import Totals
from reasonrl.algo.sft import perplexity, sft_objective


def test_the_loss_is_the_token_mean_nll_over_the_steps_trained_tokens():
    # row 0: tokens p = 1/2, 1/4 (trained), row 1: p = 1/8 (trained), then a masked token and padding
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.125, 0.3, 0.7]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, metrics = sft_objective(logp, mask, Totals.of([2, 1]))
    # (ln 2 + ln 4 + ln 8) / 3 = 6 ln 2 / 3 = 2 ln 2: every token weighs 1/3, the 2-token row 2/3
    assert loss.item() == pytest.approx(2 * math.log(2), rel=1e-6)
    assert metrics["loss"].value == pytest.approx(2 * math.log(2), rel=1e-6)
    assert metrics["loss"].reduce == "sum"


def test_micro_batch_shares_add_up_to_the_steps_loss_and_gradient():
    """N is the step's tokens: two micro-batches' shares add up to the whole batch's loss, and
    so do their gradients (float32 sums of 3 terms: bound 4 ulps of the total)."""
    logits = torch.tensor([[0.3, -1.2, 2.0], [1.5, 0.1, -0.4]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    totals = Totals.of([2, 1])
    whole, _ = sft_objective(torch.nn.functional.logsigmoid(logits), mask, totals)
    (g_whole,) = torch.autograd.grad(whole, logits)
    parts = [sft_objective(torch.nn.functional.logsigmoid(logits[i: i + 1]), mask[i: i + 1], totals)[0]
             for i in range(2)]
    (g_parts,) = torch.autograd.grad(sum(parts), logits)
    assert sum(p.item() for p in parts) == pytest.approx(whole.item(), rel=4 * 2 ** -23)
    assert torch.allclose(g_parts, g_whole, rtol=4 * 2 ** -23, atol=0)
    # d/dlogit of -logsigmoid(x)/3 = -(1 - sigmoid(x)) / 3 on trained tokens, 0 elsewhere
    expected = -(1 - torch.sigmoid(logits.detach())) / 3 * mask
    assert torch.allclose(g_whole, expected, rtol=1e-6, atol=0)


def test_perplexity_is_exp_of_the_mean_nll():
    assert perplexity(0.0) == 1.0
    assert perplexity(math.log(49152)) == pytest.approx(49152)  # uniform over SmolLM2's vocabulary
    assert perplexity(1e6) == math.inf
