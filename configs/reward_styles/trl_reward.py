"""TRL reward functions, written as TRL's GRPOTrainer documents them ("Using a custom reward
function": keyword arguments prompts, completions, completion_ids and the dataset's columns by
name, one float per completion, None where a function does not apply). reasonrl calls them the
same way: reward.fns={accuracy: configs/reward_styles/trl_reward.py:accuracy_reward, ...}.
"""

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _content(completion):
    # standard format: a string; conversational format: [{"role": "assistant", "content": ...}]
    return completion if isinstance(completion, str) else completion[0]["content"]


def accuracy_reward(completions, ground_truth, **kwargs):
    """1.0 when the completion's last number equals the ground_truth column."""
    rewards = []
    for completion, truth in zip(completions, ground_truth, strict=True):
        numbers = _NUMBER.findall(_content(completion).replace(",", ""))
        rewards.append(1.0 if numbers and float(numbers[-1]) == float(truth) else 0.0)
    return rewards


def brevity_reward(completions, **kwargs):
    """Shorter is better (TRL's docs, example 1.1, inverted): 1.0 for an empty completion,
    falling by 0.01 a character to 0 at 100 characters."""
    return [max(0.0, 1.0 - len(_content(c)) / 100) for c in completions]


def sum_only_reward(prompts, completions, **kwargs):
    """A reward for sums only: None (it does not apply) to any other question."""
    return [None if "+" not in str(p) else float("+" in _content(c) or "=" in _content(c))
            for p, c in zip(prompts, completions, strict=True)]
