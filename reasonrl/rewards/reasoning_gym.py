"""reasoning-gym's own scores (Open-Thought, `reasoning_gym`, Apache-2.0; Stojanovski et al. 2025,
"REASONING GYM: Reasoning Environments for Reinforcement Learning with Verifiable Rewards",
arXiv:2505.24760): a task's `score_answer(answer, entry)` on the answer the completion gives in
the format its prompt asked for.

A ground truth is a reference to the problem, not a copy of it, as JSON:

    {"task": "leg_counting", "seed": 0, "size": 1000, "index": 17, "options": {},
     "format": "tag", "answer": "42"}

The verifier builds the task's dataset as the data source did (`create_dataset(task, seed=,
size=, **options)`, cached per worker) and takes entry `index`, so `score_answer` sees the
entry exactly as generated, metadata and all (a JSON round trip would turn its tuples into
lists, which some scores compare). `answer` is there for people reading samples; the score
never reads it.

The answer is extracted first, by `format`: `tag`, the last `<answer>...</answer>`
(`extract.extract_answer_tag`; reasoning-gym's `utils.extract_answer` takes the last match of
`<answer>\\s?(.*?)\\s?</answer>`, the same text for one pair) or `boxed`, the last `\\boxed{}`.
reasoning-gym's training examples do the same (`examples/trl/grpo.py`: `extract_answer(c)`,
then `score_answer`). A completion without one scores 0 and `score_answer` is not called:
handed the raw completion, the default `ProceduralDataset.score_answer` gives
len(answer) / len(completion) to any completion that merely contains the answer
("There are 42 legs." scores 2/18 on an answer of 42). Within the tag the task's own rule
holds, partial credit included: `<answer>42 legs</answer>` scores 2/7, unless the ground truth
says `"partial_credit": false` (data.reasoning_gym.partial_credit): then only full marks count.
That default rule is gamed inside the tag too: GRPO on simple_equations (answers 1-10) learnt to
write `\\boxed{15.56}`, which contains the answer 6 and earns 1/5.

The verifier runs isolated (a worker process, `reward.timeout` per sample): some tasks' scores
parse the answer with sympy, whose `parse_expr` evaluates Python, and model output is never
evaluated in the training process.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from reasonrl.errors import GroundTruthError, MissingExtraError
from reasonrl.registry import VERIFIERS
from reasonrl.rewards.extract import extract_answer_tag, extract_boxed
from reasonrl.rewards.numeric import canonical_answer

INSTALL = "pip install 'reasonrl[reasoning-gym]'"
SOURCE = "reasoning_gym/"  # an example's data_source: reasoning_gym/<task> (as reasoning-gym's verl example)
EXTRACTORS = {"tag": extract_answer_tag, "boxed": extract_boxed}


def library() -> Any:
    """The `reasoning_gym` module, or MissingExtraError naming the extra to install."""
    try:
        import reasoning_gym
    except ImportError:
        raise MissingExtraError(f"reasoning-gym tasks need the reasoning-gym package: {INSTALL}") from None
    return reasoning_gym


@dataclass(frozen=True)
class Reference:
    """One problem of a reasoning-gym task: what `create_dataset` is given, and the index."""

    task: str
    seed: int
    size: int
    index: int
    options: str  # the task's options as sorted JSON (hashable: the cache key)
    format: str  # "tag" or "boxed": where the prompt asked for the answer
    answer: str | None = None  # the task's answer, for reading (None where the task checks instead)
    partial_credit: bool = True  # false: a task score below full marks counts 0

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "seed": self.seed, "size": self.size, "index": self.index,
                           "options": json.loads(self.options), "format": self.format,
                           "answer": self.answer, "partial_credit": self.partial_credit}, sort_keys=True)


def options_key(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True)


def parse_reference(ground_truth: str) -> Reference:
    """The `Reference` a ground truth holds; GroundTruthError naming what is wrong."""
    try:
        record = json.loads(ground_truth)
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise GroundTruthError(f"a reasoning-gym ground truth is a JSON object {{task, seed, size, index, "
                               f"options, format}} naming the problem, got {ground_truth[:80]!r}")
    missing = [k for k in ("task", "seed", "size", "index", "format") if k not in record]
    if missing:
        has = ", ".join(sorted(record)) or "nothing"
        raise GroundTruthError(f"missing {', '.join(missing)} (it has {has})")
    task, seed, size, index, fmt = (record[k] for k in ("task", "seed", "size", "index", "format"))
    options = record.get("options") or {}
    if not isinstance(task, str) or not task:
        raise GroundTruthError(f"task must be a task name, got {task!r}")
    for key, value in (("seed", seed), ("size", size), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GroundTruthError(f"{key} must be an integer >= 0, got {value!r}")
    if not index < size:
        raise GroundTruthError(f"index {index} is outside the task's {size} problems")
    if fmt not in EXTRACTORS:
        raise GroundTruthError(f"format must be one of {', '.join(EXTRACTORS)}, got {fmt!r}")
    if not isinstance(options, dict):
        raise GroundTruthError(f"options must be an object, got {options!r}")
    answer = None if record.get("answer") is None else str(record["answer"])
    partial = record.get("partial_credit", True)
    if not isinstance(partial, bool):
        raise GroundTruthError(f"partial_credit must be true or false, got {partial!r}")
    return Reference(task, seed, size, index, options_key(options), fmt, answer, partial)


@functools.lru_cache(maxsize=64)
def dataset(task: str, seed: int, size: int, options: str) -> Any:
    """reasoning-gym's dataset of `task` (cached: several tasks build tables or read data files
    once). ValueError / TypeError / AssertionError as reasoning-gym raises them."""
    return library().create_dataset(task, seed=seed, size=size, **json.loads(options))


@functools.lru_cache(maxsize=4096)
def entry(ref: Reference) -> dict:
    """The problem `ref` names, as the task generates it (cached: some tasks take 0.1-0.3 s)."""
    return dataset(ref.task, ref.seed, ref.size, ref.options)[ref.index]


def check_reference(completion: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """The start-up check of a ground truth, with the verifier's signature (it runs in the
    reward workers too): it parses, and its task exists with these options. 1.0, or
    GroundTruthError."""
    ref = parse_reference(ground_truth)
    try:
        dataset(ref.task, ref.seed, ref.size, ref.options)
    except (ValueError, TypeError, AssertionError) as err:
        raise GroundTruthError(f"reasoning-gym cannot build {ref.task} with options {ref.options}: "
                               f"{type(err).__name__}: {err}") from None
    return 1.0


def given_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The answer a completion commits to for the evaluation's majority vote and format-error
    rate (which see no ground truth, hence no format): the last `<answer>` text, else the last
    `\\boxed{}`, whitespace removed; never a bare number."""
    answer = extract_answer_tag(completion)
    return canonical_answer(answer if answer is not None else extract_boxed(completion), numeric=False)


@VERIFIERS.register(
    "reasoning_gym", doc="reasoning-gym: the task's own score_answer of the answer in <answer> / \\boxed{}",
    isolated=True, check=check_reference, answer=given_answer)
def reasoning_gym_reward(completion: str, ground_truth: str,
                         extra_info: dict | None = None) -> dict[str, float]:
    """{"score": the task's `score_answer` of the extracted answer (0 without one; with
    partial_credit false, 0 below full marks), "answer_found": 1 when the completion gives an answer
    in the format its prompt asked for, "task_score": the task's own score}."""
    ref = parse_reference(ground_truth)
    answer = EXTRACTORS[ref.format](completion)
    if answer is None:
        return {"score": 0.0, "answer_found": 0.0, "task_score": 0.0}
    task_score = float(dataset(ref.task, ref.seed, ref.size, ref.options).score_answer(answer, entry(ref)))
    score = task_score if ref.partial_credit or task_score >= 1.0 else 0.0
    return {"score": score, "answer_found": 1.0, "task_score": task_score}


def _warmup() -> None:
    """Import reasoning-gym (1.5 s, its 105 tasks) when a worker loads the verifier, so the first
    sample is not charged for it against reward.timeout."""
    library()


reasoning_gym_reward.warmup = _warmup
check_reference.warmup = _warmup
