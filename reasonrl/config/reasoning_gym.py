"""The `data.reasoning_gym` section: reasoning-gym's procedural tasks (`data.task=reasoning_gym`,
`data.train_path=reasoning_gym:<task>`), and the rules across its keys. Docs: docs/reasoning-gym.md.

reasoning-gym 0.1.25 draws problem i of a task from `Random(seed + i)` (the `__getitem__` of 104
of its 105 tasks; `acre` draws its whole set from `Random(seed)`; a composite's k-th task gets
seed + k + 1), so two seeds closer than the sets' sizes share problems: its own TRL example
(`examples/trl/grpo.py`) trains on composite seed 1 and validates on seed 2, whose problems are
the training problems shifted by one. The rule below keeps the training seeds [seed, seed + size)
and the held-out seeds [val_seed, val_seed + val_size) apart; the data module then drops any
training problem whose question is a held-out one (a task that draws from a fixed pool).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reasonrl.config.fields import param
from reasonrl.errors import ConfigError

SCHEME = "reasoning_gym:"  # data.train_path / data.val_path entries this section configures
COMPOSITE = "composite"  # reasoning-gym's weighted mixture of tasks (data.reasoning_gym.weights)


@dataclass
class ReasoningGymConfig:
    size: int = param(1000, ge=1)  # training problems (per task of a comma-separated data.train_path)
    seed: int = param(0, ge=0)  # the training problems' seed: problem i of most tasks is drawn from seed + i
    val_size: int = param(100, ge=0)  # held-out problems (per task)
    # the held-out problems' seed; [val_seed, val_seed + val_size) must not meet [seed, seed + size)
    val_seed: int = param(1_000_000, ge=0)
    # the task's own options (the fields of its config dataclass, e.g. {max_animals: 4}); several tasks
    # (a comma-separated path, or composite): one mapping per task, {leg_counting: {max_animals: 4}}
    options: dict[str, Any] = param({})
    weights: dict[str, float] = param({})  # data.train_path=reasoning_gym:composite: task -> weight (> 0)
    # where the prompt asks for the answer and the verifier reads it: <answer>...</answer> or \boxed{...}
    answer_format: Literal["tag", "boxed"] = "tag"
    # one worked exchange before the question: the user asks "What is 2 + 2?" with the same instruction and
    # the assistant answers in the format (<answer>4</answer>, \boxed{4}); small models follow it far more
    demo: bool = False
    # false: a task's score below full marks counts 0 (reasoning-gym's default score_answer gives
    # len(answer) / len(text) to any answer containing the right one, which GRPO learns to game)
    partial_credit: bool = True


def task_list(paths: str) -> list[str]:
    """The task names of a comma-separated `reasoning_gym:<task>` list, in order ("" entries
    dropped); an entry without the scheme is kept whole, for the rule to name."""
    return [p.strip().removeprefix(SCHEME) if p.strip().startswith(SCHEME) else p.strip()
            for p in paths.split(",") if p.strip()]


def reasoning_gym_rules(task: str, train_path: str, val_path: str, rg: ReasoningGymConfig) -> None:
    """The rules of data.task=reasoning_gym and of `reasoning_gym:` paths under another task."""
    uses = [p for p in (train_path, val_path) if SCHEME in p]
    if task != "reasoning_gym":
        if uses:
            raise ConfigError(f"data.task: data.{'train' if uses[0] == train_path else 'val'}_path={uses[0]} "
                              "names a reasoning-gym task, which data.task=reasoning_gym reads; set it "
                              f"(data.task={task} does not)")
        return
    if not train_path:
        raise ConfigError("data.train_path: required when data.task=reasoning_gym, as "
                          "reasoning_gym:<task> (e.g. reasoning_gym:leg_counting), several comma-separated, "
                          "or reasoning_gym:composite with data.reasoning_gym.weights")
    names = {}
    for key, paths in (("data.train_path", train_path), ("data.val_path", val_path)):
        for entry in (p.strip() for p in paths.split(",") if p.strip()):
            name = entry.removeprefix(SCHEME)
            if not entry.startswith(SCHEME) or not name:
                raise ConfigError(f"{key}: {entry!r} is not reasoning_gym:<task>; data.task=reasoning_gym "
                                  "reads reasoning-gym tasks only (files are data.task=file)")
            names.setdefault(key, []).append(name)
    for key, tasks in names.items():
        if COMPOSITE in tasks and len(tasks) > 1:
            raise ConfigError(f"{key}: reasoning_gym:composite mixes the tasks of "
                              "data.reasoning_gym.weights; list no other task beside it")
        if len(set(tasks)) < len(tasks):
            twice = next(t for t in tasks if tasks.count(t) > 1)
            raise ConfigError(f"{key}: reasoning_gym:{twice} is listed twice")
    composite = COMPOSITE in names.get("data.train_path", []) + names.get("data.val_path", [])
    if composite and not rg.weights:
        raise ConfigError("data.reasoning_gym.weights: reasoning_gym:composite needs the tasks it mixes and "
                          "their weights, e.g. {leg_counting: 1.0, basic_arithmetic: 2.0}")
    if rg.weights and not composite:
        raise ConfigError("data.reasoning_gym.weights: set, but no path is reasoning_gym:composite, the "
                          "mixture they weigh; remove them or use data.train_path=reasoning_gym:composite")
    for name, weight in rg.weights.items():
        if not weight > 0:
            raise ConfigError(f"data.reasoning_gym.weights.{name}: must be > 0, got {weight!r}")
    tasks = {t for ts in names.values() for t in ts}
    several = composite or len(tasks) > 1
    for name, value in rg.options.items():
        if name in ("seed", "size"):
            raise ConfigError(f"data.reasoning_gym.options.{name}: set by data.reasoning_gym."
                              f"{name} (and val_{name} for the held-out set), not as a task option")
        if several and not isinstance(value, dict):
            raise ConfigError(f"data.reasoning_gym.options.{name}: with several tasks the options are one "
                              f"mapping per task, {{task: {{option: value}}}}; got {name}: {value!r}")
        if several and name not in tasks | set(rg.weights):
            raise ConfigError(f"data.reasoning_gym.options.{name}: not a task of this run "
                              f"({', '.join(sorted((tasks | set(rg.weights)) - {COMPOSITE}))})")
    train_end, val_end = rg.seed + rg.size, rg.val_seed + rg.val_size
    if rg.val_size and rg.seed < val_end and rg.val_seed < train_end:
        raise ConfigError(
            f"data.reasoning_gym.val_seed: the held-out problems (seeds {rg.val_seed}..{val_end - 1}) "
            f"overlap the training problems (seeds {rg.seed}..{train_end - 1}): reasoning-gym draws "
            f"problem i from seed + i, so the sets would share problems; use val_seed >= {train_end}"
            + (f" or <= {rg.seed - rg.val_size}" if rg.seed >= rg.val_size else ""))
