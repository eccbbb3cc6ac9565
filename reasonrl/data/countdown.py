"""Countdown instances (TinyZero; Pan et al. 2025): reach a target from 3-4 numbers.

Every instance is solvable by construction: the target is the value of a random expression
over the drawn numbers (each used once, exact division only), and that expression is kept
as the reference solution in `extra_info["solution"]`. The same seed gives the same data.
"""

from __future__ import annotations

import json
import random

from reasonrl.batch import Example
from reasonrl.config import CountdownConfig

PROMPT = ("Using the numbers {numbers}, create an equation that equals {target}. You can use basic "
          "arithmetic operations (+, -, *, /) and each number can be used at most once. Show your "
          "work in <think> </think> tags. And return the final equation in <answer> </answer> tags, "
          "for example <answer> (1 + 2) / 3 </answer>.")
_OPS = ("+", "-", "*", "/")


def _combine(a: tuple[int, str], b: tuple[int, str], op: str) -> tuple[int, str] | None:
    (x, ex), (y, ey) = a, b
    if op == "+":
        return x + y, f"({ex} + {ey})"
    if op == "-":
        return x - y, f"({ex} - {ey})"
    if op == "*":
        return x * y, f"({ex} * {ey})"
    if y != 0 and x % y == 0:
        return x // y, f"({ex} / {ey})"
    return None


def countdown_instance(rng: random.Random, cfg: CountdownConfig) -> tuple[list[int], int, str]:
    """(numbers, target, solution): a random reachable target in [min_target, max_target]
    that is not itself one of the numbers, and an expression reaching it."""
    while True:
        count = rng.randint(cfg.min_numbers, cfg.max_numbers)
        numbers = [rng.randint(cfg.min_number, cfg.max_number) for _ in range(count)]
        items = [(n, str(n)) for n in numbers]
        while len(items) > 1:
            a, b = rng.sample(range(len(items)), 2)
            merged = _combine(items[a], items[b], rng.choice(_OPS))
            if merged is None:
                continue
            items = [x for i, x in enumerate(items) if i not in (a, b)] + [merged]
        target, solution = items[0]
        if cfg.min_target <= target <= cfg.max_target and target not in numbers:
            return numbers, target, solution[1:-1]  # drop the outer parentheses


def countdown_example(numbers: list[int], target: int, solution: str) -> Example:
    truth = json.dumps({"numbers": numbers, "target": target}, sort_keys=True)
    return Example(prompt=PROMPT.format(numbers=numbers, target=target), ground_truth=truth,
                   data_source="countdown",
                   meta={"numbers": numbers, "target": target,
                         "solution": f"<think>Try combinations.</think>\n<answer>{solution}</answer>"})


def countdown_examples(cfg: CountdownConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """Seeded train and held-out sets; no (numbers, target) instance is in both."""
    rng = random.Random(f"countdown:{seed}")
    held_out: dict[tuple, Example] = {}
    attempts = 0
    while len(held_out) < cfg.val_size and attempts < 100 * cfg.val_size:
        attempts += 1
        numbers, target, solution = countdown_instance(rng, cfg)
        held_out.setdefault((tuple(sorted(numbers)), target), countdown_example(numbers, target, solution))
    train = []
    while len(train) < cfg.train_size:
        numbers, target, solution = countdown_instance(rng, cfg)
        if (tuple(sorted(numbers)), target) not in held_out:
            train.append(countdown_example(numbers, target, solution))
    return train, list(held_out.values())
