"""reasoning-gym's procedural tasks as training and held-out examples (`data.task=reasoning_gym`,
`data.train_path=reasoning_gym:<task>`; Stojanovski et al. 2025, arXiv:2505.24760; the package
`reasoning_gym`, its data inside the wheel, deterministic per seed under a fixed hash seed).

    reasoning_gym:leg_counting                      one task, data.reasoning_gym.size problems
    reasoning_gym:leg_counting,reasoning_gym:gcd    several, each its own size problems, in order
    reasoning_gym:composite                         reasoning-gym's weighted mixture of the tasks
                                                    of data.reasoning_gym.weights

Problems come from `reasoning_gym.create_dataset(task, seed=, size=, **options)` (composite:
`create_dataset("composite", seed=, size=, datasets=[DatasetSpec(name, weight, config)])`, whose
entry i is task k's entry i, k drawn by weight from `Random(seed + i)`), generated under
PYTHONHASHSEED=0 in a child interpreter (`rewards.reasoning_gym.Generator`: some tasks' problems
follow the string hash seed, random per process otherwise; docs/reasoning-gym.md), the training set from
`data.reasoning_gym.seed` and the held-out set from `val_seed`, which the config keeps apart
(`reasonrl.config.reasoning_gym`). The held-out set is built first and any training problem
whose question is a held-out question is left out (said in one line), as the arithmetic task
does: a task drawing from a fixed pool can repeat a question under another seed.

Each prompt is the task's question followed by the instruction of data.reasoning_gym.answer_format
(`INSTRUCTIONS`); the ground truth refers to the problem (`rewards.reasoning_gym.Reference`) and
the data source is `reasoning_gym/<task>`, which `reward.task=auto` scores with the task's own
`score_answer` on the extracted answer, and the evaluation reports task by task.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from reasonrl import console
from reasonrl.batch import Example
from reasonrl.config import DataConfig, ReasoningGymConfig
from reasonrl.config.reasoning_gym import COMPOSITE, task_list
from reasonrl.errors import DataError
from reasonrl.rewards.reasoning_gym import (
    SOURCE,
    GenerationFailed,
    Reference,
    Refused,
    generate,
    library,
    options_key,
    problem_set,
    start_generator,
)

# what each answer format asks, after the question (its extraction: rewards.reasoning_gym.EXTRACTORS)
INSTRUCTIONS = {
    "tag": "Give only your final answer, between <answer> and </answer>.",
    "boxed": "Give only your final answer, inside \\boxed{}.",
}
# data.reasoning_gym.demo: a question no task asks, and its answer written in each format
DEMO_QUESTION, DEMO_ANSWERS = "What is 2 + 2?", {"tag": "<answer>4</answer>", "boxed": "\\boxed{4}"}


def render(question: str, answer_format: str, demo: bool) -> str | list[dict[str, str]]:
    """The prompt of a question: the question, a blank line and the format's instruction; with
    `demo`, as the last user turn of a chat whose first exchange asks DEMO_QUESTION the same way
    and answers it in the format."""
    instruction = INSTRUCTIONS[answer_format]
    ask = f"{question.rstrip()}\n\n{instruction}"
    if not demo:
        return ask
    return [{"role": "user", "content": f"{DEMO_QUESTION}\n\n{instruction}"},
            {"role": "assistant", "content": DEMO_ANSWERS[answer_format]},
            {"role": "user", "content": ask}]


def task_names() -> list[str]:
    """reasoning-gym's registered tasks (composite aside), sorted."""
    library()  # MissingExtraError before any other import of it
    from reasoning_gym.factory import DATASETS

    return sorted(name for name in DATASETS if name != COMPOSITE)


def task_options(task: str, options: dict[str, Any], several: bool) -> dict[str, Any]:
    """The options of `task`: data.reasoning_gym.options itself for a run of one task, its entry
    for a run of several."""
    return dict(options.get(task) or {}) if several else dict(options)


def _check(task: str, options: dict[str, Any], key: str, where: str) -> None:
    """DataError naming the key that chose `task` (`key`) if reasoning-gym has no such task, or
    the one holding its options (`where`) if it has no such option."""
    names = task_names()
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        close = difflib.get_close_matches(task, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise DataError(f"{key}: reasoning_gym:{task}: no such reasoning-gym task{hint}; its {len(names)} "
                        f"tasks: {', '.join(names)}")
    fields = list(DATASETS[task][1].__dataclass_fields__)
    unknown = [k for k in options if k not in fields]
    if unknown:
        allowed = ", ".join(f for f in fields if f not in ("seed", "size"))
        hint = (" (a run of one task takes its options directly: data.reasoning_gym.options.<option>)"
                if unknown[0] in DATASETS else "")
        raise DataError(f"{where}.{unknown[0]}: {task} has no such option{hint}; its options: {allowed}")


def _entries(task: str, seed: int, size: int, options: dict[str, Any], where: str,
             weights: str | None = None, count: int | None = None) -> tuple[tuple[dict, ...], dict]:
    """The task's `size` entries from `seed` as generated under PYTHONHASHSEED=0
    (`rewards.reasoning_gym.problem_set`; `count=0`: none, the options only checked), and a
    composite's sub-datasets' seeds; DataError naming the options (`where`) reasoning-gym refuses,
    or the problem it fails to generate."""
    name = "composite" if weights is not None else task
    try:
        if count == 0:
            generate("entries", task, seed, size, options_key(options), weights, [])
            return (), {}
        return problem_set(task, seed, size, options_key(options), weights)
    except Refused as err:
        raise DataError(f"{where}: {task} refuses {json.dumps(options, sort_keys=True)}: {err}") from None
    except GenerationFailed as err:
        raise DataError(f"reasoning_gym:{name} (seed {seed}) problem {err.index}: reasoning-gym failed "
                        f"to generate it: {err}") from None


def _example(task: str, seed: int, size: int, index: int, problem: dict, options: dict[str, Any],
             rg: ReasoningGymConfig) -> Example:
    if not isinstance(problem.get("question"), str) or not problem["question"].strip():
        raise DataError(f"reasoning_gym:{task} (seed {seed}) problem {index}: no question")
    answer = problem.get("answer")
    ref = Reference(task, seed, size, index, options_key(options), rg.answer_format,
                    None if answer is None else str(answer), rg.partial_credit)
    return Example(prompt=render(problem["question"], rg.answer_format, rg.demo), ground_truth=ref.to_json(),
                   data_source=SOURCE + task,
                   meta={"origin": f"reasoning_gym:{task}[seed {seed}]:{index}", "task": task,
                         "index": index, "answer": ref.answer})


def problems(task: str, seed: int, size: int, rg: ReasoningGymConfig, several: bool,
             key: str) -> list[Example]:
    """`size` examples of `task` (composite: the mixture of data.reasoning_gym.weights) from
    `seed`, generated under PYTHONHASHSEED=0 (in a child interpreter unless this one's hash seed is
    0: the same problems in every process, `rewards.reasoning_gym.Generator`); `several`: the run
    names more than one task, so data.reasoning_gym.options holds one mapping per task; `key`: the
    path that named the task, for errors."""
    start_generator()  # the child imports reasoning-gym while this process does (task_names)
    where = "data.reasoning_gym.options"
    if task != COMPOSITE:
        options = task_options(task, rg.options, several)
        where = f"{where}.{task}" if several else where
        _check(task, options, key, where)
        entries, _ = _entries(task, seed, size, options, where)
        return [_example(task, seed, size, i, problem, options, rg) for i, problem in enumerate(entries)]
    specs = []
    for k, (name, weight) in enumerate(rg.weights.items()):
        options = task_options(name, rg.options, True)
        _check(name, options, f"data.reasoning_gym.weights.{name}", f"{where}.{name}")
        # its refusal named: reasoning-gym's composite gives its k-th task seed + k + 1
        _entries(name, seed + k + 1, size, options, f"{where}.{name}", count=0)
        specs.append([name, weight, options])
    mixture, seeds = _entries(COMPOSITE, seed, size, {}, where, weights=json.dumps(specs, sort_keys=True))
    examples = []
    for i, problem in enumerate(mixture):
        name = problem["metadata"]["source_dataset"]  # the composite's entry i is that task's entry i
        options = task_options(name, rg.options, True)
        examples.append(_example(name, seeds[name], size, i, problem, options, rg))
    return examples


def reasoning_gym_examples(cfg: DataConfig) -> tuple[list[Example], list[Example]]:
    """(train, held_out): data.train_path's tasks from data.reasoning_gym.seed, the held-out
    problems of data.val_path's (default: the same tasks) from val_seed; no training question
    is a held-out question."""
    rg = cfg.reasoning_gym
    train_tasks = task_list(cfg.train_path)
    if not train_tasks:
        raise DataError("data.train_path: data.task=reasoning_gym reads reasoning_gym:<task> there, e.g. "
                        "data.train_path=reasoning_gym:leg_counting")
    val_tasks = task_list(cfg.val_path) if cfg.val_path else train_tasks
    several = len(set(train_tasks) | set(val_tasks)) > 1 or COMPOSITE in train_tasks + val_tasks
    val_key = "data.val_path" if cfg.val_path else "data.train_path"
    held_out = [e for t in val_tasks for e in problems(t, rg.val_seed, rg.val_size, rg, several, val_key)]
    drawn_train = [problems(t, rg.seed, rg.size, rg, several, "data.train_path") for t in train_tasks]
    questions = {json.dumps(e.prompt) for e in held_out}
    train, dropped, drawn = [], {}, {}
    for task_problems in drawn_train:
        for e in task_problems:
            drawn[e.meta["task"]] = drawn.get(e.meta["task"], 0) + 1
            if json.dumps(e.prompt) in questions:
                dropped[e.meta["task"]] = dropped.get(e.meta["task"], 0) + 1
            else:
                train.append(e)
    if dropped:
        said = ", ".join(f"{n} of the {drawn[t]} {t}" for t, n in dropped.items())
        console.info(f"data.reasoning_gym: {said} training problems ask a held-out question (val_seed "
                     f"{rg.val_seed}) and are left out")
    if not train:
        raise DataError(f"data.train_path: every problem of {cfg.train_path} is a held-out question; "
                        "raise data.reasoning_gym.size or change data.reasoning_gym.seed")
    return train, held_out
