"""Tests for reasonrl.rewards: answer extraction, number parsing, format and weighted scores."""

from __future__ import annotations

import re
import time
from fractions import Fraction

import pytest
import torch
from helpers import patch_entry

from reasonrl.batch import Scores
from reasonrl.registry import REWARD_COMPONENTS
from reasonrl.rewards import (
    BadGroundTruth,
    answer_present_reward,
    boxed_format_reward,
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_last_number,
    make_reward_fn,
    numbers_equal,
    numeric_reward,
    paired_tags_format_reward,
    parse_number,
    per_sample,
    r1_zero_format_reward,
    score,
    think_answer_format_reward,
)
from reasonrl.rewards.extract import all_between, first_between
from reasonrl.rewards.numeric import canonical_answer, parse_exact

# ---------------------------------------------------------------------------- extraction


@pytest.mark.parametrize("text, expected", [
    (r"so \boxed{42}", "42"),
    (r"\boxed{ 42 }", "42"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"\boxed{\sqrt{\frac{1}{2}}} done", r"\sqrt{\frac{1}{2}}"),
    (r"\boxed{1} then \boxed{2}", "2"),  # last wins
    (r"\boxed{1} then \boxed{2", "1"),  # unclosed last one is skipped
    (r"\boxed{2", None),
    (r"\boxed{\frac{1}{2}", None),
    (r"\fbox{7}", "7"),
    (r"$\boxed 5$", "5"),
    (r"\boxed {9}", "9"),
    (r"\boxed{\boxed{1}}", "1"),
    (r"\boxed{}", ""),
    ("no box here", None),
    ("", None),
])
def test_extract_boxed(text: str, expected: str | None) -> None:
    assert extract_boxed(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("<answer>18</answer>", "18"),
    ("<answer>\n  18 \n</answer>", "18"),
    ("<answer>1</answer> and <answer>2</answer>", "2"),
    ("<ANSWER>3</Answer>", "3"),
    ("<answer>1</answer> <answer>2", "1"),  # unclosed last tag: earlier pair
    ("<answer>a</answer></answer>", "a"),
    ("<answer>multi\nline</answer>", "multi\nline"),
    ("<answer>18", None),
    ("18</answer>", None),
    ("</answer><answer>", None),
    ("nothing", None),
])
def test_extract_answer_tag(text: str, expected: str | None) -> None:
    assert extract_answer_tag(text) == expected


@pytest.mark.parametrize("text, first, every", [
    ("<answer>1</answer><answer>2</answer>", "1", ["1", "2"]),
    ("<answer>x<answer>y</answer>z</answer>", "x<answer>y", ["x<answer>y"]),  # the first close ends it
    ("</answer><answer>1</answer>", "1", ["1"]),  # a close before any open is not a pair
    ("<answer>\n1\n</answer>", "\n1\n", ["\n1\n"]),  # across lines (re.DOTALL)
    ("<answer></answer>", "", [""]),
    ("<answer>1", None, []),
    ("<ANSWER>1</ANSWER>", None, []),  # case-sensitive, as the regexes they stand for
    ("<answer>1</answer><answer>2", "1", ["1"]),
])
def test_first_and_all_between_are_the_non_greedy_regexs_matches(text, first, every):
    """`first_between` / `all_between` are `re.search` / `re.findall` of `<answer>(.*?)</answer>`
    with re.DOTALL (what ReasonRL, EasyRL and trl_GRPO search with), in linear time."""
    assert first_between(text, "<answer>", "</answer>") == first
    assert all_between(text, "<answer>", "</answer>") == every
    match = re.search(r"<answer>(.*?)</answer>", text, re.DOTALL)
    assert (match.group(1) if match else None) == first
    assert re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL) == every
    # CPU time, not the wall clock (a loaded machine's): linear is 4 ms here, the regex's ~10^10
    # steps are minutes on any machine
    start = time.process_time()
    first_between("<answer>" * 200_000, "<answer>", "</answer>")  # the regex: ~10^10 steps
    all_between("<answer>" * 200_000 + "</answer>", "<answer>", "</answer>")
    assert time.process_time() - start < 1.0


@pytest.mark.parametrize("text, expected", [
    ("I have 3 apples and 5 pears", "5"),
    ("total: -1,234.5 dollars", "-1,234.5"),
    ("costs $1,000.", "1,000"),
    ("half is 3/4", "3/4"),
    ("x = -7", "-7"),
    ("10-3", "3"),  # a binary minus is not a sign
    ("1,2,3", "3"),  # not a thousands group
    ("pi is 3.14", "3.14"),
    ("no numbers", None),
    ("", None),
])
def test_extract_last_number(text: str, expected: str | None) -> None:
    assert extract_last_number(text) == expected


@pytest.mark.parametrize("text, fallback, expected", [
    (r"<answer>\boxed{5}</answer> \boxed{6}", True, ("5", "boxed")),  # boxed in tag first
    (r"<answer>5</answer> \boxed{6}", True, ("6", "boxed")),  # boxed anywhere beats tag
    ("<answer>12</answer> then 99", True, ("12", "answer_tag")),  # tag beats last number
    ("<answer>twelve</answer> then 99", True, ("twelve", "answer_tag")),
    ("so it is 99 and 100", True, ("100", "last_number")),
    ("so it is 99 and 100", False, (None, "none")),
    ("<answer>12</answer> 99", False, ("12", "answer_tag")),
    ("no answer", True, (None, "none")),
])
def test_extract_answer(text: str, fallback: bool, expected: tuple[str | None, str]) -> None:
    assert extract_answer(text, fallback_last_number=fallback) == expected


# ---------------------------------------------------------------------------- numbers


@pytest.mark.parametrize("s, expected", [
    ("18", 18.0),
    (" 18 ", 18.0),
    ("18.0", 18.0),
    ("-3", -3.0),
    ("+5", 5.0),
    ("1,000", 1000.0),
    ("1,234,567.5", 1234567.5),
    ("$1,000", 1000.0),
    (r"\$18", 18.0),
    ("50%", 50.0),
    (r"50\%", 50.0),
    ("18.", 18.0),
    ("5.", 5.0),
    (".5", 0.5),
    ("18 dollars", 18.0),
    ("5 apples.", 5.0),
    (r"\text{18}", 18.0),
    (r"18\text{ dollars}", 18.0),
    ("3/4", 0.75),
    ("-3/4", -0.75),
    (r"\frac{1}{2}", 0.5),
    (r"\dfrac{3}{4}", 0.75),
    (r"-\frac{1}{4}", -0.25),
    (r"\frac12", 0.5),
    ("x = 5", 5.0),
    ("x=y=-2", -2.0),
    ("1e3", 1000.0),
    ("1{,}000", 1000.0),
    ("\u22123", -3.0),  # unicode minus
    (r"90^\circ", 90.0),
    # not a single number
    ("", None),
    ("   ", None),
    ("abc", None),
    ("dollars", None),
    ("1/0", None),
    (r"\frac{1}{0}", None),
    ("5 + 3", None),
    ("5 m^2", None),
    ("1,2345", None),
    ("1e400", None),
    ("(1, 2)", None),
])
def test_parse_number(s: str, expected: float | None) -> None:
    assert parse_number(s) == expected


def test_parse_number_never_raises() -> None:
    for s in [None, 5, "\\frac{", "}{", "=", "1/", "/2", "-", "e5", "9" * 5000, "$$", "\\text{"]:
        assert parse_number(s) is None or isinstance(parse_number(s), float)  # type: ignore[arg-type]


def test_numbers_equal() -> None:
    """Exact: no tolerance (a relative 1e-6 took 1548557 for 1548556)."""
    assert numbers_equal(18.0, 18) and numbers_equal(Fraction(1, 2), 0.5)
    assert not numbers_equal(1548557, 1548556) and not numbers_equal(3.0000003, 3)
    assert not numbers_equal(0.1 + 0.2, 0.3) and not numbers_equal(0.0, 1e-12)
    assert not numbers_equal(18.0, 18.01)


@pytest.mark.parametrize("answer, truth, expected", [
    ("1548557", "1548556", 0.0),
    ("1,548,556", "1548556", 1.0),
    ("3.0000003", "3", 0.0),
    ("9007199254740993", "9007199254740992", 0.0),  # the same float, not the same integer
    ("\\frac{1}{3}", "0.333333", 0.0),
    ("0.50", "\\frac{1}{2}", 1.0),
])
def test_numeric_reward_is_exact(answer, truth, expected) -> None:
    assert numeric_reward(f"\\boxed{{{answer}}}", truth) == expected


def test_parse_exact_and_canonical_integers() -> None:
    assert parse_exact("1,234.5") == Fraction(2469, 2) and parse_exact("\\frac{1}{3}") == Fraction(1, 3)
    assert parse_exact("9007199254740993") == 9007199254740993 and parse_exact("1e-999") is None
    assert canonical_answer("9007199254740993", numeric=True) == "9007199254740993"  # not "9.00719925474e+15"
    assert canonical_answer("-0", numeric=True) == "0" and canonical_answer("0.5", numeric=True) == "0.5"


@pytest.mark.parametrize("completion, truth, fallback, expected", [
    ("The answer is 18.0", "18", True, 1.0),
    ("The answer is 18.0", "18", False, 0.0),  # no box/tag and no fallback
    ("It costs $1,000.", "1000", True, 1.0),
    ("<answer>1000</answer>", "1,000", True, 1.0),
    (r"\boxed{\frac{1}{2}}", "0.5", True, 1.0),
    (r"\boxed{18 dollars}", "18", False, 1.0),
    ("<answer>x = 5</answer>", "5", False, 1.0),
    ("<answer>-7</answer>", "-7", True, 1.0),
    ("<answer>7</answer>", "-7", True, 0.0),
    ("The answer is 17", "18", True, 0.0),
    (r"\boxed{17} but maybe 18", "18", True, 0.0),  # boxed beats the last number
    ("<answer>eighteen</answer> 18", "18", True, 0.0),  # tag beats the last number
    ("", "18", True, 0.0),
    ("I don't know", "18", True, 0.0),
])
def test_numeric_reward(completion: str, truth: str, fallback: bool, expected: float) -> None:
    assert numeric_reward(completion, truth, fallback_last_number=fallback) == expected


@pytest.mark.parametrize("truth", ["", "abc", "1/0", "five"])
def test_numeric_reward_bad_ground_truth_raises(truth: str) -> None:
    with pytest.raises(ValueError, match="ground truth"):
        numeric_reward("18", truth)


# ---------------------------------------------------------------------------- format


@pytest.mark.parametrize("completion, expected", [
    (r"<think>hmm</think><answer>\boxed{5}</answer>", 1.0),
    ("<think>hmm</think><answer>5</answer>", 0.5),
    ("<think>\nhmm\n</think>\n\n<answer>\n5\n</answer>\n", 0.5),
    (r"Sure. <think>a</think> <answer>so \boxed{5}.</answer> bye", 1.0),
    (r"<think>a</think><answer>\boxed{5</answer>", 0.5),  # unclosed box: no bonus
    ("<think></think><answer></answer>", 0.5),
    ("<THINK>a</THINK><Answer>5</Answer>", 0.5),
    ("<think>a</think>", 0.0),  # no answer
    ("<answer>5</answer>", 0.0),  # no think
    ("<think>a<answer>5</answer>", 0.0),  # think never closed
    ("<think>a</think>5</answer>", 0.0),  # </answer> without <answer>
    ("<answer>5</answer><think>a</think>", 0.0),  # answer before think
    ("<think>a<answer>5</answer></think>", 0.0),  # answer inside think
    ("<think>a</think> so: <answer>5</answer>", 0.0),  # text between the blocks
    ("<think>a</think><think>b</think><answer>5</answer>", 0.0),  # two thinks
    ("<think>a</think><answer>5</answer><answer>6</answer>", 0.0),  # two answers
    ("<think>a</think><answer>5</answer></answer>", 0.0),
    ("just 5", 0.0),
    ("", 0.0),
])
def test_think_answer_format_reward(completion: str, expected: float) -> None:
    assert think_answer_format_reward(completion) == expected


@pytest.mark.parametrize("completion, boxed, present", [
    (r"\boxed{5}", 1.0, 1.0),
    (r"\boxed{x}", 1.0, 0.0),  # boxed but not a number
    (r"\boxed{5", 0.0, 1.0),  # unclosed box, last-number fallback finds 5
    ("<answer>7</answer>", 0.0, 1.0),
    ("<answer>seven</answer>", 0.0, 0.0),
    ("the result is 12", 0.0, 1.0),
    ("no idea", 0.0, 0.0),
])
def test_boxed_and_answer_present(completion: str, boxed: float, present: float) -> None:
    assert boxed_format_reward(completion) == boxed
    assert answer_present_reward(completion) == present


# trl_GRPO's format rule (issue 17): tags in pairs (any order, any text between), 0.5; with a
# \boxed{} in the <answer>, 1.0; an unpaired or missing tag, 0.
@pytest.mark.parametrize("completion, expected", [
    (r"<think>x</think> so <answer>\boxed{4}</answer>", 1.0),  # the example (strict rule: 0)
    (r"<think>x</think><answer>\boxed{4}</answer>", 1.0),
    ("<think>x</think><answer>4</answer>", 0.5),  # paired, no \boxed{}
    (r"<answer>\boxed{4}</answer><think>x</think>", 1.0),  # order is free
    (r"<think>a</think><think>b</think><answer>\boxed{4}</answer>", 1.0),  # two pairs are pairs
    (r"<think>x</think> \boxed{4} <answer>4</answer>", 0.5),  # \boxed{} outside the <answer>
    (r"<think>x<answer>\boxed{4}</answer>", 0.0),  # <think> unpaired
    (r"<think>x</think><answer>\boxed{4}", 0.0),  # <answer> unpaired
    (r"<answer>\boxed{4}</answer>", 0.0),  # no think pair
    (r"<think>x</think> \boxed{4}", 0.0),  # no answer pair
    (r"\boxed{4}", 0.0),  # the bare box
    ("", 0.0),
])
def test_paired_tags_format_reward(completion: str, expected: float) -> None:
    assert paired_tags_format_reward(completion) == expected


# ReasonRL's `_check_format`: </think>, <answer>, </answer> once each and in that order; the
# opening <think> is in the R1-Zero prompt. Exact case, as str.count there.
@pytest.mark.parametrize("completion, expected", [
    ("reasoning here </think> <answer>18</answer>", 1.0),  # R1-Zero: <think> was in the prompt
    ("<think>r</think><answer>18</answer>", 1.0),
    ("r </think>\n<answer>\\boxed{18}</answer> trailing text", 1.0),
    ("r </think> then words <answer>18</answer>", 1.0),  # text between is allowed there
    (r"\boxed{18}", 0.0),  # the bare box: ReasonRL gives 0.0
    ("<answer>18</answer>", 0.0),  # no </think>
    ("r </think> 18", 0.0),  # no answer
    ("r </think> <answer>18</answer> </think>", 0.0),  # </think> twice
    ("r </think> <answer>1</answer> <answer>2</answer>", 0.0),  # <answer> twice
    ("<answer>18</answer> r </think>", 0.0),  # wrong order
    ("r </think> </answer>18<answer>", 0.0),  # closed before opened
    ("r </THINK> <ANSWER>18</ANSWER>", 0.0),  # case-sensitive
])
def test_r1_zero_format_reward(completion: str, expected: float) -> None:
    assert r1_zero_format_reward(completion) == expected


# ReasonRL's strict reward: 1.0 only when the format is right and the answer is; a gate makes
# the weighted sum all-or-nothing. Hand-computed totals per row.
STRICT = [
    ("r </think> <answer>18</answer>", 1.0),  # format and answer: 1
    (r"\boxed{18}", 0.0),  # right answer, no format (sum without the gate: 1.0)
    ("r </think> <answer>17</answer>", 0.0),  # format, wrong answer
    ("r </think> 18", 0.0),
]


def test_gate_makes_the_sum_all_or_nothing() -> None:
    completions, expected = [c for c, _ in STRICT], [t for _, t in STRICT]
    weights = {"correct": 1.0, "format_r1_zero": 0.0}
    gated = score(completions, ["18"] * 4, weights, fallback_last_number=False, gate=["format_r1_zero"])
    assert gated.total.tolist() == expected
    assert {k: v.tolist() for k, v in gated.components.items()} == {"correct": [1.0, 1.0, 0.0, 0.0],
                                                                   "format_r1_zero": [1.0, 0.0, 1.0, 0.0]}
    summed = score(completions, ["18"] * 4, weights, fallback_last_number=False)
    assert summed.total.tolist() == [1.0, 1.0, 0.0, 0.0]  # today's sum: the bare box earns 1.0
    # combine=all gates on every weighted component: 0.5 x 1 + 1 x 0.5 with both > 0
    both = score([r"<think>a</think><answer>\boxed{18}</answer>", "<think>a</think><answer>18</answer>",
                  r"\boxed{18}"], ["18"] * 3, {"correct": 0.5, "format": 1.0}, gate=["correct", "format"])
    assert both.total.tolist() == [1.5, 1.0, 0.0]
    with pytest.raises(ValueError, match="gate"):
        score(["x"], ["1"], {"correct": 1.0}, gate=["format"])


# ---------------------------------------------------------------------------- registry / score


def test_reward_components_and_make_reward_fn() -> None:
    assert set(REWARD_COMPONENTS.names()) == {"correct", "format", "format_paired", "format_r1_zero",
                                              "format_trl_grpo", "boxed", "answer_present", "judge",
                                              "classifier"}
    assert make_reward_fn("correct")("so 18", "18") == 1.0
    assert make_reward_fn("correct", fallback_last_number=False)("so 18", "18") == 0.0
    assert make_reward_fn("format")("<think>a</think><answer>5</answer>", "ignored") == 0.5
    assert make_reward_fn("boxed")(r"\boxed{1}", "ignored") == 1.0
    assert make_reward_fn("answer_present")("7", "ignored") == 1.0
    with pytest.raises(ValueError, match="answer_present"):
        make_reward_fn("nope")


def test_score_weighted_totals() -> None:
    completions = [
        r"<think>a</think><answer>\boxed{18}</answer>",  # correct 1, format 1, boxed 1
        "<think>a</think><answer>17</answer>",  # correct 0, format 0.5, boxed 0
        "it is 18",  # correct 1 (fallback), format 0, boxed 0
    ]
    truths = ["18", "18", "18"]
    weights = {"correct": 1.0, "format": 0.2, "boxed": 0.0}
    result = score(completions, truths, weights)
    assert isinstance(result, Scores) and result.total.dtype == torch.float64  # Python's sums, exactly
    assert result.total.tolist() == pytest.approx([1.2, 0.1, 1.0])
    assert {k: v.tolist() for k, v in result.components.items()} == {
        "correct": [1.0, 0.0, 1.0],
        "format": [1.0, 0.5, 0.0],
        "boxed": [1.0, 0.0, 0.0],  # weight 0: computed and reported, not added
    }
    assert result.errors == 0
    no_fallback = score(completions, truths, {"correct": 2.0}, fallback_last_number=False)
    assert no_fallback.total.tolist() == [2.0, 0.0, 0.0]


def test_score_empty_batch() -> None:
    empty = score([], [], {"correct": 1.0})
    assert empty.total.tolist() == [] and empty.components["correct"].tolist() == [] and empty.errors == 0
    assert empty.failures == empty.timed_out == empty.parts == []


def test_score_counts_component_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def flaky(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
        if "boom" in completion:
            raise RuntimeError("component bug")
        return 1.0

    patch_entry(monkeypatch, REWARD_COMPONENTS, "boxed", flaky)
    result = score(["ok 1", "boom", "boom 1"], ["1", "1", "1"], {"boxed": 0.5, "correct": 1.0})
    assert result.components["boxed"].tolist() == [1.0, 0.0, 0.0]
    assert result.components["correct"].tolist() == [1.0, 0.0, 1.0]
    assert result.total.tolist() == pytest.approx([1.5, 0.0, 1.0])
    assert result.errors == 2


def test_score_bad_ground_truth_propagates() -> None:
    with pytest.raises(ValueError, match="not-a-number"):
        score(["18", "18"], ["18", "not-a-number"], {"correct": 1.0, "format": 0.1})
    with pytest.raises(BadGroundTruth) as err:  # the first bad row, named by its index
        score(["18", "18", "18"], ["18", "x", "y"], {"correct": 1.0})
    assert err.value.row == 1


def test_a_per_sample_reward_is_called_in_the_batch_form() -> None:
    """`per_sample` turns fn(completion, ground_truth, extra_info, **options) into the batch form
    every reward is called in: one Outcome per row, and a row that raises fails alone."""
    def fn(completion: str, ground_truth: str, extra_info: dict, bonus: float = 0.0) -> float:
        if completion == "boom":
            raise RuntimeError("bad row")
        return float(completion == ground_truth) + bonus

    out = per_sample(fn)(["1", "boom", "2"], ["1", "1", "1"], [0, 0, 1], [{}, {}, {}], bonus=0.5)
    assert [o.value for o in out] == [1.5, None, 0.5]
    assert [o.error for o in out] == [None, "RuntimeError: bad row", None]


def test_score_argument_errors() -> None:
    with pytest.raises(ValueError, match="unknown"):
        score(["a"], ["1"], {"correct": 1.0, "lenght": 0.1})
    with pytest.raises(ValueError):
        score(["a", "b"], ["1"], {"correct": 1.0})


# ---------------------------------------------------------------------------- adversarial speed

_ADVERSARIAL = [
    "\\boxed{" * 20000,
    "{" * 100000,
    "}" * 100000,
    "1," * 50000,
    "1" * 100000 + "/",
    "-" * 100000,
    "<answer>" * 12500,
    "</answer>" * 11000,
    "<think>" * 14000,
    "\\boxed" + " " * 100000,
    "\\text{" * 16000,
    "\\frac{" * 16000,
    "1,234" * 20000,
    "=" * 100000,
    "$" * 100000,
]


@pytest.mark.parametrize("text", _ADVERSARIAL, ids=[f"adv{i}" for i in range(len(_ADVERSARIAL))])
def test_adversarial_inputs_are_fast(text: str) -> None:
    """Linear in the 100,000 characters: 0.15 s of CPU here at most (`<think>` x 14000), 1.5 s
    on a machine 10x slower; quadratic would be ~10^10 steps, minutes of CPU on any machine.
    CPU time, not the wall clock: a loaded machine's other processes do not count."""
    start = time.process_time()
    extract_boxed(text)
    extract_answer_tag(text)
    extract_last_number(text)
    extract_answer(text)
    parse_number(text)
    think_answer_format_reward(text)
    boxed_format_reward(text)
    answer_present_reward(text)
    numeric_reward(text, "18")
    assert time.process_time() - start < 10.0
