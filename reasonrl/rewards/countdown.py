"""Countdown (as in TinyZero / verl): combine the given numbers with + - * / to hit a target.

The ground truth is JSON text, `{"numbers": [3, 5, 7], "target": 24}` (what `reasonrl data
prepare countdown` writes; verl's countdown `ground_truth` object loads as the same text).
The equation is the last `<answer>` (else `\\boxed{}`) content; a trailing `= 24` is ignored.
It is parsed with Python's `ast` and walked, never evaluated: only integer literals, the four
binary operators and parentheses are allowed, so `__import__('os')` or `9**9**9` is simply
not an equation. Each given number may be used at most once; arithmetic is exact (fractions).

Score: 1.0 if valid and equal to the target, `format_score` (verl's 0.1) if the answer holds
a well-formed equation that is wrong (other numbers, another value), 0.0 if it holds none
(no answer, prose, or anything outside the grammar, such as an injection attempt).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections import Counter
from fractions import Fraction

from reasonrl.errors import GroundTruthError
from reasonrl.registry import VERIFIERS
from reasonrl.rewards.extract import extract_answer_tag, extract_boxed

MAX_EQUATION_CHARS = 200  # bounds the parse and the walk: nothing longer is a sane equation
_ALLOWED_RE = re.compile(r"[\d\s+\-*/()]+")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
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


class _NotAnEquation(Exception):
    pass


def parse_equation(equation: str) -> ast.AST | None:
    """The expression tree if `equation` is well formed, else None.

    Only digits, whitespace, + - * / and parentheses pass the character check, and the tree
    may only hold binary + - * / over integer literals: no unary minus, no powers, no names,
    no calls, so `__import__('os')` and `9**9**9` are not equations.
    """
    if not equation or len(equation) > MAX_EQUATION_CHARS or not _ALLOWED_RE.fullmatch(equation):
        return None
    try:
        tree = ast.parse(equation.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        ok = (isinstance(node, ast.BinOp) and type(node.op) in _OPS
              or isinstance(node, ast.Constant) and type(node.value) is int
              or isinstance(node, ast.operator) and type(node) in _OPS)
        if not ok:
            return None
    return tree


def evaluate_equation(equation: str) -> tuple[Fraction, list[int]] | None:
    """(exact value, integer literals used) of a well-formed `equation`, or None if it is
    not one or divides by zero."""
    tree = parse_equation(equation)
    if tree is None:
        return None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise _NotAnEquation
            return _OPS[type(node.op)](left, right)
        used.append(node.value)
        return Fraction(node.value)

    try:
        return walk(tree), used
    except (_NotAnEquation, RecursionError):
        return None


@VERIFIERS.register(
    "countdown", doc="Countdown: an expression over the given numbers that equals the target",
    isolated=False, options={"format_score": "countdown_format_score"}, check=parse_countdown_truth)
def countdown_reward(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                     format_score: float = 0.1) -> dict[str, float]:
    """{"score", "format": the answer is a well-formed equation, "valid": it also uses only
    the given numbers (each at most once) and has a value, "equals_target": and hits it}."""
    target, numbers = parse_countdown_truth(ground_truth)
    equation = extract_equation(completion)
    if equation is None or parse_equation(equation) is None:
        return {"score": 0.0, "format": 0.0, "valid": 0.0, "equals_target": 0.0}
    result = evaluate_equation(equation)
    valid = result is not None and not Counter(result[1]) - Counter(numbers)
    hit = valid and result[0] == target
    return {"score": 1.0 if hit else format_score, "format": 1.0, "valid": float(valid),
            "equals_target": float(hit)}
