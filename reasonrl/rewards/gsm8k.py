"""GSM8K (Cobbe et al. 2021): the final answer is a number, compared as a number.

The answer is taken from a `\\boxed{}` or `<answer>` tag, else from GSM8K's own `#### 72`
marker, else (if allowed) the last number in the text. "$1,000", "1000.0", "18 dollars" and
"18." all equal 18-style ground truths; see `numeric.parse_number`.
"""

from __future__ import annotations

import re

from reasonrl.registry import VERIFIERS
from reasonrl.rewards.extract import extract_answer, extract_last_number
from reasonrl.rewards.numeric import canonical_answer, numbers_equal, parse_ground_truth_number, parse_number

_HASHES_RE = re.compile(r"####[ \t]*([^\n]*)")


def extract_gsm8k_answer(text: str, fallback_last_number: bool = True) -> str | None:
    """boxed / <answer> > the text after the last `####` > the last number (if allowed)."""
    answer, _ = extract_answer(text, fallback_last_number=False)
    if answer is not None:
        return answer
    marked = _HASHES_RE.findall(text)
    if marked:
        after = marked[-1].strip()
        return after if parse_number(after) is not None else extract_last_number(after)
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
    """1.0 if the completion's final number equals the ground truth, else 0.0."""
    truth = parse_ground_truth_number(ground_truth)
    answer = extract_gsm8k_answer(completion, fallback_last_number)
    value = parse_number(answer) if answer is not None else None
    return 1.0 if value is not None and numbers_equal(value, truth) else 0.0
