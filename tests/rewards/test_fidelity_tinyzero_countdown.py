"""Fidelity: configs/recipes/verl_countdown.yaml scores every response as TinyZero does.

The original is Jiayi-Pan/TinyZero's verl/utils/reward_score/countdown.py at 4d92412:
`extract_solution` (l.7-25), `validate_equation` (l.28-41), `evaluate_equation` (l.44-56) and
`compute_score` (l.59-111, format_score 0.1, score 1.0), called by verl/trainer/main_ppo.py's
`RewardManager` on the prompt and the response decoded together. Each expected score below was
computed by running that function itself (outside this repository) on the prompt + response:
once on TinyZero's own qwen-instruct prompt and once on the recipe's prompt as SmolLM2's chat
template renders it (the same score both times), or on TinyZero's base prompt for the rows
marked "base". The comment above a case names the function and line that decide it.

Each response is scored through the recipe, as training scores it: `load_config` of the recipe
(its `reward` section), `verifier_for` the record's data_source "countdown", `score_examples`.
"""

from __future__ import annotations

import functools
import json
import re
import time
from pathlib import Path

import pytest

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.data.formats import countdown_record
from reasonrl.data.prompts import render_prompt
from reasonrl.rewards import score_examples, verifier_for
from reasonrl.rewards.safe_arithmetic import NotArithmetic
from reasonrl.rewards.tinyzero import (
    MAX_INT_BITS,
    TEMPLATES,
    extract_tinyzero_equation,
    python_value,
    uses_each_number_once,
)

RECIPE = Path(__file__).parents[2] / "configs" / "recipes" / "verl_countdown.yaml"


def truth(numbers: list[int], target: int) -> str:
    """The ground truth as `reasonrl data prepare countdown` writes it."""
    return json.dumps({"numbers": numbers, "target": target}, sort_keys=True)


@functools.cache
def recipe(*overrides: str):
    """The recipe's config, with command-line overrides."""
    return load_config(RECIPE, list(overrides))


def assert_no_failure(scored) -> None:
    """No component of any row raised or timed out: a failure scores 0, which a row expecting 0
    would pass. `errors` counts every component's (a format check's too, which leaves no message
    in `failures`), `timeouts` the calls cut."""
    assert (scored.errors, scored.timeouts) == (0, 0), scored.failures
    assert scored.failures == [None] * len(scored.total) and not any(scored.timed_out), scored.failures


def recipe_score(completion: str, ground_truth: str, *overrides: str) -> float:
    """The recipe's reward for one response of a record with this ground truth."""
    example = Example("Using the numbers ...", ground_truth, "countdown")
    scored = score_examples([completion], [example], recipe(*overrides).reward)
    assert_no_failure(scored)  # a crash scores 0.0, the expected score of many rows
    return scored.total.item()


T24 = truth([3, 5, 7, 9], 24)  # (9+3)*(7-5)
T24_BIG = truth([3, 5, 7, 9, 1], 24)
T51 = truth([93, 43, 1], 51)  # (93-43)+1
T3570 = truth([3, 5, 7, 0], 6)
T357_9 = truth([3, 5, 7], 9)
T235_13 = truth([2, 3, 5], 13)
T232_64 = truth([2, 3, 2], 64)
T232_512 = truth([2, 3, 2], 512)
T312_2 = truth([3, 1, 2, 1], 2)
T723_6 = truth([7, 2, 3], 6)
T0723_m1 = truth([0, 7, 2, 3], -1)
T1_2_99_3 = truth([1, 2, 99, 3], 1)
T0813_1 = truth([0, 8, 1, 3], 1)
T04052_m4 = truth([0, 4, 0, 5, 2], -4)
T99_99_2_1 = truth([99, 99, 2, 1], 1)
T7553_0 = truth([7, 5, 5, 3], 0)
T0011_1 = truth([0, 0, 1, 1], 1)
T3577_8 = truth([3, 5, 7, 7], 8)
T13_1 = truth([1, 3, 3], 1)
T24_1_100001 = truth([24, 1, 100001], 24)
T24_1_100000 = truth([24, 1, 100000], 24)
T24_1_99999 = truth([24, 1, 99999], 24)
T24_FLOAT_EDGE = truth([24, 71543, 7154299999], 24)

# (response, ground truth, reward.tinyzero_template, TinyZero's score): the prompt ends in
# "<|im_start|>assistant" (qwen-instruct: the recipe's chat template) or holds "Assistant:" (base).
TABLE = [
    # compute_score l.100: |24 - 24| < 1e-5 -> score
    ("<answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.16: the last line holds the answer
    ("<think>9+3=12, 7-5=2, 12*2=24</think>\n<answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.22: group(1).strip()
    ("<answer> (9 + 3) * (7 - 5) </answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.22: strip() removes tabs
    ("<answer>\t(9+3)*(7-5)\t</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.18-22: the EOS text after the pair changes nothing
    ("<answer>(9+3)*(7-5)</answer><|im_end|>", T24, "qwen-instruct", 1.0),
    # extract_solution l.18: text after the pair on the same line
    ("<answer>(9+3)*(7-5)</answer> so that is it", T24, "qwen-instruct", 1.0),
    # compute_score l.100: TinyZero's own example
    ("<answer>(93-43)+1</answer>", T51, "qwen-instruct", 1.0),
    # validate_equation l.35-39: sorted comparison, any order
    ("<answer>1 + 93 - 43</answer>", T51, "qwen-instruct", 1.0),
    # extract_solution l.18: the pattern is case-sensitive -> no answer, 0
    ("<ANSWER>(9+3)*(7-5)</ANSWER>", T24, "qwen-instruct", 0.0),
    # extract_solution l.18: case-sensitive -> 0
    ("<Answer>(9+3)*(7-5)</Answer>", T24, "qwen-instruct", 0.0),
    # extract_solution l.18: the closing tag must be lower-case -> 0
    ("<answer>(9+3)*(7-5)</ANSWER>", T24, "qwen-instruct", 0.0),
    # extract_solution l.18: only the lower-case pair counts
    ("<ANSWER>1+2</ANSWER> <answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.18: non-greedy from the first <answer>: '<answer>(9+3)*(7-5)' -> evaluate_equation
    # l.49 refuses '<' -> format_score
    ("<answer><answer>(9+3)*(7-5)</answer></answer>", T24, "qwen-instruct", 0.1),
    # extract_solution l.18: the match starts at the first <answer>: 'x <answer>...' -> validate passes, l.49
    # refuses -> format_score
    ("<answer>x <answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # extract_solution l.22: matches[-1], the last pair
    ("<answer>1+2</answer> <answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.22: the last pair is wrong -> format_score
    ("<answer>(9+3)*(7-5)</answer> <answer>1+2</answer>", T24, "qwen-instruct", 0.1),
    # extract_solution l.22: the last pair is prose -> format_score
    ("<answer>(9+3)*(7-5)</answer> <answer>I give up</answer>", T24, "qwen-instruct", 0.1),
    # extract_solution l.21-24: never closed -> None -> 0
    ("<answer>(9+3)*(7-5)", T24, "qwen-instruct", 0.0),
    # extract_solution l.21-24: never opened -> 0
    ("(9+3)*(7-5)</answer>", T24, "qwen-instruct", 0.0),
    # validate_equation l.39: no numbers != [3, 5, 7, 9] -> format_score
    ("<answer></answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.39: prose -> format_score
    ("<answer>I cannot find it</answer>", T24, "qwen-instruct", 0.1),
    # extract_solution l.24: no pair -> 0
    ("no tags at all: (9+3)*(7-5) = 24", T24, "qwen-instruct", 0.0),
    # extract_solution l.18: <answer> only, \\boxed{} is not read -> 0
    ("\\boxed{(9+3)*(7-5)}", T24, "qwen-instruct", 0.0),
    # extract_solution l.24: empty response -> 0
    ("", T24, "qwen-instruct", 0.0),
    # extract_solution l.16: the last line is empty -> 0
    ("<answer>(9+3)*(7-5)</answer>\n", T24, "qwen-instruct", 0.0),
    # extract_solution l.16: a line after the answer -> 0
    ("<answer>(9+3)*(7-5)</answer>\nThat is all.", T24, "qwen-instruct", 0.0),
    # extract_solution l.16: CRLF: the last line is empty -> 0
    ("<answer>(9+3)*(7-5)</answer>\r\n", T24, "qwen-instruct", 0.0),
    # extract_solution l.16: a lone CR is no line break -> score
    ("<answer>(9+3)*(7-5)</answer>\r", T24, "qwen-instruct", 1.0),
    # extract_solution l.16: the pair spans lines; the last line has no pair -> 0
    ("<answer>\n(9+3)*(7-5)\n</answer>", T24, "qwen-instruct", 0.0),
    # extract_solution l.16: the last line lacks the opening tag -> 0
    ("<answer>\n(9+3)*(7-5)</answer>", T24, "qwen-instruct", 0.0),
    # extract_solution l.16: only the last line counts
    ("<answer>1+2</answer>\n<answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.16: the right answer is on an earlier line -> format_score
    ("<answer>(9+3)*(7-5)</answer>\n<answer>1+2</answer>", T24, "qwen-instruct", 0.1),
    # extract_solution l.16: a long response, the answer last
    ("<think>" + "x " * 2500 + "</think>\n<answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.10-11: split at the response's first 'Assistant:' -> ' done' -> 0
    ("<answer>(9+3)*(7-5)</answer> Assistant: done", T24, "qwen-instruct", 0.0),
    # extract_solution l.10-11: the base prompt's 'Assistant:' comes first -> score
    ("<answer>(9+3)*(7-5)</answer> Assistant: done", T24, "base", 1.0),
    # extract_solution l.10-11: the answer follows the split
    ("Assistant: <answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.10-16: split, then the last line
    ("Assistant: hi\n<answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.10-22: only the part after the split is searched
    ("<answer>1+2</answer> Assistant: <answer>(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # extract_solution l.11: split at the FIRST 'Assistant:' (maxsplit 1) -> the pair stays -> format_score
    ("Assistant: <answer>1+2</answer> Assistant: x", T24, "qwen-instruct", 0.1),
    # extract_solution l.11: the split cuts the pair -> 0
    ("<answer>(9+3)*Assistant:(7-5)</answer>", T24, "qwen-instruct", 0.0),
    # extract_solution l.10: split in the prompt; evaluate_equation l.49: ':' and letters -> format_score
    ("<answer>(9+3)*Assistant:(7-5)</answer>", T24, "base", 0.1),
    # extract_solution l.10: 'assistant:' lower-case is no marker -> score
    ("<answer>(9+3)*(7-5)</answer> assistant: done", T24, "qwen-instruct", 1.0),
    # extract_solution l.12-13: the prompt's own <|im_start|>assistant comes first -> score
    ("<answer>(9+3)*(7-5)</answer> <|im_start|>assistant", T24, "qwen-instruct", 1.0),
    # extract_solution l.10-16: base template, the last line
    ("<think>ok</think>\n<answer>(9+3)*(7-5)</answer>", T24, "base", 1.0),
    # extract_solution l.16: with the base prompt and no newline, the last line is '<think>' + the response
    ("<answer>(9+3)*(7-5)</answer>", T24, "base", 1.0),
    # validate_equation l.39: 5 unused -> format_score
    ("<answer>(9+3)*7</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.39: 3 twice -> format_score
    ("<answer>(9+3)*(7-5)+3-3</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.32: '24' is a number too -> format_score
    ("<answer>(9+3)*(7-5) = 24</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.32: -> format_score
    ("<answer>24 = (9+3)*(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.32: int('07') is 7; evaluate_equation l.53: leading zero is a SyntaxError ->
    # format_score
    ("<answer>(9+3)*(07-5)</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.32: int() reads the fullwidth 3; l.53: Python does not -> format_score
    ("<answer>(9+\uff13)*(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.32: '5.0' holds 5 and 0 -> format_score
    ("<answer>(9+3)*(7-5.0)</answer>", T24, "qwen-instruct", 0.1),
    # validate_equation l.32: 3, 7, 5, 0 are the numbers; eval gives 6.0 -> score
    ("<answer>3*(7-5.0)</answer>", T3570, "qwen-instruct", 1.0),
    # validate_equation l.32-39: the numbers differ -> format_score
    ("<answer>(9+3)*(7-5)</answer>", T24_BIG, "qwen-instruct", 0.1),
    # evaluate_equation l.48-50: '\u00d7' is not allowed -> format_score
    ("<answer>(9+3)\u00d7(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.48-50: LaTeX -> format_score
    ("<answer>(9+3) \\times (7-5)</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.48-50: '$' -> format_score
    ("<answer>$(9+3)*(7-5)$</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.53: a trailing '.' is a SyntaxError -> format_score
    ("<answer>(9+3)*(7-5).</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.53: '12(2)' calls an int: TypeError -> format_score
    ("<answer>(9+3)(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.53: int + tuple: TypeError -> format_score
    ("<answer>(9+3)*(7-5)+()</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.53: unary minus is Python -> score
    ("<answer>-3+5+7</answer>", T357_9, "qwen-instruct", 1.0),
    # evaluate_equation l.53: two unary minuses -> score
    ("<answer>--(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 1,000 nested unary minuses still parse -> score
    ("<answer>" + "-" * 1000 + "(9+3)*(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # evaluate_equation l.53: past the parser's 6,000 levels (MemoryError) -> format_score
    ("<answer>" + "-" * 6000 + "(9+3)*(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.49-53: a form feed is whitespace to Python -> score
    ("<answer>(9+3)*\x0c(7-5)</answer>", T24, "qwen-instruct", 1.0),
    # evaluate_equation l.53: a vertical tab is not: SyntaxError -> format_score
    ("<answer>(9+3)*\x0b(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.49: \\s admits U+00A0; l.53: Python does not -> format_score
    ("<answer>(9+3)*\u00a0(7-5)</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.53: a correct equation of 300+ characters -> score
    ("<answer>(9 + 3)" + " " * 300 + "* (7 - 5)</answer>", T24, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 150 nested parentheses -> score
    ("<answer>" + "(" * 150 + "(9+3)*(7-5)" + ")" * 150 + "</answer>", T24, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 'too many nested parentheses' -> format_score
    ("<answer>" + "(" * 201 + "(9+3)*(7-5)" + ")" * 201 + "</answer>", T24, "qwen-instruct", 0.1),
    # evaluate_equation l.53: ** is admitted and computed -> score
    ("<answer>2**3+5</answer>", T235_13, "qwen-instruct", 1.0),
    # evaluate_equation l.53: (2**3)**2 = 64 -> score
    ("<answer>(2**3)**2</answer>", T232_64, "qwen-instruct", 1.0),
    # evaluate_equation l.53: ** is right-associative: 2**9 = 512 -> format_score
    ("<answer>2**3**2</answer>", T232_64, "qwen-instruct", 0.1),
    # evaluate_equation l.53: 512 -> score
    ("<answer>2**3**2</answer>", T232_512, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 2**-1 is 0.5 -> 2.0 -> score
    ("<answer>(3+1)*2**-1</answer>", T312_2, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 7//2 = 3 -> score
    ("<answer>7//2+3</answer>", T723_6, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 6.5 -> format_score
    ("<answer>7/2+3</answer>", T723_6, "qwen-instruct", 0.1),
    # evaluate_equation l.53: floor division rounds down: -4 + 3 = -1 -> score
    ("<answer>(0-7)//2+3</answer>", T0723_m1, "qwen-instruct", 1.0),
    # evaluate_equation l.53: 1**(2**970299) = 1 (a 970,300-bit exponent) -> score
    ("<answer>1**2**99**3</answer>", T1_2_99_3, "qwen-instruct", 1.0),
    # evaluate_equation l.53: a negative base to a fractional power is complex; l.100: |c - 1| = 1.73 ->
    # format_score
    ("<answer>(0-8)**(1/3)</answer>", T0813_1, "qwen-instruct", 0.1),
    # l.100: (-4+4.9e-16j) is within 1e-5 of -4 -> score
    ("<answer>((0-4)**0.5)**2</answer>", T04052_m4, "qwen-instruct", 1.0),
    # evaluate_equation l.53: complex // is a TypeError -> format_score
    ("<answer>((0-4)**0.5)//2</answer>", T04052_m4, "qwen-instruct", 0.1),
    # evaluate_equation l.53: int / int past 1e308: OverflowError -> format_score
    ("<answer>(99**99)**2/1</answer>", T99_99_2_1, "qwen-instruct", 0.1),
    # evaluate_equation l.53: ZeroDivisionError -> None -> format_score
    ("<answer>7/(5-5)*3</answer>", T7553_0, "qwen-instruct", 0.1),
    # l.100: 0.0 is the target 0 -> score
    ("<answer>(5-5)/7*3</answer>", T7553_0, "qwen-instruct", 1.0),
    # evaluate_equation l.53: integer ZeroDivisionError -> format_score
    ("<answer>7//(5-5)+3</answer>", T7553_0, "qwen-instruct", 0.1),
    # evaluate_equation l.53: 0 to a negative power: ZeroDivisionError -> format_score
    ("<answer>0**(0-1)+1</answer>", T0011_1, "qwen-instruct", 0.1),
    # l.100: 8/7*7 is 8.0 in floats -> score
    ("<answer>(3+5)/7*7</answer>", T3577_8, "qwen-instruct", 1.0),
    # l.100: 1/3*3 rounds to 1.0 -> score
    ("<answer>1/3*3</answer>", T13_1, "qwen-instruct", 1.0),
    # l.100: 24 + 9.9999e-6: within 1e-5 -> score
    ("<answer>24+1/100001</answer>", T24_1_100001, "qwen-instruct", 1.0),
    # l.100: exactly 1e-5 above 24, but (24 + 1e-05) - 24 is 9.9999999996e-06 in floats -> score
    ("<answer>24+1/100000</answer>", T24_1_100000, "qwen-instruct", 1.0),
    # l.100: 1.00001e-05 above 24 -> format_score
    ("<answer>24+1/99999</answer>", T24_1_99999, "qwen-instruct", 0.1),
    # l.100: exactly 1.00000000014e-05 above 24, within 1e-5 in floats -> score
    ("<answer>24+71543/7154299999</answer>", T24_FLOAT_EDGE, "qwen-instruct", 1.0),
    # validate_equation l.39: 1 and 100000 are not the numbers -> format_score
    ("<answer>(9+3)*(7-5)+1/100000</answer>", T24, "qwen-instruct", 0.1),
]


@pytest.mark.parametrize("completion, ground_truth, template, expected", TABLE)
def test_recipe_scores_as_tinyzero(completion, ground_truth, template, expected):
    overrides = () if template == "qwen-instruct" else (f"reward.tinyzero_template={template}",)
    assert recipe_score(completion, ground_truth, *overrides) == expected


def test_the_table_covers_each_score():
    """Every outcome of compute_score is in the table, for both templates."""
    assert len(TABLE) >= 60
    assert {row[3] for row in TABLE} == {0.0, 0.1, 1.0}
    assert {row[2] for row in TABLE} == set(TEMPLATES)


def test_recipe_reward_is_tinyzeros_by_default():
    reward = recipe().reward
    assert (reward.task, reward.countdown_rule, reward.countdown_format_score, reward.tinyzero_template) == (
        "countdown", "tinyzero", 0.1, "qwen-instruct")
    assert dict(verifier_for("countdown", reward).options) == {
        "format_score": 0.1, "rule": "tinyzero", "template": "qwen-instruct"}


def test_recipe_prompt_ends_where_the_template_says(tokenizer):
    """TinyZero reads the prompt too: the recipe's rendered prompt holds "<|im_start|>assistant",
    ends with TEMPLATES["qwen-instruct"], and holds no "Assistant:" (which TinyZero would split
    at instead)."""
    record = countdown_record({"target": 24, "nums": [3, 5, 7, 9]}, "cd:1", 0)
    example = Example(record["prompt"], record["ground_truth"], record["data_source"])
    data = recipe().data
    prompt = render_prompt(example, tokenizer, data.apply_chat_template, data.system_prompt)
    assert prompt.endswith(TEMPLATES["qwen-instruct"])
    assert "Assistant:" not in prompt and prompt.count("<|im_start|>assistant") == 1


@pytest.mark.parametrize("completion, ground_truth, tinyzero, subset", [
    ("<ANSWER>(9+3)*(7-5)</ANSWER>", T24, 0.0, 1.0),  # reasonrl's tags are case-insensitive
    ("<answer><answer>(9+3)*(7-5)</answer></answer>", T24, 0.1, 1.0),  # the inner pair wins
    ("<answer>(9+3)*(7-5)</answer> Assistant: done", T24, 0.0, 1.0),  # no prompt frame
    ("<answer>(9+3)*(7-5)</answer>\nThat is all.", T24, 0.0, 1.0),  # any line
    ("<answer>(9 + 3)" + " " * 300 + "* (7 - 5)</answer>", T24, 1.0, 0.0),  # at most 200 characters
    ("<answer>(9+3)*(7-5) = 24</answer>", T24, 0.1, 1.0),  # a trailing "= 24" is ignored
    ("<answer>2**3+5</answer>", T235_13, 1.0, 0.0),  # no powers, computed with fractions
    ("<answer>24+1/100000</answer>", T24_1_100000, 1.0, 0.1),  # exact: 1e-5 above is a miss
    ("\\boxed{(9+3)*(7-5)}", T24, 0.0, 1.0),  # \boxed{} when there is no <answer>
])
def test_reasonrl_rule_is_a_named_option(completion, ground_truth, tinyzero, subset):
    """`reward.countdown_rule=subset` (reasonrl's own rule, the countdown task's default) turns
    reasonrl's cleaner reading on in the recipe; off by default there."""
    assert recipe_score(completion, ground_truth) == tinyzero
    assert recipe_score(completion, ground_truth, "reward.countdown_rule=subset") == subset


# Hostile answers: TinyZero's score for each (computed by running it), reached here without
# anything of the answer being executed, at once.
@pytest.mark.parametrize("completion, expected", [
    ("<answer>__import__('os').system('echo 3 5 7 9')</answer>", 0.1),  # evaluate_equation l.49
    ("<answer>(9+3)*(7-5)+().__class__.__bases__[0]</answer>", 0.1),  # evaluate_equation l.49
    ("<answer>lambda: (9+3)*(7-5)</answer>", 0.1),  # evaluate_equation l.49
    ("<answer>" + "(" * 5000 + "(9+3)*(7-5)" + ")" * 5000 + "</answer>", 0.1),  # l.53: nesting
    ("<answer>(9+3)*(7-5)" + "+0" * 20000 + "</answer>", 0.1),  # validate_equation l.39
    ("<answer>" * 20000 + "(9+3)*(7-5)", 0.0),  # extract_solution l.21-24: never closed
])
def test_hostile_answers_score_as_tinyzero_at_once(completion, expected):
    recipe_score("", T24)  # the config loaded and the verifier imported before the clock starts
    # CPU time (the verifier runs in this process): 4 ms here at most, 40 ms on a machine 10x
    # slower; executing them is seconds to forever (below). A loaded machine's wall clock is not.
    start = time.process_time()
    assert recipe_score(completion, T24) == expected
    assert time.process_time() - start < 1.0


# ------------------------------------------------------- the parts, with hand-computed values


@pytest.mark.parametrize("solution, equation", [
    ("<|im_start|>assistant\n<answer> 1+2 </answer>", "1+2"),
    ("x Assistant: a\n<answer>1</answer><answer>2</answer>", "2"),
    ("Assistant: <answer>1</answer>\n", None),
    ("<|im_start|>assistant\nAssistant: <answer>1</answer>", "1"),  # "Assistant:" is tried first
    ("<answer>1</answer>", None),  # neither marker
    ("Assistant: <answer><answer>1</answer></answer>", "<answer>1"),
])
def test_extract_tinyzero_equation(solution, equation):
    assert extract_tinyzero_equation(solution) == equation


def test_uses_each_number_once():
    assert uses_each_number_once("(9+3)*(7-5)", [3, 5, 7, 9])
    assert not uses_each_number_once("(9+3)*7", [3, 5, 7, 9])
    assert uses_each_number_once("07 + 3", [3, 7])  # int("07") is 7
    assert not uses_each_number_once("9" * 5000, [9])  # int() refuses > 4,300 digits: False there too


@pytest.mark.parametrize("equation, value", [
    ("7//2", 3), ("(0-7)//2", -4), ("2**-1", 0.5), ("2**3**2", 512), ("1.5*2", 3.0), ("-3+5", 2),
    ("8/7*7", 8.0), ("1/3*3", 1.0), (" 1 + 2", 3), ("\t1+\x0c2", 3), ("00", 0), ("1.", 1.0), (".5", 0.5),
    ("(0-4)**0.5", complex(1.2246467991473532e-16, 2.0)), ("2**10", 1024),
])
def test_python_value(equation, value):
    """Python's own value (what TinyZero's eval returns), hand-computed."""
    result = python_value(equation)
    assert result == value and type(result) is type(value)


@pytest.mark.parametrize("equation", [
    "1/0", "7//0", "0**-1", "1(2)", "()", "...", "1+()", "007", "1..2", "1\x0b+2", "1+\u00a02", "\uff11+2",
    "1e5", "1 = 1", "(99**99)**2/1", "(0-4)**0.5//2", "", "   ", "(" * 201 + "1" + ")" * 201,
    "-" * 6000 + "1",
])
def test_python_value_refuses_what_eval_cannot_compute(equation):
    with pytest.raises(NotArithmetic):
        python_value(equation)


@pytest.mark.parametrize("equation", ["9**9**9", "2**99**4", "99**99**99", "(2**999999)*(2**999999)",
                                      "2**(2**1000)", "1**2**99**4"])
def test_integers_past_the_bound_are_refused_at_once(equation):
    """TinyZero's eval computes these for seconds (2**99**4: 1.3 s here) to forever (99**99**99);
    here an integer past MAX_INT_BITS is not computed: format_score, at once. The one score that
    differs: `1**2**99**4` is 1 there (1.0 for a target of 1) after computing 2**96059601."""
    start = time.process_time()  # CPU time: 5 ms here at most; computed, 1.3 s to forever
    with pytest.raises(NotArithmetic, match=f"past {MAX_INT_BITS} bits"):
        python_value(equation)
    assert time.process_time() - start < 1.0
    numbers = sorted(int(n) for n in re.findall(r"\d+", equation))
    assert recipe_score(f"<answer>{equation}</answer>", truth(numbers, 1)) == 0.1
