"""On-policy distillation's per-token advantage, on tensors.

The student pi_s samples a completion y; a fixed teacher pi_t scores each of its tokens. At the
state s_t = (prompt, y_<t) the reverse KL, KL(pi_s(. | s_t) || pi_t(. | s_t)), has the
single-sample estimate on the sampled token

    k1_t = log pi_s(y_t | s_t) - log pi_t(y_t | s_t)

(unbiased because y_t ~ pi_s: Schulman 2020, "Approximating KL Divergence", k1; `reasonrl.algo.kl`).
On-policy distillation takes -k1_t as the reward of token t with discount 0, hence as token t's
advantage, and trains with the policy gradient and its importance sampling as for any advantage
(Lu and Thinking Machines Lab 2025, "On-Policy Distillation": per-token `advantages = -reverse_kl`,
tinker-cookbook `distillation/train_on_policy.py`; verl's "PG OPD" with the k1 estimator,
docs/algo/opd.md). It may be added to the task's advantage: slime's `apply_opd_kl_to_advantages`
(`slime/backends/megatron_utils/loss.py`) computes `advantages - opd_kl_coef * (student_log_probs -
teacher_log_probs)`, "orthogonal to the base advantage estimator", and prime-rl's `ref_kl` loss
(`trainer/rl/loss.py`) uses `(ref_logprobs - trainer_logprobs).detach()` times the importance
ratio as the per-token signal. Here:

    A_t = task_weight x A_task,t + coef x (log pi_t(y_t | s_t) - log pi_s(y_t | s_t))

on the completion's model tokens (an episode's environment tokens are context: 0 there), where
A_task,t is the task estimator's advantage of the completion (or of token t, for a critic's).

Only the sampled-token estimator is built. The full-distribution reverse KL (sum over the
vocabulary at each position, differentiated directly) is exact but needs the teacher's whole
next-token distribution at every position of the update (49,152 floats per token for SmolLM2),
moved from the teacher's worker into the update; the top-k variants are what inference servers
can return, and verl's page (docs/algo/opd.md) explains why they are not a sound policy-gradient
reward: the update acts only through the sampled token, so the teacher's top-k mass on other
tokens pushes on the sampled one, and a truncated KL can be negative (clamped, losing gradient).
"""

from __future__ import annotations

import torch


def reverse_kl(student_logp: torch.Tensor, teacher_logp: torch.Tensor) -> torch.Tensor:
    """k1 of KL(pi_s || pi_t) per sampled token: log pi_s - log pi_t, same shape (Schulman 2020).
    Signed: one token's value may be negative; its expectation over y_t ~ pi_s is the KL >= 0."""
    return student_logp - teacher_logp


def distill_advantages(task_advantages: torch.Tensor, student_logp: torch.Tensor,
                       teacher_logp: torch.Tensor, mask: torch.Tensor, coef: float,
                       task_weight: float) -> torch.Tensor:
    """[N, T] per-token advantages: task_weight x A_task - coef x mask x (log pi_s - log pi_t)
    (the module docstring). `task_advantages` [N] (one per completion, the same for its every
    token) or [N, >= T] (per token); `student_logp`, `teacher_logp` and `mask` [N, T] (mask 1 on
    the tokens the student chose, 0 on padding and on environment tokens). Where the student and
    the teacher agree on a token (equal log-probs) and task_weight is 0, its advantage is exactly
    0, so is its gradient."""
    if student_logp.shape != teacher_logp.shape or mask.shape != student_logp.shape:
        raise ValueError(f"student_logp, teacher_logp and mask must be [N, T] alike, got "
                         f"{tuple(student_logp.shape)}, {tuple(teacher_logp.shape)}, {tuple(mask.shape)}")
    width = student_logp.size(1)
    task = (task_advantages.unsqueeze(-1).expand(-1, width) if task_advantages.dim() == 1
            else task_advantages[:, :width])
    distill = -coef * reverse_kl(student_logp, teacher_logp) * mask
    if task_weight == 0:  # distillation alone: exactly the teacher's term (no 0 x a task advantage)
        return distill
    return task_weight * task.float() * mask + distill
