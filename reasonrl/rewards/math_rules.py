"""Other systems' math rewards, as their code computes them (`reward.math_rule`, `MATH_SCORING`).

A recipe that names a system scores as that system does; reasonrl's own rule (`extracted`,
`math_equiv.py`) is the default elsewhere. Each rule here is written from the original's code
(cited in its docstring) and tested against a table of that code's own scores
(tests/rewards/test_fidelity_*.py). They call math-verify as the original does: the same `parse`
extraction settings and the same argument order to `verify` (ReasonRL and EasyRL pass the
prediction where math-verify expects the gold), with math-verify's own timeouts off (they use
SIGALRM; the reward worker's `reward.timeout` bounds the whole call instead, `pool.py`).

The rules take (completion, ground_truth, fallback_last_number) like `extracted`; none of them
reads `fallback_last_number` (none of the originals has a last-number fallback). Text is only
searched and compared; numbers are read with Python's `float` where the original does; nothing
is evaluated.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache

from reasonrl.registry import MATH_SCORING
from reasonrl.rewards.extract import all_between, first_between


@lru_cache(maxsize=1)
def _math_verify():
    """math-verify's `parse`, `verify` and the extraction configs the originals build, once."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled" warnings
    # EasyRL's equations=True logs "deprecated" on every call (it still keeps `c` of `a = b = c`)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    configs = {
        "default": [LatexExtractionConfig(), ExprExtractionConfig()],  # parse()'s own default
        "latex": [LatexExtractionConfig()],
        # EasyRL's second try (math_verifier.py): boxed=True is what it passes (no value of the
        # Literal "all" | "last" | "none": the normaliser leaves \boxed{} to the extraction)
        "easyrl": [LatexExtractionConfig(
            normalization_config=NormalizationConfig(nits=False, malformed_operators=False, basic_latex=True,
                                                     equations=True, boxed=True, units=True),
            boxed_match_priority=0, try_extract_without_anchor=False)],
        # TRL's accuracy_reward (trl/rewards/accuracy_rewards.py): LaTeX only, \boxed{} first
        "trl": [LatexExtractionConfig(normalization_config=NormalizationConfig(units=True),
                                      boxed_match_priority=0, try_extract_without_anchor=False)],
    }
    return parse, verify, configs


def _parse(text: str, config: str = "default", mode: str = "any_match") -> list:
    parse, _, configs = _math_verify()
    return parse(text, extraction_config=configs[config], extraction_mode=mode, parsing_timeout=None)


def _verify(gold: list, target: list) -> bool:
    _, verify, _ = _math_verify()
    return bool(verify(gold, target, timeout_seconds=None))


@MATH_SCORING.register("reason_rl")
def reason_rl_rule(completion: str, ground_truth: str, fallback_last_number: bool = True) -> dict[str, float]:
    """ReasonRL's answer check (SdeeRK/reasonRL, reason_rl/reward/math_reward.py,
    `MathReward._check_answer`): the text of the first `<answer>...</answer>` (the regex
    `<answer>(.*?)</answer>`, case-sensitive, across lines), stripped, parsed by math-verify's
    default `parse` (LaTeX, then plain expressions: "The answer is 72", "72 apples" and "So -8"
    read as numbers), then `verify(prediction, truth)` against the ground truth's default parse;
    if math-verify raises, the stripped texts must be equal. No `<answer>` pair: 0. ReasonRL's
    total also needs its format (`format_r1_zero`, the recipe's gate)."""
    answer = first_between(completion, "<answer>", "</answer>")
    if answer is None:
        return {"score": 0.0, "answer_found": 0.0}
    pred = answer.strip()
    try:
        right = _verify(_parse(pred), _parse(ground_truth))
    except Exception:
        right = pred == ground_truth.strip()
    return {"score": 1.0 if right else 0.0, "answer_found": 1.0}


_SPACED_OPERATOR = re.compile(r"\s*([=+\-*/])\s*")
_SPACE_BEFORE_NEWLINE = {c: re.compile(r"(?<=\s)" + re.escape(c)) for c in "\n\r"}
_NEWLINE_AFTER_TEXT = {c: re.compile(r"(?<!\s)" + re.escape(c)) for c in "\n\r"}
_TRUTH_TAG = re.compile(r"<answer>(.*?)</answer>")  # on the ground truth: one line, as there


def _easyrl_clean(text: str) -> str:
    """EasyRL's `MathVerifier._clean_text`: the last `<answer>` match if any; a newline after
    whitespace dropped, any other newline a space (\\n, then \\r); stripped, trailing periods
    dropped, lower case."""
    tags = all_between(text, "<answer>", "</answer>")
    if tags:
        text = tags[-1]
    for c in "\n\r":
        text = _SPACE_BEFORE_NEWLINE[c].sub("", text)
        text = _NEWLINE_AFTER_TEXT[c].sub(" ", text)
    return text.strip().rstrip(".").lower()


def _easyrl_numbers_equal(answer: str, truth: str) -> bool:
    """EasyRL's `MathVerifier._numeric_reward` == 1.0: both cleaned texts read by Python's `float`
    ("72", " 72.0", "1e2", "1_000", "inf"; not "1,000" or "$72") and equal."""
    try:
        return float(_easyrl_clean(answer)) == float(_easyrl_clean(truth))
    except ValueError:
        return False


@MATH_SCORING.register("easyrl", text_truth=True)  # its try 3 matches any ground truth as text
def easyrl_rule(completion: str, ground_truth: str, fallback_last_number: bool = True) -> dict[str, float]:
    """EasyRL's reward (liunanfu1992/EasyRL, easyrl/reward_verifier/math_verifier.py,
    `MathVerifier._default_accuracy_reward`, the only reward its trainer computes), 1.0 at the
    first of three tries that succeeds, else 0.0:

    1. math-verify's default `parse` of the whole completion (LaTeX, then plain expressions,
       anywhere in the text: prose, `<answer>` tags or not), `verify(prediction, truth)` against
       the ground truth's default parse;
    2. if the ground truth parses as LaTeX (first match), the completion's first LaTeX match with
       `\\\\boxed{}` tried first and no match without a LaTeX anchor (`$...$`, `\\\\boxed{}`, ...),
       `verify(prediction, truth)`;
    3. exact text: the last `<answer>...</answer>` of the completion (else all of it) and the
       ground truth's first one-line `<answer>` (else all of it), stripped; a `$...$` truth loses
       its outer dollars, a `$...$` answer every dollar; spaces around `= + - * /` removed; then
       equal as strings, or both cleaned texts (`_easyrl_clean`) equal as Python floats.
    """
    try:
        if _verify(_parse(completion), _parse(ground_truth)):
            return {"score": 1.0}
    except Exception:
        pass
    gold = _parse(ground_truth, "latex", "first_match")
    if gold:
        try:
            if _verify(_parse(completion, "easyrl", "first_match"), gold):
                return {"score": 1.0}
        except Exception:
            pass
    match = _TRUTH_TAG.search(ground_truth)
    truth = match.group(1).strip() if match else ground_truth.strip()
    tags = all_between(completion, "<answer>", "</answer>")
    answer = tags[-1].strip() if tags else completion.strip()
    if truth[:1] == "$" and truth[-1:] == "$":
        truth = truth[1:-1]
    if answer[:1] == "$" and answer[-1:] == "$":
        answer = answer.replace("$", "")
    answer, truth = _SPACED_OPERATOR.sub(r"\1", answer), _SPACED_OPERATOR.sub(r"\1", truth)
    return {"score": 1.0 if answer == truth or _easyrl_numbers_equal(answer, truth) else 0.0}


@MATH_SCORING.register("trl")
def trl_rule(completion: str, ground_truth: str, fallback_last_number: bool = True) -> dict[str, float]:
    """TRL's `accuracy_reward` (huggingface/trl, trl/rewards/accuracy_rewards.py): the ground
    truth by math-verify's default `parse`; the completion's first LaTeX match, `\\\\boxed{}`
    tried first (`boxed_match_priority=0`), units normalised, nothing taken without a LaTeX
    anchor (`\\\\boxed{}`, `$...$`, `\\\\[...\\\\]`: a bare "72" or `\\\\boxed 72` reads nothing);
    `verify(truth, prediction)`. A ground truth math-verify cannot read is scored None there
    (the example skipped, its other rewards still summed): 0.0 here, the same total. (The
    start-up check already refuses such a ground truth, `check_math_truth`.)"""
    gold = _parse(ground_truth)
    if not gold:
        return {"score": 0.0, "answer_found": 0.0}
    pred = _parse(completion, "trl", "first_match")
    return {"score": 1.0 if _verify(gold, pred) else 0.0, "answer_found": float(bool(pred))}
