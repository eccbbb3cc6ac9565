"""configs/recipes/trl_grpo_format.yaml scores as trl_GRPO does: a differential table.

trl_GRPO (xywen97/TRL-GRPO) trains with `reward_funcs=[format_reward, accuracy_reward]` summed by
TRL's GRPOTrainer; the recipe's accuracy is TRL's `accuracy_reward` (huggingface/trl,
trl/rewards/accuracy_rewards.py: the ground truth by math-verify's default `parse`, the
completion's first LaTeX match with `\\boxed{}` tried first and nothing without a LaTeX anchor,
`verify(truth, prediction)`) and the format is trl_GRPO's `format_reward` (reward.py: the regexes
`<think>.*?</think>` and `<answer>(.*?)</answer>` found, 0.5; `\\boxed{.*?}` in the first answer,
1.0). Each row is (class, completion, ground truth, (total, accuracy, format)); the expected
values were computed by running those two functions themselves on each row, with math-verify
0.9.0 (reasonrl's pin); the comment says what in them decides the row.

The rows are scored as a run of the recipe scores them: the recipe's `reward` section ->
`score_examples` (the `math` verifier with reward.math_rule=trl in the reward worker pool, the
`format_trl_grpo` component, weights 1 + 1), compared exactly as (total, correct,
format_trl_grpo). reward.timeout is raised for the test only (a loaded machine cannot turn a
row into a timeout); it changes no score.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import score_recipe_cases

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.rewards import score_examples

RECIPE = Path(__file__).parents[2] / "configs" / "recipes" / "trl_grpo_format.yaml"
LONG = "Let me compute step by step. " * 300

# (class, completion, ground truth, (total, TRL's accuracy_reward, trl_GRPO's format_reward))
CASES = [
    # format: both pairs, \boxed{} in the answer: 1.0; accuracy: the \boxed{}
    ("format", "<think>x</think><answer>\\boxed{72}</answer>", "72", (2.0, 1.0, 1.0)),
    # format 0.5 (no \boxed{}); accuracy: no LaTeX anchor, nothing read
    ("format", "<think>x</think><answer>72</answer>", "72", (0.5, 0.0, 0.5)),
    # text between the pairs is free (trl_GRPO's `python reward.py` check)
    ("format", "<think>x</think> so <answer>\\boxed{72}</answer>", "72", (2.0, 1.0, 1.0)),
    # order is free: each regex searched alone
    ("format", "<answer>\\boxed{72}</answer><think>x</think>", "72", (2.0, 1.0, 1.0)),
    # no <think> pair: format 0; accuracy still 1
    ("format", "<answer>\\boxed{72}</answer>", "72", (1.0, 1.0, 0.0)),
    ("format", "<think>x</think>\\boxed{72}", "72", (1.0, 1.0, 0.0)),  # no <answer> pair: format 0
    # pairs nested in each other: both regexes match
    ("format", "<think>x<answer>\\boxed{72}</answer></think>", "72", (2.0, 1.0, 1.0)),
    ("format", "<think>x</think><answer>\\boxed{72}", "72", (1.0, 1.0, 0.0)),  # unclosed <answer>: format 0
    ("format", "<think>x<answer>\\boxed{72}</answer>", "72", (1.0, 1.0, 0.0)),  # unclosed <think>: format 0
    # </think> before <think>: `<think>.*?</think>` does not match
    ("format", "</think>x<think><answer>\\boxed{72}</answer>", "72", (1.0, 1.0, 0.0)),
    ("format", "\\boxed{72}", "72", (1.0, 1.0, 0.0)),  # no tags: format 0, accuracy 1
    # the regexes are case-sensitive: format 0
    ("case", "<THINK>x</THINK><ANSWER>\\boxed{72}</ANSWER>", "72", (1.0, 1.0, 0.0)),
    # upper-case answer tags: format 0
    ("case", "<think>x</think><ANSWER>\\boxed{72}</ANSWER>", "72", (1.0, 1.0, 0.0)),
    # mixed-case think tags: format 0
    ("case", "<Think>x</Think><answer>\\boxed{72}</answer>", "72", (1.0, 1.0, 0.0)),
    # an extra upper-case pair changes nothing
    ("case", "<think>x</think><answer>\\boxed{72}</answer><ANSWER>5</ANSWER>", "72", (2.0, 1.0, 1.0)),
    # two think pairs: still found
    ("duplication", "<think>a</think><think>b</think><answer>\\boxed{72}</answer>", "72", (2.0, 1.0, 1.0)),
    # format reads the first <answer> (no \boxed{}): 0.5
    ("duplication", "<think>x</think><answer>5</answer><answer>\\boxed{72}</answer>", "72", (1.5, 1.0, 0.5)),
    # format reads the first <answer>: 1.0
    ("duplication", "<think>x</think><answer>\\boxed{72}</answer><answer>5</answer>", "72", (2.0, 1.0, 1.0)),
    # accuracy: math-verify's first_match scans from the end: the last \boxed{}, 72
    ("duplication", "<think>x</think><answer>\\boxed{5}</answer> <answer>\\boxed{72}</answer>",
     "72", (2.0, 1.0, 1.0)),
    # accuracy: the last \boxed{}, 5
    ("duplication", "<think>x</think><answer>\\boxed{72}</answer> <answer>\\boxed{5}</answer>",
     "72", (1.0, 0.0, 1.0)),
    # the first <answer> match is '<answer>\boxed{72}': it has a \boxed{}
    ("nesting", "<think>x</think><answer><answer>\\boxed{72}</answer></answer>", "72", (2.0, 1.0, 1.0)),
    # re.DOTALL: newlines inside the tags
    ("whitespace", "<think>\nx\n</think>\n<answer>\n\\boxed{72}\n</answer>", "72", (2.0, 1.0, 1.0)),
    # spaces inside \boxed{}
    ("whitespace", "<think>x</think><answer>\\boxed{ 72 }</answer>", "72", (2.0, 1.0, 1.0)),
    # a space before the brace: neither `\boxed{.*?}` nor math-verify reads it
    ("whitespace", "<think>x</think><answer>\\boxed {72}</answer>", "72", (0.5, 0.0, 0.5)),
    ("whitespace", "<think></think><answer></answer>", "72", (0.5, 0.0, 0.5)),  # empty pairs: format 0.5
    # `\boxed{.*?}` matches an empty \boxed{}: format 1.0; nothing to read
    ("boxed", "<think>x</think><answer>\\boxed{}</answer>", "72", (1.0, 0.0, 1.0)),
    # \fbox{} is not \boxed{}: format 0.5, accuracy 0
    ("boxed", "<think>x</think><answer>\\fbox{72}</answer>", "72", (0.5, 0.0, 0.5)),
    # \boxed -5: no brace, format 0.5; no LaTeX anchor for accuracy
    ("boxed", "<think>x</think><answer>\\boxed -5</answer>", "-5", (0.5, 0.0, 0.5)),
    # \boxed 72: format 0.5, accuracy 0
    ("boxed", "<think>x</think><answer>\\boxed 72</answer>", "72", (0.5, 0.0, 0.5)),
    # unclosed \boxed{ in the answer: no `}` after it there
    ("boxed", "<think>x</think><answer>\\boxed{72</answer>", "72", (0.5, 0.0, 0.5)),
    # the `}` after </answer> is outside the answer text
    ("boxed", "<think>x</think><answer>\\boxed{72</answer> }", "72", (0.5, 0.0, 0.5)),
    # nested \boxed{}
    ("boxed", "<think>x</think><answer>\\boxed{\\boxed{72}}</answer>", "72", (2.0, 1.0, 1.0)),
    # accuracy reads the whole completion: the \boxed{} in <think> counts
    ("boxed", "<think>\\boxed{72}</think><answer>72</answer>", "72", (1.5, 1.0, 0.5)),
    # a \boxed{} after the answer: accuracy 1, format 0.5
    ("boxed", "<think>x</think><answer>72</answer> \\boxed{72}", "72", (1.5, 1.0, 0.5)),
    # \text{72 apples} in \boxed{} is not 72
    ("boxed", "<think>x</think><answer>\\boxed{\\text{72 apples}}</answer>", "72", (1.0, 0.0, 1.0)),
    ("latex", "<think>x</think><answer>$72$</answer>", "72", (1.5, 1.0, 0.5)),  # a $...$ anchor is read
    ("latex", "<think>x</think><answer>\\(72\\)</answer>", "72", (1.5, 1.0, 0.5)),  # a \(...\) anchor
    ("latex", "<think>x</think><answer>\\[72\\]</answer>", "72", (1.5, 1.0, 0.5)),  # a \[...\] anchor
    # \frac in \boxed{}
    ("latex", "<think>x</think><answer>\\boxed{\\frac{144}{2}}</answer>", "72", (2.0, 1.0, 1.0)),
    # \dfrac in \boxed{} against 0.5
    ("latex", "<think>x</think><answer>\\boxed{\\dfrac{1}{2}}</answer>", "0.5", (2.0, 1.0, 1.0)),
    ("latex", "<think>x</think><answer>\\boxed{\\$72}</answer>", "72", (2.0, 1.0, 1.0)),  # \$72 in \boxed{}
    # U+2212 minus in \boxed{}
    ("latex", "<think>x</think><answer>\\boxed{\u221272}</answer>", "-72", (2.0, 1.0, 1.0)),
    ("latex", "<think>x</think><answer>\\boxed{-72}</answer>", "-72", (2.0, 1.0, 1.0)),  # ASCII minus
    ("latex", "<think>x</think><answer>\\boxed{1,000}</answer>", "1000", (2.0, 1.0, 1.0)),  # thousands comma
    # percent (math-verify 0.9; 0.8 reads no number here)
    ("latex", "<think>x</think><answer>\\boxed{72\\%}</answer>", "72", (2.0, 1.0, 1.0)),
    # a LaTeX ground truth
    ("latex", "<think>x</think><answer>\\boxed{72}</answer>", "\\frac{144}{2}", (2.0, 1.0, 1.0)),
    # prose: no LaTeX anchor, accuracy 0 (try_extract_without_anchor=False)
    ("prose", "<think>x</think><answer>The answer is 72</answer>", "72", (0.5, 0.0, 0.5)),
    # prose with $72$
    ("prose", "<think>x</think><answer>The answer is $72$</answer>", "72", (1.5, 1.0, 0.5)),
    ("prose", "<think>x</think><answer>So -8</answer>", "-8", (0.5, 0.0, 0.5)),  # no anchor: 0
    # wrong: format 1.0 only
    ("near_miss", "<think>x</think><answer>\\boxed{73}</answer>", "72", (1.0, 0.0, 1.0)),
    # exact integers: off by one is wrong
    ("near_miss", "<think>x</think><answer>\\boxed{1548557}</answer>", "1548556", (1.0, 0.0, 1.0)),
    # float comparison to 6 places
    ("near_miss", "<think>x</think><answer>\\boxed{3.0000003}</answer>", "3", (1.0, 0.0, 1.0)),
    ("near_miss", "<think>x</think><answer>\\boxed{72.0}</answer>", "72", (2.0, 1.0, 1.0)),  # 72.0 == 72
    ("near_miss", "<think>x</think><answer>\\boxed{-72}</answer>", "72", (1.0, 0.0, 1.0)),  # sign
    ("near_miss", "<think>x</think><answer>\\boxed{720}</answer>", "72", (1.0, 0.0, 1.0)),  # a digit more
    ("fallback", "<think>x</think><answer>72</answer>", "72", (0.5, 0.0, 0.5)),  # no last-number fallback
    ("fallback", "The answer is 72.", "72", (0.0, 0.0, 0.0)),  # no tags, no anchor: 0
    # a long reasoning
    ("long", "<think>" + LONG + "</think><answer>\\boxed{72}</answer>", "72", (2.0, 1.0, 1.0)),
    # long and wrong
    ("long", "<think>" + LONG + "</think><answer>\\boxed{73}</answer>", "72", (1.0, 0.0, 1.0)),
    # long, <think> never closed: format 0
    ("long", "<think>" + LONG + "<answer>\\boxed{72}</answer>", "72", (1.0, 1.0, 0.0)),

]


def assert_no_failure(scored) -> None:
    """No component of any row raised or timed out: a failure scores 0, which a row expecting 0
    would pass. `errors` counts every component's (a format check's too, which leaves no message
    in `failures`), `timeouts` the calls cut."""
    assert (scored.errors, scored.timeouts) == (0, 0), scored.failures
    assert scored.failures == [None] * len(scored.total) and not any(scored.timed_out), scored.failures


@pytest.fixture(scope="module")
def scored():
    return score_recipe_cases(RECIPE, CASES)


@pytest.mark.parametrize("row", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_recipe_scores_as_trl_grpo(scored, row):
    _, completion, truth, expected = CASES[row]
    got = (scored.total[row].item(), scored.components["correct"][row].item(),
           scored.components["format_trl_grpo"][row].item())
    assert got == expected, (completion[:200], truth)
    assert scored.failures[row] is None
    assert_no_failure(scored)  # every component of every row (a format check's error names no row)


def test_a_ground_truth_trl_cannot_read_adds_no_accuracy():
    """accuracy_reward returns None when `parse(solution)` reads nothing (the example's accuracy
    is skipped; GRPOTrainer's nansum keeps the other rewards): `\\sqrt{2}` without `$...$` is
    such a solution, though math-verify reads it inside `\\boxed{}` (so the start-up check lets it
    through). The total is the format reward alone, here as there."""
    cfg = load_config(RECIPE, ["reward.timeout=120"]).reward
    completion = "<think>x</think><answer>\\boxed{\\sqrt{2}}</answer>"
    scored = score_examples([completion], [Example(prompt="", ground_truth="\\sqrt{2}")], cfg)
    assert (scored.total[0].item(), scored.components["correct"][0].item()) == (1.0, 0.0)
    assert_no_failure(scored)  # 0.0 read as no accuracy, not a crash
