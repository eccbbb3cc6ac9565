"""`reasonrl data prepare TASK`: convert public datasets (or generate tasks) to training files.

Every output record is {"prompt", "ground_truth", "data_source", "extra_info"}; `extra_info`
keeps the reference solution ("solution") and the source's own fields. Records are written
as JSONL, or Parquet when the output ends in .parquet; `data.task=file` reads both.

- gsm8k: the official files (`question`, `answer` ending in `#### 72`): the number after
  `####` (commas dropped) becomes the ground truth.
- math: MATH-style records (`problem`, `solution`, optional `answer`, `level`, `type`): the
  ground truth is `answer`, else the last `\\boxed{}` of the solution. Reads JSONL, JSON,
  Parquet, or the official folder of one-problem JSON files.
- countdown, piecewise: generated from a seed (no input).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from reasonrl.config import CountdownConfig
from reasonrl.data.readers import iter_records, write_records
from reasonrl.errors import DataError
from reasonrl.rewards.extract import extract_boxed
from reasonrl.rewards.numeric import parse_number

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
_HASHES_RE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def _text(record: dict, key: str, where: str) -> str:
    value = record.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field '{key}' must be a non-empty string")
    return value


def _prompt(question: str, instruction: str) -> str:
    return f"{question.strip()}\n{instruction}" if instruction else question.strip()


def prepare_gsm8k(path: str | Path, instruction: str = GSM8K_INSTRUCTION, limit: int = 0) -> list[dict]:
    """GSM8K's official `{"question", "answer"}` records -> training records."""
    records = []
    for index, (where, raw) in enumerate(iter_records(path)):
        if limit and index >= limit:
            break
        if not isinstance(raw, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        question, answer = _text(raw, "question", where), _text(raw, "answer", where)
        m = _HASHES_RE.search(answer)
        truth = m.group(1).replace(",", "").strip() if m else ""
        if parse_number(truth) is None:
            raise DataError(f"{where}: field 'answer' must end in '#### <number>', got ...{answer[-40:]!r}")
        records.append({"prompt": _prompt(question, instruction), "ground_truth": truth,
                        "data_source": "gsm8k",
                        "extra_info": {"index": index, "question": question, "solution": answer}})
    return records


def prepare_math(path: str | Path, instruction: str = MATH_INSTRUCTION, limit: int = 0) -> list[dict]:
    """MATH-style `{"problem", "solution", "answer"?}` records -> training records."""
    records = []
    for index, (where, raw) in enumerate(iter_records(path)):
        if limit and index >= limit:
            break
        if not isinstance(raw, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
        problem, solution = _text(raw, "problem", where), _text(raw, "solution", where)
        answer = raw.get("answer")
        if answer is not None and not (isinstance(answer, (str, int, float)) and str(answer).strip()):
            raise DataError(f"{where}: field 'answer' must be a non-empty string or number")
        truth = str(answer).strip() if answer is not None else extract_boxed(solution)
        if not truth:
            raise DataError(f"{where}: field 'solution' has no \\boxed{{}} answer "
                            "and there is no 'answer' field")
        extra = {"index": index, "problem": problem, "solution": solution}
        extra.update({k: raw[k] for k in ("level", "type", "subject", "unique_id") if k in raw})
        records.append({"prompt": _prompt(problem, instruction), "ground_truth": truth,
                        "data_source": "math", "extra_info": extra})
    return records


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


def prepare(task: str, output: str | Path, input_path: str | Path | None = None, *, limit: int = 0,
            size: int = 1000, seed: int = 0, instruction: str | None = None) -> int:
    """Run one preparation and write `output`; returns the number of records."""
    if task in ("gsm8k", "math"):
        if input_path is None:
            raise DataError(f"data prepare {task}: --input is required (the dataset's file or folder)")
        fn = prepare_gsm8k if task == "gsm8k" else prepare_math
        default = GSM8K_INSTRUCTION if task == "gsm8k" else MATH_INSTRUCTION
        records = fn(input_path, default if instruction is None else instruction, limit)
    elif task == "countdown":
        records = prepare_countdown(size, seed)
    elif task == "piecewise":
        records = prepare_piecewise(size, seed)
    else:
        raise DataError(f"data prepare: unknown task {task!r}; allowed: gsm8k, math, countdown, piecewise")
    if not records:
        raise DataError(f"{input_path}: no records")
    write_records(records, output)
    return len(records)
