"""A verl custom reward function, written as verl documents one (docs/preparation/reward_function.rst:
`custom_reward_function.path` / `.name`, parameters data_source, solution_str, ground_truth,
extra_info). reasonrl calls it the same way: reward.fn=configs/reward_styles/verl_reward.py:compute_score.

It scores the default arithmetic task: the last number of the response against the ground truth,
`score` for a match and `format_score` for a response that gives a number at all (verl's GSM8K
score has the same two knobs; here they come from reward.fn_kwargs, verl's reward_kwargs). The
dict's other keys are logged by verl (reward_extra_info) and by reasonrl (reward/verl/<key>).
"""

import re

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0, score=1.0):
    numbers = _NUMBER.findall(solution_str.replace(",", ""))
    if not numbers:
        return {"score": 0.0, "acc": False, "answered": False}
    correct = float(numbers[-1]) == float(ground_truth)
    return {"score": score if correct else format_score, "acc": correct, "answered": True}
