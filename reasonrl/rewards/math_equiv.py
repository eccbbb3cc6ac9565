"""MATH-style answers (Hendrycks et al. 2021): equivalence checked by `math-verify`.

`reward.math_rule` (`MATH_SCORING`) says how. reasonrl's own rule, `extracted` (the default):
the answer is extracted as for `correct` (last `\\boxed{}`, then `<answer>`, then the last
number if allowed), then both it and the ground truth are parsed by math-verify (LaTeX and
plain expressions: fractions, roots, intervals, sets, percentages, units stripped) and
compared symbolically and numerically. The other rules are other systems' math-verify rewards
as their code computes them (`math_rules.py`: `reason_rl`, `easyrl`, `trl`). math-verify can
hang on adversarial input, so the trainer runs this function in a worker process with a hard
timeout (`pool.py`); it never runs sympy in the training process.
"""

from __future__ import annotations

import logging

from reasonrl.errors import GroundTruthError
from reasonrl.registry import MATH_SCORING, VERIFIERS
from reasonrl.rewards.extract import extract_answer
from reasonrl.rewards.numeric import any_answer

_parse_configs = None


def _parse(text: str) -> list:
    """math-verify's parse of `text` as a boxed answer (LaTeX first, then a plain expression)."""
    global _parse_configs
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    if _parse_configs is None:
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warnings
        _parse_configs = [LatexExtractionConfig(), ExprExtractionConfig()]
    # Timeouts are off here (they use SIGALRM, main thread only); the caller enforces them.
    return parse("\\boxed{" + text + "}", extraction_config=_parse_configs, parsing_timeout=None)


def parse_truth(ground_truth: str) -> list:
    """math-verify's parse of a ground truth; GroundTruthError when it reads nothing but the
    text itself. math-verify returns [expression, text] for what it understands ("4" ->
    [4, "4"]) and only the text for what it does not ("@@@" -> ["@@@"]; "" -> []): a ground
    truth like that can never be matched, so every sample would silently score 0."""
    gold = _parse(ground_truth)
    if not any(not isinstance(x, str) for x in gold):
        raise GroundTruthError(f"math-verify cannot read ground truth {ground_truth!r} as a math "
                               "expression (it parses to nothing but its own text)")
    return gold


def math_equal(answer: str, ground_truth: str) -> bool:
    """True if math-verify finds `answer` equivalent to `ground_truth`. No timeout of its own."""
    from math_verify import verify

    gold = parse_truth(ground_truth)
    pred = _parse(answer)
    return bool(pred) and bool(verify(gold, pred, timeout_seconds=None))


def check_math_truth(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                     fallback_last_number: bool = True, rule: str = "extracted") -> float:
    """The math verifier's ground-truth check, with the verifier signature so that it runs in
    the worker pool like the verifier (sympy never runs in the training process): 1.0 when
    math-verify reads `ground_truth` as an expression (`parse_truth`), else GroundTruthError.
    Under a rule that also compares ground truths as text (`text_truth` on its `MATH_SCORING`
    entry: EasyRL's exact-text try), any non-empty ground truth can be matched and passes.
    `completion` is not used."""
    if not ground_truth.strip():
        raise GroundTruthError("ground truth is empty")
    if not MATH_SCORING[rule].text_truth:
        parse_truth(ground_truth)
    return 1.0


@MATH_SCORING.register("extracted")
def extracted_rule(completion: str, ground_truth: str, fallback_last_number: bool = True) -> dict[str, float]:
    """reasonrl's rule: the extracted answer (`extract_answer`: `\\boxed{}` in the last `<answer>`,
    else the last `\\boxed{}`, else the `<answer>` text, else the last number if allowed),
    math-verify-equivalent to the ground truth; "answer_found" 0/1."""
    answer, _ = extract_answer(completion, fallback_last_number)
    if answer is None or not answer.strip():
        return {"score": 0.0, "answer_found": 0.0}
    return {"score": 1.0 if math_equal(answer, ground_truth) else 0.0, "answer_found": 1.0}


@VERIFIERS.register(
    "math", doc="MATH: math-verify equivalence of the answer, by reward.math_rule (process pool, timeout)",
    isolated=True, options={"fallback_last_number": "fallback_last_number", "rule": "math_rule"},
    check=check_math_truth, answer=any_answer)
def math_reward(completion: str, ground_truth: str, extra_info: dict | None = None, *,
                fallback_last_number: bool = True, rule: str = "extracted") -> dict[str, float]:
    """{"score": 1 or 0, ...} of `rule` (a `MATH_SCORING` entry: reward.math_rule). An empty ground
    truth is a GroundTruthError under every rule (a data bug, not a wrong answer)."""
    if not ground_truth.strip():
        raise GroundTruthError("ground truth is empty")
    return MATH_SCORING.get(rule)(completion, ground_truth, fallback_last_number)


def _warmup() -> None:
    """Import sympy and build math-verify's parsers once (seconds on a busy machine), so the
    first real sample is not charged for it against its timeout (the other rules' module too)."""
    MATH_SCORING.names()
    math_equal("\\frac{1}{2}", "0.5")


math_reward.warmup = _warmup  # called by the reward worker right after loading
check_math_truth.warmup = _warmup
