"""The `reward.weights` registry: named reward components, summed with their weights.

A component is fn(completion, ground_truth, fallback_last_number) -> float. `correct` is the
task verifier's score (`reasonrl.rewards.verifiers`: the function here is only the plain
numeric check used when no verifier is given); the others are format checks. Module-level
functions (not lambdas) so they pickle to worker processes.
"""

from __future__ import annotations

from reasonrl.registry import REWARD_COMPONENTS
from reasonrl.rewards.format import (
    answer_present_reward,
    boxed_format_reward,
    paired_tags_format_reward,
    r1_zero_format_reward,
    think_answer_format_reward,
    trl_grpo_format_reward,
)
from reasonrl.rewards.numeric import numeric_reward


@REWARD_COMPONENTS.register("correct")
def correct(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """the task verifier's score (reward.task / data_source / reward.fn); numeric: 1 if the
    extracted answer equals the ground truth (boxed > tag > last number)"""
    return numeric_reward(completion, ground_truth, fallback_last_number)


@REWARD_COMPONENTS.register("format")
def think_answer_format(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """DeepSeek-R1 <think></think><answer></answer> format: 0, 0.5, or 1 with a \\boxed{}"""
    return think_answer_format_reward(completion)


@REWARD_COMPONENTS.register("format_paired")
def paired_tags_format(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """trl_GRPO's format: <think> and <answer> tags in pairs, any order: 0, 0.5, or 1 with a
    \\boxed{} in the answer"""
    return paired_tags_format_reward(completion)


@REWARD_COMPONENTS.register("format_trl_grpo")
def trl_grpo_format(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """trl_GRPO's format reward as written there: <think>...</think> and <answer>...</answer>
    found (case-sensitive): 0.5, 1.0 with \\boxed{ ... } in the first answer, else 0"""
    return trl_grpo_format_reward(completion)


@REWARD_COMPONENTS.register("format_r1_zero")
def r1_zero_format(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """ReasonRL's R1-Zero format: </think> <answer> </answer> once each, in order (the opening
    <think> may be in the prompt): 1 or 0"""
    return r1_zero_format_reward(completion)


@REWARD_COMPONENTS.register("boxed")
def boxed(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """1 if the completion contains a complete \\boxed{...} (MATH convention)"""
    return boxed_format_reward(completion)


@REWARD_COMPONENTS.register("answer_present")
def answer_present(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """1 if an answer can be extracted and parses as a number, right or wrong"""
    return answer_present_reward(completion)
