"""Safe arithmetic: parse an expression with `ast`, check every node, compute it exactly.

Nothing here is evaluated by Python. The text must pass a character check first (digits,
whitespace, + - * / ( ) and, where allowed, the decimal point), so names, calls, attributes,
strings, subscripts and comprehensions cannot even reach the parser; the parsed tree may then
only hold the node types the rules allow, and the value is computed by walking the tree with
exact fractions. Sizes are bounded before anything is computed: the text's length, each
exponent, and the number of digits of every intermediate value, so `9**9**9` or
`(10**100)**100` is refused instead of eating the machine.

Two users, two sets of rules: the Countdown verifier (integers, + - * / and parentheses only:
`COUNTDOWN_RULES`) and the `calculator` tool (also decimals, unary minus and powers with a
bounded integer exponent).
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_BITS_PER_DIGIT = math.log2(10)


@dataclass(frozen=True)
class ArithmeticRules:
    """What an expression may hold. The defaults are Countdown's: integer literals, binary
    + - * / and parentheses, at most 200 characters."""

    max_chars: int = 200  # longer text is refused before parsing
    decimals: bool = False  # decimal literals such as 3.25 (exact: 3.25 is 13/4, not a float)
    unary: bool = False  # unary minus and plus: -3, -(2 + 1)
    max_exponent: int = 0  # 0: no powers; else `**` with an integer exponent of at most this magnitude
    max_digits: int = 1000  # every intermediate numerator and denominator stays below this many digits


COUNTDOWN_RULES = ArithmeticRules()


class NotArithmetic(ValueError):
    """The text is not an expression the rules allow, or has no value (division by zero,
    a value too large); the message says which."""


def _allowed_chars(rules: ArithmeticRules) -> re.Pattern[str]:
    return re.compile(r"[0-9\s+\-*/().]+" if rules.decimals else r"[0-9\s+\-*/()]+")


def parse_arithmetic(text: str, rules: ArithmeticRules = COUNTDOWN_RULES) -> ast.expr:
    """The checked expression tree of `text`; NotArithmetic (with the reason) if the text is
    empty, too long, holds a character or a construct the rules do not allow, or does not
    parse."""
    if not isinstance(text, str) or not text.strip():
        raise NotArithmetic("empty expression")
    if len(text) > rules.max_chars:
        raise NotArithmetic(f"expression too long: {len(text)} characters (at most {rules.max_chars})")
    if not _allowed_chars(rules).fullmatch(text):
        bad = sorted({c for c in text if not _allowed_chars(rules).fullmatch(c)})
        allowed = "numbers, + - * / ( )" + (", decimal points" if rules.decimals else "") + (
            ", **" if rules.max_exponent else "")
        raise NotArithmetic(f"only {allowed} are allowed; found {''.join(bad[:10])!r}")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise NotArithmetic("not a well-formed expression") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) in _BINARY or isinstance(node.op, ast.Pow) and rules.max_exponent > 0:
                continue
            raise NotArithmetic(f"operator {type(node.op).__name__} is not allowed")
        if isinstance(node, ast.UnaryOp):
            if rules.unary and type(node.op) in _UNARY:
                continue
            raise NotArithmetic(f"unary {type(node.op).__name__} is not allowed")
        if isinstance(node, ast.Constant):
            if type(node.value) is int or rules.decimals and type(node.value) is float:
                continue
            raise NotArithmetic(f"literal {node.value!r} is not a number the rules allow")
        if isinstance(node, (ast.operator, ast.unaryop)):
            continue  # the operator nodes of the BinOp / UnaryOp checked above
        raise NotArithmetic(f"{type(node).__name__} is not allowed")
    return tree


def _check_size(value: Fraction, rules: ArithmeticRules) -> Fraction:
    bits = max(value.numerator.bit_length(), value.denominator.bit_length())
    if bits > rules.max_digits * _BITS_PER_DIGIT:
        raise NotArithmetic(f"a value exceeds {rules.max_digits} digits")
    return value


def _power(base: Fraction, exponent: Fraction, rules: ArithmeticRules) -> Fraction:
    if exponent.denominator != 1:
        raise NotArithmetic(f"exponent {exponent} is not an integer")
    power = exponent.numerator
    if abs(power) > rules.max_exponent:
        raise NotArithmetic(f"exponent {power} exceeds {rules.max_exponent} in magnitude")
    if base == 0 and power < 0:
        raise NotArithmetic("division by zero")
    bits = max(base.numerator.bit_length(), base.denominator.bit_length())
    if (bits - 1) * abs(power) > rules.max_digits * _BITS_PER_DIGIT:  # decided before computing
        raise NotArithmetic(f"a value exceeds {rules.max_digits} digits")
    return base ** power


def evaluate_arithmetic(text: str, rules: ArithmeticRules = COUNTDOWN_RULES
                        ) -> tuple[Fraction, list[int | Fraction]]:
    """(exact value, the number literals in the order written) of `text`; NotArithmetic if
    it is not an expression the rules allow or has no value (division by zero, too large).
    Integer literals come back as `int`, decimal ones as exact `Fraction`s."""
    tree = parse_arithmetic(text, rules)
    source = text.strip()
    used: list[int | Fraction] = []

    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.BinOp):
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow):
                return _check_size(_power(left, right, rules), rules)
            if isinstance(node.op, ast.Div) and right == 0:
                raise NotArithmetic("division by zero")
            return _check_size(_BINARY[type(node.op)](left, right), rules)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](walk(node.operand))
        assert isinstance(node, ast.Constant)  # parse_arithmetic allows nothing else
        if type(node.value) is int:
            used.append(node.value)
            return _check_size(Fraction(node.value), rules)
        literal = Fraction(ast.get_source_segment(source, node) or repr(node.value))  # exact, not the float
        used.append(literal)
        return _check_size(literal, rules)

    try:
        return walk(tree), used
    except RecursionError:
        raise NotArithmetic("expression nested too deeply") from None
