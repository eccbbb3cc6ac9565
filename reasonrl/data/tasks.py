"""The `data.task` registry: where a run's training and held-out examples come from.

Each entry is fn(data_config, seed) -> (train, held_out). `generated`: the task makes its own
problems from the seed (so `reasonrl eval --data NAME` can use its held-out split);
`system_prompt`: the system turn `data.system_prompt=auto` gives the task's prompts (only
arithmetic has one: its prompts do not say how to answer, every other task's do).
"""

from __future__ import annotations

from reasonrl.batch import Example
from reasonrl.config import DEFAULT_SYSTEM_PROMPT, DataConfig
from reasonrl.data.arithmetic import arithmetic_examples
from reasonrl.data.calculator_task import CALCULATOR_SYSTEM_PROMPT, calculator_examples
from reasonrl.data.countdown import countdown_examples
from reasonrl.data.files import load_files
from reasonrl.data.piecewise import piecewise_examples
from reasonrl.data.reasoning_gym import reasoning_gym_examples
from reasonrl.errors import DataError
from reasonrl.registry import DATA_TASKS


@DATA_TASKS.register("arithmetic", generated=True, system_prompt=DEFAULT_SYSTEM_PROMPT)
def arithmetic(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """seeded `a + b` problems (data.arithmetic)"""
    return arithmetic_examples(cfg.arithmetic, seed)


@DATA_TASKS.register("calculator", generated=True, system_prompt=CALCULATOR_SYSTEM_PROMPT)
def calculator(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """data.arithmetic problems after a worked calculator call: the tool task (env.name=tool)"""
    return calculator_examples(cfg.arithmetic, seed)


@DATA_TASKS.register("file", generated=False)
def files(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """data.train_path / data.val_path: JSONL, JSON, Parquet, CSV, `datasets` folders, Hub ids"""
    budget = prompt_budget(cfg)
    held_out = (load_files(cfg.val_path, cfg.fields, cfg.val_subset, cfg.val_split, cfg.format, budget)
                if cfg.val_path else [])
    return (load_files(cfg.train_path, cfg.fields, cfg.train_subset, cfg.train_split, cfg.format, budget),
            held_out)


def prompt_budget(cfg: DataConfig) -> int:
    """The prompt length a file's records are held to as they are read (`files.prompt_byte_limit`):
    data.max_prompt_tokens, or 0 (none) under data.truncate_prompts=left, which cuts long prompts
    to their last tokens instead of refusing them."""
    return cfg.max_prompt_tokens if cfg.truncate_prompts == "error" else 0


DATA_TASKS.register("jsonl", generated=False, doc="the same as file")(files)


@DATA_TASKS.register("countdown", generated=True)
def countdown(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """seeded Countdown problems (data.countdown)"""
    return countdown_examples(cfg.countdown, seed)


@DATA_TASKS.register("piecewise", generated=True)
def piecewise(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """Transparent GRPO's piecewise problem and its variants (data.piecewise)"""
    return piecewise_examples(cfg.piecewise, seed)


@DATA_TASKS.register("reasoning_gym", generated=True)
def reasoning_gym(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """reasoning-gym's procedural tasks: data.train_path=reasoning_gym:<task> (data.reasoning_gym)"""
    return reasoning_gym_examples(cfg)


def system_prompt_for(cfg: DataConfig) -> str:
    """The system turn of the run's prompts: `data.system_prompt`, or with `auto` the task's
    own (arithmetic: the calculator instruction; file tasks and the others: none, so that a
    GSM8K file is not told to answer like a calculator)."""
    if cfg.system_prompt != "auto":
        return cfg.system_prompt
    return DATA_TASKS[cfg.task].system_prompt


def load_examples(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, held_out) for the configured task; held_out may be empty."""
    train, held_out = DATA_TASKS.get(cfg.task)(cfg, seed)
    if not train:
        raise DataError("the training set is empty")
    if cfg.val_size:
        held_out = take_per_source(held_out, cfg.val_size)
    return train, held_out


def take_per_source(examples: list[Example], count: int) -> list[Example]:
    """At most `count` examples, shared evenly between data sources (round robin, each
    source in file order), so capping a mixed validation set keeps every source in it.
    With one source this is simply the first `count`."""
    by_source: dict[str, list[Example]] = {}
    for e in examples:
        by_source.setdefault(e.data_source, []).append(e)
    if len(by_source) == 1:
        return examples[:count]
    queues = [iter(v) for v in by_source.values()]
    taken: list[Example] = []
    while queues and len(taken) < count:
        for q in list(queues):
            e = next(q, None)
            if e is None:
                queues.remove(q)
            elif len(taken) < count:
                taken.append(e)
    return taken
