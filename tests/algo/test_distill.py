"""On-policy distillation's per-token advantage (reasonrl/algo/distill.py) against hand-computed
values, and the property that makes a teacher equal to the student a no-op: zero advantage,
hence zero gradient through the policy objective."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import loss_settings

from reasonrl.algo import Totals, policy_objective
from reasonrl.algo.distill import distill_advantages, reverse_kl


def test_reverse_kl_is_the_student_minus_the_teacher_log_prob_of_each_sampled_token():
    # student p = 0.5, 0.25; teacher p = 0.25, 0.5: k1 = log 2, -log 2
    student = torch.log(torch.tensor([[0.5, 0.25]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5]]))
    # float32 logs: each within 1 ulp of log 2 (6e-8)
    assert reverse_kl(student, teacher)[0].tolist() == pytest.approx([math.log(2), -math.log(2)], abs=1e-7)


def test_distillation_alone_is_minus_coef_times_the_reverse_kl_on_model_tokens():
    """A_t = -coef (log pi_s - log pi_t), 0 where the mask is 0 (padding, environment tokens)."""
    student = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -1.0, 0.0]])
    teacher = torch.tensor([[-1.5, -0.5, -0.5], [-1.0, -4.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])  # row 1: one model token, then not the model's
    task = torch.tensor([7.0, -7.0])  # ignored: task_weight = 0
    out = distill_advantages(task, student, teacher, mask, coef=2.0, task_weight=0.0)
    # row 0: k1 = 0.5, -1.5, 0 -> -2 k1 = -1, 3, 0; row 1: k1 = -2 -> 4, then masked
    assert out.tolist() == [[-1.0, 3.0, 0.0], [4.0, 0.0, 0.0]]


def test_the_task_advantage_is_added_with_its_weight_per_completion_or_per_token():
    student = torch.tensor([[-1.0, -2.0]])
    teacher = torch.tensor([[-1.5, -0.5]])  # k1 = 0.5, -1.5
    mask = torch.ones(1, 2)
    # slime: adv - coef * (student - teacher) with adv = 1: 1 - 0.5, 1 + 1.5; here x0.5 on the task term
    per_completion = distill_advantages(torch.tensor([1.0]), student, teacher, mask, 1.0, 0.5)
    assert per_completion.tolist() == [[0.0, 2.0]]
    # a critic's token advantages, wider than this width (cut to it): 0.5 x (2, -2) + (-0.5, 1.5)
    per_token = distill_advantages(torch.tensor([[2.0, -2.0, 9.0]]), student, teacher, mask, 1.0, 0.5)
    assert per_token.tolist() == [[0.5, 0.5]]


def test_shapes_that_do_not_line_up_are_refused():
    with pytest.raises(ValueError, match="must be \\[N, T\\] alike"):
        distill_advantages(torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), 1.0, 0.0)


def test_a_teacher_equal_to_the_student_gives_zero_advantage_and_zero_gradient():
    """Equal log-probs: every advantage is exactly 0, and the policy objective's gradient with
    respect to the student's log-probs is exactly 0 (a no-op update: AdamW's step is 0 too)."""
    torch.manual_seed(0)
    logp = torch.randn(3, 5).clamp(max=-0.01).requires_grad_()
    mask = torch.ones(3, 5)
    advantages = distill_advantages(torch.zeros(3), logp.detach(), logp.detach().clone(), mask, 1.0, 0.0)
    assert torch.count_nonzero(advantages) == 0
    loss, _ = policy_objective(logp, logp.detach(), advantages, mask, loss_settings(), Totals(15.0, 3.0))
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0
    # and a teacher that prefers token (0, 0) pushes its log-prob up: gradient of -A logp < 0
    teacher = logp.detach().clone()
    teacher[0, 0] += 1.0
    logp.grad = None
    advantages = distill_advantages(torch.zeros(3), logp.detach(), teacher, mask, 1.0, 0.0)
    policy_objective(logp, logp.detach(), advantages, mask, loss_settings(), Totals(15.0, 3.0))[0].backward()
    assert logp.grad[0, 0] == pytest.approx(-1.0 / 15.0) and torch.count_nonzero(logp.grad) == 1
