"""Rewards for tasks whose answer a program can check: correctness plus format shaping.

    scoring.py     completions -> one `Scores` record: weighted components, a gate, failures
    verifiers.py   which verifier scores `correct` for a sample, and the start-up ground-truth check
    components.py  the `reward.weights` names (format checks; `correct` is the verifier's score)
    numeric.py, gsm8k.py, math_equiv.py, countdown.py, piecewise.py   the task verifiers
    tinyzero.py    TinyZero's Countdown score (countdown_rule=tinyzero), computed without eval
    math_rules.py  other systems' math rewards as written there (reward.math_rule)
    extract.py, format.py, safe_arithmetic.py   answer extraction, format rules, safe arithmetic
    styles.py      reward.fn / reward.fns written as TRL, verl or OpenRLHF write theirs: told by
                   their parameter names, called as their framework calls them (reward.fn_style)
    pool.py, worker.py   isolated reward calls in worker processes with hard timeouts
    failures.py    reward failures a user can see

Components are summed with their weights; `reward.gate` (or `reward.combine=all`) makes the
total 0 unless the gate components score above 0.
"""

from reasonrl.errors import GroundTruthError
from reasonrl.rewards.extract import extract_answer, extract_answer_tag, extract_boxed, extract_last_number
from reasonrl.rewards.format import (
    answer_present_reward,
    boxed_format_reward,
    paired_tags_format_reward,
    r1_zero_format_reward,
    think_answer_format_reward,
)
from reasonrl.rewards.numeric import numbers_equal, numeric_reward, parse_number
from reasonrl.rewards.scoring import (
    BadGroundTruth,
    RewardFn,
    call_reward,
    gate_of,
    make_reward_fn,
    per_sample,
    score,
    score_examples,
    score_rollouts,
)
from reasonrl.rewards.verifiers import Verifier, check_examples, make_verifier, task_for_source, verifier_for

__all__ = [
    "BadGroundTruth", "GroundTruthError", "RewardFn", "Verifier", "answer_present_reward",
    "boxed_format_reward",
    "call_reward", "check_examples", "extract_answer", "extract_answer_tag", "extract_boxed",
    "extract_last_number", "gate_of", "make_reward_fn", "make_verifier", "numbers_equal", "numeric_reward",
    "paired_tags_format_reward", "parse_number", "per_sample", "r1_zero_format_reward", "score",
    "score_examples", "score_rollouts", "task_for_source", "think_answer_format_reward", "verifier_for",
]
