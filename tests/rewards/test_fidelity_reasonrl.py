"""configs/recipes/reasonrl_strict_math.yaml scores as ReasonRL does: a differential table.

Each row is (class, completion, ground truth, ReasonRL's scores), the scores being
`MathReward.compute`'s (reward, format_reward, answer_reward) from SdeeRK/reasonRL,
reason_rl/reward/math_reward.py: `_check_format` (`</think>`, `<answer>`, `</answer>` once each
by `str.count`, in that order), `_check_answer` (the first `<answer>(.*?)</answer>` match,
stripped, math-verify's default `parse`, `verify(prediction, truth)`; the stripped texts equal
if math-verify raises), reward = answer_reward when both are 1. The expected values were
computed by running that function itself on each row, with math-verify 0.9.0 (ReasonRL's
uv.lock and reasonrl pin it); the comment says what in it decides the row.

The rows are scored as a run of the recipe scores them: the recipe's `reward` section ->
`score_examples` (the `math` verifier with reward.math_rule=reason_rl in the reward worker pool,
the `format_r1_zero` component, the `format_r1_zero` gate), and compared exactly as (total,
format_r1_zero, correct). reward.timeout is raised for the test only, so that a loaded machine
cannot turn a row into a timeout; it changes no score.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import score_recipe_cases

from reasonrl.config import load_config
from reasonrl.errors import ConfigError
from reasonrl.train.advantage_stage import estimate_advantages

RECIPE = Path(__file__).parents[2] / "configs" / "recipes" / "reasonrl_strict_math.yaml"
LONG = "Let me compute step by step. " * 300

# (class, completion, ground truth, (reward, format_reward, answer_reward) of ReasonRL's MathReward)
CASES = [
    # _check_format: each tag once, in order; _check_answer: verify
    ("format", "</think> <answer>72</answer>", "72", (1.0, 1.0, 1.0)),
    # _check_format counts only </think>, so the opening <think> is free
    ("format", "<think>x</think> <answer>72</answer>", "72", (1.0, 1.0, 1.0)),
    ("format", "</think><answer>72</answer>", "72", (1.0, 1.0, 1.0)),  # no text needed between the tags
    # _check_format: response.count('</think>') != 1
    ("format", "<answer>72</answer>", "72", (0.0, 0.0, 1.0)),
    # no <answer>: _check_format fails and answer_pattern.search finds nothing
    ("format", "</think> 72", "72", (0.0, 0.0, 0.0)),
    # _check_format: think_end >= answer_start
    ("format", "<answer>72</answer> </think>", "72", (0.0, 0.0, 1.0)),
    # _check_format: answer_start >= answer_end
    ("format", "</think> </answer>72<answer>", "72", (0.0, 0.0, 0.0)),
    # no </answer>: count 0, and the regex needs the pair
    ("format", "</think> <answer>72", "72", (0.0, 0.0, 0.0)),
    # text after </answer> is free
    ("format", "</think> <answer>72</answer> and more text after", "72", (1.0, 1.0, 1.0)),
    # count('</think>') == 2; the answer alone is right
    ("format", "</think></think> <answer>72</answer>", "72", (0.0, 0.0, 1.0)),
    # str.count and the regex are case-sensitive
    ("case", "</think> <ANSWER>72</ANSWER>", "72", (0.0, 0.0, 0.0)),
    ("case", "</THINK> <answer>72</answer>", "72", (0.0, 0.0, 1.0)),  # count('</think>') == 0
    ("case", "</think> <Answer>72</Answer>", "72", (0.0, 0.0, 0.0)),  # count('<answer>') == 0
    # upper-case tags are neither counted nor read
    ("case", "</think> <answer>72</answer> <ANSWER>5</ANSWER>", "72", (1.0, 1.0, 1.0)),
    # the lower-case pair is the one read
    ("case", "</think> <ANSWER>5</ANSWER> <answer>72</answer>", "72", (1.0, 1.0, 1.0)),
    # count('<answer>') == 2 fails the format; search reads the first
    ("duplication", "</think> <answer>72</answer> <answer>5</answer>", "72", (0.0, 0.0, 1.0)),
    # first match 5: both checks fail
    ("duplication", "</think> <answer>5</answer> <answer>72</answer>", "72", (0.0, 0.0, 0.0)),
    # two of each tag; the first match, '<answer>72', reads no number
    ("nesting", "</think> <answer><answer>72</answer></answer>", "72", (0.0, 0.0, 0.0)),
    # a second </think> fails the format; '5 <think>72</think>' is not 72
    ("nesting", "</think> <answer>5 <think>72</think></answer>", "72", (0.0, 0.0, 0.0)),
    ("whitespace", "</think> <answer>\n72\n</answer>", "72", (1.0, 1.0, 1.0)),  # re.DOTALL, then .strip()
    ("whitespace", "</think> <answer>   72   </answer>", "72", (1.0, 1.0, 1.0)),  # .strip()
    ("whitespace", "</think> <answer></answer>", "72", (0.0, 1.0, 0.0)),  # parse('') == []: verify is False
    ("whitespace", "</think> <answer> </answer>", "72", (0.0, 1.0, 0.0)),  # empty after strip
    # math-verify's parse reads the number in the prose
    ("prose", "</think> <answer>So -8</answer>", "-8", (1.0, 1.0, 1.0)),
    # parse: 'answer is' then the number
    ("prose", "</think> <answer>The answer is 72</answer>", "72", (1.0, 1.0, 1.0)),
    ("prose", "</think> <answer>72 apples</answer>", "72", (1.0, 1.0, 1.0)),  # parse reads 72
    ("prose", "</think> <answer>72 dollars.</answer>", "72", (1.0, 1.0, 1.0)),  # parse reads 72
    # parse reads the equation's right side
    ("prose", "</think> <answer>x = 72</answer>", "72", (1.0, 1.0, 1.0)),
    # parse takes the last number, 72
    ("prose", "</think> <answer>I first got 5, then 72</answer>", "72", (1.0, 1.0, 1.0)),
    ("prose", "</think> <answer>72, not 5</answer>", "72", (0.0, 1.0, 0.0)),  # parse takes the last number, 5
    ("prose", "</think> <answer>seventy-two</answer>", "72", (0.0, 1.0, 0.0)),  # no number: []
    # parse's LaTeX extraction reads \boxed{}
    ("boxed", "</think> <answer>\\boxed{72}</answer>", "72", (1.0, 1.0, 1.0)),
    # the plain-expression extraction reads 72
    ("boxed", "</think> <answer>\\boxed 72</answer>", "72", (1.0, 1.0, 1.0)),
    ("boxed", "</think> <answer>\\fbox{72}</answer>", "72", (0.0, 1.0, 0.0)),  # \fbox{72} reads no number
    ("boxed", "</think> <answer>\\boxed{\\boxed{72}}</answer>", "72", (1.0, 1.0, 1.0)),  # nested \boxed{}
    ("boxed", "</think> <answer>\\boxed{}</answer>", "72", (0.0, 1.0, 0.0)),  # empty \boxed{}
    # an unclosed \boxed{ reads nothing
    ("boxed", "</think> <answer>\\boxed{72</answer>", "72", (0.0, 1.0, 0.0)),
    # only the <answer> text is read, not a \boxed{} outside it
    ("boxed", "\\boxed{72} </think> <answer>5</answer>", "72", (0.0, 1.0, 0.0)),
    # a \boxed{} after the answer is not read
    ("boxed", "</think> <answer>5</answer> \\boxed{72}", "72", (0.0, 1.0, 0.0)),
    # parse reads a bare \frac too: 72
    ("latex", "</think> <answer>\\frac{144}{2}</answer>", "72", (1.0, 1.0, 1.0)),
    # inside $...$ LaTeX is parsed: 72
    ("latex", "</think> <answer>$\\frac{144}{2}$</answer>", "72", (1.0, 1.0, 1.0)),
    ("latex", "</think> <answer>\\dfrac{1}{2}</answer>", "0.5", (0.0, 1.0, 0.0)),  # a bare \dfrac is not read
    # $\dfrac{1}{2}$ against \frac{1}{2}
    ("latex", "</think> <answer>$\\dfrac{1}{2}$</answer>", "\\frac{1}{2}", (1.0, 1.0, 1.0)),
    ("latex", "</think> <answer>\\$72</answer>", "72", (0.0, 1.0, 0.0)),  # \$72 is not read
    ("latex", "</think> <answer>$72$</answer>", "72", (1.0, 1.0, 1.0)),  # $72$: LaTeX 72
    # U+2212 minus is not read as a minus
    ("latex", "</think> <answer>\u221272</answer>", "-72", (0.0, 1.0, 0.0)),
    ("latex", "</think> <answer>-72</answer>", "-72", (1.0, 1.0, 1.0)),  # ASCII minus
    ("latex", "</think> <answer>1,000</answer>", "1000", (1.0, 1.0, 1.0)),  # the thousands comma is read
    ("latex", "</think> <answer>72\\%</answer>", "72", (1.0, 1.0, 1.0)),  # the percent sign is dropped
    ("latex", "</think> <answer>\\text{72}</answer>", "72", (0.0, 1.0, 0.0)),  # \text{72} is not read
    ("near_miss", "</think> <answer>73</answer>", "72", (0.0, 1.0, 0.0)),  # verify: 73 != 72
    # exact integers: off by one is wrong
    ("near_miss", "</think> <answer>1548557</answer>", "1548556", (0.0, 1.0, 0.0)),
    ("near_miss", "</think> <answer>3.0000003</answer>", "3", (0.0, 1.0, 0.0)),  # not 3 to math-verify
    ("near_miss", "</think> <answer>72.0</answer>", "72", (1.0, 1.0, 1.0)),  # 72.0 == 72
    ("near_miss", "</think> <answer>72.0000001</answer>", "72", (0.0, 1.0, 0.0)),  # not 72 to math-verify
    ("near_miss", "</think> <answer>-72</answer>", "72", (0.0, 1.0, 0.0)),  # sign
    ("near_miss", "</think> <answer>720</answer>", "72", (0.0, 1.0, 0.0)),  # a digit more
    ("near_miss", "</think> <answer>0.72</answer>", "72", (0.0, 1.0, 0.0)),  # scale
    ("fallback", "</think> The answer is 72.", "72", (0.0, 0.0, 0.0)),  # no <answer>: no last-number fallback
    # text after the tag is not read
    ("fallback", "</think> <answer>five</answer> so 72", "72", (0.0, 1.0, 0.0)),
    # text before the tag is not read
    ("fallback", "The answer is 72 </think> <answer>5</answer>", "72", (0.0, 1.0, 0.0)),
    # a long reasoning before the tags
    ("long", LONG + "</think> <answer>72</answer>", "72", (1.0, 1.0, 1.0)),
    ("long", "</think> <answer>" + "so " * 300 + "72</answer>", "72", (1.0, 1.0, 1.0)),  # a long answer text
    ("long", LONG + "</think> <answer>73</answer>", "72", (0.0, 1.0, 0.0)),  # long and wrong
    # the ground truth parsed too: 72 == 72.0
    ("ground_truth", "</think> <answer>72</answer>", "72.0", (1.0, 1.0, 1.0)),
    # the ground truth \frac{1}{2} is parsed too: 0.5 = 1/2
    ("ground_truth", "</think> <answer>0.5</answer>", "\\frac{1}{2}", (1.0, 1.0, 1.0)),

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
def test_recipe_scores_as_reasonrl(scored, row):
    _, completion, truth, expected = CASES[row]
    got = (scored.total[row].item(), scored.components["format_r1_zero"][row].item(),
           scored.components["correct"][row].item())
    assert got == expected, (completion[:200], truth)
    assert scored.failures[row] is None
    assert_no_failure(scored)  # every component of every row (a format check's error names no row)


def test_recipe_normalises_groups_with_reasonrls_population_std():
    """GRPOAdvantage._compute_group_advantage (reason_rl/advantage/grpo_advantage.py, mode grpo):
    (r - mean) / (np.std(r) + advantage_eps), np.std the population std, eps 1e-6. By hand for
    the group [1, 1, 0, 0, 0, 0, 0, 0]: mean 0.25, sum of squares 2 x 0.5625 + 6 x 0.0625 = 1.5,
    np.std = sqrt(1.5 / 8) = 0.4330127; A = 0.75 / 0.4330137 = 1.7320468 and -0.25 / 0.4330137 =
    -0.5773489 (the unbiased std, sqrt(1.5 / 7) = 0.4629100, would give 1.6201817 and -0.5400606).
    A group of equal rewards: 0. Through the advantage stage with the recipe's algo section."""
    algo = load_config(RECIPE).algo
    assert (algo.advantage, algo.std_eps, algo.std_ddof) == ("grpo", 1e-6, 0)
    rewards = torch.tensor([1.0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1])
    batch = SimpleNamespace(rewards=rewards,
                            rollouts=SimpleNamespace(group=torch.tensor([0] * 8 + [1] * 8), episode=None),
                            scores=SimpleNamespace(unscored=torch.zeros(16, dtype=torch.bool)))  # all scored
    advantages, _, _ = estimate_advantages(batch, None, None, torch.ones(16, dtype=torch.bool), algo)
    expected = torch.tensor([1.7320468, 1.7320468] + [-0.5773489] * 6 + [0.0] * 8)
    torch.testing.assert_close(advantages, expected, rtol=1e-6, atol=1e-7)  # float32 vs numpy's float64


def test_the_originals_rules_are_options_off_by_default():
    """reasonrl's own rules stay the defaults: reward.math_rule extracted, algo.std_ddof 1; the
    keys refuse other values at start-up, naming what is allowed."""
    cfg = load_config(None)
    assert (cfg.reward.math_rule, cfg.algo.std_ddof) == ("extracted", 1)
    with pytest.raises(ConfigError, match=r"reward.math_rule: 'reasonrl' is not allowed \(did you mean "
                                          r"'reason_rl'\?\); allowed values: extracted, reason_rl, easyrl, "
                                          r"trl"):
        load_config(None, ["reward.math_rule=reasonrl"])
    with pytest.raises(ConfigError, match="algo.std_ddof: must be in"):
        load_config(None, ["algo.std_ddof=2"])
