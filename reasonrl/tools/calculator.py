"""The `calculator` tool: an arithmetic expression, parsed and computed exactly, never evaluated.

The expression goes through `reasonrl.rewards.safe_arithmetic` (the Countdown verifier's safe
arithmetic) with wider rules: decimals (exact: 0.1 is 1/10), unary minus, and powers whose
integer exponent is at most `MAX_EXPONENT` in magnitude; at most `MAX_CHARS` characters and
`MAX_DIGITS` digits in any intermediate value. `^` is read as a power, `×` `·` as `*`, `÷`
as `/`, `−` as `-`. Anything else (names, calls, attributes, strings, comparisons) is
refused with the reason, as an error observation. The answer is the exact value: an integer,
a terminating decimal (`7/4` -> `1.75`), or, for a repeating one, 12 significant digits
(`1/3` -> `0.333333333333`).
"""

from __future__ import annotations

from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

from reasonrl.registry import TOOLS
from reasonrl.rewards.safe_arithmetic import ArithmeticRules, NotArithmetic, evaluate_arithmetic
from reasonrl.tools.base import ToolArgumentError, text_argument
from reasonrl.tools.sandbox import Limits, Observation

MAX_CHARS = 500
MAX_EXPONENT = 100
MAX_DIGITS = 1000
SIGNIFICANT_DIGITS = 12
RULES = ArithmeticRules(max_chars=MAX_CHARS, decimals=True, unary=True, max_exponent=MAX_EXPONENT,
                        max_digits=MAX_DIGITS)
_SPELLINGS = (("^", "**"), ("×", "*"), ("·", "*"), ("÷", "/"), ("\u2212", "-"))


def format_value(value: Fraction) -> str:
    """An exact value as text: integer, terminating decimal (every digit), or 12 significant digits."""
    if value.denominator == 1:
        return str(value.numerator)
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest == 1:  # terminating: 10**places / denominator is an integer
        places = max(twos, fives)
        whole, frac = divmod(abs(value.numerator) * 10 ** places // value.denominator, 10 ** places)
        return f"{'-' if value < 0 else ''}{whole}.{frac:0{places}d}"
    rounded = Context(prec=SIGNIFICANT_DIGITS).divide(Decimal(value.numerator), Decimal(value.denominator))
    return format(rounded, "f") if -20 < rounded.adjusted() < 20 else format(rounded, "e")


def calculate(expression: str) -> str:
    """The value of `expression` as text; NotArithmetic (with the reason) if refused."""
    for spelled, op in _SPELLINGS:
        expression = expression.replace(spelled, op)
    value, _ = evaluate_arithmetic(expression, RULES)
    return format_value(value)


@TOOLS.register("calculator", doc='arithmetic: + - * / ** ( ), decimals; "347 * 29" or {"expression": ...}',
                sandboxed=False)
def calculator(arguments: Any, limits: Limits) -> Observation:
    """Compute an arithmetic expression (text, or {"expression": ...}) exactly; refusals and bad
    arguments come back as error observations."""
    try:
        expression = text_argument(arguments, "expression", max_chars=MAX_CHARS)
        return Observation(output=calculate(expression), exit_code=0)
    except ToolArgumentError as err:
        return Observation(error=f"calculator: {err}")
    except NotArithmetic as err:
        return Observation(error=f"calculator: {err}")
