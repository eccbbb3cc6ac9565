"""Numeric correctness: does the model's final answer equal the ground-truth number?

Answers are compared exactly, as fractions, after normalising the ways people (and models)
write numbers: "$1,000", "1000.", "\\frac{1}{2}", "x = 5", "18 dollars". There is no
tolerance: 1548557 is not 1548556 and 3.0000003 is not 3 (a relative tolerance accepts wrong
integers above a million), while "18.0", "18" and "\\frac{36}{2}" are the same number. A
float tolerance belongs only to a scorer whose original has one (TinyZero's Countdown:
`countdown.py`). Strings are parsed with linear-time regexes and string ops only; model output
is never evaluated.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from reasonrl.errors import GroundTruthError
from reasonrl.registry import VERIFIERS
from reasonrl.rewards.extract import extract_answer

_TEXT_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{([^{}]*)\}")
_FRAC_RE = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
_FRAC_DIGITS_RE = re.compile(r"\\[dt]?frac(\d)(\d)")  # \frac12
# Removed outright: currency, percent, LaTeX spacing and degree marks.
_DROP = ("\\$", "$", "\\%", "%", "\\!", "\\,", "\\;", "\\ ", "^{\\circ}", "^\\circ", "~")
_NUM = r"[-+]?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_VALUE_RE = re.compile(rf"({_NUM})(?:\s*/\s*({_NUM}))?")
_UNIT_CHARS = frozenset(".,'/()-")


def _is_units(rest: str) -> bool:
    """True for trailing words like "dollars" or "km/h" that follow a number.

    Trailing text with digits or operators ("+ 3", "m^2") is not units: it changes the
    value, so the answer is treated as unparseable rather than guessed at.
    """
    if not rest:
        return True
    if not rest[0].isalpha():
        return False
    return all(c.isalpha() or c.isspace() or c in _UNIT_CHARS for c in rest)


def _normalise(s: str) -> str:
    """Strip the decoration around a number: `\\text{}`, `$`, `%`, `x =`, a final period."""
    s = s.replace("\u2212", "-").replace("{,}", ",")  # unicode minus, LaTeX "1{,}000"
    s = _TEXT_RE.sub(r"\1", s)
    for token in _DROP:
        s = s.replace(token, "")
    s = s.rsplit("=", 1)[-1]  # "x = 5": the right-hand side of the final `=`
    s = _FRAC_RE.sub(r"\1/\2", s)
    s = _FRAC_DIGITS_RE.sub(r"\1/\2", s)
    return s.strip().rstrip(".").strip()


_MAX_EXPONENT = 400  # "1e-999999999" is not read: its exact value would be a billion digits


def _to_exact(num: str) -> Fraction:
    """The exact value of a `_NUM` match ("1,234.5" -> 2469/2): ValueError past `_MAX_EXPONENT`
    or when the float would not be finite (what was never a number here, "1e400")."""
    plain = num.replace(",", "")
    if not math.isfinite(float(plain)):
        raise ValueError(f"{num} is not a finite number")
    decimal = Decimal(plain)
    if abs(decimal.as_tuple().exponent) > _MAX_EXPONENT:
        raise ValueError(f"{num}: exponent out of range")
    return Fraction(decimal)


def parse_exact(s: str) -> Fraction | None:
    """Parse an answer string to its exact value, or None if it is not a single number. Never
    raises.

    Accepts "1,234.5", "$18", "50\\%", "18 dollars", "5 apples.", "\\frac{1}{2}", "3/4",
    "+5", ".5", "x = 5", "\\text{5}". Rejects words only, empty strings, division by zero,
    values that are not finite as floats ("1e400"), and numbers followed by more maths ("5 + 3").
    """
    if not isinstance(s, str):
        return None
    try:
        s = _normalise(s)
        m = _VALUE_RE.match(s)
        if m is None or not _is_units(s[m.end():].strip()):
            return None
        value = _to_exact(m.group(1))
        if m.group(2) is not None:
            denominator = _to_exact(m.group(2))
            if denominator == 0:
                return None
            value /= denominator
        if not math.isfinite(float(value)):
            return None
    except (ValueError, ArithmeticError, InvalidOperation):
        return None
    return value


def parse_number(s: str) -> float | None:
    """`parse_exact` as the nearest float, or None. Never raises."""
    value = parse_exact(s)
    return None if value is None else float(value)


def numbers_equal(a: int | float | Fraction, b: int | float | Fraction) -> bool:
    """Exact equality by value, with no tolerance: 18.0 equals 18 and Fraction(1, 2) equals 0.5,
    but 1548557 is not 1548556 and 0.1 + 0.2 is not 0.3 (Python compares int, float and
    Fraction exactly). Compare `parse_exact` values, not floats, for integers above 2**53."""
    return a == b


def numeric_reward(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    """1.0 if the completion's extracted answer equals the ground-truth number exactly, else 0.0.

    The ground truth is parsed first and must parse: if it does not, GroundTruthError (a
    ValueError) is raised, because a silent 0 would look like the model failing.
    """
    truth = parse_exact_ground_truth(ground_truth)
    answer, _ = extract_answer(completion, fallback_last_number)
    value = parse_exact(answer) if answer is not None else None
    return 1.0 if value is not None and numbers_equal(value, truth) else 0.0


def parse_exact_ground_truth(ground_truth: str) -> Fraction:
    """The ground truth's exact value, or GroundTruthError."""
    truth = parse_exact(ground_truth)
    if truth is None:
        raise GroundTruthError(f"ground truth {ground_truth!r} does not parse as a number")
    return truth


def parse_ground_truth_number(ground_truth: str) -> float:
    """The ground truth as a float, or GroundTruthError."""
    return float(parse_exact_ground_truth(ground_truth))


def canonical_answer(answer: str | None, numeric: bool) -> str | None:
    """An extracted answer in a form where equal answers compare equal as strings: a number
    (`parse_exact`: "$1,000", "1000.0" -> "1000") or, unless `numeric`, the text with
    whitespace removed. None (no answer) for an empty string or, when `numeric`, for text
    that is not a number. An integer is written out in full (two integers are one answer only
    when they are equal), any other number to 12 significant digits."""
    if answer is None:
        return None
    value = parse_exact(answer)
    if value is not None:
        return str(value.numerator) if value.denominator == 1 else f"{float(value):.12g}"
    if numeric:
        return None
    text = "".join(answer.split())
    return text or None


def numeric_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The answer a numeric verifier reads (`\\boxed{}` > `<answer>` > the last number, if
    allowed), normalised; it must be a number."""
    return canonical_answer(extract_answer(completion, fallback_last_number)[0], numeric=True)


def any_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The answer of a task whose answers need not be numbers (math, a custom reward):
    `\\boxed{}` > `<answer>` > the last number, any non-empty text, normalised."""
    return canonical_answer(extract_answer(completion, fallback_last_number)[0], numeric=False)


# `answer`: the normalised answer a completion commits to by this verifier's extraction rule
# (the evaluation's majority vote and format-error rate, `reasonrl.evaluate.final_answer`).
@VERIFIERS.register(
    "numeric", doc="the extracted answer equals the ground-truth number (the default; arithmetic)",
    isolated=False, options={"fallback_last_number": "fallback_last_number"}, check=parse_ground_truth_number,
    answer=numeric_answer)
def numeric_verifier(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                     fallback_last_number: bool = True) -> float:
    """`numeric_reward` with the verifier signature (task "numeric", the default)."""
    return numeric_reward(completion, ground_truth, fallback_last_number)
