"""The policy worker: completion log-probs, exact micro-batch normalisation, updates."""

import copy

import pytest
import torch

from reasonrl.batch import TrainBatch
from reasonrl.policy.model import build_tiny_model
from reasonrl.policy.worker import PolicyHyper, PolicyWorker, completion_logprobs, make_micro_batches

PROMPTS = [[1, 5, 9, 11], [1, 7], [1, 5, 9, 11], [3, 4, 5, 6, 7, 8]]
COMPLETIONS = [[20, 21, 2], [30], [40, 41, 42, 43, 44], [50, 51]]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.5])


@pytest.fixture(scope="module")
def base_model():
    model, _ = build_tiny_model(seed=3)
    return model


def naive_logprobs(model, prompt, completion):
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return torch.stack([logp[len(prompt) - 1 + t, tok] for t, tok in enumerate(completion)])


def test_micro_batches_pad_to_their_own_length():
    mbs = make_micro_batches(PROMPTS, COMPLETIONS, size=2, pad_id=0)
    assert sorted(r for mb in mbs for r in mb.rows) == [0, 1, 2, 3]
    # sorted by total length: rows 1 (3 tokens) and 0 (7) together, then 3 (8) and 2 (9)
    assert [mb.rows for mb in mbs] == [[1, 0], [3, 2]]
    assert mbs[0].input_ids.shape == (2, 7) and mbs[1].input_ids.shape == (2, 9)
    assert mbs[0].mask.tolist() == [[1, 0, 0], [1, 1, 1]]


@pytest.mark.parametrize("size", [1, 3, 4])
def test_completion_logprobs_match_a_plain_forward(base_model, size):
    with torch.no_grad():
        for mb in make_micro_batches(PROMPTS, COMPLETIONS, size=size, pad_id=0):
            logp, entropy = completion_logprobs(base_model, mb, with_entropy=True)
            for j, row in enumerate(mb.rows):
                n = len(COMPLETIONS[row])
                expected = naive_logprobs(base_model, PROMPTS[row], COMPLETIONS[row])
                torch.testing.assert_close(logp[j, :n], expected, rtol=1e-5, atol=1e-5)
                assert (entropy[j, :n] > 0).all()


def test_temperature_scales_logits(base_model):
    mb = make_micro_batches(PROMPTS[:1], COMPLETIONS[:1], size=1, pad_id=0)[0]
    with torch.no_grad():
        hot, _ = completion_logprobs(base_model, mb, temperature=2.0)
        ids = torch.tensor([PROMPTS[0] + COMPLETIONS[0]])
        logits = base_model(input_ids=ids).logits[0] / 2.0
    expected = torch.log_softmax(logits, -1)[[3, 4, 5], COMPLETIONS[0]]
    torch.testing.assert_close(hot[0], expected, rtol=1e-5, atol=1e-5)


def grads_after_step(model, micro_batch_size, loss_agg, beta=0.0, kl_estimator="k3"):
    model = copy.deepcopy(model)
    hyper = PolicyHyper(lr=0.0, max_grad_norm=0.0, micro_batch_size=micro_batch_size,
                        loss_agg=loss_agg, beta=beta, kl_estimator=kl_estimator)
    worker = PolicyWorker(model, pad_id=0, hyper=hyper)
    if beta > 0:  # make the reference differ from the policy so the KL term has a gradient
        with torch.no_grad():
            for p in worker.ref_model.parameters():
                p.add_(0.01 * torch.randn_like(p))
    metrics = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


def assert_grads_close(grads, expected, what):
    """Equal up to float32 round-off: |diff| <= 1e-4 of the tensor's largest entry (measured
    here: <= 6e-6; padding changes the summation order). A wrong normaliser is off by O(1)."""
    for name, g in grads.items():
        scale = expected[name].abs().max().item()
        diff = (g - expected[name]).abs().max().item()
        assert diff <= 1e-4 * scale + 1e-9, f"{what}: {name} differs by {diff} (scale {scale})"


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
@pytest.mark.parametrize("beta", [0.0, 0.1])
def test_gradient_does_not_depend_on_micro_batch_size(base_model, loss_agg, beta):
    torch.manual_seed(0)
    full, m_full = grads_after_step(base_model, 4, loss_agg, beta)
    for size in (1, 2, 3):
        torch.manual_seed(0)
        grads, metrics = grads_after_step(base_model, size, loss_agg, beta)
        assert_grads_close(grads, full, f"micro_batch_size={size}")
        assert metrics["train/loss"] == pytest.approx(m_full["train/loss"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
def test_gradient_equals_the_hand_written_objective(base_model, loss_agg):
    """On-policy, the loss is -sum A_i logp_it / normaliser; compare to autograd of that."""
    grads, _ = grads_after_step(base_model, 2, loss_agg)
    model = copy.deepcopy(base_model)
    total_tokens = sum(len(c) for c in COMPLETIONS)
    objective = 0.0
    for p, c, a in zip(PROMPTS, COMPLETIONS, ADVANTAGES, strict=True):
        logp = naive_logprobs(model, p, c)
        if loss_agg == "token":
            objective = objective + (-a * logp).sum() / total_tokens
        else:
            objective = objective + (-a * logp).mean() / len(PROMPTS)
    objective.backward()
    assert_grads_close(grads, {n: p.grad for n, p in model.named_parameters()}, "hand-written")


def test_kl_in_loss_adds_beta_times_kl(base_model):
    _, plain = grads_after_step(base_model, 4, "token", beta=0.0)
    torch.manual_seed(0)
    _, with_kl = grads_after_step(base_model, 4, "token", beta=0.1)
    assert with_kl["train/kl"] > 0
    assert with_kl["train/loss"] == pytest.approx(plain["train/loss"] + 0.1 * with_kl["train/kl"], rel=1e-5)
    assert "train/kl" not in plain  # no reference model, no KL metric


def test_reference_model_only_when_beta_positive(base_model):
    assert PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(beta=0.0)).ref_model is None
    worker = PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(beta=0.05))
    assert worker.ref_model is not None
    assert not any(p.requires_grad for p in worker.ref_model.parameters())


def test_sequence_kl_is_zero_against_an_identical_reference(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(beta=0.05, kl_estimator="k1"))
    kl = worker.sequence_kl(PROMPTS, COMPLETIONS)
    assert kl.shape == (4,) and kl.abs().max().item() < 1e-6


def test_update_moves_weights_and_zero_advantage_does_not(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(lr=1e-3))
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, torch.zeros(4)))
    assert m["train/grad_norm"] == 0.0
    assert all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES))
    assert m["train/grad_norm"] > 0 and m["train/skipped_update"] == 0.0
    assert any(not torch.equal(before[n], p) for n, p in worker.model.named_parameters())


def test_higher_advantage_completion_becomes_more_likely(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(lr=1e-2))
    mb = make_micro_batches(PROMPTS[:1], COMPLETIONS[:1], 1, 0)[0]
    with torch.no_grad():
        before = completion_logprobs(worker.model, mb)[0].sum().item()
    for _ in range(3):
        worker.train_step(TrainBatch(PROMPTS[:2], COMPLETIONS[:2], torch.tensor([1.0, -1.0])))
    with torch.no_grad():
        after = completion_logprobs(worker.model, mb)[0].sum().item()
    assert after > before + 0.1


def test_non_finite_loss_skips_the_update(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(lr=1e-2))
    before = {n: p.detach().clone() for n, p in worker.model.named_parameters()}
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, torch.tensor([float("nan"), 1.0, 1.0, 1.0])))
    assert m["train/skipped_update"] == 1.0
    assert all(torch.equal(before[n], p) for n, p in worker.model.named_parameters())


def test_loss_mask_drops_rows(base_model):
    worker = PolicyWorker(copy.deepcopy(base_model), 0, PolicyHyper(lr=0.0, max_grad_norm=0.0))
    m = worker.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES,
                                     loss_mask=torch.tensor([True, False, True, False])))
    assert m["train/tokens"] == 3 + 5
