"""`reasonrl data prepare TASK`: convert public datasets (or generate tasks) to training files.

Every output record is {"prompt", "ground_truth", "data_source", "extra_info"}; `extra_info`
keeps the reference solution ("solution") and the source's own fields. Records are written
as JSONL, or Parquet when the output ends in .parquet; `data.task=file` reads both.

- gsm8k: the official files (`question`, `answer` ending in `#### 72`): the number after
  `####` (commas dropped) becomes the ground truth.
- math: MATH-style records (`problem`, `solution`, optional `answer`, `level`, `type`): the
  ground truth is `answer`, else the last `\\boxed{}` of the solution. Reads JSONL, JSON,
  Parquet, or the official folder of one-problem JSON files.
- countdown: `--input` converts TinyZero's Countdown-Tasks-3to4 records (`target`, `nums`;
  JSONL or Parquet) with TinyZero's question; without it, problems generated from a seed.
- piecewise: generated from a seed (no input).

An option the chosen preparation does not use (`--size` with `--input`, `--instruction` for
Countdown, ...) is an error, not silently ignored.
"""

from __future__ import annotations

import random
from pathlib import Path

from reasonrl.config import CountdownConfig
from reasonrl.data.formats import TEMPLATES
from reasonrl.data.readers import iter_records, write_records
from reasonrl.errors import ConfigError, DataError
from reasonrl.registry import DATA_FORMATS


def _window(path: str | Path, skip: int = 0, limit: int = 0):
    """(index, where, record) for the records of `path` numbered skip .. skip + limit - 1
    (limit 0: to the end), index counted from 0 over the whole file."""
    for index, (where, raw) in enumerate(iter_records(path)):
        if index < skip:
            continue
        if limit and index >= skip + limit:
            break
        yield index, where, raw


def convert(fmt: str, path: str | Path, instruction: str | None = None, limit: int = 0, skip: int = 0,
            template: str = "") -> list[dict]:
    """The records of `path` in a known layout (`data.format`: gsm8k, math, numina, countdown;
    `reasonrl.data.formats`) -> training records; `instruction` None = the format's own.
    Countdown's `skip` / `limit` take TinyZero's splits: train = the first 327680, test = the
    1024 after them."""
    entry = DATA_FORMATS[fmt]
    instruction = entry.instruction if instruction is None else instruction
    return [entry.fn(raw, where, index, instruction, template)
            for index, where, raw in _window(path, skip, limit)]


def _example_record(example) -> dict:
    extra = {k: v for k, v in example.meta.items() if k != "origin"}
    return {"prompt": example.prompt, "ground_truth": example.ground_truth,
            "data_source": example.data_source, "extra_info": extra}


def prepare_countdown(size: int, seed: int = 0, cfg: CountdownConfig | None = None) -> list[dict]:
    """`size` solvable Countdown instances from `seed` (the `data.countdown` generator)."""
    from reasonrl.data.countdown import countdown_example, countdown_instance

    cfg = cfg or CountdownConfig()
    rng = random.Random(f"countdown-prepare:{seed}")
    return [_example_record(countdown_example(*countdown_instance(rng, cfg))) for _ in range(size)]


def prepare_piecewise(size: int, seed: int = 0) -> list[dict]:
    """The canonical piecewise problem, then `size - 1` seeded variants."""
    from reasonrl.data.piecewise import piecewise_example, piecewise_variants

    rng = random.Random(f"piecewise-prepare:{seed}")
    examples = [piecewise_example()] + piecewise_variants(max(size - 1, 0), rng, {(2, 3, 5)})
    return [_example_record(e) for e in examples[:size]]


# what each preparation uses of the options: converting a file, or generating problems
_CONVERT = {"input", "limit", "skip"}
_USES = {("gsm8k", True): _CONVERT | {"instruction", "template"},
         ("math", True): _CONVERT | {"instruction", "template"},
         ("countdown", True): _CONVERT, ("countdown", False): {"size", "seed"},
         ("piecewise", False): {"size", "seed"}}


def check_options(task: str, given: dict[str, object]) -> None:
    """ConfigError for an option given (not None) that `task` does not use, naming it and what
    the preparation does use; an option is never silently ignored."""
    tasks = sorted({t for t, _ in _USES})
    if task not in tasks:
        raise DataError(f"data prepare: unknown task {task!r}; allowed: {', '.join(tasks)}")
    converts = given.get("input") is not None
    if (task, converts) not in _USES:
        if converts:
            raise ConfigError(f"data prepare {task}: --input not used ({task} problems are generated)")
        raise DataError(f"data prepare {task}: --input is required (the dataset's file or folder)")
    uses = _USES[(task, converts)]
    unused = [k for k, v in given.items() if v is not None and k not in uses]
    if unused:
        what = "converting --input" if converts else "generating"
        flags = ", ".join(f"--{k}" for k in unused)
        allowed = ", ".join(f"--{k}" for k in sorted(uses)) or "none"
        raise ConfigError(f"data prepare {task}: {flags} not used when {what} (it uses {allowed})")
    negative = [f"--{k} {given[k]}" for k in ("limit", "skip", "size") if (given.get(k) or 0) < 0]
    if negative:
        raise ConfigError(f"data prepare {task}: {', '.join(negative)}: must be >= 0")
    if given.get("template") not in (None, *TEMPLATES):
        raise ConfigError(f"data prepare {task}: --template {given['template']!r}; allowed: r1_zero")
    if given.get("template") and given.get("instruction") is not None:
        raise ConfigError(f"data prepare {task}: --instruction not used with --template {given['template']} "
                          "(the template says how to answer)")


def prepare(task: str, output: str | Path, input_path: str | Path | None = None, *, limit: int | None = None,
            size: int | None = None, seed: int | None = None, instruction: str | None = None,
            skip: int | None = None, template: str | None = None) -> int:
    """Run one preparation and write `output`; returns the number of records. Options left
    None take their defaults (limit 0 = all, skip 0, size 1000, seed 0, the task's instruction,
    no template); one given that the preparation does not use is a ConfigError
    (`check_options`)."""
    check_options(task, {"input": input_path, "limit": limit, "size": size, "seed": seed,
                         "instruction": instruction, "skip": skip, "template": template})
    limit, skip, size, seed = limit or 0, skip or 0, 1000 if size is None else size, seed or 0
    if input_path is not None:  # check_options: only the tasks with a data format take a file
        records = convert(task, input_path, instruction, limit, skip, template or "")
    elif task == "countdown":
        records = prepare_countdown(size, seed)
    else:
        records = prepare_piecewise(size, seed)
    if not records:
        raise DataError(_nothing_to_write(task, input_path, skip, size))
    write_records(records, output)
    return len(records)


def _nothing_to_write(task: str, input_path: str | Path | None, skip: int, size: int) -> str:
    """Why a preparation has no record to write: an empty input, a --skip past its end, --size 0."""
    if input_path is None:
        return f"data prepare {task}: --size {size}: no records to write"
    total = sum(1 for _ in iter_records(input_path))
    if total == 0:
        return f"{input_path}: no records to write: the input holds none"
    return (f"{input_path}: no records to write: the input has {total} records and --skip {skip} "
            f"passed them all (records are counted from 0)")
