"""The trainer's log-probs stage (`logprobs_stage`, `time/logprobs`): the policy's log-probs
without gradient computed once per step, before the update, and read by every consumer (the KL
in the reward, the teacher stage's student side, the old log-probs of a multi-update step),
each consumer getting bitwise what it computed with its own forward before the stage existed."""

from __future__ import annotations

import pytest
import torch
from helpers import keep_torch_threads, smoke_cfg  # noqa: F401 (autouse)

import reasonrl.train.trainer as trainer_module
import reasonrl.workers.frozen as frozen_module
import reasonrl.workers.policy as worker_module
from reasonrl.model.forward import completion_logprobs as forward_logprobs
from reasonrl.train.stages import logprobs_stage
from reasonrl.train.trainer import Trainer

# KL in the reward, a teacher and a two-epoch update: the three consumers in one step
ALL_THREE = ["teacher.path=tiny", "algo.beta=0.05", "algo.kl_in=reward", "algo.kl_estimator=k3",
             "optim.ppo_epochs=2", "trainer.steps=1", "trainer.eval_every=0"]


class CountingPolicy:
    """The policy's `logprobs` seen through its calls: (rows asked for: None = all, the log-probs)."""

    def __init__(self):
        self.calls = []

    def logprobs(self, prompt_ids, completion_ids, rows=None):
        self.calls.append(None if rows is None else rows.tolist())
        return [torch.full((len(c),), float(len(self.calls))) if rows is None or rows[i] else torch.zeros(0)
                for i, c in enumerate(completion_ids)]


IDS = ([[1, 2]] * 4, [[3], [4, 5], [6], [7, 8, 9]])


@pytest.mark.parametrize("every_row, trained, mask, calls", [
    (True, True, [True] * 4, [None]),  # one forward serves all: the same rows, the same layout
    (True, True, [True, False, True, True], [None, [True, False, True, True]]),  # a layout each
    (True, False, [True, False, True, True], [None]),
    (False, True, [True, False, True, True], [[True, False, True, True]]),
    (False, True, [True] * 4, [[True] * 4]),
])
def test_the_stage_runs_one_forward_per_layout_read(every_row, trained, mask, calls):
    policy = CountingPolicy()
    found = logprobs_stage(policy, IDS, torch.tensor(mask), every_row, trained)
    assert policy.calls == calls
    assert (found.every_row is not None) == every_row and (found.trained is not None) == trained
    if every_row and trained and all(mask):
        assert found.trained is found.every_row


def policy_forwards(monkeypatch, trainer) -> list[int]:
    """The rows of each forward of the policy's model without gradient (its log-probs): the
    stage's, and those a consumer would run itself."""
    rows: list[int] = []

    def counted(model, mb, *args, **kwargs):
        if model is trainer.policy.model and not torch.is_grad_enabled():
            rows.append(len(mb.rows))
        return forward_logprobs(model, mb, *args, **kwargs)

    monkeypatch.setattr(worker_module, "completion_logprobs", counted)
    monkeypatch.setattr(frozen_module, "completion_logprobs", counted)  # the stage's (`rows_logprobs`)
    return rows


def leave_rows_out(monkeypatch, trainer, rows: list[int]) -> None:
    """The step's batch with `rows` out of the loss mask (as dynamic sampling or
    algo.mask_truncated would leave them)."""
    take = trainer.source.take

    def fewer(step):
        batch, produced = take(step)
        batch.trainable[rows] = False
        return batch, produced

    monkeypatch.setattr(trainer.source, "take", fewer)


@pytest.mark.parametrize("left_out", [[], [0, 3, 6]], ids=["every row trains", "rows left out"])
def test_one_forward_serves_the_kl_in_the_reward_the_teacher_and_the_old_log_probs(tmp_path, monkeypatch,
                                                                                    left_out):
    """KL in the reward + a teacher + ppo_epochs=2: the policy's forward without gradient runs
    once over the batch where it ran three times (token_kl's, the teacher stage's student side
    and train_step's old log-probs, each its own forward); with rows out of the loss mask, once
    over every row (the KL) and once over the trained rows (the other two: the update's layout)."""
    trainer = Trainer(smoke_cfg(tmp_path, "r", *ALL_THREE))
    try:
        leave_rows_out(monkeypatch, trainer, left_out)
        rows = policy_forwards(monkeypatch, trainer)
        metrics = trainer.step()[0]
    finally:
        trainer.workers.close()
    n = trainer.cfg.trainer.batch_size
    assert sum(rows) == n + (n - len(left_out) if left_out else 0)  # it was 3 n (3 n - 2 x left out)
    assert metrics["time/logprobs"] > 0 and metrics["train/updates"] == 2
    assert "train/kl_in_reward" in metrics and "distill/reverse_kl" in metrics  # all three consumers ran


@pytest.mark.parametrize("staleness", [0, 1], ids=["on-policy", "max_staleness=1"])
def test_each_consumer_reads_what_it_computed_itself(tmp_path, monkeypatch, staleness):
    """With rows out of the loss mask (the two layouts differ): the KL in the reward is bitwise
    `token_kl`'s own forward's (every row), the teacher's student side and the update's old
    log-probs are bitwise the forward of the trained rows alone that each ran before, all from
    the policy now, before its update (asynchronous: not the version that sampled the batch)."""
    trainer = Trainer(smoke_cfg(tmp_path, "r", *ALL_THREE, f"trainer.max_staleness={staleness}",
                                "trainer.steps=2"))
    policy = trainer.policy
    seen: dict[str, bool] = {}

    def own_forward(prompt_ids, completion_ids, rows=None) -> list[torch.Tensor]:
        """The policy's log-probs as a consumer computed them itself: `rows` alone, laid out alone."""
        keep = [i for i in range(len(prompt_ids)) if rows is None or rows[i]]
        found = policy.row_logprobs(policy.model, [prompt_ids[i] for i in keep],
                                    [completion_ids[i] for i in keep])
        out = [torch.zeros(0)] * len(prompt_ids)
        for i, x in zip(keep, found, strict=True):
            out[i] = x.float().cpu()
        return out

    token_kl, teacher_stage, train_step = policy.token_kl, trainer_module.teacher_stage, policy.train_step

    def checked_kl(prompt_ids, completion_ids, ref, logprobs):
        from reasonrl.algo import kl_estimate
        from reasonrl.model.forward import pad_like, per_row

        def kl(mb):  # token_kl before the stage: its own forward per micro-batch of every row
            logp, _ = forward_logprobs(policy.model, mb, policy.settings.temperature)
            ref_logp = pad_like([ref[i] for i in mb.rows], logp)
            return kl_estimate(logp, ref_logp, policy.algo.kl_estimator).cpu()

        before = per_row(policy.micro_batches(prompt_ids, completion_ids), completion_ids, policy.device, kl)
        found = token_kl(prompt_ids, completion_ids, ref, logprobs)
        seen["kl"] = all(torch.equal(a, b) for a, b in zip(found, before, strict=True))
        return found

    def checked_teacher(teacher, student, ids, loss_mask, settings):
        before = own_forward(*ids, loss_mask)
        seen["teacher"] = all(torch.equal(a, b) for a, b in zip(student, before, strict=True))
        return teacher_stage(teacher, student, ids, loss_mask, settings)

    def checked_update(batch):
        before = own_forward(batch.prompt_ids, batch.completion_ids, batch.loss_mask)
        seen["old"] = all(torch.equal(a, b) for a, b in zip(batch.old_logprobs, before, strict=True))
        return train_step(batch)

    monkeypatch.setattr(policy, "token_kl", checked_kl)
    monkeypatch.setattr(trainer_module, "teacher_stage", checked_teacher)
    monkeypatch.setattr(policy, "train_step", checked_update)
    leave_rows_out(monkeypatch, trainer, [1, 2, 5])
    found = []
    try:
        for _ in range(2):  # the second step's batch: from version 0 with staleness, the policy is at 1
            trainer.step()
            found.append(dict(seen))
    finally:
        trainer.source.close()
        trainer.workers.close()
    assert found == [{"kl": True, "teacher": True, "old": True}] * 2
