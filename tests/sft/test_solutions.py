"""The solvers behind `sft.source=solver` (`reasonrl.sft.solutions`): correct worked solutions in
the task's answer format, checked by hand and by the task's own verifier."""

from __future__ import annotations

import json

import pytest

from reasonrl.batch import Example
from reasonrl.config import ArithmeticConfig, CountdownConfig
from reasonrl.data import arithmetic_examples
from reasonrl.data.countdown import countdown_examples
from reasonrl.errors import ConfigError, DataError
from reasonrl.rewards.countdown import countdown_reward, extract_equation
from reasonrl.rewards.safe_arithmetic import evaluate_arithmetic
from reasonrl.sft.solutions import arithmetic_solution, countdown_search, countdown_solution, solution_records


def countdown(numbers: list[int], target: int) -> Example:
    return Example("?", json.dumps({"numbers": numbers, "target": target}), "countdown")


def test_countdown_solutions_by_hand():
    # 89 + 28 = 117, 117 - 78 = 39: every number once, the steps in order, the expression in <answer>
    assert countdown_solution(countdown([89, 28, 78], 39)) == (
        "<think>\n89 + 28 = 117\n117 - 78 = 39\n</think>\n<answer>(89 + 28) - 78</answer>")
    # no expression of exact integer steps over all of 2, 3, 50 makes 6: then the fewest numbers
    assert countdown_search([2, 3, 50], 6, use_all=True) is None
    assert countdown_solution(countdown([2, 3, 50], 6)) == (
        "<think>\n3 * 2 = 6\n</think>\n<answer>3 * 2</answer>")
    # exact division only: 7 / 2 is not a step; 8 / 2 = 4, 4 + 7 = 11
    assert countdown_search([8, 2, 7], 11, use_all=True) == ("7 + (8 / 2)", [(8, "/", 2, 4), (7, "+", 4, 11)])


def test_a_countdown_problem_without_a_solution_is_named():
    with pytest.raises(DataError, match=r"no expression over \[1, 1\] equals 100"):
        countdown_solution(countdown([1, 1], 100))


def test_every_generated_countdown_problem_gets_full_marks_from_the_verifier():
    """Full marks under reasonrl's rule, and every number used exactly once (TinyZero's rule):
    the generated problems are made from all their numbers, so such a solution exists."""
    train, held_out = countdown_examples(CountdownConfig(train_size=200, val_size=20), seed=3)
    for example in train + held_out:
        solution = countdown_solution(example)
        assert countdown_reward(solution, example.ground_truth)["score"] == 1.0, example.ground_truth
        value, used = evaluate_arithmetic(extract_equation(solution))
        assert sorted(used) == sorted(json.loads(example.ground_truth)["numbers"]), solution


def test_arithmetic_solutions_state_the_value_as_the_system_prompt_asks():
    assert arithmetic_solution(Example("What is 19 + 8?", "27", "arithmetic", {"expression": "19 + 8"})) == (
        "19 + 8 = 27. The answer is 27.")
    cfg = ArithmeticConfig(operators=["+", "-", "*"], num_operands=3, train_size=50)
    train, _ = arithmetic_examples(cfg, 0)
    for example in train:
        assert arithmetic_solution(example).endswith(f"The answer is {example.ground_truth}.")


def test_records_pair_each_problem_with_its_solution_and_a_task_without_a_solver_is_refused():
    (record,) = solution_records([countdown([3, 5], 8)], "countdown")
    assert (record.prompt, record.completion) == ("?", "<think>\n5 + 3 = 8\n</think>\n<answer>5 + 3</answer>")
    assert record.where == "data.task=countdown training problem 1"
    (record,) = solution_records([countdown([3, 5], 8)], "file")  # a file's problems: by data_source
    assert record.completion.endswith("<answer>5 + 3</answer>")
    with pytest.raises(ConfigError, match=r"sft.source=solver: no solver for data.task=piecewise training "
                                          r"problem 1 \(data_source 'gsm8k', data.task=piecewise\)"):
        solution_records([Example("?", "1", "gsm8k")], "piecewise")
