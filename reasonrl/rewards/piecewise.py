"""Transparent GRPO's toy environment: make a piecewise function continuous.

    f(x) = ax + 3 if x > 2;  x - 5 if -2 <= x <= 2;  2x - b if x < -2.   Find a + b.

(MATH, algebra; a = -3, b = 3, a + b = 0.) The reward gives partial credit for each step of
the reasoning, so a policy is rewarded for showing its work, not only for the final answer:

    boundary_pos  0.10  names the boundary x = 2        equation_a  0.10  an equation for a
    boundary_neg  0.10  names the boundary x = -2       equation_b  0.10  an equation for b
    a_value       0.05  its last "a = ..." is right     b_value     0.05  same for b
    answer        0.50  the final answer (\\boxed{}, <answer>, or "a + b = ...") is a + b

The ground truth is JSON `{"k": 2, "a": -3, "b": 3}` (boundary k, solution a and b), so
generated variants with other constants score the same way. "An equation for a" is any
equation in `a` alone (besides the bare `a = c`) that the true a satisfies and a wrong a does
not: "2a + 3 = -3" and "a(2) + 3 = 2 - 5" both count. Equations are read with `ast` over
numbers, a, b, + - * / and parentheses only; nothing is evaluated as code.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from fractions import Fraction

from reasonrl.errors import GroundTruthError
from reasonrl.registry import PIECEWISE_SCORING, VERIFIERS
from reasonrl.rewards.extract import extract_answer
from reasonrl.rewards.numeric import canonical_answer, numbers_equal, parse_number

WEIGHTS = {"boundary_pos": 0.1, "boundary_neg": 0.1, "equation_a": 0.1, "equation_b": 0.1,
           "a_value": 0.05, "b_value": 0.05, "answer": 0.5}
_MAX_SIDE = 120
_SPELLINGS = (("\\cdot", "*"), ("\\times", "*"), ("×", "*"), ("\u2212", "-"), ("\\left", ""),
              ("\\right", ""), ("\\(", " "), ("\\)", " "), ("\\[", " "), ("\\]", " "), ("$", " "))
_BOUNDARY_RE = re.compile(r"x\s*(?:=|\\to|→|->)\s*(-?\s*\d+)(?![\d.]*\d)")
_RUN_RE = re.compile(r"(?:[0-9+\-*/().=\s]|(?<![A-Za-z\\])[ab](?![A-Za-z]))+")
_IMPLICIT_RE = re.compile(r"(?<=[\d)ab])\s*(?=[ab(])")
_SUM_RE = re.compile(r"a\s*\+\s*b\s*=\s*(?:[^=\n]*=\s*)*(-?\d+(?:\.\d+)?)")
_MAX_EQUATIONS = 300  # a completion that is all "1=1=1=..." costs bounded time
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def parse_piecewise_truth(ground_truth: str) -> tuple[int, Fraction, Fraction]:
    """(k, a, b) from `{"k": 2, "a": -3, "b": 3}`; GroundTruthError if malformed."""
    try:
        data = json.loads(ground_truth)
        return int(data["k"]), Fraction(str(data["a"])), Fraction(str(data["b"]))
    except (ValueError, TypeError, KeyError):
        raise GroundTruthError(f'piecewise ground truth must be JSON like {{"k": 2, "a": -3, "b": 3}}, '
                               f"got {ground_truth!r}") from None


class _Bad(Exception):
    pass


def _value(node: ast.AST, env: dict[str, Fraction]) -> Fraction:
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _value(node.left, env), _value(node.right, env)
        if isinstance(node.op, ast.Div) and right == 0:
            raise _Bad
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _value(node.operand, env)
        return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(str(node.value))
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    raise _Bad


def _side(text: str) -> ast.AST | None:
    text = _IMPLICIT_RE.sub("*", text.strip()).rstrip(".").strip()
    if not text or len(text) > _MAX_SIDE:
        return None
    try:
        return ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _equations(text: str):
    """(lhs, rhs) ASTs of every `lhs = rhs` written with numbers, a, b and operators."""
    for spelled, plain in _SPELLINGS:
        text = text.replace(spelled, plain)
    count = 0
    for line in text.splitlines():
        for run in _RUN_RE.findall(line):
            sides = run.split("=")
            for left, right in zip(sides[:-1], sides[1:], strict=True):
                count += 1
                if count > _MAX_EQUATIONS:
                    return
                lhs, rhs = _side(left), _side(right)
                if lhs is not None and rhs is not None:
                    yield lhs, rhs


def piecewise_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The final answer `\\boxed{}` / `<answer>` holds (never the last number: the working has
    many), normalised; it must be a number."""
    return canonical_answer(extract_answer(completion, fallback_last_number=False)[0], numeric=True)


@VERIFIERS.register(
    "piecewise", doc="Transparent GRPO's piecewise-continuity toy problem, with partial credit",
    isolated=False, options={"rule": "piecewise_rule"}, check=parse_piecewise_truth, answer=piecewise_answer)
def piecewise_reward(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                     rule: str = "partial_credit") -> dict[str, float]:
    """The score of `rule` (a `PIECEWISE_SCORING` entry: `partial_credit`, `transparent_grpo`)."""
    return PIECEWISE_SCORING.get(rule)(completion, ground_truth)


# Transparent GRPO's ToyEnv.compute_reward, credit by credit: (regex on the text with spaces
# removed unless noted, credit). Written for the canonical problem only (k = 2, a = -3, b = 3).
_TGRPO_CANONICAL = (2, Fraction(-3), Fraction(3))
_TGRPO_A_EQUATION = re.compile(r"2a.*=.*-3|2a.*=.*-6|a.*=.*-3")
_TGRPO_A = re.compile(r"a\s*=\s*-3(\.0)?")
_TGRPO_B_EQUATION = re.compile(r"-2-5=2\(-2\)-b|-7=-4-b")
_TGRPO_B = re.compile(r"b\s*=\s*3(\.0)?")
_TGRPO_SUM = re.compile(r"a\+b\s*=\s*0")
_TGRPO_BOUNDARY = re.compile(r"x\s*=\s*2|x\s*=\s*-2")  # on the text as written
_TGRPO_ANSWER = re.compile(r"answer.*0")  # on the lower-cased text


@PIECEWISE_SCORING.register("transparent_grpo")
def transparent_grpo_rule(completion: str, ground_truth: str) -> dict[str, float]:
    """Transparent GRPO's reward (Siyuan-Harry/transparent-grpo, transparent_grpo.py,
    `ToyEnv.compute_reward`), for the canonical problem only: + 0.2 for naming x = 2 or
    x = -2 with "continuous" or "lim" in the text, + 0.25 for an equation for a (`2a ... = -3`,
    `2a ... = -6` or `a ... = -3`), + 0.15 for `a = -3`, + 0.25 for `-2-5=2(-2)-b` or `-7=-4-b`,
    + 0.15 for `b = 3`, + 0.2 for the answer (`a+b=0`, "answer" followed later by a 0, or
    `\\boxed{0}`), capped at 1.0. Its regexes as written there (they are loose: `a.*=.*-3` also
    matches `a = 5, so -3`). A ground truth other than the canonical problem's is an error."""
    if parse_piecewise_truth(ground_truth) != _TGRPO_CANONICAL:
        raise GroundTruthError("reward.piecewise_rule=transparent_grpo is written for the canonical problem "
                               f'only (ground truth {{"k": 2, "a": -3, "b": 3}}), got {ground_truth!r}')
    clean = completion.replace(" ", "")
    lower = completion.lower()
    continuity = "continuous" in lower or "lim" in lower
    parts = {
        "boundary": float(bool(_TGRPO_BOUNDARY.search(completion)) and continuity),
        "equation_a": float(bool(_TGRPO_A_EQUATION.search(clean))),
        "a_value": float(bool(_TGRPO_A.search(clean))),
        "equation_b": float(bool(_TGRPO_B_EQUATION.search(clean))),
        "b_value": float(bool(_TGRPO_B.search(clean))),
        "answer": float(bool(_TGRPO_SUM.search(clean) or _TGRPO_ANSWER.search(lower))
                        or "\\boxed{0}" in completion),
    }
    credits = {"boundary": 0.2, "equation_a": 0.25, "a_value": 0.15, "equation_b": 0.25, "b_value": 0.15,
               "answer": 0.2}
    # added in the original's order from 0.0, unrounded: the same float as there, bit for bit
    return {"score": min(sum(credits[k] * v for k, v in parts.items()), 1.0), **parts}


@PIECEWISE_SCORING.register("partial_credit")
def partial_credit_rule(completion: str, ground_truth: str) -> dict[str, float]:
    """reasonrl's rule: the weighted partial credits (`WEIGHTS`) as "score", and each credit
    (0/1) as a part; equations are checked mathematically (see the module docstring)."""
    k, a_true, b_true = parse_piecewise_truth(ground_truth)
    parts = dict.fromkeys(WEIGHTS, 0.0)
    text = completion.replace("\u2212", "-")
    bounds = {parse_number(m.replace(" ", "")) for m in _BOUNDARY_RE.findall(text)}
    parts["boundary_pos"] = float(k in bounds)
    parts["boundary_neg"] = float(-k in bounds)
    truth = {"a": a_true, "b": b_true}
    stated: dict[str, Fraction] = {}
    for lhs, rhs in _equations(completion):
        names = _names(lhs) | _names(rhs)
        if len(names) != 1:
            continue
        (var,) = names
        if isinstance(lhs, ast.Name) and not _names(rhs) or isinstance(rhs, ast.Name) and not _names(lhs):
            try:
                stated[var] = _value(rhs if isinstance(lhs, ast.Name) else lhs, {})
            except _Bad:
                pass
            continue
        try:
            holds = _value(lhs, {var: truth[var]}) == _value(rhs, {var: truth[var]})
            wrong = truth[var] + 1
            if holds and _value(lhs, {var: wrong}) != _value(rhs, {var: wrong}):
                parts[f"equation_{var}"] = 1.0
        except _Bad:
            continue
    parts["a_value"] = float(stated.get("a") == a_true)
    parts["b_value"] = float(stated.get("b") == b_true)
    answer, _ = extract_answer(completion, fallback_last_number=False)
    if answer is None:
        sums = _SUM_RE.findall(completion.replace("\u2212", "-"))
        answer = sums[-1] if sums else None
    value = parse_number(answer) if answer is not None else None
    parts["answer"] = float(value is not None and numbers_equal(value, float(a_true + b_true)))
    return {"score": round(sum(WEIGHTS[name] * v for name, v in parts.items()), 6), **parts}
