"""configs/recipes/transparent_grpo_piecewise.yaml scores as Transparent GRPO does: a
differential table.

Each row is (class, completion, Transparent GRPO's reward), the reward being
`ToyEnv.compute_reward([completion], ...)[0]` from Siyuan-Harry/transparent-grpo,
transparent_grpo.py: six regex credits added in order from 0.0 -- 1 `x\\s*=\\s*2|x\\s*=\\s*-2` with
"continuous" or "lim" in the lower-cased text +0.2; on the text with spaces removed,
2 `2a.*=.*-3|2a.*=.*-6|a.*=.*-3` +0.25, 3 `a\\s*=\\s*-3(\\.0)?` +0.15, 4 `-2-5=2\\(-2\\)-b|-7=-4-b`
+0.25, 5 `b\\s*=\\s*3(\\.0)?` +0.15, 6 `a\\+b\\s*=\\s*0`, or `answer.*0` in the lower-cased
text, or the literal `\\boxed{0}`, +0.2 -- then min(sum, 1.0). The expected values were computed
by running that function itself on each row; the comment names the credits that decide it.

The rows are scored as a run of the recipe scores them: the recipe's `reward` section (the
piecewise verifier, reward.piecewise_rule=transparent_grpo) on the problem's ground truth ->
`score_examples`, compared exactly: the same float as the original's sum, rounding included
(0.25 + 0.15 + 0.2 is 0.6000000000000001 there and here).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reasonrl.config import load_config
from reasonrl.data.tasks import load_examples
from reasonrl.rewards import score_examples

RECIPE = Path(__file__).parents[2] / "configs" / "recipes" / "transparent_grpo_piecewise.yaml"
LONG = "We need the function to be continuous at the boundaries. " * 100
FULL = ("For continuity at x = 2: 2a + 3 = 2 - 5, so 2a = -6 and a = -3. "
        "At x = -2: -2 - 5 = 2(-2) - b, so -7 = -4 - b and b = 3. The function is continuous, so a + b = 0. "
        "\\boxed{0}")

# (class, completion, Transparent GRPO's ToyEnv.compute_reward)
CASES = [
    ("full", FULL, 1.0),  # every credit: 1.2, capped at 1.0
    ("boundary", "x = 2 makes it continuous", 0.2),  # 1: x = 2 and 'continuous'
    ("boundary", "x = 2", 0.0),  # 1 needs 'continuous' or 'lim' too
    ("boundary", "x=-2, the limit", 0.2),  # 1: 'lim' inside 'limit'
    ("boundary", "x  =  -2 is continuous", 0.2),  # 1: \s* on the text as written
    ("boundary", "X = 2 CONTINUOUS", 0.0),  # 1: `x` is case-sensitive, 'continuous' is searched lower-cased
    ("boundary", "x = 20 continuous", 0.2),  # 1: `x\s*=\s*2` matches the start of 20
    ("boundary", "y = 2 continuous", 0.0),  # 1: no x
    ("boundary", "sublime x = 2", 0.2),  # 'lim' inside 'sublime' counts
    ("equation_a", "2a + 3 = -3", 0.25),  # 2: `2a.*=.*-3` on the text without spaces
    ("equation_a", "2a = -6", 0.25),  # 2: `2a.*=.*-6`; 3: 'a=-6' is not -3
    ("equation_a", "a(2) + 3 = -3", 0.25),  # 2: `a.*=.*-3`
    ("equation_a", "a = 5, so -3", 0.25),  # 2: loose: `a.*=.*-3` (3: a=5)
    ("equation_a", "2a\n= -3", 0.15),  # 2: `.` does not cross the newline; 3: `\s` does
    ("equation_a", "2 a = - 6", 0.25),  # 2: spaces removed first: '2a=-6'
    ("a_value", "a = -3", 0.4),  # 3 and also 2 (`a.*=.*-3`)
    ("a_value", "a=-3.0", 0.4),  # 3: optional .0; 2 too
    ("a_value", "a = -30", 0.4),  # 3: `a\s*=\s*-3` matches the start of -30; 2 too
    ("a_value", "a \u2212 3", 0.0),  # U+2212 is not '-' and there is no '='
    ("a_value", "A = -3", 0.0),  # uppercase A: no match for 2 or 3
    ("equation_b", "-2 - 5 = 2(-2) - b", 0.25),  # 4: `-2-5=2\(-2\)-b` without spaces
    ("equation_b", "-7 = -4 - b", 0.25),  # 4: `-7=-4-b`
    ("equation_b", "-7 = -4 + (-b)", 0.0),  # 4 needs the exact form
    ("equation_b", "-2-5=2*(-2)-b", 0.0),  # 4: `2*(-2)` is not `2(-2)`
    ("b_value", "b = 3", 0.15),  # 5
    ("b_value", "b=3.0", 0.15),  # 5: optional .0
    ("b_value", "b = 30", 0.15),  # 5: matches the start of 30
    ("b_value", "b = -3", 0.0),  # 5 needs +3
    ("answer", "a + b = 0", 0.2),  # 6: `a\+b\s*=\s*0` without spaces; 2: `a.*=.*-3` no
    ("answer", "The answer is 0", 0.2),  # 6: `answer.*0` on the lower-cased text
    ("answer", "ANSWER: 10", 0.2),  # 6: `answer.*0` matches the 0 of 10
    ("answer", "\\boxed{0}", 0.2),  # 6: '\boxed{0}' in the text
    ("answer", "\\boxed{ 0 }", 0.0),  # 6: not the literal '\boxed{0}', and no 'answer'
    ("answer", "\\boxed 0", 0.0),  # 6: not '\boxed{0}'
    ("answer", "\\fbox{0}", 0.0),  # 6: not '\boxed{0}'
    ("answer", "<answer>0</answer>", 0.2),  # 6: `answer.*0` ('answer>0')
    ("answer", "a+b=00", 0.2),  # 6: `a\+b\s*=\s*0` matches the first 0
    ("answer", "a + b = 1", 0.0),  # no credit
    ("answer", "answer\n0", 0.0),  # 6: `.` does not cross the newline
    ("sums", "x = 2 continuous. 2a = -6, a = -3", 0.6),  # 1 + 2 + 3: 0.2 + 0.25 + 0.15 in float
    ("sums", "-7 = -4 - b, b = 3", 0.4),  # 4 + 5: 0.25 + 0.15
    ("sums", "a = -3, b = 3, a + b = 0", 0.75),  # 2 + 3 + 5 + 6
    ("sums", "x = -2 lim, -7=-4-b, b=3, answer 0", 0.8),  # 1 + 4 + 5 + 6
    ("sums", "2a = -6. b = 3. The answer is 0.", 0.6000000000000001),  # 2 + 5 + 6: 0.25 + 0.15 + 0.2
    ("sums", "x=2 continuous 2a=-6 a=-3 -7=-4-b b=3", 1.0),  # 1..5: 1.0 before the answer
    ("cap", FULL + " " + FULL, 1.0),  # duplicated: each credit once, capped at 1.0
    ("cap", "x = 2 continuous a = -3 -7=-4-b b = 3 a+b=0", 1.0),  # 1 + 2 + 3 + 4 + 5 + 6 = 1.2: 1.0
    ("empty", "", 0.0),  # nothing
    ("empty", "I don't know.", 0.0),  # nothing
    ("latex", "$2a + 3 = -3$ so $a = -3$", 0.4),  # 2 and 3 through the dollars
    ("latex", "a = \\frac{-6}{2}", 0.0),  # LaTeX is not evaluated: no credit
    ("latex", "$b = 3$ and $-7 = -4 - b$", 0.4),  # 4 and 5
    ("long", LONG + FULL, 1.0),  # long text before: credits unchanged, capped
    ("long", LONG, 0.0),  # 'continuous' but no x = 2
    ("long", LONG + "x = 2", 0.2),  # 1 with a long text
    ("near_miss", "a = 3, b = -3, a + b = 0", 0.45),  # 2: `a.*=.*-3` (a=3,b=-3); 6; not 3 or 5
    ("near_miss", "a = -2, b = 2", 0.0),  # nothing: 2's `a.*=.*-3` no

]


def assert_no_failure(scored) -> None:
    """No component of any row raised or timed out: a failure scores 0, which a row expecting 0
    would pass. `errors` counts every component's (a format check's too, which leaves no message
    in `failures`), `timeouts` the calls cut."""
    assert (scored.errors, scored.timeouts) == (0, 0), scored.failures
    assert scored.failures == [None] * len(scored.total) and not any(scored.timed_out), scored.failures


@pytest.fixture(scope="module")
def scored():
    cfg = load_config(RECIPE)
    train, _ = load_examples(cfg.data, cfg.trainer.seed)
    example = train[0]  # the recipe's one problem, with its ground truth
    assert {e.ground_truth for e in train} == {example.ground_truth}
    return score_examples([completion for _, completion, _ in CASES], [example] * len(CASES), cfg.reward)


@pytest.mark.parametrize("row", range(len(CASES)), ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_recipe_scores_as_transparent_grpo(scored, row):
    _, completion, expected = CASES[row]
    assert scored.total[row].item() == expected, completion[:200]
    assert scored.failures[row] is None
    assert_no_failure(scored)  # every component of every row (a format check's error names no row)
