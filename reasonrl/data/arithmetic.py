"""The default task: seeded arithmetic problems (`What is 7 + 5?`) with disjoint splits."""

from __future__ import annotations

import random

from reasonrl import console
from reasonrl.batch import Example
from reasonrl.config import ArithmeticConfig


def arithmetic_problem(rng: random.Random, cfg: ArithmeticConfig) -> tuple[str, int]:
    """One random expression like `7 + 5` (left to right, standard precedence) and its value."""
    operands = [rng.randint(cfg.min_operand, cfg.max_operand) for _ in range(cfg.num_operands)]
    ops = [rng.choice(cfg.operators) for _ in range(cfg.num_operands - 1)]
    expr = str(operands[0])
    for op, x in zip(ops, operands[1:], strict=True):
        expr += f" {op} {x}"
    return expr, _evaluate(operands, ops)


def _evaluate(operands: list[int], ops: list[str]) -> int:
    # Multiplication binds tighter: fold products first, then sum the signed terms.
    terms, signs = [operands[0]], [1]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def arithmetic_examples(cfg: ArithmeticConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """Seeded train and held-out splits whose expressions never overlap.

    The held-out problems are drawn first; training problems are drawn from the rest of
    the space, so held-out accuracy measures generalisation, not memorisation. The same
    seed always gives the same splits.
    """
    rng = random.Random(f"arithmetic:{seed}")
    space = (cfg.max_operand - cfg.min_operand + 1) ** cfg.num_operands * len(
        set(cfg.operators)) ** (cfg.num_operands - 1)
    val_size = min(cfg.val_size, space // 3)
    if val_size < cfg.val_size:
        console.info(f"data.arithmetic: only {space} distinct problems; holding out "
                     f"{val_size} instead of val_size={cfg.val_size}")
    held_out: dict[str, int] = {}
    while len(held_out) < val_size:
        expr, value = arithmetic_problem(rng, cfg)
        held_out.setdefault(expr, value)
    train = []
    while len(train) < cfg.train_size:
        expr, value = arithmetic_problem(rng, cfg)
        if expr not in held_out:
            train.append((expr, value))

    def make(expr: str, value: int) -> Example:
        return Example(prompt=f"What is {expr}?", ground_truth=str(value),
                       data_source="arithmetic", meta={"expression": expr})

    return [make(e, v) for e, v in train], [make(e, v) for e, v in held_out.items()]
