"""The policy worker's side of the log-probs stage: `logprobs` (all rows, or the rows of a loss
mask in their own micro-batches) computed once and read by the KL in the reward (`token_kl`,
no forward of its own) and by the update's old log-probs (`TrainBatch.old_logprobs`), each
bitwise what that consumer computed with its own forward before the stage existed."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import needs_peft, policy_settings

from reasonrl.algo import kl_estimate
from reasonrl.batch import TrainBatch
from reasonrl.model.forward import completion_logprobs, pad_like, per_row
from reasonrl.model.load import build_tiny_model
from reasonrl.workers.policy import PolicyWorker

# eight rows of unequal lengths: with micro_batch_size=3 the layout of every row and that of
# the kept rows differ (other row sets, other padding)
PROMPTS = [[1, 5, 9, 11], [1, 7], [1, 5, 9, 11], [3, 4, 5, 6, 7, 8], [1, 7], [2, 9, 4], [3, 4, 5, 6, 7, 8],
           [2, 9, 4]]
COMPLETIONS = [[20, 21, 2], [30], [40, 41, 42, 43, 44], [50, 51], [60, 61, 62, 63], [70, 71, 72],
               [80], [90, 91, 92, 93, 94, 95]]
ADVANTAGES = torch.tensor([1.0, -0.5, 0.25, -1.5, 0.75, -0.25, 0.5, -1.0])
KEEP = torch.tensor([True, False, True, True, False, True, True, True])


@pytest.fixture(scope="module")
def base_model():
    model, _ = build_tiny_model(seed=3)
    return model


def worker_with_reference(base_model, **settings) -> PolicyWorker:
    """A policy worker whose reference differs from the policy (so the KL is not 0)."""
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(**settings))
    if worker.ref_model is not None:
        with torch.no_grad():
            for p, q in zip(worker.ref_model.parameters(), base_model.parameters(), strict=True):
                p.copy_(q + 0.01 * torch.sin(torch.arange(q.numel(), dtype=q.dtype)).view_as(q))
    return worker


def forward_token_kl(worker: PolicyWorker, ref: list[torch.Tensor]) -> list[torch.Tensor]:
    """`token_kl` as it was before the log-probs stage: the policy's forward per micro-batch of
    every row, the estimate on its [M, T] output."""
    def kl(mb):
        logp, _ = completion_logprobs(worker.model, mb, worker.settings.temperature)
        return kl_estimate(logp, pad_like([ref[i] for i in mb.rows], logp), worker.algo.kl_estimator).cpu()

    return per_row(worker.micro_batches(PROMPTS, COMPLETIONS), COMPLETIONS, worker.device, kl)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3", "k3+"])
@pytest.mark.parametrize("layout", [{"micro_batch_size": 3}, {"micro_batch_size": 8, "share_prompt": True},
                                    {"micro_batch_size": 8, "max_tokens_per_micro_batch": 24}],
                         ids=["rows", "shared prompt", "token budget"])
def test_the_kl_in_the_reward_from_the_stage_is_bitwise_the_kl_of_its_own_forward(base_model, estimator,
                                                                                    layout):
    worker = worker_with_reference(base_model, beta=0.05, kl_in="reward", kl_estimator=estimator,
                                   temperature=0.7, **layout)
    ref = worker.reference_logprobs(PROMPTS, COMPLETIONS)
    expected = forward_token_kl(worker, ref)
    logprobs = worker.logprobs(PROMPTS, COMPLETIONS)
    forwards = []
    worker.model.register_forward_pre_hook(lambda *args: forwards.append(1))
    worker.model.get_decoder().register_forward_pre_hook(lambda *args: forwards.append(1))
    found = worker.token_kl(PROMPTS, COMPLETIONS, ref, logprobs)
    assert forwards == []  # no forward of its own
    assert [len(k) for k in found] == [len(c) for c in COMPLETIONS]
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    assert max(k.abs().max().item() for k in found) > 0


def test_the_rows_of_a_loss_mask_are_laid_out_alone_and_others_come_back_empty(base_model):
    """`logprobs(..., rows)`: what the teacher stage asked for with the kept rows alone (its
    student side), bitwise, in the order of the batch; with every row, the same as no `rows`."""
    worker = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(micro_batch_size=3))
    kept = [i for i in range(len(PROMPTS)) if KEEP[i]]
    alone = worker.logprobs([PROMPTS[i] for i in kept], [COMPLETIONS[i] for i in kept])
    found = worker.logprobs(PROMPTS, COMPLETIONS, KEEP)
    assert [len(x) for x in found] == [len(c) if k else 0 for c, k in zip(COMPLETIONS, KEEP, strict=True)]
    assert all(torch.equal(found[i], alone[k]) for k, i in enumerate(kept))
    assert all(x.dtype == torch.float32 and x.device.type == "cpu" for x in found)
    every = worker.logprobs(PROMPTS, COMPLETIONS)
    assert all(torch.equal(a, b) for a, b in zip(every, worker.logprobs(PROMPTS, COMPLETIONS,
                                                                          torch.ones(8, dtype=torch.bool)),
                                                  strict=True))
    # the kept rows' own layout is not every row's: float32 values may differ in the last bits,
    # which is why the stage keeps one list per layout
    assert worker.micro_batches(PROMPTS, COMPLETIONS)[0].rows != \
        worker.micro_batches([PROMPTS[i] for i in kept], [COMPLETIONS[i] for i in kept])[0].rows


@pytest.mark.parametrize("hyper", [{"ppo_epochs": 2}, {"mini_batches": 2}, {"ppo_epochs": 2, "beta": 0.1}],
                         ids=["two epochs", "two mini-batches", "two epochs, KL in the loss"])
def test_the_old_log_probs_from_the_stage_give_the_update_bitwise_its_own(base_model, hyper):
    """A multi-update step with a row left out: the stage's log-probs of the kept rows, handed
    in as `old_logprobs`, give bitwise the metrics and weights of the update computing them
    itself, and the update then runs no forward without gradient."""
    settings = dict(micro_batch_size=3, lr=1e-3, **hyper)
    alone = worker_with_reference(base_model, **settings)
    staged = worker_with_reference(base_model, **settings)
    old = staged.logprobs(PROMPTS, COMPLETIONS, KEEP)
    ref = staged.reference_logprobs(PROMPTS, COMPLETIONS, KEEP) if staged.ref_model is not None else None
    no_grad = [0, 0]
    for k, worker in enumerate((alone, staged)):
        worker.model.get_decoder().register_forward_hook(
            lambda *args, k=k: no_grad.__setitem__(k, no_grad[k] + (not torch.is_grad_enabled())))
    a = alone.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, KEEP, ref_logprobs=ref))
    b = staged.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, KEEP, ref_logprobs=ref,
                                     old_logprobs=old))
    assert no_grad[0] > 0 and no_grad[1] == 0
    assert a == b and a["train/updates"] > 1
    assert a["train/ratio_max"] != 1.0  # the later updates' ratios are not 1: the old log-probs matter
    for p, q in zip(alone.model.parameters(), staged.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_one_update_reads_no_old_log_probs(base_model):
    """With one update the old log-probs are the update's own, detached (ratio exactly 1):
    log-probs handed in (a teacher's step computed them) are not read."""
    plain = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(micro_batch_size=3, lr=1e-3))
    given = PolicyWorker(copy.deepcopy(base_model), 0, policy_settings(micro_batch_size=3, lr=1e-3))
    shifted = [x - 1.0 for x in given.logprobs(PROMPTS, COMPLETIONS, KEEP)]
    a = plain.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, KEEP))
    b = given.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, KEEP, old_logprobs=shifted))
    assert a == b and a["train/ratio_max"] == 1.0


@needs_peft
def test_a_lora_policy_reads_the_stage_alike(base_model):
    """LoRA (the reference: the adapter switched off, the same modules): the KL in the reward and
    the old log-probs of a two-epoch update from the stage are bitwise those of their own forwards."""
    from reasonrl.model.lora import apply_lora

    def lora_worker() -> PolicyWorker:
        model = apply_lora(copy.deepcopy(base_model), 4, 8.0, 0.0, ["q_proj", "v_proj"], seed=0)
        with torch.no_grad():  # B = 0 would make the policy its reference
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.01 * torch.sin(torch.arange(p.numel(), dtype=p.dtype)).view_as(p))
        return PolicyWorker(model, 0, policy_settings(micro_batch_size=3, beta=0.05, kl_in="reward",
                                                      ppo_epochs=2, lr=1e-3))

    alone, staged = lora_worker(), lora_worker()
    ref = staged.reference_logprobs(PROMPTS, COMPLETIONS)
    expected = forward_token_kl(staged, ref)
    found = staged.token_kl(PROMPTS, COMPLETIONS, ref, staged.logprobs(PROMPTS, COMPLETIONS))
    assert all(torch.equal(a, b) for a, b in zip(found, expected, strict=True))
    assert max(k.abs().max().item() for k in found) > 0
    old = staged.logprobs(PROMPTS, COMPLETIONS, KEEP)
    a = alone.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, KEEP))
    b = staged.train_step(TrainBatch(PROMPTS, COMPLETIONS, ADVANTAGES, KEEP, old_logprobs=old))
    assert a == b and a["train/updates"] == 2
    for p, q in zip(alone.model.parameters(), staged.model.parameters(), strict=True):
        assert torch.equal(p, q)
