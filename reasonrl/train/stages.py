"""The model stages of a training step that are more than one worker call: the policy's log-probs
without gradient (computed once, read by every consumer), the reference's and the teacher's
forwards; and `timed`, which records each stage's seconds as `time/<stage>`. `Trainer.step`
calls them in order (reasonrl.train.trainer)."""

from __future__ import annotations

import time

import torch

from reasonrl.batch import PolicyLogprobs, TeacherScores
from reasonrl.config import TeacherConfig


def timed(times: dict[str, float], stage: str, fn, *args):
    """`fn(*args)`, its wall-clock seconds recorded as `times[stage]` (logged as time/<stage>)."""
    t = time.perf_counter()
    out = fn(*args)
    times[stage] = time.perf_counter() - t
    return out


def logprobs_stage(policy, ids: tuple, loss_mask: torch.Tensor, every_row: bool,
                   trained: bool) -> PolicyLogprobs:
    """The policy's log-probs without gradient, computed once per step for every consumer
    (verl's `compute_log_prob` stage, whose `old_log_probs` its KL penalty and update then read:
    verl/trainer/ppo/ray_trainer.py): `every_row` for the KL in the reward, `trained` (the rows
    of `loss_mask`, laid out as the update lays them out) for the teacher stage and the old
    log-probs of a multi-update step. Each is bitwise what its consumer computed itself before
    this stage existed: one forward when the loss mask holds every row (the same rows, the same
    micro-batches) or one list is asked for, else one per list. All of them are the policy now,
    before its update (with trainer.max_staleness > 0: not the version that sampled the batch)."""
    everything = policy.logprobs(*ids) if every_row else None
    if not trained:
        return PolicyLogprobs(everything, None)
    if everything is not None and bool(loss_mask.all()):
        return PolicyLogprobs(everything, everything)
    return PolicyLogprobs(everything, policy.logprobs(*ids, loss_mask))


def reference_stage(reference, policy, ids: tuple, loss_mask: torch.Tensor, algo,
                    logprobs: PolicyLogprobs) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """(the reference model's log-probs, the per-token KL for the reward or None): the step's
    one reference forward (the reference role, served within the policy's worker). KL in the
    reward needs every row, and reads the policy's log-probs of every row from the log-probs
    stage (`logprobs.every_row`); otherwise only the rows the update trains on, laid out as the
    update lays them out."""
    if algo.beta > 0 and algo.kl_in == "reward":
        ref = reference.logprobs(*ids)
        return ref, policy.token_kl(*ids, ref, logprobs.every_row)
    return reference.logprobs(*ids, loss_mask), None


def teacher_stage(teacher, student: list[torch.Tensor], ids: tuple, loss_mask: torch.Tensor,
                  settings: TeacherConfig) -> TeacherScores:
    """The teacher's log-probs of the completions the update trains on (`loss_mask`), beside the
    student's to compare them with (`student`: the log-probs stage's `trained`, the policy's now:
    on-policy, the version that sampled them; with trainer.max_staleness > 0, the version the
    update changes): the step's teacher forward. Other rows' are empty: they get no advantage."""
    rows = [i for i in range(len(ids[0])) if loss_mask[i]]
    found = teacher.logprobs([ids[0][i] for i in rows], [ids[1][i] for i in rows])
    teacher_lp = [torch.zeros(0)] * len(ids[0])
    for k, i in enumerate(rows):
        teacher_lp[i] = found[k]
    return TeacherScores(teacher_lp, student, settings.coef, settings.task_weight)
