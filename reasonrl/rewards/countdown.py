"""Countdown (as in TinyZero / verl): combine the given numbers with + - * / to hit a target.

The ground truth is JSON text, `{"numbers": [3, 5, 7], "target": 24}` (what `reasonrl data
prepare countdown` writes; verl's countdown `ground_truth` object loads as the same text).

Two scoring rules (`reward.countdown_rule`, the `COUNTDOWN_SCORING` registry):

- `subset` (the default, reasonrl's own rule): the equation is the last `<answer>` (any case;
  else `\\boxed{}`) content, a trailing `= 24` ignored. It is parsed with Python's `ast` and
  walked, never evaluated: only integer literals, the four binary operators and parentheses are
  allowed, at most 200 characters, so `__import__('os')` or `9**9**9` is simply not an
  equation; arithmetic is exact (fractions). 1.0 if valid (each given number at most once) and
  equal to the target, `format_score` (verl's 0.1) if the answer holds a well-formed equation
  that is wrong (other numbers, another value), 0.0 if it holds none (no answer, prose, or
  anything outside the grammar, such as an injection attempt).
- `tinyzero`: TinyZero's `compute_score`, on every input (`reasonrl.rewards.tinyzero`): the last
  line's last case-sensitive `<answer>` of the text after the first "Assistant:" (the prompt's
  share named by `reward.tinyzero_template`); every given number exactly once; Python's value of
  the expression, `**` and `//` included, within 1e-5 of the target; `format_score` for any
  answer present but not a hit, prose included; 0.0 without one.
"""

from __future__ import annotations

import ast
import json
from collections import Counter
from fractions import Fraction

from reasonrl.errors import GroundTruthError
from reasonrl.registry import COUNTDOWN_SCORING, VERIFIERS
from reasonrl.rewards.extract import extract_answer_tag, extract_boxed
from reasonrl.rewards.numeric import canonical_answer
from reasonrl.rewards.safe_arithmetic import (
    ArithmeticRules,
    NotArithmetic,
    evaluate_arithmetic,
    parse_arithmetic,
)
from reasonrl.rewards.tinyzero import tinyzero_score

MAX_EQUATION_CHARS = 200  # bounds the parse and the walk: nothing longer is a sane equation
_RULES = ArithmeticRules(max_chars=MAX_EQUATION_CHARS)  # integers, binary + - * /, parentheses
_SPELLINGS = (("\\times", "*"), ("\\cdot", "*"), ("×", "*"), ("·", "*"), ("÷", "/"), ("\u2212", "-"),
              ("\\left", ""), ("\\right", ""), ("$", ""))


def parse_countdown_truth(ground_truth: str) -> tuple[int, list[int]]:
    """(target, numbers) from the JSON ground truth; GroundTruthError if malformed."""
    try:
        data = json.loads(ground_truth)
        target, numbers = data["target"], data["numbers"]
    except (ValueError, TypeError, KeyError):
        raise GroundTruthError(f"countdown ground truth must be JSON like "
                               f'{{"numbers": [3, 5, 7], "target": 24}}, got {ground_truth!r}') from None
    ints = isinstance(target, int) and isinstance(numbers, list) and numbers and all(
        isinstance(n, int) and not isinstance(n, bool) for n in numbers)
    if not ints or isinstance(target, bool):
        raise GroundTruthError(f"countdown ground truth needs an integer target and a non-empty list "
                               f"of integer numbers, got {ground_truth!r}")
    return target, numbers


def extract_equation(completion: str) -> str | None:
    """The equation the model committed to: last <answer> content, else last \\boxed{}."""
    text = extract_answer_tag(completion)
    if text is None:
        text = extract_boxed(completion)
    if text is None:
        return None
    for spelled, op in _SPELLINGS:
        text = text.replace(spelled, op)
    return text.split("=", 1)[0].strip()  # "(3 + 5) * 3 = 24" -> the left side


def parse_equation(equation: str) -> ast.AST | None:
    """The expression tree if `equation` is well formed, else None.

    Only digits, whitespace, + - * / and parentheses pass the character check, and the tree
    may only hold binary + - * / over integer literals: no unary minus, no powers, no names,
    no calls, so `__import__('os')` and `9**9**9` are not equations (`rewards/safe_arithmetic.py`).
    """
    try:
        return parse_arithmetic(equation, _RULES)
    except NotArithmetic:
        return None


def evaluate_equation(equation: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, integer literals used) of a well-formed `equation`, or None if it is
    not one or divides by zero."""
    try:
        value, used = evaluate_arithmetic(equation, _RULES)
    except NotArithmetic:
        return None
    return value, [int(n) for n in used]  # integers only under Countdown's rules


@COUNTDOWN_SCORING.register("subset")
def subset_rule(completion: str, target: int, numbers: list[int], format_score: float) -> dict[str, float]:
    """reasonrl's rule: the `<answer>` (else `\\boxed{}`) equation, a trailing `= 24` ignored;
    each given number at most once. {"score": 1.0 if valid and equal to the target,
    `format_score` for a well-formed equation that is wrong, 0.0 for none; "format": the answer
    is a well-formed equation, "valid": it also uses only the given numbers (each at most once)
    and has a value, "equals_target": and hits it}."""
    equation = extract_equation(completion)
    if equation is None or parse_equation(equation) is None:
        return {"score": 0.0, "format": 0.0, "valid": 0.0, "equals_target": 0.0}
    result = evaluate_equation(equation)
    valid = result is not None and not Counter(result[1]) - Counter(numbers)
    hit = valid and result[0] == target
    return {"score": 1.0 if hit else format_score, "format": 1.0, "valid": float(valid),
            "equals_target": float(hit)}


@COUNTDOWN_SCORING.register("tinyzero", options=("template",))
def tinyzero_rule(completion: str, target: int, numbers: list[int], format_score: float,
                  template: str = "qwen-instruct") -> dict[str, float]:
    """TinyZero's Countdown score (Jiayi-Pan/TinyZero, verl/utils/reward_score/countdown.py,
    `compute_score`), input by input: `reasonrl.rewards.tinyzero.tinyzero_score`. {"score",
    "format": an answer is present, "valid": it uses every number exactly once and has a value,
    "equals_target": and hits it}."""
    return tinyzero_score(completion, target, numbers, format_score, template)


def countdown_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The left-hand side of the equation in `<answer>` (else `\\boxed{}`), whitespace removed."""
    return canonical_answer(extract_equation(completion), numeric=False)


@VERIFIERS.register(
    "countdown", doc="Countdown: an expression over the given numbers that equals the target",
    isolated=False, options={"format_score": "countdown_format_score", "rule": "countdown_rule",
                             "template": "tinyzero_template"},
    check=parse_countdown_truth, answer=countdown_answer)
def countdown_reward(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                     format_score: float = 0.1, rule: str = "subset",
                     template: str = "qwen-instruct") -> dict[str, float]:
    """The score of `rule` (a `COUNTDOWN_SCORING` entry: `subset`, `tinyzero`) with its parts;
    `template` (`reward.tinyzero_template`) goes to the rules that read the prompt's end."""
    target, numbers = parse_countdown_truth(ground_truth)
    entry = COUNTDOWN_SCORING[rule]
    options = {"template": template} if "template" in entry.options else {}
    return entry.fn(completion, target, numbers, format_score, **options)
