"""configs/recipes/easyrl_math.yaml scores as EasyRL does: a differential table.

Each row is (class, completion, ground truth, EasyRL's reward), the reward being
`MathVerifier._acc_reward(content, ground_truth)` from liunanfu1992/EasyRL,
easyrl/reward_verifier/math_verifier.py (what its trainer's `verify_training_answer` and
`verify_validation_answer` compute for every response): 1.0 at the first of three tries that
succeeds, else 0.0 -- try 1, math-verify's default `parse` of the whole response and
`verify(prediction, truth)`; try 2, when the truth parses as LaTeX, the response's first LaTeX
match (`\\boxed{}` first, nothing without a LaTeX anchor); try 3, the exact text of the last
`<answer>` (else the whole response) after its `$` and operator-space rules, or both cleaned
texts equal as Python floats (`_numeric_reward`). The expected values were computed by running
that function itself on each row, with math-verify 0.9.0 (reasonrl's pin; every row is the
same under EasyRL's uv.lock pins, math-verify 0.8.0 and latex2sympy2_extended 1.10.2); each
comment names the try that decides the row.

The rows are scored as a run of the recipe scores them: the recipe's `reward` section ->
`score_examples` (the `math` verifier with reward.math_rule=easyrl in the reward worker pool),
compared exactly. reward.timeout is raised for the test only (a loaded machine cannot turn a
row into a timeout); it changes no score.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import score_recipe_cases

from reasonrl.batch import Example
from reasonrl.config import load_config
from reasonrl.errors import GroundTruthError
from reasonrl.rewards import check_examples
from reasonrl.train.advantage_stage import estimate_advantages

RECIPE = Path(__file__).parents[2] / "configs" / "recipes" / "easyrl_math.yaml"
LONG = "Let me compute step by step. " * 300

# (class, completion, ground truth, EasyRL's MathVerifier._acc_reward)
CASES = [
    # a number next to a tag ('>72<') is not read by parse; try 3 (exact text)
    ("format", "<think>x</think><answer>72</answer>", "72", 1.0),
    # no format check in the reward (_format_reward is never called); try 3 (exact text)
    ("format", "<answer>72</answer>", "72", 1.0),
    ("format", "72", "72", 1.0),  # no tags at all; try 1 (math-verify on the whole text)
    # the number after the tags; try 1 (math-verify on the whole text)
    ("format", "<think>x</think> 72", "72", 1.0),
    # tags in the wrong order: no <answer> pair, the whole text is compared; every try fails
    ("format", "</answer>72<answer>", "72", 0.0),
    # the whole text '<think>72</think>' is compared; every try fails
    ("format", "<think>72</think>", "72", 0.0),
    ("case", "<ANSWER>72</ANSWER>", "72", 0.0),  # upper-case tags are plain text; every try fails
    # the lower-case pair's text '72'; try 3 (exact text)
    ("case", "<ANSWER>5</ANSWER> <answer>72</answer>", "72", 1.0),
    # the last lower-case pair, '72'; <ANSWER> is not a tag there; try 3 (exact text)
    ("case", "<answer>72</answer> <ANSWER>5</ANSWER>", "72", 1.0),
    # findall's last match, '72'; try 3 (exact text)
    ("duplication", "<answer>5</answer> <answer>72</answer>", "72", 1.0),
    # findall's last match, '5'; every try fails
    ("duplication", "<answer>72</answer> <answer>5</answer>", "72", 0.0),
    # the match is '<answer>72', not a number; every try fails
    ("nesting", "<answer><answer>72</answer></answer>", "72", 0.0),
    # newlines around the number; try 1 (math-verify on the whole text)
    ("whitespace", "<answer>\n72\n</answer>", "72", 1.0),
    # spaces around the number; try 1 (math-verify on the whole text)
    ("whitespace", "<answer>  72  </answer>", "72", 1.0),
    ("whitespace", "", "72", 0.0),  # empty completion; every try fails
    ("whitespace", "   ", "72", 0.0),  # whitespace only; every try fails
    # parse reads the \frac, 72 (no last-number fallback: not '2'); try 1 (math-verify on the whole text)
    ("prose", "So the answer is \\frac{144}{2}", "72", 1.0),
    ("prose", "The answer is 72", "72", 1.0),  # prose; try 1 (math-verify on the whole text)
    ("prose", "72 apples", "72", 1.0),  # a unit word; try 1 (math-verify on the whole text)
    ("prose", "I got 72, then 5", "72", 0.0),  # parse reads the last number, 5; every try fails
    # parse reads the last number, 72; try 1 (math-verify on the whole text)
    ("prose", "I got 5, then 72", "72", 1.0),
    # prose in the tag, a space before the number; try 1 (math-verify on the whole text)
    ("prose", "<answer>So -8</answer>", "-8", 1.0),
    ("prose", "seventy-two", "72", 0.0),  # no number; every try fails
    ("boxed", "\\boxed{72}", "72", 1.0),  # \boxed{}; try 1 (math-verify on the whole text)
    # \boxed without braces: 72 as a plain expression; try 1 (math-verify on the whole text)
    ("boxed", "\\boxed 72", "72", 1.0),
    ("boxed", "\\fbox{72}", "72", 0.0),  # \fbox{} is not read; every try fails
    # the \boxed{} wins over a later number; try 1 (math-verify on the whole text)
    ("boxed", "\\boxed{72} and later 5", "72", 1.0),
    # the \boxed{5} wins over a later number; every try fails
    ("boxed", "\\boxed{5} and later 72", "72", 0.0),
    ("boxed", "\\boxed{\\boxed{72}}", "72", 1.0),  # nested \boxed{}; try 1 (math-verify on the whole text)
    ("boxed", "\\boxed{}", "72", 0.0),  # empty \boxed{}; every try fails
    ("boxed", "\\boxed{72", "72", 0.0),  # an unclosed \boxed{ reads nothing; every try fails
    # two \boxed{}: the last is read; try 1 (math-verify on the whole text)
    ("boxed", "<think>\\boxed{5}</think><answer>\\boxed{72}</answer>", "72", 1.0),
    ("latex", "$\\frac{144}{2}$", "72", 1.0),  # LaTeX in $...$: 72; try 1 (math-verify on the whole text)
    ("latex", "\\dfrac{1}{2}", "0.5", 0.0),  # a bare \dfrac is not read; every try fails
    ("latex", "$\\dfrac{1}{2}$", "0.5", 1.0),  # $\dfrac{1}{2}$ = 1/2; try 1 (math-verify on the whole text)
    ("latex", "\\$72", "72", 0.0),  # \$72 is not read; every try fails
    ("latex", "$72$", "72", 1.0),  # $72$; try 1 (math-verify on the whole text)
    ("latex", "\u221272", "-72", 0.0),  # U+2212 minus is not a minus; every try fails
    ("latex", "-72", "-72", 1.0),  # ASCII minus; try 1 (math-verify on the whole text)
    ("latex", "1,000", "1000", 1.0),  # the thousands comma; try 1 (math-verify on the whole text)
    ("latex", "72\\%", "72", 1.0),  # the percent sign is dropped; try 1 (math-verify on the whole text)
    ("latex", "\\text{72}", "72", 0.0),  # \text{72} is not read; every try fails
    # _process_expression removes the spaces around +; try 3 (exact text)
    ("exact_text", "<answer>x + 1</answer>", "x+1", 1.0),
    # a $...$ answer loses its dollars; try 3 (exact text)
    ("exact_text", "<answer>$x+1$</answer>", "x+1", 1.0),
    ("exact_text", "<answer>A</answer>", "A", 1.0),  # equal strings; try 3 (exact text)
    # case-sensitive strings; _numeric_reward lower-cases, but float('a') fails; every try fails
    ("exact_text", "<answer>a</answer>", "A", 0.0),
    ("exact_text", "<answer>1e2</answer>", "100", 1.0),  # float('1e2') == float('100'); try 3 (exact text)
    ("exact_text", "<answer>1_000</answer>", "1000", 1.0),  # float('1_000') == 1000.0; try 3 (exact text)
    # _clean_text's rstrip('.'), then float; try 3 (exact text)
    ("exact_text", "<answer>72.</answer>", "72", 1.0),
    ("exact_text", "<answer>inf</answer>", "inf", 1.0),  # equal strings; try 3 (exact text)
    # '7 2' is not '72', and float('7 2') fails; every try fails
    ("exact_text", "<answer>7 2</answer>", "72", 0.0),
    # the ground truth's own <answer> is read; try 3 (exact text)
    ("ground_truth", "72", "<answer>72</answer>", 1.0),
    ("ground_truth", "72", "$72$", 1.0),  # a $...$ ground truth; try 1 (math-verify on the whole text)
    # a LaTeX ground truth: 0.5 = 1/2; try 1 (math-verify on the whole text)
    ("ground_truth", "0.5", "\\frac{1}{2}", 1.0),
    ("near_miss", "73", "72", 0.0),  # wrong; every try fails
    ("near_miss", "1548557", "1548556", 0.0),  # exact integers: off by one is wrong; every try fails
    ("near_miss", "3.0000003", "3", 0.0),  # math-verify's float comparison (6 places); every try fails
    ("near_miss", "72.0", "72", 1.0),  # 72.0 == 72; try 1 (math-verify on the whole text)
    ("near_miss", "72.0000001", "72", 0.0),  # not 72 to math-verify or to float; every try fails
    ("near_miss", "720", "72", 0.0),  # a digit more; every try fails
    ("near_miss", "-72", "72", 0.0),  # sign; every try fails
    # a long reasoning without numbers, then the tag; try 3 (exact text)
    ("long", LONG + "<answer>72</answer>", "72", 1.0),
    ("long", LONG + "The answer is 73", "72", 0.0),  # long and wrong; every try fails
    ("long", "<answer>72</answer>" + LONG, "72", 1.0),  # the answer first, then long text; try 3 (exact text)

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
def test_recipe_scores_as_easyrl(scored, row):
    _, completion, truth, expected = CASES[row]
    assert scored.total[row].item() == expected, (completion[:200], truth)
    assert list(scored.components) == ["correct"] and scored.failures[row] is None
    assert_no_failure(scored)  # every component of every row (a format check's error names no row)


def test_recipe_takes_every_ground_truth_easyrl_can_match():
    """EasyRL's exact-text try matches ground truths math-verify cannot read ("A", an <answer>
    tag): the start-up check lets every non-empty one through under this recipe (reasonrl's own
    rule refuses them: no answer could ever match), and still stops an empty one."""
    cfg = load_config(RECIPE).reward
    truths = sorted({truth for _, _, truth, _ in CASES})
    check_examples([Example(prompt="", ground_truth=t, data_source="gsm8k") for t in truths], cfg)
    for rule, truth in (("extracted", "<answer>72</answer>"), ("easyrl", " ")):
        bad = dataclasses.replace(cfg, math_rule=rule)
        with pytest.raises(GroundTruthError, match="x.jsonl:1: field 'ground_truth'"):
            check_examples([Example(prompt="", ground_truth=truth, data_source="gsm8k",
                                    meta={"origin": "x.jsonl:1"})], bad)


def test_recipe_normalises_groups_as_easyrl():
    """GroupAdvantageCalculator (easyrl/advantage_calculator/group_advantage_calculator.py):
    (r - mean) / (np.std(r) + 1e-8), np.std the population std. By hand for [1, 0, 0, 0]:
    mean 0.25, np.std = sqrt((0.5625 + 3 x 0.0625) / 4) = 0.4330127, A = 0.75 / 0.4330127 =
    1.7320508 (= sqrt 3) and -0.25 / 0.4330127 = -0.5773503 (the unbiased std would give 1.5 and
    -0.5). Through the advantage stage with the recipe's algo section."""
    algo = load_config(RECIPE).algo
    assert (algo.advantage, algo.std_eps, algo.std_ddof) == ("grpo", 1e-8, 0)
    batch = SimpleNamespace(rewards=torch.tensor([1.0, 0, 0, 0]),
                            rollouts=SimpleNamespace(group=torch.tensor([0, 0, 0, 0]), episode=None),
                            scores=SimpleNamespace(unscored=torch.zeros(4, dtype=torch.bool)))  # all scored
    advantages, _, _ = estimate_advantages(batch, None, None, torch.ones(4, dtype=torch.bool), algo)
    torch.testing.assert_close(advantages, torch.tensor([1.7320508, -0.5773503, -0.5773503, -0.5773503]),
                               rtol=1e-6, atol=1e-7)  # float32 vs numpy's float64
