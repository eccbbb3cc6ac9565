"""Tests for reasonrl.model.head: chunked LM-head log-probs and entropies."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.model import head as head_module
from reasonrl.model.head import fusable, head_logprobs


def plain(hidden, weight, targets, temperature=1.0):
    """The reference: whole logits, log_softmax, gather; entropy -sum p log p."""
    log_probs = torch.log_softmax((hidden @ weight.t()).float() / temperature, dim=-1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


def test_hand_computed_values():
    # logits [ln 2, 0, 0] -> p = [1/2, 1/4, 1/4]
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    hidden = torch.tensor([[math.log(2.0), 0.0]])
    logp, entropy = head_logprobs(hidden, weight, torch.tensor([0]), with_entropy=True)
    assert logp.item() == pytest.approx(math.log(0.5), abs=1e-6)
    # H = -(1/2 ln 1/2 + 2 * 1/4 ln 1/4) = 1.5 ln 2
    assert entropy.item() == pytest.approx(1.5 * math.log(2.0), abs=1e-6)
    # d log p_0 / d logits = onehot(0) - p = [1/2, -1/4, -1/4]; d logits / d hidden = W
    h = hidden.clone().requires_grad_(True)
    head_logprobs(h, weight, torch.tensor([0]))[0].sum().backward()
    torch.testing.assert_close(h.grad, torch.tensor([[0.5, -0.25]]))
    # temperature 2: logits [ln 2 / 2, 0, 0], p_0 = sqrt 2 / (sqrt 2 + 2)
    logp_t, _ = head_logprobs(hidden, weight, torch.tensor([0]), temperature=2.0)
    assert logp_t.item() == pytest.approx(math.log(math.sqrt(2) / (math.sqrt(2) + 2)), abs=1e-6)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_coef", [0.0, 0.3])
def test_values_and_gradients_match_the_plain_path(monkeypatch, temperature, entropy_coef):
    monkeypatch.setattr(head_module, "CHUNK_ELEMENTS", 3 * 50)  # 3 rows per chunk, a partial last one
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(50, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 50, (2, 5), generator=g)
    upstream = torch.randn(2, 5, generator=g, dtype=torch.float64)
    grads = []
    for fn in ("fused", "plain"):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        if fn == "fused":
            logp, ent = head_logprobs(h, w, targets, temperature, True, entropy_grad=entropy_coef != 0)
        else:
            logp, ent = plain(h, w, targets, temperature)
        loss = (upstream * logp).sum() + (entropy_coef * ent.sum() if entropy_coef else 0.0)
        loss.backward()
        grads.append((logp.detach(), ent.detach(), h.grad, w.grad))
    for got, want in zip(grads[0], grads[1], strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-6, atol=1e-6)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(4, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 6, 3, 3])

    def f(h, w):
        logp, ent = head_module._HeadLogprobs.apply(h, w, targets, 1 / 0.9, True, True)
        return logp.to(torch.float64), ent.to(torch.float64)

    # the Function computes in float32 internally: compare at float32 precision
    assert torch.autograd.gradcheck(f, (hidden, weight), eps=1e-3, atol=2e-3, rtol=2e-3)


def test_entropy_without_grad_is_detached():
    hidden = torch.randn(3, 4, requires_grad=True)
    weight = torch.randn(9, 4)
    _, ent = head_logprobs(hidden, weight, torch.tensor([1, 2, 3]), with_entropy=True)
    assert not ent.requires_grad
    _, none = head_logprobs(hidden, weight, torch.tensor([1, 2, 3]))
    assert torch.equal(none, torch.zeros(3))


def test_fusable():
    assert fusable(torch.nn.Linear(4, 9, bias=False))
    assert not fusable(torch.nn.Linear(4, 9, bias=True))
    assert not fusable(torch.nn.Identity())
