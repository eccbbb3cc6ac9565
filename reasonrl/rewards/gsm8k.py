"""GSM8K (Cobbe et al. 2021): the final answer is a number. Two verifiers:

- `gsm8k` (reasonrl's own rule; data_source "gsm8k", what `data.format=gsm8k` and `reasonrl data
  prepare gsm8k` write): the answer is taken from a `\\boxed{}` or `<answer>` tag, else from
  GSM8K's own `#### 72` marker, else (if allowed) the last number in the text, and compared
  with the ground truth as an exact number: "$1,000", "1000.0", "18 dollars" and "18." all
  equal 18-style ground truths (`numeric.parse_exact`), and 1548557 is not 1548556.
- `verl_gsm8k` (data_source "openai/gsm8k", what verl's `examples/data_preprocess/gsm8k.py`
  writes): verl's `compute_score`, as it is.
"""

from __future__ import annotations

import re

from reasonrl.errors import GroundTruthError
from reasonrl.registry import VERIFIERS
from reasonrl.rewards.extract import extract_answer, extract_last_number
from reasonrl.rewards.numeric import (
    canonical_answer,
    numbers_equal,
    parse_exact,
    parse_exact_ground_truth,
    parse_ground_truth_number,
)

_HASHES_RE = re.compile(r"####[ \t]*([^\n]*)")


def extract_gsm8k_answer(text: str, fallback_last_number: bool = True) -> str | None:
    """boxed / <answer> > the text after the last `####` > the last number (if allowed)."""
    answer, _ = extract_answer(text, fallback_last_number=False)
    if answer is not None:
        return answer
    marked = _HASHES_RE.findall(text)
    if marked:
        after = marked[-1].strip()
        return after if parse_exact(after) is not None else extract_last_number(after)
    return extract_last_number(text) if fallback_last_number else None


def gsm8k_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """`extract_gsm8k_answer`, normalised; it must be a number."""
    return canonical_answer(extract_gsm8k_answer(completion, fallback_last_number), numeric=True)


@VERIFIERS.register(
    "gsm8k", doc="GSM8K: numeric answer after ####, in \\boxed{}, <answer>, or the last number",
    isolated=False, options={"fallback_last_number": "fallback_last_number"}, check=parse_ground_truth_number,
    answer=gsm8k_answer)
def gsm8k_reward(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                 fallback_last_number: bool = True) -> float:
    """1.0 if the completion's final number equals the ground truth exactly, else 0.0."""
    truth = parse_exact_ground_truth(ground_truth)
    answer = extract_gsm8k_answer(completion, fallback_last_number)
    value = parse_exact(answer) if answer is not None else None
    return 1.0 if value is not None and numbers_equal(value, truth) else 0.0


# ----------------------------------------------------------------------------- verl's rule
# volcengine/verl, verl/utils/reward_score/gsm8k.py (`extract_solution`, `compute_score`, as of
# the commit that clips the text to 300 characters, #2568), reached through
# verl/utils/reward_score/__init__.py `default_compute_score`, which sends exactly the
# data_source "openai/gsm8k" there with compute_score's defaults (method "strict", format_score
# 0.0, score 1.0). verl's reward manager passes the response alone, special tokens skipped.

VERL_CLIP_CHARS = 300  # verl's _SOLUTION_CLIP_CHARS: only the text's last 300 characters are read
VERL_METHODS = ("strict", "flexible")
_VERL_STRICT_RE = re.compile(r"#### (-?[0-9.,]+)")  # "#### " with one space, then digits . , and a sign
_VERL_NUMBER_RE = re.compile(r"-?[0-9.,]+")
_VERL_TRUTH_RE = re.compile(r"-?[0-9.,]+")  # what either method can ever return


def extract_verl_gsm8k(text: str, method: str = "strict") -> str | None:
    """verl's `extract_solution`: the answer string, or None, from the last 300 characters.

    strict: the last `#### N` (exactly one space after `####`; N a run of digits, `.` and `,`
    with an optional leading `-`), its commas removed. flexible: the last such run anywhere in
    those 300 characters that is not a lone "." (when every run is one, "."), commas kept.
    """
    if method not in VERL_METHODS:
        raise ValueError(f"verl GSM8K method must be one of {', '.join(VERL_METHODS)}, got {method!r}")
    tail = text[-VERL_CLIP_CHARS:]
    if method == "strict":
        found = _VERL_STRICT_RE.findall(tail)
        return found[-1].replace(",", "") if found else None
    runs = _VERL_NUMBER_RE.findall(tail)
    if not runs:
        return None
    return next((run for run in reversed(runs) if run != "."), ".")


def check_verl_gsm8k_truth(ground_truth: str) -> str:
    """The ground truth as verl compares it (a string), or GroundTruthError when no extracted
    answer could ever equal it (verl would score every completion 0 without a word)."""
    if not isinstance(ground_truth, str) or not _VERL_TRUTH_RE.fullmatch(ground_truth):
        raise GroundTruthError(f"verl's GSM8K score compares strings, and {ground_truth!r} is not one it can "
                               "ever extract (digits, '.', ',' and a leading '-', as verl's "
                               "data_preprocess/gsm8k.py writes it: '72')")
    return ground_truth


def verl_gsm8k_answer(completion: str, fallback_last_number: bool = True) -> str | None:
    """The answer verl's default (strict) extraction reads; equal answers score alike under
    it. (`fallback_last_number` is not verl's: it is ignored.)"""
    return extract_verl_gsm8k(completion, "strict")


@VERIFIERS.register(
    "verl_gsm8k", doc="verl's GSM8K score: the last '#### N' of the last 300 characters, equal as a string",
    isolated=False, options={"method": "verl_gsm8k_method"}, check=check_verl_gsm8k_truth,
    answer=verl_gsm8k_answer)
def verl_gsm8k_reward(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                      method: str = "strict") -> float:
    """verl's `compute_score` with its defaults: 1.0 when the extracted answer
    (`extract_verl_gsm8k`, `reward.verl_gsm8k_method`) is the ground truth's very string
    ("72"; "72.0", "072" and "1,548,557" for "1548557" in flexible mode are not), else 0.0
    (verl's format_score 0.0 for a wrong answer, 0 for none)."""
    truth = check_verl_gsm8k_truth(ground_truth)
    return 1.0 if extract_verl_gsm8k(completion, method) == truth else 0.0
