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
from reasonrl.data.prepare import convert, prepare_countdown, prepare_piecewise
from reasonrl.errors import ConfigError
from reasonrl.rewards import (
    GroundTruthError,
    check_examples,
    pool,
    score,
    score_examples,
    score_rollouts,
    task_for_source,
    verifier_for,
)
from reasonrl.rewards.countdown import countdown_reward, evaluate_equation, parse_countdown_truth
from reasonrl.rewards.failures import FailureLog
from reasonrl.rewards.gsm8k import extract_gsm8k_answer, gsm8k_reward
from reasonrl.rewards.math_equiv import check_math_truth, math_reward
from reasonrl.rewards.piecewise import WEIGHTS, piecewise_reward, transparent_grpo_rule
from reasonrl.rewards.pool import get_pool
from reasonrl.rewards.verifiers import as_score, load_target

FIXTURES = Path(__file__).parents[1] / "fixtures"
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
    assert result.components["correct"].tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert result.timeouts == 3 and result.errors == 0
    assert result.timed_out == [f is not None for f in result.failures] == [False, True, True, True, False]
    # Cut, not waited out: uncut, each of the three runs for minutes (10^{10^{10}}! for ever).
    # That each call was cut at its deadline is `timed_out` (the pool says so only there); the
    # wall clock is a backstop. Not the deadlines' sum (3 x 1.7 s over two workers): each kill is
    # followed by a fresh worker that imports math-verify (~1 s idle, 5 s and more on a loaded
    # 2-core machine; 6 s for the test here, so 60 s on a machine 10x slower, more if loaded).
    assert elapsed < 300
    again = score_examples(["\\boxed{\\frac{1}{2}}"], math_examples(["0.5"]), MATH_CFG)  # pool recovers
    assert again.components["correct"].tolist() == [1.0] and again.timeouts == 0


def test_math_bad_ground_truth_names_the_example():
    with pytest.raises(GroundTruthError, match=r"f\.jsonl:2: field 'ground_truth'"):
        score_examples(["\\boxed{1}", "\\boxed{1}"], math_examples(["1", ""]), MATH_CFG)


def test_math_injections_score_zero_quickly():
    """Each injection scores 0, none waited out: a call is cut at its deadline (MATH_CFG: 1 s,
    the worker's SIGALRM; the pool's kill at 1.7 s), so the 14 take at most ~12 s of deadlines
    over two workers on any machine, plus a fresh worker's import after a kill (none here).
    Here: 1.5 s, the 5000 nested parentheses and the 20000 terms cut at 1 s; uncut, the nested
    parentheses alone run 60 s here (longer on a slower machine): the bound, 30 s, is between.
    The pool's workers import math-verify before the clock starts (seconds on a slow machine)."""
    score_examples(["\\boxed{5}"] * 2, math_examples(["5"] * 2), MATH_CFG)  # both workers
    start = time.perf_counter()
    result = score_examples(INJECTIONS, math_examples(["5"] * len(INJECTIONS)), MATH_CFG)
    assert result.components["correct"].tolist() == [0.0] * len(INJECTIONS)
    assert result.errors == 0, result.failures  # refused, or cut at the deadline: not crashed
    assert time.perf_counter() - start < 30


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


# TinyZero's rule (reward.countdown_rule=tinyzero): its compute_score's own cases. TinyZero's
# debug example: numbers [93, 43, 1], target 51, "(93-43)+1" -> 1.0; every number exactly once;
# format_score (0.1) for any answer present, prose included; 0 without <answer>.
TZ = json.dumps({"numbers": [93, 43, 1], "target": 51})
CD3 = json.dumps({"numbers": [3, 5, 7], "target": 15})


@pytest.mark.parametrize("completion, truth, tinyzero, subset", [
    ("<think>93-43=50, 50+1=51</think>\n\n<answer>(93-43)+1</answer>", TZ, 1.0, 1.0),
    ("<answer>(93 - 43) + 1</answer>", TZ, 1.0, 1.0),
    ("<answer>1 + 93 - 43</answer>", TZ, 1.0, 1.0),
    ("<answer>3*5</answer>", CD3, 0.1, 1.0),  # the case: 7 unused (at most once: fine)
    ("<answer>3*5*7/7</answer>", CD3, 0.1, 0.1),  # 7 twice
    ("<answer>I cannot find it</answer>", CD3, 0.1, 0.0),  # prose: present but wrong
    ("<answer></answer>", CD3, 0.1, 0.0),  # present, empty
    ("<answer>(7-5)*3 = 6</answer>", CD3, 0.1, 0.1),  # "=" is not in TinyZero's characters
    ("<answer>-3+5+7</answer>", json.dumps({"numbers": [3, 5, 7], "target": 9}), 1.0, 0.0),  # unary minus
    ("<answer>3*(7-5.0)</answer>", json.dumps({"numbers": [3, 5, 7, 0], "target": 6}), 1.0, 0.0),  # "5.0"
    ("<answer>(3+5)/7*7</answer>", json.dumps({"numbers": [3, 5, 7, 7], "target": 8}), 1.0, 1.0),  # exact
    ("<answer>3**2+5-7</answer>", json.dumps({"numbers": [3, 2, 5, 7], "target": 7}), 1.0, 0.0),  # eval's **
    ("<answer>(5+7)//3</answer>", json.dumps({"numbers": [5, 7, 3], "target": 4}), 1.0, 0.0),  # eval's //
    ("<answer>7/(5-5)*3</answer>", json.dumps({"numbers": [7, 5, 5, 3], "target": 0}), 0.1, 0.1),  # 1/0
    ("\\boxed{3*5+7-7}", CD3, 0.0, 0.1),  # TinyZero reads <answer> only
    ("3*5 = 15", CD3, 0.0, 0.0),
    ("<answer>3*5", CD3, 0.0, 0.0),  # never closed
])
def test_countdown_rules(completion, truth, tinyzero, subset):
    assert countdown_reward(completion, truth, {}, rule="tinyzero")["score"] == tinyzero
    assert countdown_reward(completion, truth, {})["score"] == subset


def test_countdown_rule_through_the_config():
    examples = [Example("q", CD3, "countdown")] * 2
    completions = ["<answer>3*5</answer>", "<answer>no idea</answer>"]
    assert score_examples(completions, examples, RewardConfig()).total.tolist() == [1.0, 0.0]
    cfg = RewardConfig(countdown_rule="tinyzero", countdown_format_score=0.2)
    result = score_examples(completions, examples, cfg)
    assert result.total.tolist() == [0.2, 0.2]
    assert result.parts[1] == {"format": 1.0, "valid": 0.0, "equals_target": 0.0}


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
    """In this process: CPU time, which a loaded machine does not stretch. 0.05 s here at most,
    0.5 s on a machine 10x slower; computing 9**9**9 or parsing 5000 nested parentheses
    exponentially would be minutes on any machine."""
    start = time.process_time()
    assert countdown_reward(text, CD, {})["score"] == 0.0
    assert piecewise_reward(text, PW, {})["score"] == 0.0
    assert gsm8k_reward(text, "24", {}) == 0.0
    assert time.process_time() - start < 5.0


# ----------------------------------------------------------------- routing and config


@pytest.mark.parametrize("source, task", [
    ("gsm8k", "gsm8k"), ("openai/gsm8k", "verl_gsm8k"), ("math", "math"), ("lighteval/MATH", "math"),
    ("math500", "math"), ("countdown_3to4", "countdown"), ("piecewise", "piecewise"),
    ("arithmetic", "numeric"), ("tiny_math", "numeric"), ("my_data", "numeric"),
])
def test_task_for_source(source, task):
    assert task_for_source(source) == task


def test_verifier_precedence():
    assert verifier_for("gsm8k", RewardConfig()).task == "gsm8k"
    assert verifier_for("gsm8k", RewardConfig(task="math")).task == "math"
    # reward.fn is imported to tell its style (reward.fn_style=auto): a real function here
    custom = verifier_for("gsm8k", RewardConfig(task="math", fn=f"{CUSTOM}:keyword"))
    assert (custom.task, custom.target, custom.isolated) == ("custom", f"{CUSTOM}:keyword", True)
    assert custom.style == "reasonrl"
    v = verifier_for("countdown", RewardConfig(countdown_format_score=0.2, timeout=3.0))
    assert dict(v.options) == {"format_score": 0.2, "rule": "subset", "template": "qwen-instruct"}
    assert not v.isolated
    v = verifier_for("countdown", RewardConfig(countdown_rule="tinyzero"))
    assert dict(v.options) == {"format_score": 0.1, "rule": "tinyzero", "template": "qwen-instruct"}
    batch = verifier_for("gsm8k", RewardConfig(batch_fn=f"{BATCH}:group_rank", isolate_fn=False))
    assert (batch.task, batch.target, batch.isolated, batch.batch) == ("batch", f"{BATCH}:group_rank", False,
                                                                       True)


def test_default_arithmetic_scoring_is_unchanged():
    examples = [Example("What is 2 + 3?", "5", "arithmetic")] * 3
    completions = ["The answer is 5.", "\\boxed{5}", "6"]
    via_examples = score_examples(completions, examples, RewardConfig())
    plain = score(completions, ["5"] * 3, {"correct": 1.0})
    assert via_examples.total.tolist() == plain.total.tolist() == [1.0, 1.0, 0.0]


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
    assert result.components["correct"].tolist() == [1.0, 0.0]
    assert result.parts[0] == {"found": 1.0, "has_origin": 1.0}


def test_custom_reward_by_module_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    cfg = RewardConfig(fn="custom_reward:keyword", weights={"correct": 2.0})
    assert score_examples(["7"], examples_for(["7"]), cfg).total.tolist() == [2.0]


def test_a_pooled_worker_loads_a_module_target_from_the_working_directory_of_now(tmp_path, monkeypatch):
    """A reward worker outlives the directory it was started in (a run's folder removed, a
    test's tmp_path): a module target loaded later is found in the scoring process's working
    directory as it is then, as `python -c` would find it, not failed on the vanished one."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (second / "rewards_of_now.py").write_text("def fn(completion, ground_truth, extra_info):\n"
                                               "    return 1.0\n")
    monkeypatch.setattr(pool, "_POOLS", {})  # workers of this test's own
    try:
        monkeypatch.chdir(first)
        two = score_examples(["7", "7"], examples_for(["7", "7"]), custom_cfg("keyword"))  # both workers
        assert two.total.tolist() == [1.0, 1.0] and len(pool.get_pool(2)._idle) == 2
        monkeypatch.chdir(second)
        first.rmdir()  # the workers' starting directory is gone
        cfg = RewardConfig(fn="rewards_of_now:fn", weights={"correct": 2.0})
        result = score_examples(["7"], examples_for(["7"]), cfg)
        assert result.failures == [None] and result.total.tolist() == [2.0]
    finally:
        for workers in pool._POOLS.values():
            workers.close()


@pytest.mark.parametrize("isolate", [True, False])
def test_custom_reward_exceptions_are_counted(isolate):
    result = score_examples(["ok", "boom", "fine", "boom"], examples_for(["1"] * 4),
                            custom_cfg("flaky", isolate_fn=isolate))
    assert result.components["correct"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert result.errors == 2 and result.timeouts == 0
    assert "flaky reward exploded" in result.failures[1]


def test_custom_reward_soft_and_hard_timeouts():
    pool = get_pool(RewardConfig().num_workers)
    killed = pool.killed
    for name, kills in (("sleepy", 0), ("stubborn", 1)):
        start = time.perf_counter()
        result = score_examples(["ok", "hang", "ok"], examples_for(["1"] * 3), custom_cfg(name, timeout=0.5))
        assert result.components["correct"].tolist() == [1.0, 0.0, 1.0], name
        assert result.timeouts == 1 and result.timed_out == [f is not None for f in result.failures] == [
            False, True, False]
        assert time.perf_counter() - start < 30  # uncut, "hang" sleeps 60 s (bound: as above)
        assert pool.killed - killed == kills, name  # sleepy: SIGALRM; stubborn: killed at the deadline


def test_custom_reward_worker_crash_and_prints_and_bad_values():
    result = score_examples(["ok", "crash", "ok"], examples_for(["1"] * 3), custom_cfg("crasher"))
    assert result.components["correct"].tolist() == [1.0, 0.0, 1.0] and result.errors == 1
    assert "exited" in result.failures[1]
    assert score_examples(["x"], examples_for(["1"]), custom_cfg("chatty")).total.tolist() == [0.5]
    bad = score_examples(["str", "dict"], examples_for(["1", "1"]), custom_cfg("bad_type"))
    assert bad.total.tolist() == [0.0, 0.0] and bad.errors == 2


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


# ------------------------------------------------- Transparent GRPO's piecewise rule

# ToyEnv.compute_reward's credits, hand-summed: boundary (x = 2 or -2, with "continuous" or
# "lim") 0.2, equation for a 0.25, a = -3 0.15, equation for b 0.25, b = 3 0.15, answer 0.2.
@pytest.mark.parametrize("completion, score", [
    (FULL, 0.25 + 0.15 + 0.25 + 0.15 + 0.2),  # no "continuous"/"lim": no boundary credit
    ("f is continuous at x = 2. " + FULL, 1.0),  # all six, capped at 1.0 (they sum to 1.2)
    ("The limit at x=-2: -7 = -4 - b, so b = 3.", 0.2 + 0.25 + 0.15),
    ("Continuity at x=-2: -7 = -4 - b, so b = 3.", 0.25 + 0.15),  # "continuity" is neither word
    ("2a + 3 = -3", 0.25),  # "2a.*=.*-3"
    ("a = 5, so -3", 0.25),  # its loose regex: "a.*=.*-3"
    ("the answer is 10", 0.2),  # "answer.*0" on the lower-cased text
    ("a+b = 0", 0.2),
    ("nothing useful", 0.0),
])
def test_transparent_grpo_piecewise_rule(completion, score):
    assert transparent_grpo_rule(completion, PW)["score"] == pytest.approx(score)
    assert piecewise_reward(completion, PW, {}, rule="transparent_grpo")["score"] == pytest.approx(score)


def test_transparent_grpo_rule_is_for_the_canonical_problem():
    with pytest.raises(GroundTruthError, match="canonical problem"):
        transparent_grpo_rule("x", json.dumps({"k": 3, "a": 1, "b": 2}))
    with pytest.raises(ConfigError, match="piecewise_rule=transparent_grpo"):
        from reasonrl.config import load_config

        load_config(None, ["data.task=piecewise", "reward.piecewise_rule=transparent_grpo",
                           "data.piecewise.train_variants=2"])


# -------------------------------------------------------- MATH ground truths at start-up

@pytest.mark.parametrize("truth, readable", [
    ("4", True), ("\\frac{1}{2}", True), ("(1,3)", True), ("\\text{Monday}", True), ("5\\sqrt{2}", True),
    ("@@@", False), ("#", False), ("   ", False),
])
def test_math_truth_check(truth, readable):
    """math-verify parses what it understands into [expression, text] and what it does not into
    [text] alone: the check fails on the latter (run here in-process to test the rule itself)."""
    if readable:
        assert check_math_truth("", truth) == 1.0
    else:
        with pytest.raises(GroundTruthError):
            check_math_truth("", truth)


def test_math_ground_truths_are_checked_at_start_in_the_pool(tmp_path):
    """`check_examples` sends each distinct MATH ground truth to the reward worker pool (sympy
    never runs in the training process) and names the first unreadable one's file:line."""
    good = [Example("q", t, "math", {"origin": f"m.jsonl:{i}"}) for i, t in enumerate(["4", "4", "\\pi"], 1)]
    check_examples(good, RewardConfig())
    bad = good + [Example("q", "@@@", "math", {"origin": "m.jsonl:9"})]
    with pytest.raises(GroundTruthError, match=r"m\.jsonl:9: field 'ground_truth': math-verify cannot read "
                                               r"ground truth '@@@'.*\(task math\)"):
        check_examples(bad, RewardConfig())
    # scoring such a record is an error too, never a silent 0
    with pytest.raises(GroundTruthError, match=r"m\.jsonl:9"):
        score_examples(["\\boxed{4}"], bad[-1:], RewardConfig())


# ------------------------------------------------------------------ reward.batch_fn

BATCH = f"{FIXTURES / 'batch_reward.py'}"


@pytest.mark.parametrize("isolate", [True, False])
def test_batch_reward_sees_the_whole_batch_and_its_groups(isolate):
    examples = [Example("q", "7", "x", {"origin": f"f:{i}"}) for i in range(4)]
    cfg = RewardConfig(batch_fn=f"{BATCH}:group_rank", isolate_fn=isolate, weights={"correct": 2.0})
    result = score_examples(["7", "it is 7", "no", "7!"], examples, cfg, groups=[0, 0, 1, 1])
    assert result.components["correct"].tolist() == [1.5, 1.0, 0.0, 1.5]  # the first hit of each group: +0.5
    assert result.total.tolist() == [3.0, 2.0, 0.0, 3.0] and result.errors == result.timeouts == 0
    parts = score_examples(["7", "8"], examples[:2], RewardConfig(batch_fn=f"{BATCH}:with_parts",
                                                                 isolate_fn=isolate))
    assert parts.total.tolist() == [1.0, 0.0] and parts.parts == [{"origin_seen": 1.0}] * 2


@pytest.mark.parametrize("name, isolate, errors, timeouts, needle", [
    ("exploding", True, 3, 0, "batch reward exploded"),
    ("exploding", False, 3, 0, "batch reward exploded"),
    ("short", True, 3, 0, "one score per completion (3)"),
    ("short", False, 3, 0, "one score per completion (3)"),
    ("hanging", True, 0, 3, "timeout"),
])
def test_batch_reward_failures_score_zero_and_are_counted(name, isolate, errors, timeouts, needle):
    start = time.perf_counter()
    cfg = RewardConfig(batch_fn=f"{BATCH}:{name}", isolate_fn=isolate, timeout=0.2)
    result = score_examples(["a", "b", "c"], examples_for(["1"] * 3), cfg, groups=[0, 0, 1])
    assert result.total.tolist() == [0.0, 0.0, 0.0]
    assert (result.errors, result.timeouts) == (errors, timeouts)
    assert all(needle in result.failures[i] for i in range(3))
    assert time.perf_counter() - start < 30  # cut at 0.2 s x 3 completions; uncut, "hanging" sleeps 60 s


def test_batch_reward_checked_at_start():
    check_examples(examples_for(["1"]), RewardConfig(batch_fn=f"{BATCH}:group_rank"))
    for fn, needle in [(f"{BATCH}:one_arg", "completions, ground_truths, groups, extra_infos"),
                       (f"{BATCH}:missing", "no function")]:
        with pytest.raises(ConfigError, match=needle):
            check_examples(examples_for(["1"]), RewardConfig(batch_fn=fn))


# ------------------------------------------- property: reference solutions score 1.0


def fixture_examples() -> list[Example]:
    gsm8k = FIXTURES / "gsm8k"
    records = (convert("gsm8k", gsm8k / "train.jsonl") + convert("gsm8k", gsm8k / "test.jsonl")
               + convert("math", FIXTURES / "math_style.jsonl") + prepare_countdown(30, seed=1)
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
             for e, s in zip(examples, result.total.tolist(), strict=True) if s != 1.0]
    assert not wrong
    assert result.timeouts == 0 and result.errors == 0


@pytest.mark.parametrize("isolate", [True, False])
def test_a_reward_that_calls_sys_exit_scores_zero_and_is_named(isolate):
    """In the trainer's own process (reward.isolate_fn=false) SystemExit used to end the run
    with exit code 2 and no message; now it is one more counted failure, named."""
    examples = examples_for(["1"] * 3)
    result = score_examples(["ok", "quit", "ok"], examples, custom_cfg("quitter", isolate_fn=isolate))
    assert result.components["correct"].tolist() == [1.0, 0.0, 1.0] and result.errors == 1
    assert ("called sys.exit(2)" if not isolate else "exit") in result.failures[1]
    batch = RewardConfig(batch_fn=f"{BATCH}:quitting", isolate_fn=isolate)
    result = score_examples(["a", "b"], examples_for(["1"] * 2), batch, groups=[0, 1])
    assert result.total.tolist() == [0.0, 0.0] and result.errors == 2


def test_score_rollouts_names_the_function_of_each_failure():
    cfg = custom_cfg("flaky", isolate_fn=False)
    scores = score_rollouts(["ok", "boom"], examples_for(["1", "1"]), cfg)
    assert scores.failures == [None, f"reward.fn {CUSTOM}:flaky: RuntimeError: flaky reward exploded"]
    scores = score_rollouts(["ok", "hang"], examples_for(["1", "1"]), custom_cfg("sleepy", timeout=0.3))
    assert scores.failures == [None, f"reward.fn {CUSTOM}:sleepy: timed out (reward.timeout: 0.3 s)"]


def test_each_kind_of_reward_failure_is_reported_once():
    log = FailureLog()
    f = "reward.fn m.py:f"
    assert log.new([None, f"{f}: KeyError: 'a'", f"{f}: KeyError: 'b'", f"{f}: timed out (5 s)"]) == [
        f"{f}: KeyError: 'a'", f"{f}: timed out (5 s)"]
    assert log.new([f"{f}: KeyError: 'c'", f"{f}: called sys.exit(2)", None]) == [f"{f}: called sys.exit(2)"]
    assert log.new(None) == [] and log.new([f"{f}: timed out (5 s)"]) == []
