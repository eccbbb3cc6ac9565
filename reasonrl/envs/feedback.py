"""The feedback environment (`env.name=feedback`): a plain multi-turn game on numeric tasks.

The model answers; while the answer is wrong the environment says so and how ("Too high." /
"Too low.", or "Answer with a number." when it finds none) and the model tries again, until it
is right or `env.max_turns` run out: the guessing game, on any data whose ground truth is a
number (arithmetic, GSM8K). The answer is read by the numeric verifier's rule
(`reasonrl.rewards.extract_answer`: `\\boxed{}` > `<answer>` > the last number). It gives no
reward of its own: the task's verifier scores the last turn, so a run learns to be right
sooner only through `env.max_turns`.
"""

from __future__ import annotations

from fractions import Fraction

from reasonrl.batch import Example
from reasonrl.config import EnvConfig
from reasonrl.envs.base import EnvStep
from reasonrl.errors import ConfigError
from reasonrl.registry import ENVIRONMENTS
from reasonrl.rewards.extract import extract_answer
from reasonrl.rewards.numeric import numbers_equal, parse_exact

TOO_HIGH, TOO_LOW, NO_NUMBER = "Too high.", "Too low.", "Answer with a number."


def feedback(answer: float | Fraction | None, target: float | Fraction) -> str | None:
    """The environment's word on `answer` for `target`: None when it is right (numbers_equal:
    exactly equal)."""
    if answer is None:
        return NO_NUMBER
    if numbers_equal(answer, target):
        return None
    return TOO_HIGH if answer > target else TOO_LOW


class FeedbackEnvironment:
    """One guessing episode (see the module docstring)."""

    stop_strings: tuple[str, ...] = ()  # a turn ends at EOS

    def __init__(self, observation_format: str = "chat"):
        if observation_format not in ("tagged", "chat"):
            raise ConfigError(f"env.observation_format: {observation_format!r}; allowed: tagged, chat")
        self.observation_format = observation_format
        self.target: Fraction | None = None

    def reset(self, example: Example) -> None:
        """The target is the example's ground truth, a number (ValueError otherwise)."""
        self.target = parse_exact(example.ground_truth)
        if self.target is None:
            raise ValueError(f"env.name=feedback needs a numeric ground truth, got {example.ground_truth!r}")

    def step(self, turn: str) -> EnvStep:
        word = feedback(parse_exact(extract_answer(turn)[0] or ""), self.target)
        if word is None:
            return EnvStep(done=True)
        if self.observation_format == "chat":
            return EnvStep(observation={"role": "user", "content": word})
        return EnvStep(observation=f"\n{word}\n")


@ENVIRONMENTS.register("feedback", doc='numeric answers get "Too high." / "Too low." until right')
def feedback_environment(cfg: EnvConfig) -> FeedbackEnvironment:
    """A feedback environment with the `env` section's observation format."""
    return FeedbackEnvironment(cfg.observation_format)
