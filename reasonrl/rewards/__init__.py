"""Rewards for tasks whose answer a program can check: correctness plus format shaping.

A reward component is a function (completion, ground_truth) -> float. `score` runs a
weighted set of components over a batch and reports each one's raw scores for logging.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from reasonrl.rewards.extract import (
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_last_number,
)
from reasonrl.rewards.format import (
    answer_present_reward,
    boxed_format_reward,
    think_answer_format_reward,
)
from reasonrl.rewards.numeric import (
    GroundTruthError,
    numbers_equal,
    numeric_reward,
    parse_number,
)

RewardFn = Callable[[str, str], float]  # (completion, ground_truth) -> score

REWARD_COMPONENTS: dict[str, str] = {
    "correct": "1 if the extracted answer equals the ground truth (boxed > tag > last number)",
    "format": "DeepSeek-R1 <think></think><answer></answer> format: 0, 0.5, or 1 with a \\boxed{}",
    "boxed": "1 if the completion contains a complete \\boxed{...} (MATH convention)",
    "answer_present": "1 if an answer can be extracted and parses as a number, right or wrong",
}


def _correct(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    return numeric_reward(completion, ground_truth, fallback_last_number)


def _format(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    return think_answer_format_reward(completion)


def _boxed(completion: str, ground_truth: str, fallback_last_number: bool = True) -> float:
    return boxed_format_reward(completion)


def _answer_present(completion: str, ground_truth: str,
                    fallback_last_number: bool = True) -> float:
    return answer_present_reward(completion)


# name -> fn(completion, ground_truth, fallback_last_number). Module-level functions (not
# lambdas) so the RewardFns built from them pickle and can be sent to worker processes.
_COMPONENTS: dict[str, Callable[..., float]] = {
    "correct": _correct,
    "format": _format,
    "boxed": _boxed,
    "answer_present": _answer_present,
}


def make_reward_fn(name: str, fallback_last_number: bool = True) -> RewardFn:
    """The (completion, ground_truth) -> float function for a component name.

    `fallback_last_number` only matters for "correct": off, an answer must be boxed or tagged.
    """
    if name not in _COMPONENTS:
        raise ValueError(f"unknown reward {name!r}; allowed: {', '.join(_COMPONENTS)}")
    return partial(_COMPONENTS[name], fallback_last_number=fallback_last_number)


@dataclass
class RewardResult:
    """Weighted totals per sample, raw per-component scores, and how many calls raised."""

    total: list[float]
    components: dict[str, list[float]]
    errors: int


def score(completions: list[str], ground_truths: list[str], weights: dict[str, float],
          fallback_last_number: bool = True) -> RewardResult:
    """total[i] = sum_k weights[k] * component_k(completions[i], ground_truths[i]).

    Every component named in `weights` is computed and reported, weight 0 included, so it can
    be logged without shaping the reward. A component that raises scores 0 for that sample
    and is counted in `errors`: one odd completion must not kill a training run. A
    GroundTruthError (unparseable ground truth, a ValueError) propagates: that is a data bug.
    """
    if len(completions) != len(ground_truths):
        raise ValueError(f"{len(completions)} completions but {len(ground_truths)} ground truths")
    unknown = [k for k in weights if k not in _COMPONENTS]
    if unknown:
        raise ValueError(f"unknown reward weights {unknown}; allowed: {', '.join(_COMPONENTS)}")
    total = [0.0] * len(completions)
    components: dict[str, list[float]] = {}
    errors = 0
    for name, weight in weights.items():
        fn = make_reward_fn(name, fallback_last_number)
        scores = []
        for i, (completion, truth) in enumerate(zip(completions, ground_truths, strict=True)):
            try:
                s = float(fn(completion, truth))
            except GroundTruthError:
                raise
            except Exception:
                s = 0.0
                errors += 1
            scores.append(s)
            total[i] += weight * s
        components[name] = scores
    return RewardResult(total=total, components=components, errors=errors)


__all__ = [
    "REWARD_COMPONENTS",
    "GroundTruthError",
    "RewardFn",
    "RewardResult",
    "answer_present_reward",
    "boxed_format_reward",
    "extract_answer",
    "extract_answer_tag",
    "extract_boxed",
    "extract_last_number",
    "make_reward_fn",
    "numbers_equal",
    "numeric_reward",
    "parse_number",
    "score",
    "score_rollouts",
    "think_answer_format_reward",
]


def score_rollouts(texts: list[str], ground_truths: list[str], weights: dict[str, float],
                   fallback_last_number: bool = True):
    """`score` packed as the `Scores` batch record (tensors aligned with the rollouts)."""
    import torch

    from reasonrl.batch import Scores

    result = score(texts, ground_truths, weights, fallback_last_number)
    return Scores(total=torch.tensor(result.total, dtype=torch.float32),
                  components={k: torch.tensor(v, dtype=torch.float32)
                              for k, v in result.components.items()},
                  errors=result.errors)
