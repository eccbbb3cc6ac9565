"""The environment protocol, what a step returns, and how a run gets its environment.

An environment is a plain class. One instance plays one episode:

    env.reset(example)       # the episode starts from an `Example` (its prompt is the first turn)
    env.step(turn) -> step   # the model's latest turn (its text) -> EnvStep(observation, reward, done)

`EnvStep.observation` is text (appended to the trajectory as it is, tokenized) or a chat
message {"role": ..., "content": ...} (rendered through the tokenizer's chat template as the
next message, then the generation prompt), or None (nothing to add). A step may also return
the tuple (observation, reward, done). `stop_strings` (a class attribute, may be empty) are
the strings that end a model turn besides EOS: a tool environment's closing tags.

Built-in environments register in `ENVIRONMENTS` (`env.name`); a user's class loads by
`env.fn=module:Class` (or `path/file.py:Class`), is checked when the run starts
(`environment_spec`: a class that builds with no arguments and has `reset(example)` and
`step(turn)`), and is built once per episode. What a step that raises, hangs or answers badly
does to the run (nothing: it becomes an error observation, counted) is `reasonrl.envs.runner`'s.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from reasonrl.batch import Example, Rollouts, Scores
from reasonrl.config import EnvConfig
from reasonrl.errors import ConfigError
from reasonrl.registry import ENVIRONMENTS
from reasonrl.rewards.scoring import MAX_ABS_REWARD


@dataclass(frozen=True)
class EnvStep:
    """What an environment answers to one model turn."""

    observation: str | dict | None = None  # text, a chat message {"role", "content"}, or nothing
    reward: float | None = None  # this turn's reward (summed over the episode, added to the task reward)
    done: bool = False  # the episode is over (the model gets no further turn)
    call: str | None = None  # the tool call this step ran, as text (counted: env/tool_calls_mean)
    error: str | None = None  # why that call failed (counted: env/tool_errors)
    timed_out: bool = False  # the call ran past its timeout (counted: env/tool_timeouts)


@runtime_checkable
class Environment(Protocol):
    """What an episode's environment implements (see the module docstring)."""

    def reset(self, example: Example) -> Any:
        """Start an episode from `example`; the return value is ignored."""
        ...

    def step(self, turn: str) -> EnvStep | tuple:
        """The model's latest turn (its text) -> `EnvStep` or (observation, reward, done)."""
        ...


class BadStep(ValueError):
    """An environment's answer that is not an `EnvStep` (or a valid tuple): its message says why."""


def as_step(value: Any) -> EnvStep:
    """A step's return value as a checked `EnvStep`; `BadStep` naming what is wrong: not an
    EnvStep or an (observation, reward, done) tuple, an observation that is not text, a chat
    message or None, a reward that is not a finite number or None, a `done` that is not a bool."""
    if isinstance(value, tuple):
        if len(value) != 3:
            raise BadStep(f"a step returned a tuple of {len(value)} items; expected "
                          "(observation, reward, done)")
        value = EnvStep(*value)
    if not isinstance(value, EnvStep):
        raise BadStep(f"a step returned {type(value).__name__}; expected EnvStep or "
                      "(observation, reward, done)")
    obs = value.observation
    if isinstance(obs, dict):
        if set(obs) - {"role", "content"} or not isinstance(obs.get("role"), str) \
                or not isinstance(obs.get("content"), str):
            raise BadStep(f"the observation is a dict with keys {sorted(map(str, obs))}; a chat message "
                          "is {'role': str, 'content': str}")
    elif obs is not None and not isinstance(obs, str):
        raise BadStep(f"the observation is {type(obs).__name__}; expected text, a chat message or None")
    reward = value.reward
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                               or not math.isfinite(reward)):
        raise BadStep(f"the reward is {reward!r}; expected a finite number or None")
    if reward is not None and abs(reward) > MAX_ABS_REWARD:  # as a reward function's (rewards/scoring.py)
        raise BadStep(f"the reward is {reward!r}, beyond +-{MAX_ABS_REWARD:g}, the most float32 training "
                      f"takes safely; scale it down")
    if not isinstance(value.done, bool):
        raise BadStep(f"done is {value.done!r}; expected True or False")
    return value


def observation_text(observation: str | dict | None) -> str | None:
    """An observation as plain text, for logs and the report."""
    if isinstance(observation, dict):
        return f"[{observation['role']}] {observation['content']}"
    return observation


@dataclass(frozen=True)
class EnvSpec:
    """A run's environment: how to build one per episode, the strings that end a model turn,
    and the episode limits of the `env` section."""

    name: str  # the env.name, or the env.fn target
    make: Callable[[], Any]  # a fresh environment for one episode
    stop_strings: tuple[str, ...]  # end a model turn besides EOS (a tool environment's closing tags)
    config: EnvConfig  # max_turns, token limits, step timeout, workers


def check_stop_strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or \
            not all(isinstance(s, str) and s for s in value):
        raise ConfigError(f"{where}: stop_strings must be a tuple of non-empty strings, got {value!r}")
    return tuple(value)


def check_environment_class(cls: Any, target: str) -> Callable[[], Any]:
    """`cls` (what `env.fn` names) as a factory of environments, after checking that it is a
    class building with no arguments, whose instances have `reset(example)` and `step(turn)`
    and valid `stop_strings`; ConfigError naming `env.fn` and what is wrong otherwise."""
    where = f"env.fn={target}"
    if not inspect.isclass(cls):
        raise ConfigError(f"{where}: expected a class (an environment is built per episode), got "
                          f"{type(cls).__name__}")
    try:
        inspect.signature(cls).bind()
    except TypeError as err:
        raise ConfigError(f"{where}: the class must build with no arguments: {err}") from None
    except ValueError:  # no signature to read: building it below says more
        pass
    for method, args in (("reset", ("example",)), ("step", ("turn",))):
        fn = getattr(cls, method, None)
        if not callable(fn):
            raise ConfigError(f"{where}: {cls.__name__} has no method {method}({', '.join(args)}); an "
                              "environment implements reset(example) and step(turn) (docs/environments.md)")
        try:
            inspect.signature(fn).bind(None, *args)  # (self, ...) on the class
        except TypeError as err:
            raise ConfigError(f"{where}: {cls.__name__}.{method} must accept ({', '.join(args)}): "
                              f"{err}") from None
        except ValueError:
            pass
    try:
        sample = cls()
    except Exception as err:
        raise ConfigError(f"{where}: building {cls.__name__}() failed: {type(err).__name__}: {err}") from None
    check_stop_strings(getattr(sample, "stop_strings", ()), f"{where}: {cls.__name__}")
    return cls


def environment_spec(cfg: EnvConfig) -> EnvSpec | None:
    """The run's environment (None: env.name=none, single-turn), checked now: a user class of
    `env.fn` (imported, `check_environment_class`) or a registered one built from the section;
    ConfigError naming the key otherwise."""
    if cfg.fn:
        from reasonrl.rewards.verifiers import load_target

        try:
            cls = load_target(cfg.fn)
        except Exception as err:
            raise ConfigError(f"env.fn: cannot load {cfg.fn!r}: {type(err).__name__}: {err}") from None
        make = check_environment_class(cls, cfg.fn)
        stops = check_stop_strings(getattr(make(), "stop_strings", ()), f"env.fn={cfg.fn}")
        return EnvSpec(cfg.fn, make, stops, cfg)
    if cfg.name == "none":
        return None
    entry = ENVIRONMENTS[cfg.name]
    if entry.info.get("check") is not None:
        entry.info["check"](cfg)
    build = entry.fn

    def make() -> Any:
        return build(cfg)

    stops = check_stop_strings(getattr(make(), "stop_strings", ()), f"env.name={cfg.name}")
    return EnvSpec(cfg.name, make, stops, cfg)


def with_env_reward(scores: Scores, rollouts: Rollouts) -> Scores:
    """`scores` with each episode's environment reward (the sum of its steps' rewards) added to
    the total and logged as the component `env`; unchanged for single-turn rollouts."""
    if rollouts.episodes is None:
        return scores
    reward = rollouts.episodes.reward
    return dataclasses.replace(scores, total=scores.total + reward,
                               components={**scores.components, "env": reward.clone()})
