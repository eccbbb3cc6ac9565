"""The piecewise-continuity problem of Transparent GRPO's toy environment, and variants.

The canonical problem (MATH, algebra) is

    f(x) = ax + 3 if x > 2;  x - 5 if -2 <= x <= 2;  2x - b if x < -2.  Find a + b (= 0).

Variants keep the shape, `ax + p` / `x - q` / `2x - b` with boundary k, and draw k, q and
the integer solution a from a seed; continuity at x = k gives a*k + p = k - q, at x = -k it
gives b = q - k. Each example carries a worked reference solution in `extra_info`.
"""

from __future__ import annotations

import json
import random

from reasonrl.batch import Example
from reasonrl.config import PiecewiseConfig

INSTRUCTION = "Show each step, then give the final answer within \\boxed{}."


def _affine(coef: str, const: int) -> str:
    """"ax+3", "ax-7", "ax" in the problem's LaTeX style."""
    return coef if const == 0 else f"{coef}{'+' if const > 0 else '-'}{abs(const)}"


def piecewise_problem(k: int, p: int, q: int) -> str:
    return ("Let \\[f(x) = \\left\\{\n\\begin{array}{cl} "
            f"{_affine('ax', p)}, &\\text{{ if }}x>{k}, \\\\\n"
            f"{_affine('x', -q)} &\\text{{ if }} -{k} \\le x \\le {k}, \\\\\n"
            f"2x-b &\\text{{ if }} x <-{k}.\n\\end{{array}}\n\\right.\\]Find $a+b$ if the piecewise "
            "function is continuous (which means that its graph can be drawn without lifting your "
            "pencil from the paper).")


def _signed(n: int) -> str:
    return f"({n})" if n < 0 else str(n)


def piecewise_solution(k: int, p: int, q: int) -> str:
    """A worked solution that earns every partial credit of the piecewise reward."""
    a, b = (k - q - p) // k, q - k
    return (f"The pieces must meet at the boundaries x = {k} and x = -{k}.\n"
            f"At x = {k}: a({k}) {'+' if p >= 0 else '-'} {abs(p)} = {k} - {q}, so {k}a = {k - q - p}, "
            f"which gives a = {a}.\n"
            f"At x = -{k}: -{k} - {q} = 2(-{k}) - b, so {-k - q} = {-2 * k} - b, which gives b = {b}.\n"
            f"Therefore a + b = {_signed(a)} + {_signed(b)} = {a + b}.\n\\boxed{{{a + b}}}")


def piecewise_example(k: int = 2, p: int = 3, q: int = 5) -> Example:
    """The problem with constants (k, p, q); the defaults are the canonical one."""
    a, b = (k - q - p) // k, q - k
    if a * k + p != k - q:
        raise ValueError(f"no integer a for k={k}, p={p}, q={q}")
    return Example(prompt=f"{piecewise_problem(k, p, q)} {INSTRUCTION}",
                   ground_truth=json.dumps({"a": a, "b": b, "k": k}, sort_keys=True),
                   data_source="piecewise",
                   meta={"k": k, "p": p, "q": q, "solution": piecewise_solution(k, p, q)})


def piecewise_variants(count: int, rng: random.Random, exclude: set[tuple[int, int, int]]) -> list[Example]:
    """`count` distinct variants (k, p, q) not in `exclude` (which they are added to)."""
    out = []
    while len(out) < count:
        k, q, a = rng.randint(1, 5), rng.randint(1, 9), rng.choice([n for n in range(-9, 10) if n])
        p = k - q - a * k
        if (k, p, q) not in exclude:
            exclude.add((k, p, q))
            out.append(piecewise_example(k, p, q))
    return out


def piecewise_examples(cfg: PiecewiseConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """Train: the canonical problem (+ `train_variants`); held out: the canonical problem
    (what the toy env measures) + `val_variants` variants never trained on."""
    rng = random.Random(f"piecewise:{seed}")
    seen = {(2, 3, 5)}
    held_out = [piecewise_example()] + piecewise_variants(cfg.val_variants, rng, seen)
    train = [piecewise_example()] + piecewise_variants(cfg.train_variants, rng, seen)
    return train, held_out
