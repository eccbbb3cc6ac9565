"""Worked solutions a program writes, for SFT data without downloading any (`sft.source=solver`):
each of a task's problems with a correct solution in the task's answer format, the form its
verifier reads.

- `countdown`: a search finds an expression over the given numbers that equals the target
  (each number once: all of them when that is possible, as TinyZero's rule asks, else the
  fewest), and the solution shows its steps in `<think>` and the expression in `<answer>`, as
  the Countdown prompt asks (TinyZero; Pan et al. 2025);
- `arithmetic`: the expression evaluated, then the calculator system prompt's answer sentence
  (`The answer is 7.`).

`SOLVERS` maps a task to its solver, `solution(example) -> text`, found by each problem's
`data_source` (as `reward.task=auto` finds its verifier), else by `data.task`; the problem is read
from the example's ground truth (Countdown's `{"numbers", "target"}`) or its expression, so a
file of such problems (`data.task=file`, data_source `countdown`) gets solutions as well as the
generated ones do.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

from reasonrl.batch import Example
from reasonrl.errors import ConfigError, DataError
from reasonrl.rewards.countdown import parse_countdown_truth
from reasonrl.rewards.safe_arithmetic import ArithmeticRules, NotArithmetic, evaluate_arithmetic
from reasonrl.sft.records import SFTRecord

Step = tuple[int, str, int, int]  # a op b = c
Item = tuple[int, str, tuple[Step, ...]]  # a value, the expression that makes it and its steps


def _combinations(a: Item, b: Item) -> list[Item]:
    """Every exact integer result of one operation on `a` and `b`, the larger first where the
    order matters: a + b, a - b, a * b, a / b (exact), then b - a and b / a."""
    (x, ex, sx), (y, ey, sy) = (a, b) if a[0] >= b[0] else (b, a)
    steps = sx + sy

    def item(value: int, op: str, left: tuple[int, str], right: tuple[int, str]) -> Item:
        return value, f"({left[1]} {op} {right[1]})", (*steps, (left[0], op, right[0], value))

    out = [item(x + y, "+", (x, ex), (y, ey)), item(x - y, "-", (x, ex), (y, ey)),
           item(x * y, "*", (x, ex), (y, ey))]
    if y != 0 and x % y == 0:
        out.append(item(x // y, "/", (x, ex), (y, ey)))
    if x != y:
        out.append(item(y - x, "-", (y, ey), (x, ex)))
        if x != 0 and y % x == 0:
            out.append(item(y // x, "/", (y, ey), (x, ex)))
    return out


def countdown_search(numbers: list[int], target: int, use_all: bool) -> tuple[str, list[Step]] | None:
    """(expression, its steps in order) reaching `target` from `numbers`, each used at most once
    (all of them with `use_all`), by depth-first search over pairs and operations in a fixed
    order (the same problem always gets the same solution); None when there is none. A step is
    one operation of the expression: a step whose result the expression does not use is never
    listed."""
    def search(items: list[Item]) -> Item | None:
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                rest = [it for k, it in enumerate(items) if k not in (i, j)]
                for merged in _combinations(items[i], items[j]):
                    if merged[0] == target and (not use_all or not rest):
                        return merged
                    found = search([*rest, merged]) if rest else None
                    if found is not None:
                        return found
        return None

    found = search([(n, str(n), ()) for n in numbers])
    if found is None:
        return None
    _, expr, steps = found
    return expr[1:-1], list(steps)


def countdown_solution(example: Example) -> str:
    """A worked Countdown solution: the steps in <think>, the expression in <answer>. A problem
    with no expression over its numbers is a DataError naming it."""
    target, numbers = parse_countdown_truth(example.ground_truth)
    if target in numbers:  # the target itself, no step needed
        return f"<think>\n{target} is one of the numbers.\n</think>\n<answer>{target}</answer>"
    found = (countdown_search(numbers, target, use_all=True)
             or countdown_search(numbers, target, use_all=False))
    if found is None:
        where = example.meta.get("origin", str(example.prompt)[:60])
        raise DataError(f"{where}: no expression over {numbers} equals {target}: no solution to train on")
    expr, steps = found
    lines = "\n".join(f"{a} {op} {b} = {c}" for a, op, b, c in steps)
    return f"<think>\n{lines}\n</think>\n<answer>{expr}</answer>"


ARITHMETIC_RULES = ArithmeticRules(max_chars=200)


def arithmetic_solution(example: Example) -> str:
    """`7 + 5 = 12. The answer is 12.`: the problem's expression evaluated exactly, then the
    sentence the calculator system prompt asks for."""
    expr = example.meta.get("expression") or str(example.prompt).removeprefix("What is ").rstrip("?")
    try:
        value, _ = evaluate_arithmetic(expr, ARITHMETIC_RULES)
    except NotArithmetic as err:
        where = example.meta.get("origin", str(example.prompt)[:60])
        raise DataError(f"{where}: not an arithmetic problem the solver reads ({err})") from None
    shown = str(value.numerator) if value.denominator == 1 else str(float(Fraction(value)))
    return f"{expr} = {shown}. The answer is {shown}."


SOLVERS: dict[str, Callable[[Example], str]] = {"countdown": countdown_solution,
                                                "arithmetic": arithmetic_solution}


def solver_for(example: Example, task: str, where: str) -> Callable[[Example], str]:
    """The solver of the example's data_source, else of `data.task`; a ConfigError naming
    sft.source, the problem and the tasks that have one."""
    solve = SOLVERS.get(example.data_source) or SOLVERS.get(task)
    if solve is None:
        raise ConfigError(f"sft.source=solver: no solver for {where} (data_source {example.data_source!r}, "
                          f"data.task={task}); tasks with one: {', '.join(SOLVERS)} (or give records with "
                          "sft.source=files and sft.train_path)")
    return solve


def solution_records(examples: list[Example], task: str, split: str = "training") -> list[SFTRecord]:
    """Each problem (its prompt as `train` shows it) paired with its worked solution."""
    records = []
    for i, e in enumerate(examples, start=1):
        where = e.meta.get("origin", f"data.task={task} {split} problem {i}")
        records.append(SFTRecord(where, prompt=e.prompt, completion=solver_for(e, task, where)(e)))
    return records
