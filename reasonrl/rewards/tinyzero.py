"""TinyZero's Countdown score, computed as TinyZero computes it, without `eval`.

Read from Jiayi-Pan/TinyZero, verl/utils/reward_score/countdown.py, `compute_score(solution_str,
ground_truth, format_score=0.1, score=1.)`, and verl/trainer/main_ppo.py's `RewardManager`
that calls it:

1. The text scored is the prompt and the response decoded together (special tokens kept).
   `extract_solution` drops everything up to the first "Assistant:", else up to the first
   "<|im_start|>assistant" (else there is no answer); of the rest only the last line counts
   (split on "\\n"), and of that line the last `<answer>(.*?)</answer>` match (case-sensitive),
   stripped. No answer: 0.
2. `validate_equation`: the answer's digit runs (`\\d+`, as ints), sorted, must equal the
   sorted numbers (each number exactly once); else `format_score`.
3. `evaluate_equation`: the answer must match `^[\\d+\\-*/().\\s]+$`, and is then given to
   Python's `eval` with no builtins; an exception, there or later, gives `format_score`.
4. `score` (1.0) when `abs(result - target) < 1e-5`, else `format_score`.

reasonrl's verifier sees the response alone, so the prompt's share of step 1 is named by
`reward.tinyzero_template` (`TEMPLATES`): `qwen-instruct`, a prompt that holds
"<|im_start|>assistant" and no "Assistant:" (TinyZero's qwen-instruct template, and any ChatML
chat template such as Qwen's and SmolLM2's), where a response that writes "Assistant:" itself
is read from there on; `base`, a prompt that holds "Assistant:" (TinyZero's base template,
"... Assistant: Let me solve this step by step.\\n<think>"), where it is not. The response's
special tokens (the EOS at its end) cannot change the last line's last match, so the decoded
text without them scores the same.

Step 3 is not done with `eval`. `python_value` parses the answer with `ast` (the parser `eval`
itself uses), refuses any node but number literals, unary + and -, and the binary + - * / //
and ** (everything else the allowed characters can spell, a call `1(2)`, an empty tuple `()`,
an Ellipsis `...`, makes `eval` raise or return a non-number, so the score is `format_score`
either way), and computes with Python's own int, float and complex arithmetic, operation by
operation: the result is the very number `eval` returns, float rounding included (exact
fractions would part from TinyZero at the 1e-5 edge: `24 + 1/100000` is exactly 1e-5 above 24,
and (24 + 1e-05) - 24 is 9.9999999996e-06 in floats, so TinyZero gives it 1.0). `**` and `//`
are computed as Python does (`2**-1` is 0.5, `(0-8)**(1/3)` a complex number, `7//2` is 3),
and a result is checked as there, `abs(result - target) < 1e-5` (a complex one by its modulus).
Nesting fails where Python's does, since the parser is
Python's: 201 nested parentheses, 6,000 nested operators, and from ~3,000 (fewer the deeper the
caller's own stack, for `eval` as for `ast.parse`) a RecursionError; the walk itself does not
recurse. The one bound of reasonrl's own: an integer past `MAX_INT_BITS` bits (`2**99**4`) is
not computed and scores `format_score`, where TinyZero's `eval` would spend seconds to hours on
it (or fail); no Countdown expression over 3-4 numbers below 100 needs one to reach its target.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable

from reasonrl.rewards.extract import all_between
from reasonrl.rewards.safe_arithmetic import NotArithmetic

TEMPLATES = {  # reward.tinyzero_template -> the prompt's end, as TinyZero's decoded text holds it
    "qwen-instruct": "<|im_start|>assistant\n",
    "base": "Assistant: Let me solve this step by step.\n<think>",
}
TOLERANCE = 1e-5  # compute_score: abs(result - target) < 1e-5
MAX_INT_BITS = 1 << 20  # integers up to ~315,000 digits are computed; a product or power past it is not
_MARKERS = ("Assistant:", "<|im_start|>assistant")  # extract_solution's two splits, in its order
_ALLOWED_RE = re.compile(r"^[\d+\-*/().\s]+$")  # evaluate_equation's allowed_pattern, used with re.match
_DIGITS_RE = re.compile(r"\d+")  # validate_equation's numbers
Number = int | float | complex


def solution_string(completion: str, template: str = "qwen-instruct") -> str:
    """The text TinyZero scores for this response: the prompt's end (`TEMPLATES`) + the response."""
    if template not in TEMPLATES:
        raise ValueError(f"tinyzero template must be one of {', '.join(TEMPLATES)}, got {template!r}")
    return TEMPLATES[template] + completion


def extract_tinyzero_equation(solution: str) -> str | None:
    """`extract_solution`: after the first marker, the last line's last `<answer>...</answer>`
    content, stripped; None without a marker or a closed pair on that line."""
    for marker in _MARKERS:
        if marker in solution:
            line = solution.split(marker, 1)[1].rsplit("\n", 1)[-1]
            found = all_between(line, "<answer>", "</answer>")  # re.finditer of the non-greedy pair
            return found[-1].strip() if found else None
    return None


def uses_each_number_once(equation: str, numbers: list[int]) -> bool:
    """`validate_equation`: the sorted ints of the `\\d+` runs (Unicode digits included, as
    `int` reads them) equal the sorted numbers; False where `int` fails (a run past Python's
    4,300-digit limit), as there."""
    try:
        return sorted(int(run) for run in _DIGITS_RE.findall(equation)) == sorted(numbers)
    except ValueError:
        return False


def _power(base: Number, exponent: Number) -> Number:
    if type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1:
        if exponent.bit_length() > 40 or exponent * math.log2(abs(base)) > MAX_INT_BITS:
            raise NotArithmetic(f"an integer power past {MAX_INT_BITS} bits is not computed")
    return base ** exponent


def _times(left: Number, right: Number) -> Number:
    if type(left) is int and type(right) is int and left.bit_length() + right.bit_length() > MAX_INT_BITS + 1:
        raise NotArithmetic(f"an integer product past {MAX_INT_BITS} bits is not computed")
    return left * right


_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: _times, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Pow: _power}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def python_value(equation: str) -> Number:
    """The number Python's `eval(equation, {"__builtins__": None}, {})` returns, computed
    without eval (module docstring); NotArithmetic wherever that eval raises, returns something
    that is not a number, or would need an integer past `MAX_INT_BITS` bits."""
    if not _ALLOWED_RE.match(equation):
        raise NotArithmetic("a character outside TinyZero's digits, + - * / ( ) . and whitespace")
    try:  # eval strips leading spaces and tabs, then parses as ast.parse does
        tree = ast.parse(equation.lstrip(" \t"), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise NotArithmetic(f"Python does not parse it: {type(err).__name__}") from None
    values: list[Number] = []
    todo: list[tuple[ast.expr, bool]] = [(tree, False)]  # a walk without recursion: eval nests ~3,000 deep
    while todo:
        node, ready = todo.pop()
        try:
            if isinstance(node, ast.Constant) and type(node.value) in (int, float):
                values.append(node.value)
            elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
                if ready:
                    values.append(_UNARY[type(node.op)](values.pop()))
                else:
                    todo += [(node, True), (node.operand, False)]
            elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
                if ready:
                    right = values.pop()
                    values.append(_BINARY[type(node.op)](values.pop(), right))
                else:  # the left operand first, as Python evaluates
                    todo += [(node, True), (node.right, False), (node.left, False)]
            else:
                raise NotArithmetic(f"{type(node).__name__}: eval raises or returns a non-number")
        except NotArithmetic:
            raise
        except (ArithmeticError, TypeError, ValueError) as err:  # ZeroDivisionError, OverflowError, ...
            raise NotArithmetic(f"{type(err).__name__}: {err}") from None
    return values[0]


def tinyzero_score(completion: str, target: int, numbers: list[int], format_score: float = 0.1,
                   template: str = "qwen-instruct") -> dict[str, float]:
    """`compute_score` (module docstring) of the response `completion`: {"score": 1.0, format_score
    or 0.0; "format": an answer was found; "valid": it uses each number exactly once and has a
    numeric value; "equals_target": that value is within 1e-5 of the target}."""
    equation = extract_tinyzero_equation(solution_string(completion, template))
    if equation is None:
        return {"score": 0.0, "format": 0.0, "valid": 0.0, "equals_target": 0.0}
    value: Number | None = None
    if uses_each_number_once(equation, numbers):
        try:
            value = python_value(equation)
        except NotArithmetic:
            value = None
    try:
        hit = value is not None and abs(value - target) < TOLERANCE
    except (ArithmeticError, TypeError):  # OverflowError: a float against a target past 1e308
        hit = False
    return {"score": 1.0 if hit else format_score, "format": 1.0, "valid": float(value is not None),
            "equals_target": float(hit)}
