"""Format rewards: did the completion follow the answer format the prompt asked for?

These are shaping terms, usually given a small weight next to correctness: they teach the
format early in training, when almost no answer is correct yet.
"""

from __future__ import annotations

import re

from reasonrl.rewards.extract import extract_answer, extract_boxed
from reasonrl.rewards.numeric import parse_number

_TAG_RE = re.compile(r"</?(?:think|answer)>", re.IGNORECASE)
_TEMPLATE = ["<think>", "</think>", "<answer>", "</answer>"]


def think_answer_format_reward(completion: str) -> float:
    """DeepSeek-R1's `<think>...</think><answer>...</answer>` format (DeepSeek-AI 2025).

    0.0 unless the text holds exactly one of each tag, in that order, with only whitespace
    between `</think>` and `<answer>`; text before `<think>` and after `</answer>` is allowed.
    0.5 for the right tags; 1.0 when the answer also contains a complete `\\boxed{...}`
    (the MATH convention), which makes the final answer unambiguous to extract. Tags match
    case-insensitively, as in `extract_answer_tag`, so a stray `<ANSWER>` cannot slip past.
    """
    tags = list(_TAG_RE.finditer(completion))
    if [t.group().lower() for t in tags] != _TEMPLATE:
        return 0.0
    if completion[tags[1].end():tags[2].start()].strip():
        return 0.0
    answer = completion[tags[2].end():tags[3].start()]
    return 1.0 if extract_boxed(answer) is not None else 0.5


def boxed_format_reward(completion: str) -> float:
    """1.0 if the completion has a complete `\\boxed{...}` (MATH / Minerva convention)."""
    return 1.0 if extract_boxed(completion) is not None else 0.0


def answer_present_reward(completion: str) -> float:
    """1.0 if some answer can be extracted (last-number fallback on) and parses as a number.

    A small "you gave a number" credit, independent of whether the number is right.
    """
    answer, _ = extract_answer(completion, fallback_last_number=True)
    return 1.0 if answer is not None and parse_number(answer) is not None else 0.0
