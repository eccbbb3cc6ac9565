"""Task verifiers (gsm8k, math, countdown, piecewise, custom reward.fn), their routing, the
worker pool's timeouts, and the property that every fixture's reference solution scores 1."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from reasonrl.batch import Example
from reasonrl.config import CountdownConfig, PiecewiseConfig, RewardConfig
from reasonrl.data.countdown import countdown_examples
from reasonrl.data.piecewise import piecewise_examples
from reasonrl.data.prepare import prepare_countdown, prepare_gsm8k, prepare_math, prepare_piecewise
from reasonrl.errors import ConfigError
from reasonrl.rewards import (
    GroundTruthError,
    check_examples,
    score,
    score_examples,
    task_for_source,
    verifier_for,
)
from reasonrl.rewards.countdown import countdown_reward, evaluate_equation, parse_countdown_truth
from reasonrl.rewards.gsm8k import extract_gsm8k_answer, gsm8k_reward
from reasonrl.rewards.math_equiv import math_reward
from reasonrl.rewards.piecewise import WEIGHTS, piecewise_reward
from reasonrl.rewards.pool import get_pool
from reasonrl.rewards.verifiers import as_score, load_target

FIXTURES = Path(__file__).parent / "fixtures"
CUSTOM = f"{FIXTURES / 'custom_reward.py'}"
CD = json.dumps({"numbers": [3, 5, 7, 9], "target": 24})
PW = json.dumps({"k": 2, "a": -3, "b": 3})

# Adversarial model output: each verifier must answer 0 at once, never evaluate anything.
INJECTIONS = [
    "__import__('os').system('echo pwned')",
    "<answer>__import__('os').system('echo pwned')</answer>",
    "<answer>9**9**9</answer>",
    "\\boxed{9**9**9}",
    "<answer>" + "(" * 5000 + "1" + ")" * 5000 + "</answer>",
    "<answer>" + "+".join(["1"] * 20000) + "</answer>",
    "<answer>" + "9" * 100000 + "</answer>",
    "<answer>().__class__.__bases__[0].__subclasses__()</answer>",
    "<answer>lambda: 1</answer>",
    "\\boxed{" * 20000,
    "a=" * 50000,
    "1=" * 50000,
    "x = " * 30000,
    "<answer>exec('1')</answer> \\boxed{eval('2')}",
]


# ----------------------------------------------------------------------------- gsm8k


@pytest.mark.parametrize("completion, truth, expected", [
    ("She sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),
    ("#### 72", "72", 1.0),
    ("The answer is $1,000.", "1000", 1.0),
    ("#### 1,000", "1000", 1.0),
    ("so the total is 18.0", "18", 1.0),
    ("#### 18.00 dollars", "18", 1.0),
    ("She earned $10 per hour.", "10", 1.0),
    ("The answer is 5 apples.", "5", 1.0),
    ("\\boxed{72}", "72", 1.0),
    ("<answer>72</answer> though some say 71", "72", 1.0),
    ("#### 72\nThat was 3 steps.", "72", 1.0),  # the marked answer beats the last number
    ("I think 72 but #### 71", "72", 0.0),
    ("The answer is 71", "72", 0.0),
    ("\\boxed{71} and also 72", "72", 0.0),  # boxed beats the last number
    ("-72", "72", 0.0),
    ("I don't know", "72", 0.0),
    ("", "72", 0.0),
    ("####", "72", 0.0),
    ("#### seventy-two", "72", 0.0),
])
def test_gsm8k_reward(completion, truth, expected):
    assert gsm8k_reward(completion, truth, {}) == expected


def test_gsm8k_without_fallback_needs_a_marked_answer():
    assert gsm8k_reward("so it is 72", "72", {}, fallback_last_number=False) == 0.0
    assert gsm8k_reward("so it is\n#### 72", "72", {}, fallback_last_number=False) == 1.0
    assert extract_gsm8k_answer("#### $5.", True) == "$5."


def test_gsm8k_bad_ground_truth_raises():
    with pytest.raises(GroundTruthError):
        gsm8k_reward("72", "seventy", {})


# ------------------------------------------------------------------------------ math


@pytest.mark.parametrize("completion, truth, expected", [
    ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{1/2}", "\\frac12", 1.0),
    ("\\boxed{\\dfrac{2}{4}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{(x+2)^2}", "x^2+4x+4", 1.0),
    ("\\boxed{[1,3)}", "[1,3)", 1.0),
    ("\\boxed{(1,3]}", "[1,3)", 0.0),
    ("\\boxed{\\{3, -3\\}}", "\\{-3, 3\\}", 1.0),
    ("\\boxed{120}", "120^\\circ", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("\\boxed{5}", "5\\text{ cm}", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("<answer>3/4</answer>", "0.75", 1.0),
    ("the answer is 42", "42", 1.0),  # last-number fallback
    ("\\boxed{\\frac{1}{3}}", "0.3", 0.0),
    ("\\boxed{2}", "3", 0.0),
    ("\\boxed{x^2+4x+5}", "x^2+4x+4", 0.0),
    ("no answer at all", "3", 0.0),
    ("\\boxed{}", "3", 0.0),
    ("\\boxed{\\frac{", "1", 0.0),
])
def test_math_reward_equivalence(completion, truth, expected):
    assert math_reward(completion, truth, {})["score"] == expected


def test_math_reward_parts_and_bad_truth():
    assert math_reward("nothing", "3", {}) == {"score": 0.0, "answer_found": 0.0}
    assert math_reward("\\boxed{4}", "3", {}) == {"score": 0.0, "answer_found": 1.0}
    with pytest.raises(GroundTruthError):
        math_reward("\\boxed{1}", "  ", {})


MATH_CFG = RewardConfig(task="math", timeout=1.0)


def math_examples(truths: list[str]) -> list[Example]:
    return [Example(prompt="q", ground_truth=t, data_source="x", meta={"origin": f"f.jsonl:{i + 1}"})
            for i, t in enumerate(truths)]


def test_math_runs_in_worker_processes_with_hard_timeouts():
    """The hanging cases hang math-verify for real (minutes) in this version."""
    completions = ["\\boxed{0.5}",
                   "\\boxed{9^{9^{9}}}",  # sympy computes a 370-million-digit power
                   "\\boxed{" + "(" * 50 + "1" + ")" * 50 + "}",  # exponential parse
                   "\\boxed{10^{10^{10}}!}",
                   "\\boxed{2}"]
    start = time.perf_counter()
    result = score_examples(completions, math_examples(["1/2", "5", "1", "7", "2"]), MATH_CFG)
    elapsed = time.perf_counter() - start
    assert result.components["correct"] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert result.timeouts == 3 and result.errors == 0
    assert result.failures == {1: "timeout", 2: "timeout", 3: "timeout"}
    assert elapsed < 3 * 2.0 + 3  # each past its deadline at worst, two workers in parallel
    again = score_examples(["\\boxed{\\frac{1}{2}}"], math_examples(["0.5"]), MATH_CFG)  # pool recovers
    assert again.components["correct"] == [1.0] and again.timeouts == 0


def test_math_bad_ground_truth_names_the_example():
    with pytest.raises(GroundTruthError, match=r"f\.jsonl:2: field 'ground_truth'"):
        score_examples(["\\boxed{1}", "\\boxed{1}"], math_examples(["1", ""]), MATH_CFG)


def test_math_injections_score_zero_quickly():
    start = time.perf_counter()
    result = score_examples(INJECTIONS, math_examples(["5"] * len(INJECTIONS)), MATH_CFG)
    assert result.components["correct"] == [0.0] * len(INJECTIONS)
    assert time.perf_counter() - start < 15


# ------------------------------------------------------------------------- countdown


@pytest.mark.parametrize("completion, expected", [
    ("<answer>(9 - 5) * (7 - 3) + 8</answer>", 0.1),  # 8 is not given
    ("<answer>(7 - 3) * (9 - 5 + 2)</answer>", 0.1),
    ("<answer>3 * (5 + 7) - 9 - 3</answer>", 0.1),  # 3 used twice
    ("<answer>(9 + 7) + (5 + 3)</answer>", 1.0),
    ("<answer> 9 + 7 + 5 + 3 </answer>", 1.0),
    ("<answer>(9 + 7 + 5 + 3) = 24</answer>", 1.0),
    ("<answer>3 * (5 + 7) - 9 - 3</answer>", 0.1),
    ("<answer>(9 - 7) * (5 + 7)</answer>", 0.1),  # 7 used twice
    ("<answer>9 * 3 - 7 + 5</answer>", 0.1),  # = 25
    ("<answer>(5 + 7) * (9 - 7)</answer>", 0.1),
    ("<answer>3 \\times (9 - 5) + 7 + 5</answer>", 0.1),  # 5 twice
    ("<answer>(9 - 3) \\times (9 - 5)</answer>", 0.1),  # 9 twice
    ("<answer>(7 + 5) * 3 - 9 - 3</answer>", 0.1),
    ("<answer>3 \\times 5 + 9</answer>", 1.0),  # a subset: each at most once
    ("<answer>5 × 3 + 9</answer>", 1.0),
    ("<think>3*5=15, 15+9=24</think>\n<answer>3*5+9</answer>", 1.0),
    ("\\boxed{9 + 3 * 5}", 1.0),  # boxed when there is no tag
    ("<answer>9 / (3 - 3)</answer>", 0.1),  # division by zero: well formed, no value
    ("<answer>(3 + 5) / 7 * 21</answer>", 0.1),
    ("<answer>-3 + 27</answer>", 0.0),  # unary minus is not in the grammar
    ("<answer>2.5 * 9.6</answer>", 0.0),  # decimals neither
    ("<answer>twenty-four</answer>", 0.0),
    ("<answer></answer>", 0.0),
    ("3 * 5 + 9", 0.0),  # no answer tag
    ("", 0.0),
])
def test_countdown_reward(completion, expected):
    assert countdown_reward(completion, CD, {})["score"] == expected


def test_countdown_parts_and_format_score():
    assert countdown_reward("<answer>3 * 5 + 9</answer>", CD, {}) == {
        "score": 1.0, "format": 1.0, "valid": 1.0, "equals_target": 1.0}
    assert countdown_reward("<answer>3 * 5 + 7</answer>", CD, {}, format_score=0.0) == {
        "score": 0.0, "format": 1.0, "valid": 1.0, "equals_target": 0.0}
    assert countdown_reward("no tag", CD, {})["format"] == 0.0
    assert evaluate_equation("(9 - 3) / 4") == (1.5, [9, 3, 4])
    assert evaluate_equation("3 ** 2") is None and evaluate_equation("f(3)") is None


@pytest.mark.parametrize("truth", ["24", '{"target": 24}', '{"numbers": [], "target": 24}',
                                   '{"numbers": [1, "2"], "target": 24}', '{"numbers": [1], "target": 2.5}'])
def test_countdown_bad_ground_truth(truth):
    with pytest.raises(GroundTruthError, match="countdown ground truth"):
        parse_countdown_truth(truth)


# ------------------------------------------------------------------------- piecewise

FULL = ("The function can only jump at the boundaries x = 2 and x = -2.\n"
        "At x = 2: 2a + 3 = 2 - 5, so a = -3.\n"
        "At x = -2: -2 - 5 = 2(-2) - b, so b = 3.\n"
        "So a + b = 0, and the answer is \\boxed{0}.")


@pytest.mark.parametrize("completion, parts_on", [
    (FULL, set(WEIGHTS)),
    ("\\boxed{0}", {"answer"}),
    ("Check x=2 and x=-2. \\boxed{0}", {"boundary_pos", "boundary_neg", "answer"}),
    ("At $x=2$: $a\\cdot 2+3=-3$ so $a=-3$. At $x=-2$: $-7=-4-b$ so $b=3$. Then $a+b=0$.", set(WEIGHTS)),
    ("a(2)+3 = -3 gives a = -3", {"equation_a", "a_value"}),
    ("2a + 3 = -3, a = 3", {"equation_a"}),  # right equation, wrong value
    ("a = -3 and b = 3", {"a_value", "b_value"}),
    ("a = 5, then a = -3", {"a_value"}),  # the last statement counts
    ("a = -3, then a = 5", set()),
    ("2a = 2a", set()),  # an identity says nothing about a
    ("b + 1 = 4 but the answer is \\boxed{1}", {"equation_b"}),
    ("x = 3 and x = -3", set()),
    ("a + b = -3 + 3 = 0", {"answer"}),
    ("", set()),
])
def test_piecewise_partial_credit(completion, parts_on):
    result = piecewise_reward(completion, PW, {})
    assert {k for k in WEIGHTS if result[k] == 1.0} == parts_on
    assert result["score"] == pytest.approx(sum(WEIGHTS[k] for k in parts_on))


def test_piecewise_variant_uses_its_own_constants():
    truth = json.dumps({"k": 3, "a": 2, "b": -1})
    text = "At x = 3 and x = -3: 3a - 2 = 4 gives a = 2; b - 1 = -2 gives b = -1. \\boxed{1}"
    assert piecewise_reward(text, truth, {})["score"] == 1.0
    assert piecewise_reward(FULL, truth, {})["score"] == 0.0


# ------------------------------------------------------------- adversarial, all tasks


@pytest.mark.parametrize("text", INJECTIONS, ids=[f"inj{i}" for i in range(len(INJECTIONS))])
def test_local_verifiers_reject_injections_quickly(text):
    start = time.perf_counter()
    assert countdown_reward(text, CD, {})["score"] == 0.0
    assert piecewise_reward(text, PW, {})["score"] == 0.0
    assert gsm8k_reward(text, "24", {}) == 0.0
    assert time.perf_counter() - start < 1.0


# ----------------------------------------------------------------- routing and config


@pytest.mark.parametrize("source, task", [
    ("gsm8k", "gsm8k"), ("openai/gsm8k", "gsm8k"), ("math", "math"), ("lighteval/MATH", "math"),
    ("math500", "math"), ("countdown_3to4", "countdown"), ("piecewise", "piecewise"),
    ("arithmetic", "numeric"), ("tiny_math", "numeric"), ("my_data", "numeric"),
])
def test_task_for_source(source, task):
    assert task_for_source(source) == task


def test_verifier_precedence():
    assert verifier_for("gsm8k", RewardConfig()).task == "gsm8k"
    assert verifier_for("gsm8k", RewardConfig(task="math")).task == "math"
    custom = verifier_for("gsm8k", RewardConfig(task="math", fn="m:f"))
    assert (custom.task, custom.target, custom.isolated) == ("custom", "m:f", True)
    v = verifier_for("countdown", RewardConfig(countdown_format_score=0.2, timeout=3.0))
    assert dict(v.options) == {"format_score": 0.2} and not v.isolated


def test_default_arithmetic_scoring_is_unchanged():
    examples = [Example("What is 2 + 3?", "5", "arithmetic")] * 3
    completions = ["The answer is 5.", "\\boxed{5}", "6"]
    via_examples = score_examples(completions, examples, RewardConfig())
    plain = score(completions, ["5"] * 3, {"correct": 1.0})
    assert via_examples.total == plain.total == [1.0, 1.0, 0.0]


def test_as_score():
    assert as_score(1) == (1.0, {})
    assert as_score({"score": 0.5, "x": True}) == (0.5, {"x": 1.0})
    for bad in ["1", None, {"x": 1}, float("nan")]:
        with pytest.raises((TypeError, ValueError)):
            as_score(bad)


# ---------------------------------------------------------------------- custom reward


def custom_cfg(name: str, **kw) -> RewardConfig:
    return RewardConfig(fn=f"{CUSTOM}:{name}", timeout=kw.pop("timeout", 1.0), **kw)


def examples_for(truths: list[str]) -> list[Example]:
    return [Example("q", t, "s", {"origin": f"c.jsonl:{i + 1}"}) for i, t in enumerate(truths)]


@pytest.mark.parametrize("isolate", [True, False])
def test_custom_reward_by_file_path(isolate):
    cfg = custom_cfg("keyword", isolate_fn=isolate)
    result = score_examples(["has 42", "no"], examples_for(["42", "42"]), cfg)
    assert result.components["correct"] == [1.0, 0.0]
    assert result.parts[0] == {"found": 1.0, "has_origin": 1.0}


def test_custom_reward_by_module_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    cfg = RewardConfig(fn="custom_reward:keyword", weights={"correct": 2.0})
    assert score_examples(["7"], examples_for(["7"]), cfg).total == [2.0]


@pytest.mark.parametrize("isolate", [True, False])
def test_custom_reward_exceptions_are_counted(isolate):
    result = score_examples(["ok", "boom", "fine", "boom"], examples_for(["1"] * 4),
                            custom_cfg("flaky", isolate_fn=isolate))
    assert result.components["correct"] == [1.0, 0.0, 1.0, 0.0]
    assert result.errors == 2 and result.timeouts == 0
    assert "flaky reward exploded" in result.failures[1]


def test_custom_reward_soft_and_hard_timeouts():
    pool = get_pool(RewardConfig().num_workers)
    killed = pool.killed
    for name, kills in (("sleepy", 0), ("stubborn", 1)):
        start = time.perf_counter()
        result = score_examples(["ok", "hang", "ok"], examples_for(["1"] * 3), custom_cfg(name, timeout=0.5))
        assert result.components["correct"] == [1.0, 0.0, 1.0], name
        assert result.timeouts == 1 and result.failures == {1: "timeout"}
        assert time.perf_counter() - start < 5
        assert pool.killed - killed == kills, name  # sleepy: SIGALRM; stubborn: killed at the deadline


def test_custom_reward_worker_crash_and_prints_and_bad_values():
    result = score_examples(["ok", "crash", "ok"], examples_for(["1"] * 3), custom_cfg("crasher"))
    assert result.components["correct"] == [1.0, 0.0, 1.0] and result.errors == 1
    assert "exited" in result.failures[1]
    assert score_examples(["x"], examples_for(["1"]), custom_cfg("chatty")).total == [0.5]
    bad = score_examples(["str", "dict"], examples_for(["1", "1"]), custom_cfg("bad_type"))
    assert bad.total == [0.0, 0.0] and bad.errors == 2


def test_custom_reward_checked_at_start():
    examples = examples_for(["1"])
    check_examples(examples, custom_cfg("keyword"))
    for fn, needle in [(f"{CUSTOM}:two_args", "extra_info"), (f"{CUSTOM}:missing", "no function"),
                       ("no_such_module_xyz:fn", "No module"), ("nofile.py:fn", "no such file")]:
        with pytest.raises(ConfigError, match=needle):
            check_examples(examples, RewardConfig(fn=fn))
    with pytest.raises(ValueError, match="module:function"):
        load_target("no_colon")


def test_check_examples_names_file_line_and_field():
    check_examples([Example("q", CD, "countdown"), Example("q", "7", "arithmetic")], RewardConfig())
    bad = [Example("q", "5", "arithmetic", {"origin": "a.jsonl:1"}),
           Example("q", "[3, 5]", "countdown", {"origin": "b.jsonl:7"})]
    with pytest.raises(GroundTruthError, match=r"b\.jsonl:7: field 'ground_truth'.*task countdown"):
        check_examples(bad, RewardConfig())
    with pytest.raises(GroundTruthError, match=r"a\.jsonl:1: .*task gsm8k"):
        check_examples([Example("q", "five", "gsm8k", {"origin": "a.jsonl:1"})], RewardConfig())


# ------------------------------------------- property: reference solutions score 1.0


def fixture_examples() -> list[Example]:
    gsm8k = FIXTURES / "gsm8k"
    records = (prepare_gsm8k(gsm8k / "train.jsonl") + prepare_gsm8k(gsm8k / "test.jsonl")
               + prepare_math(FIXTURES / "math_style.jsonl") + prepare_countdown(30, seed=1)
               + prepare_piecewise(10, seed=1))
    examples = [Example(r["prompt"], r["ground_truth"], r["data_source"], r["extra_info"]) for r in records]
    train, held_out = countdown_examples(CountdownConfig(train_size=30, val_size=10), seed=2)
    pw_train, pw_held = piecewise_examples(PiecewiseConfig(train_variants=5, val_variants=5), seed=3)
    return examples + train + held_out + pw_train + pw_held


def test_every_reference_solution_scores_one():
    examples = fixture_examples()
    assert {e.data_source for e in examples} == {"gsm8k", "math", "countdown", "piecewise"}
    result = score_examples([e.meta["solution"] for e in examples], examples, RewardConfig(timeout=5.0))
    wrong = [(e.data_source, e.ground_truth, s)
             for e, s in zip(examples, result.total, strict=True) if s != 1.0]
    assert not wrong
    assert result.timeouts == 0 and result.errors == 0
