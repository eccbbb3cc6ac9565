"""Task data: `Example` records from files (JSONL, Parquet, `datasets` folders) or built-in
seeded generators (arithmetic, Countdown, the piecewise toy problem).

`load_examples(cfg.data, seed)` returns (train, held_out) lists; `render_prompt` turns an
example into the text the model sees (chat template applied or not). `prepare.py` converts
public datasets (GSM8K, MATH) to files this loader reads.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from reasonrl.batch import Example
from reasonrl.config import ArithmeticConfig, DataConfig
from reasonrl.data.readers import DataError, iter_records


def _get(record: dict, dotted: str) -> tuple[bool, object]:
    """(found, value) of a dotted field path like `reward_model.ground_truth`. A null is not
    found: Parquet fills a column that some records lack with nulls."""
    node: object = record
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return False, None
        node = node[part]
    return True, node


def load_file(path: str | Path, data_source: str | None = None,
              fields: dict[str, str] | None = None) -> list[Example]:
    """Read one `Example` per record of a JSONL / JSON / Parquet file or `datasets` folder.

    A record has `prompt` (a string, or a list of {"role", "content"} messages as in verl's
    Parquet files) or `messages` (a list of messages), `ground_truth` (string, number, or an
    object, kept as JSON text; verl's `reward_model.ground_truth` is found too), and optional
    `data_source` (default: `data_source` or the file's stem) and `extra_info` (or `meta`).
    `fields` renames them: {"prompt": "question", "ground_truth": "reward_model.ground_truth"}.
    Anything malformed raises `DataError` naming file:line and the field, before training.
    """
    path = Path(path)
    source = data_source or path.stem
    examples = [_record_to_example(record, where, source, fields or {})
                for where, record in iter_records(path)]
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def load_jsonl(path: str | Path, data_source: str | None = None) -> list[Example]:
    """`load_file` for a JSONL file (kept for its callers; any supported format works)."""
    return load_file(path, data_source)


def load_files(paths: str, fields: dict[str, str] | None = None) -> list[Example]:
    """`load_file` over a comma-separated list of paths, concatenated in order."""
    examples = []
    for path in (p.strip() for p in paths.split(",")):
        if path:
            examples += load_file(path, fields=fields)
    return examples


def _record_to_example(record: object, where: str, source: str, fields: dict[str, str]) -> Example:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")

    def field(name: str) -> tuple[bool, object, str]:
        key = fields.get(name, name)
        found, value = _get(record, key)
        return found, value, key

    has_prompt, prompt, prompt_key = field("prompt")
    has_messages, messages, messages_key = field("messages")
    if has_prompt and isinstance(prompt, list) or not has_prompt and has_messages:
        key = prompt_key if has_prompt else messages_key
        prompt = prompt if has_prompt else messages
        ok = isinstance(prompt, list) and prompt and all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in prompt)
        if not ok:
            raise DataError(f"{where}: field '{key}' must be a non-empty list of "
                            '{"role": str, "content": str} objects')
        prompt = [{"role": m["role"], "content": m["content"]} for m in prompt]
    elif has_prompt:
        if not isinstance(prompt, str) or not prompt.strip():
            raise DataError(f"{where}: field '{prompt_key}' must be a non-empty string "
                            "(or a list of messages)")
    else:
        raise DataError(f"{where}: missing field '{prompt_key}' (or '{messages_key}')")
    found, truth, truth_key = field("ground_truth")
    if not found and "ground_truth" not in fields:
        found, truth = _get(record, "reward_model.ground_truth")  # verl's layout
    if not found:
        raise DataError(f"{where}: missing field '{truth_key}'")
    if isinstance(truth, dict):
        truth = json.dumps(truth, sort_keys=True)
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)) or str(truth) == "":
        raise DataError(f"{where}: field '{truth_key}' must be a non-empty string, number or object")
    meta_key = fields.get("extra_info", "meta" if "meta" in record else "extra_info")
    meta = _get(record, meta_key)[1]
    meta = {} if meta is None else meta
    if not isinstance(meta, dict):
        raise DataError(f"{where}: field '{meta_key}' must be an object")
    found, data_source, source_key = field("data_source")
    data_source = data_source if found else source
    if not isinstance(data_source, str):
        raise DataError(f"{where}: field '{source_key}' must be a string")
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
    elif cfg.task in ("file", "jsonl"):
        train = load_files(cfg.train_path, cfg.fields)
        held_out = load_files(cfg.val_path, cfg.fields) if cfg.val_path else []
    elif cfg.task == "countdown":
        from reasonrl.data.countdown import countdown_examples

        train, held_out = countdown_examples(cfg.countdown, seed)
    elif cfg.task == "piecewise":
        from reasonrl.data.piecewise import piecewise_examples

        train, held_out = piecewise_examples(cfg.piecewise, seed)
    else:
        raise DataError(f"data.task: unknown task {cfg.task!r}")
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
