"""Gradient checkpointing (`optim.gradient_checkpointing`): the same loss and gradient with and
without it, with and without the lean kernels, through the policy worker too; less kept for
the backward; nothing changes without gradients (rollouts, the reference model)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import grouped_rows, needs_peft, policy_settings

from reasonrl.accel.kernels import apply_lean_kernels
from reasonrl.batch import TrainBatch
from reasonrl.model.forward import completion_logprobs, make_micro_batches
from reasonrl.model.grad_checkpointing import checkpoint_layers, is_checkpointed
from reasonrl.workers.policy import PolicyWorker


def variant(model, kernels: bool, checkpointing: bool):
    m = copy.deepcopy(model)
    m.train()
    if kernels:
        apply_lean_kernels(m)
    if checkpointing:
        assert checkpoint_layers(m) == 2  # the tiny model's two decoder layers
    return m


def loss_and_grads(model) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    prompt_ids, completion_ids = grouped_rows()
    total = 0.0
    for mb in make_micro_batches(prompt_ids, completion_ids, 4, 0):
        logp, _ = completion_logprobs(model, mb)
        loss = (logp * mb.mask).sum()
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kernels", [False, True])
def test_checkpointing_gives_the_same_loss_and_gradient(tiny, kernels):
    """The recompute runs the same modules on the same inputs with the same kernels: the loss
    and every gradient are bitwise those of the run that kept its activations."""
    model, _ = tiny
    expected_loss, expected = loss_and_grads(variant(model, kernels, checkpointing=False))
    loss, grads = loss_and_grads(variant(model, kernels, checkpointing=True))
    assert loss == expected_loss
    assert grads.keys() == expected.keys() and len(grads) == len(list(model.parameters()))
    for name in expected:
        assert torch.equal(grads[name], expected[name]), name


def test_checkpointing_with_kernels_matches_the_plain_modules(tiny):
    """Both switches on against both off: the lean kernels' fp32 reassociation is the only
    difference (the bound of tests/accel/test_accel.py: atol 1e-6, rtol 1e-4)."""
    model, _ = tiny
    expected_loss, expected = loss_and_grads(variant(model, kernels=False, checkpointing=False))
    loss, grads = loss_and_grads(variant(model, kernels=True, checkpointing=True))
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    for name in expected:
        torch.testing.assert_close(grads[name], expected[name], atol=1e-6, rtol=1e-4, msg=name)


def saved_activation_bytes(model) -> int:
    """Bytes of the non-parameter tensors the decoder's forward keeps for the backward, as a
    saved-tensors hook around it sees them (a checkpointed layer keeps its own inside the
    checkpoint: none but what it needs to recompute)."""
    params = {p.data_ptr() for p in model.parameters()}
    total = 0

    def pack(t: torch.Tensor):
        nonlocal total
        if t.data_ptr() not in params:
            total += t.numel() * t.element_size()
        return t

    prompt_ids, completion_ids = grouped_rows()
    mb = make_micro_batches(prompt_ids, completion_ids, 6, 0)[0]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        hidden = model.get_decoder()(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                                     use_cache=False).last_hidden_state
    hidden.sum().backward()
    return total


@pytest.mark.parametrize("kernels", [False, True])
def test_checkpointing_keeps_less_for_the_backward(tiny, kernels):
    model, _ = tiny
    kept = saved_activation_bytes(variant(model, kernels, checkpointing=False))
    checkpointed = saved_activation_bytes(variant(model, kernels, checkpointing=True))
    assert 0 < checkpointed < kept / 4, (checkpointed, kept)


def test_no_gradients_no_checkpoint_and_copies_stay_their_own(tiny):
    """Without gradients a checkpointed layer is the plain forward (same values, and a KV
    cache still works); a deepcopy (the reference model) calls its own layers, not the
    original's."""
    model, _ = tiny
    plain, wrapped = variant(model, False, False), variant(model, False, True)
    assert is_checkpointed(wrapped) and not is_checkpointed(plain)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, wrapped(ids).logits)
        out = wrapped(ids[:, :3], use_cache=True)
        step = wrapped(ids[:, 3:], past_key_values=out.past_key_values, use_cache=True).logits
        torch.testing.assert_close(step[0, -1], plain(ids).logits[0, -1], atol=1e-5, rtol=1e-5)
    copy_ = copy.deepcopy(wrapped)
    with torch.no_grad():
        for p in copy_.parameters():
            p.add_(0.5)
    assert is_checkpointed(copy_)
    layer = copy_.get_decoder().layers[0]
    assert layer.forward.__self__ is layer  # rebound to the copy
    with torch.no_grad():
        assert not torch.equal(copy_(ids).logits, wrapped(ids).logits)


def updated_weights(tiny, **settings) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    model, tokenizer = tiny
    worker = PolicyWorker(copy.deepcopy(model), tokenizer.pad_token_id,
                          policy_settings(lr=1e-2, micro_batch_size=4, beta=0.1, **settings))
    prompt_ids, completion_ids = grouped_rows(1)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    metrics = worker.train_step(TrainBatch(prompt_ids, completion_ids, advantages))
    return metrics, {n: p.detach().clone() for n, p in worker.model.named_parameters()}, worker


@pytest.mark.parametrize("kernels", [False, True])
def test_policy_worker_step_is_the_same_with_checkpointing(tiny, kernels):
    """One optimizer step (with a KL term to the reference model) with and without
    checkpointing: the same loss, KL, gradient norm and updated weights. Checkpointing turns
    the shared-prompt layout off (its cache would be written twice), so both use plain rows."""
    base_metrics, base, _ = updated_weights(tiny, lean_kernels=kernels, share_prompt=False)
    metrics, weights, worker = updated_weights(tiny, lean_kernels=kernels, share_prompt=True,
                                               gradient_checkpointing=True)
    assert worker.optim.share_prompt is False and is_checkpointed(worker.model)
    assert is_checkpointed(worker.ref_model)
    for key in ("train/loss", "train/kl", "train/grad_norm", "train/tokens"):
        assert metrics[key] == base_metrics[key], key
    for name in base:
        assert torch.equal(weights[name], base[name]), name


def test_wrapped_models_checkpoint_their_layers(tiny):
    """The layers are found inside a data-parallel rank's root and the critic's value model."""
    from reasonrl.model.sharding import ShardRoot
    from reasonrl.model.value import ValueModel

    model, _ = tiny
    inner = copy.deepcopy(model)
    assert checkpoint_layers(ShardRoot(inner)) == 2 and is_checkpointed(inner)
    value = ValueModel(copy.deepcopy(model))
    assert checkpoint_layers(value) == 2 and is_checkpointed(value.lm)


@needs_peft
def test_a_lora_policy_checkpoints_its_layers_and_trains_with_a_reference(tiny):
    """Inside a LoRA wrapper too; the policy with a reference (the adapter switched off) trains
    with checkpointing on."""
    from reasonrl.model.lora import apply_lora

    model, tokenizer = tiny
    wrapped = apply_lora(copy.deepcopy(model), 4, 8, 0.0, ["q_proj", "v_proj"], seed=0)
    worker = PolicyWorker(wrapped, tokenizer.pad_token_id,
                          policy_settings(lr=1e-2, beta=0.1, gradient_checkpointing=True))
    assert is_checkpointed(wrapped)
    prompt_ids, completion_ids = grouped_rows(1)
    metrics = worker.train_step(TrainBatch(prompt_ids, completion_ids, torch.tensor([1.0, -1.0] * 3)))
    assert metrics["train/kl"] >= 0 and torch.isfinite(torch.tensor(metrics["train/loss"]))
