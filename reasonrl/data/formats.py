"""Known dataset layouts, mapped record by record to reasonrl's {"prompt", "ground_truth",
"data_source", "extra_info"} (`data.format`, the `DATA_FORMATS` registry): a Hub dataset or file
in one of these layouts trains without a `data prepare` pass, and `data prepare` writes the same
records to a file.

- gsm8k: `question`, `answer` ending in `#### 72` (openai/gsm8k): the number after `####`
  (commas dropped) is the ground truth;
- math: `problem`, `solution`, optional `answer` (MATH, lighteval/MATH, MATH-500): `answer`,
  else the last `\\boxed{}` of the solution;
- numina: NuminaMath (AI-MO/NuminaMath-CoT, -TIR): `problem`, `solution` with a `\\boxed{}`
  answer; data_source "math_numina" (the math verifier);
- countdown: TinyZero's Countdown-Tasks-3to4 (`target`, `nums`): TinyZero's question, ground
  truth `{"numbers", "target"}`.

Each converter names the record (`where`) and the field that is wrong, and lists the fields the
record has. Each entry registers the `fields` it reads, so a record in the wrong layout is told
which `data.format` fits it (`format_mismatch`).
"""

from __future__ import annotations

import json
import re

from reasonrl.errors import DataError
from reasonrl.registry import DATA_FORMATS
from reasonrl.rewards.extract import extract_boxed
from reasonrl.rewards.numeric import parse_number

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
_HASHES_RE = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def _record(raw: object, where: str) -> dict:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _text(record: dict, key: str, where: str) -> str:
    value = record.get(key)
    if key not in record:
        has = ", ".join(sorted(record)) or "no fields"
        raise DataError(f"{where}: missing field '{key}'; the record has {has}")
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field '{key}' must be a non-empty string")
    return value


# ReasonRL's R1-Zero prompt (SdeeRK/reasonRL, data/r1_zero_prompt.txt, as in its data files):
# already templated text that opens the <think> block, for data.apply_chat_template=false.
R1_ZERO_TEMPLATE = ("A conversation between User and Assistant. The User asks a question, and the Assistant "
                    "solves it. The Assistant first thinks about the reasoning process in the mind and then "
                    "provides the User with the answer. The reasoning process is enclosed within <think> "
                    "</think> and answer is enclosed within <answer> </answer> tags, respectively, i.e., "
                    "<think> reasoning process here </think> <answer> answer here </answer>.\nUser: "
                    "{question}\nAssistant: <think>")
TEMPLATES = ("", "r1_zero")  # --template: "" = the question and the instruction (chat template at run time)


def _prompt(question: str, instruction: str, template: str = "") -> str:
    if template == "r1_zero":
        return R1_ZERO_TEMPLATE.format(question=question.strip())
    return f"{question.strip()}\n{instruction}" if instruction else question.strip()


@DATA_FORMATS.register("gsm8k", instruction=GSM8K_INSTRUCTION, fields=("question", "answer"))
def gsm8k_record(raw: object, where: str, index: int, instruction: str = GSM8K_INSTRUCTION,
                 template: str = "") -> dict:
    """GSM8K's `{"question", "answer"}` -> a training record."""
    raw = _record(raw, where)
    question, answer = _text(raw, "question", where), _text(raw, "answer", where)
    m = _HASHES_RE.search(answer)
    truth = m.group(1).replace(",", "").strip() if m else ""
    if parse_number(truth) is None:
        raise DataError(f"{where}: field 'answer' must end in '#### <number>', got ...{answer[-40:]!r}")
    return {"prompt": _prompt(question, instruction, template), "ground_truth": truth, "data_source": "gsm8k",
            "extra_info": {"index": index, "question": question, "solution": answer}}


@DATA_FORMATS.register("math", instruction=MATH_INSTRUCTION, fields=("problem", "solution"))
def math_record(raw: object, where: str, index: int, instruction: str = MATH_INSTRUCTION, template: str = "",
                data_source: str = "math") -> dict:
    """MATH-style `{"problem", "solution", "answer"?}` -> a training record."""
    raw = _record(raw, where)
    problem, solution = _text(raw, "problem", where), _text(raw, "solution", where)
    answer = raw.get("answer")
    if answer is not None and not (isinstance(answer, (str, int, float)) and str(answer).strip()):
        raise DataError(f"{where}: field 'answer' must be a non-empty string or number")
    truth = str(answer).strip() if answer is not None else extract_boxed(solution)
    if not truth:
        raise DataError(f"{where}: field 'solution' has no \\boxed{{}} answer and there is no 'answer' field")
    extra = {"index": index, "problem": problem, "solution": solution}
    extra.update({k: raw[k] for k in ("level", "type", "subject", "unique_id", "source") if k in raw})
    return {"prompt": _prompt(problem, instruction, template), "ground_truth": truth,
            "data_source": data_source, "extra_info": extra}


@DATA_FORMATS.register("numina", instruction=MATH_INSTRUCTION, fields=("problem", "solution"))
def numina_record(raw: object, where: str, index: int, instruction: str = MATH_INSTRUCTION,
                  template: str = "") -> dict:
    """NuminaMath's `{"problem", "solution", "messages"?}` (answer boxed in the solution) -> a
    training record scored by the math verifier."""
    return math_record(raw, where, index, instruction, template, data_source="math_numina")


# TinyZero's question (Jiayi-Pan/TinyZero, examples/data_preprocess/countdown.py, `make_prefix`),
# without its base-model conversation frame: reasonrl applies the model's chat template.
TINYZERO_COUNTDOWN = ("Using the numbers {numbers}, create an equation that equals {target}. You can use "
                      "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show "
                      "your work in <think> </think> tags. And return the final answer in <answer> </answer> "
                      "tags, for example <answer> (1 + 2) / 3 </answer>.")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@DATA_FORMATS.register("countdown", instruction="", fields=("target", "nums"))
def countdown_record(raw: object, where: str, index: int, instruction: str = "", template: str = "") -> dict:
    """TinyZero's `{"target": 98, "nums": [44, 19, 35]}` -> a training record with TinyZero's
    question, ground truth `{"numbers": nums, "target": target}` and data_source "countdown" (as
    TinyZero's converter writes them for verl)."""
    raw = _record(raw, where)
    target, nums = raw.get("target"), raw.get("nums")
    if "target" not in raw or "nums" not in raw:
        missing = "target" if "target" not in raw else "nums"
        raise DataError(f"{where}: missing field '{missing}'; the record has {', '.join(sorted(raw))}")
    if not _int(target):
        raise DataError(f"{where}: field 'target' must be an integer, got {target!r}")
    if not isinstance(nums, list) or not nums or not all(_int(n) for n in nums):
        raise DataError(f"{where}: field 'nums' must be a non-empty list of integers, got {nums!r}")
    truth = json.dumps({"numbers": nums, "target": target}, sort_keys=True)
    return {"prompt": TINYZERO_COUNTDOWN.format(numbers=nums, target=target), "ground_truth": truth,
            "data_source": "countdown", "extra_info": {"index": index, "numbers": nums, "target": target}}


def fitting_formats(record: dict) -> list[str]:
    """The `data.format` values whose fields `record` has, in the registry's order; "" (no
    format) when it is already in reasonrl's own layout: `prompt` or `messages`, and
    `ground_truth` or verl's `reward_model.ground_truth` (what `reasonrl data prepare` writes)."""
    fits = [e.name for e in DATA_FORMATS if all(k in record for k in e.fields)]
    truth = "ground_truth" in record or isinstance(record.get("reward_model"), dict) and \
        "ground_truth" in record["reward_model"]
    if ("prompt" in record or "messages" in record) and truth:
        fits.insert(0, "")
    return fits


def format_hint(record: dict) -> str:
    """The fix for a record that the chosen layout cannot read: the `data.format=...` overrides
    that would fit it (from its keys), or, when none does, `data.fields`."""
    fits = fitting_formats(record)
    if not fits:
        known = "; ".join(f"{e.name}: {', '.join(e.fields)}" for e in DATA_FORMATS)
        return (f"no known layout fits it (reasonrl's: prompt, ground_truth; {known}): name its fields "
                "with data.fields, e.g. data.fields={prompt: question, ground_truth: answer}")
    named = [f"data.format={f}" if f else "data.format= (empty: reasonrl's own layout, as `reasonrl data "
             "prepare` writes it)" for f in fits]
    return f"it fits {' or '.join(named)}: add that override to the command"


def format_mismatch(record: object, where: str, fmt: str) -> str | None:
    """None when `record` has the fields `data.format=fmt` reads; else the one-line error: the
    record (file:line), the missing field, the fields it has, and the fix (`format_hint`)."""
    if not isinstance(record, dict):
        return None  # the converter says what is wrong with it
    fields = DATA_FORMATS[fmt].fields
    missing = [k for k in fields if k not in record]
    if not missing:
        return None
    has = ", ".join(sorted(record)) or "no fields"
    return (f"{where}: missing field '{missing[0]}' for data.format={fmt} (it reads {', '.join(fields)}); "
            f"the record has {has}; {format_hint(record)}")
