"""Format rewards: did the completion follow the answer format the prompt asked for?

These are shaping terms, usually given a small weight next to correctness: they teach the
format early in training, when almost no answer is correct yet.
"""

from __future__ import annotations

import re

from reasonrl.rewards.extract import extract_answer, extract_answer_tag, extract_boxed, first_between
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


_OPEN_THINK_RE = re.compile(r"<think>", re.IGNORECASE)
_CLOSE_THINK_RE = re.compile(r"</think>", re.IGNORECASE)
_OPEN_ANSWER_RE = re.compile(r"<answer>", re.IGNORECASE)
_CLOSE_ANSWER_RE = re.compile(r"</answer>", re.IGNORECASE)


def paired_tags_format_reward(completion: str) -> float:
    """trl_GRPO's format reward (the rule its users know, as stated in issue 17): `<think>`
    and `<answer>` must each appear in pairs, as many opening as closing tags and at least
    one pair of each, else 0.0; then 1.0 when the last `<answer>...</answer>` holds a
    complete `\\boxed{...}`, else 0.5. Unlike `think_answer_format_reward`, the order of the
    pairs and the text between them are free: `<think>x</think> so <answer>\\boxed{4}</answer>`
    scores 1.0 here and 0.0 there. Tags match case-insensitively, as in `extract_answer_tag`.
    """
    counts = [len(r.findall(completion)) for r in (_OPEN_THINK_RE, _CLOSE_THINK_RE, _OPEN_ANSWER_RE,
                                                    _CLOSE_ANSWER_RE)]
    if counts[0] != counts[1] or counts[2] != counts[3] or min(counts) == 0:
        return 0.0
    answer = extract_answer_tag(completion)
    return 1.0 if answer is not None and extract_boxed(answer) is not None else 0.5


def trl_grpo_format_reward(completion: str) -> float:
    """trl_GRPO's format reward as its code computes it (xywen97/TRL-GRPO, reward.py,
    `format_reward`): 0.0 unless the regexes `<think>.*?</think>` and `<answer>(.*?)</answer>`
    each match somewhere (case-sensitive, across lines; order, counts and text around are free);
    then 1.0 when the first `<answer>` match holds a match of `\\boxed{.*?}` (a `\\boxed{`
    with a `}` after it: `\\boxed{}` counts, `\\fbox{4}` and `\\boxed 4` do not), else 0.5.
    The same matches found in linear time (`first_between`). reasonrl's own rule for these tags
    is `paired_tags_format_reward` (component `format_paired`)."""
    answer = first_between(completion, "<answer>", "</answer>")
    if answer is None or first_between(completion, "<think>", "</think>") is None:
        return 0.0
    return 1.0 if first_between(answer, "\\boxed{", "}") is not None else 0.5


def r1_zero_format_reward(completion: str) -> float:
    """ReasonRL's format check (SdeeRK/reasonRL, `reason_rl/reward/math_reward.py`,
    `MathReward._check_format`): 1.0 when `</think>`, `<answer>` and `</answer>` each appear
    exactly once, in that order, else 0.0. The opening `<think>` is optional because R1-Zero
    prompts end in `Assistant: <think>`; text anywhere around the tags is allowed. Counted with
    `str.count`, case-sensitive, as there."""
    if any(completion.count(tag) != 1 for tag in ("</think>", "<answer>", "</answer>")):
        return 0.0
    ends, opens, closes = (completion.find(t) for t in ("</think>", "<answer>", "</answer>"))
    return 1.0 if ends < opens < closes else 0.0


def boxed_format_reward(completion: str) -> float:
    """1.0 if the completion has a complete `\\boxed{...}` (MATH / Minerva convention)."""
    return 1.0 if extract_boxed(completion) is not None else 0.0


def answer_present_reward(completion: str) -> float:
    """1.0 if some answer can be extracted (last-number fallback on) and parses as a number.

    A small "you gave a number" credit, independent of whether the number is right.
    """
    answer, _ = extract_answer(completion, fallback_last_number=True)
    return 1.0 if answer is not None and parse_number(answer) is not None else 0.0
