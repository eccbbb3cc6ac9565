"""Task data: `Example` records from JSONL files or built-in seeded generators.

`load_examples(cfg.data, seed)` returns (train, held_out) lists; `render_prompt` turns an
example into the text the model sees (chat template applied or not).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from reasonrl.batch import Example
from reasonrl.config import ArithmeticConfig, DataConfig


class DataError(ValueError):
    """Bad task data; the message names the file, line and field."""


def load_jsonl(path: str | Path, data_source: str | None = None) -> list[Example]:
    """Read one `Example` per line.

    Each line is a JSON object with `prompt` (a string) or `messages` (a list of
    {"role", "content"}), `ground_truth` (string or number), and optional `data_source`
    and `meta` (or `extra_info`). Blank lines are skipped; anything else malformed raises
    `DataError` naming file:line and the field, before any training starts.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: data file does not exist")
    source = data_source or path.stem
    examples = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            examples.append(_record_to_example(record, where, source))
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def _record_to_example(record: object, where: str, source: str) -> Example:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: field 'prompt' must be a non-empty string")
    elif "messages" in record:
        prompt = record["messages"]
        ok = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in prompt)
        if not ok:
            raise DataError(f"{where}: field 'messages' must be a non-empty list of "
                            '{"role": str, "content": str} objects')
    else:
        raise DataError(f"{where}: missing field 'prompt' (or 'messages')")
    if "ground_truth" not in record:
        raise DataError(f"{where}: missing field 'ground_truth'")
    truth = record["ground_truth"]
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or str(truth) == "":
        raise DataError(f"{where}: field 'ground_truth' must be a non-empty string or number")
    meta = record.get("meta", record.get("extra_info", {}))
    if not isinstance(meta, dict):
        raise DataError(f"{where}: field 'meta' must be an object")
    data_source = record.get("data_source", source)
    if not isinstance(data_source, str):
        raise DataError(f"{where}: field 'data_source' must be a string")
    return Example(prompt=prompt, ground_truth=str(truth), data_source=data_source,
                   meta={**meta, "origin": where})


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
        print(f"[reasonrl] data.arithmetic: only {space} distinct problems; holding out "
              f"{val_size} instead of val_size={cfg.val_size}", flush=True)
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


def load_examples(cfg: DataConfig, seed: int) -> tuple[list[Example], list[Example]]:
    """(train, held_out) for the configured task; held_out may be empty."""
    if cfg.task == "arithmetic":
        train, held_out = arithmetic_examples(cfg.arithmetic, seed)
    elif cfg.task == "jsonl":
        train = load_jsonl(cfg.train_path)
        held_out = load_jsonl(cfg.val_path) if cfg.val_path else []
    else:
        raise DataError(f"data.task: unknown task {cfg.task!r}")
    if not train:
        raise DataError("the training set is empty")
    if cfg.val_size:
        held_out = held_out[: cfg.val_size]
    return train, held_out


def render_prompt(example: Example, tokenizer, apply_chat_template: bool,
                  system_prompt: str = "") -> str:
    """The exact text fed to the model for `example`.

    A plain `prompt` string gets the tokenizer's chat template (with `system_prompt` as
    the system turn when non-empty) unless `apply_chat_template` is false, in which case
    it is used verbatim (already templated, as ReasonRL's data is). `messages` are
    always templated; a system message in them wins over `system_prompt`.
    """
    if isinstance(example.prompt, str):
        if not apply_chat_template:
            return example.prompt
        messages = [{"role": "user", "content": example.prompt}]
    else:
        messages = list(example.prompt)
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}, *messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class PromptSampler:
    """Deterministic, resumable stream of training examples: shuffled epochs from a seed.

    `state_dict()` is (epoch, position), enough to continue exactly where a run stopped.
    """

    def __init__(self, examples: list[Example], seed: int, shuffle: bool = True):
        self.examples, self.seed, self.shuffle = examples, seed, shuffle
        self.epoch, self.position = 0, 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(len(self.examples)))
        if self.shuffle:
            random.Random(f"sampler:{self.seed}:{self.epoch}").shuffle(order)
        return order

    def next(self, count: int) -> list[Example]:
        batch = []
        while len(batch) < count:
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._make_order()
            batch.append(self.examples[self._order[self.position]])
            self.position += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = state["epoch"], state["position"]
        self._order = self._make_order()
