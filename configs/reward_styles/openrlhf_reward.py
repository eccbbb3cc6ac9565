"""An OpenRLHF reward function, written as OpenRLHF's README documents one (`--reward.remote_url
/path/to/reward_func.py`, `reward_func(queries, prompts, labels)` returning rewards, scores and
extra_logs). reasonrl calls it the same way: reward.fn=configs/reward_styles/openrlhf_reward.py:reward_func.
"""

import re

import torch

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def reward_func(queries, prompts, labels):
    rewards = []
    for query, prompt, label in zip(queries, prompts, labels, strict=True):
        response = query[len(prompt):]  # queries are the prompt followed by the response
        numbers = _NUMBER.findall(response.replace(",", ""))
        rewards.append(1.0 if numbers and float(numbers[-1]) == float(label) else 0.0)
    reward = torch.tensor(rewards)
    return {
        "rewards": reward,  # the reward the advantages are computed from
        "scores": reward,  # OpenRLHF's dynamic filtering reads these; reasonrl logs them
        "extra_logs": {"answer_rate": reward.mean().item()},  # logged as reward/openrlhf/answer_rate
    }
