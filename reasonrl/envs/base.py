"""The environment protocol, what a step returns, and how a run gets its environment.

An environment is a plain class. One instance plays one episode:

    env.reset(example)       # the episode starts from an `Example` (its prompt is the first turn)
    env.step(turn) -> step   # the model's latest turn (its text) -> EnvStep(observation, reward, done)
    env.end() -> reward      # optional: the episode is over; a last reward (or None), clean-up

`EnvStep.observation` is text (appended to the trajectory as it is, tokenized), a chat
message {"role": ..., "content": ...} (optionally "name") or a list of them (rendered through
the tokenizer's chat template as the next messages, then the generation prompt), or None
(nothing to add). A step may also return the tuple (observation, reward, done). `reset` may
return an `Example`: the episode's example from then on, its prompt rendered again (an
environment that writes the task, as TRL's `reset` and SkyRL's `init` may); anything else it
returns is ignored. `stop_strings` (a class attribute, may be empty) are the strings that end
a model turn besides EOS: a tool environment's closing tags.

Built-in environments register in `ENVIRONMENTS` (`env.name`); a user's class loads by
`env.fn=module:Class` (or `path/file.py:Class`), in the style `env.format` names or detects
(`ENV_FORMATS`: this protocol, `reasonrl`, registered here; TRL's environment classes and the
gym styles through the adapters of `trl_env.py` and `gym_env.py`), is checked when the run
starts (`environment_spec`) and is built once per episode. What a step that raises, hangs or
answers badly does to the run (nothing: it becomes an error observation, counted) is
`reasonrl.envs.runner`'s.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from reasonrl.batch import Example, Rollouts, Scores
from reasonrl.config import EnvConfig
from reasonrl.errors import ConfigError
from reasonrl.registry import ENV_FORMATS, ENVIRONMENTS
from reasonrl.rewards.scoring import MAX_ABS_REWARD


@dataclass(frozen=True)
class EnvStep:
    """What an environment answers to one model turn."""

    observation: str | dict | list[dict] | None = None  # text, chat message(s) {"role", "content"}, nothing
    reward: float | None = None  # this turn's reward (summed over the episode, added to the task reward)
    done: bool = False  # the episode is over (the model gets no further turn)
    call: str | None = None  # the tool call this step ran, as text (counted: env/tool_calls_mean)
    error: str | None = None  # why that call failed (counted: env/tool_errors)
    timed_out: bool = False  # the call ran past its timeout (counted: env/tool_timeouts)


@runtime_checkable
class Environment(Protocol):
    """What an episode's environment implements (see the module docstring)."""

    def reset(self, example: Example) -> Any:
        """Start an episode from `example`; an `Example` returned is the episode's from now on
        (its prompt rendered again), anything else is ignored."""
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
    if isinstance(obs, list):
        if not obs:
            value = dataclasses.replace(value, observation=None)  # no message: nothing to add
        for message in obs:
            if not isinstance(message, dict):
                raise BadStep(f"the observation is a list holding {type(message).__name__}; expected chat "
                              "messages {'role': str, 'content': str}")
            check_message(message)
    elif isinstance(obs, dict):
        check_message(obs)
    elif obs is not None and not isinstance(obs, str):
        raise BadStep(f"the observation is {type(obs).__name__}; expected text, chat message(s) or None")
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


def check_message(message: dict) -> None:
    """BadStep unless `message` is a chat message: {"role": str, "content": str}, and optionally
    "name": str (a tool message's tool, as TRL sends it)."""
    if set(message) - {"role", "content", "name"} or not isinstance(message.get("role"), str) \
            or not isinstance(message.get("content"), str) or not isinstance(message.get("name", ""), str):
        raise BadStep(f"the observation is a dict with keys {sorted(map(str, message))}; a chat message "
                      "is {'role': str, 'content': str} (and optionally 'name': str)")


def observation_text(observation: str | dict | list[dict] | None) -> str | None:
    """An observation as plain text, for logs and the report."""
    if isinstance(observation, list):
        return "\n".join(f"[{m['role']}] {m['content']}" for m in observation) or None
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
    # the tools' JSON schemas, rendered into every prompt by the chat template's `tools=` (TRL's classes)
    tools: tuple[dict, ...] = ()
    # the roles of the chat messages its observations send: the chat template must render them
    # after the model's turn (checked at start-up)
    chat_roles: tuple[str, ...] = ()
    # who plays the episodes instead of the turn loop (an EPISODE_RUNNERS name: an agent program's,
    # env.format=agent); "": reasonrl.rollout.episodes
    runner: str = ""


def check_stop_strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or \
            not all(isinstance(s, str) and s for s in value):
        raise ConfigError(f"{where}: stop_strings must be a tuple of non-empty strings, got {value!r}")
    return tuple(value)


def reasonrl_mismatch(cls: type) -> str | None:
    """Why `cls` does not have this protocol's methods (`reset(example)`, `step(turn)`), None
    when it has them."""
    for method, args in (("reset", ("example",)), ("step", ("turn",))):
        fn = getattr(cls, method, None)
        if not callable(fn):
            return f"{cls.__name__} has no method {method}({', '.join(args)})"
        try:
            inspect.signature(fn).bind(None, *args)  # (self, ...) on the class
        except TypeError as err:
            return f"{cls.__name__}.{method} must accept ({', '.join(args)}): {err}"
        except ValueError:
            pass
    return None


def check_environment_class(cls: Any, target: str, other_styles: str = "") -> Callable[[], Any]:
    """`cls` (what `env.fn` names) as a factory of environments, after checking that it is a
    class building with no arguments, whose instances have `reset(example)` and `step(turn)`
    and valid `stop_strings`; ConfigError naming `env.fn` and what is wrong otherwise (followed
    by `other_styles`, why no other `env.format` fits, when the style was detected)."""
    where = f"env.fn={target}"
    check_is_class(cls, target)
    try:
        inspect.signature(cls).bind()
    except TypeError as err:
        raise ConfigError(f"{where}: the class must build with no arguments: {err}") from None
    except ValueError:  # no signature to read: building it below says more
        pass
    mismatch = reasonrl_mismatch(cls)
    if mismatch is not None:
        raise ConfigError(f"{where}: {mismatch}; an environment implements reset(example) and step(turn) "
                          f"(docs/environments.md){other_styles}")
    try:
        sample = cls()
    except Exception as err:
        raise ConfigError(f"{where}: building {cls.__name__}() failed: {type(err).__name__}: {err}") from None
    check_stop_strings(getattr(sample, "stop_strings", ()), f"{where}: {cls.__name__}")
    return cls


def check_is_class(cls: Any, target: str) -> None:
    if not inspect.isclass(cls):
        raise ConfigError(f"env.fn={target}: expected a class (an environment is built per episode), got "
                          f"{type(cls).__name__}")


@ENV_FORMATS.register("reasonrl", doc="reasonrl's protocol: reset(example) and step(turn) -> EnvStep",
                      needs="reset(example) and step(turn)", detect=None)
def reasonrl_environment(cls: type, cfg: EnvConfig, other_styles: str = "") -> EnvSpec:
    """A class of this module's protocol, checked (`check_environment_class`), built per episode."""
    make = check_environment_class(cls, cfg.fn, other_styles)
    stops = check_stop_strings(getattr(make(), "stop_strings", ()), f"env.fn={cfg.fn}")
    return EnvSpec(cfg.fn, make, stops, cfg)


def public_methods(cls: type) -> list[str]:
    """The names of `cls`'s public methods (its own and inherited, not `object`'s), sorted."""
    return sorted(name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None))
                  and not inspect.isclass(getattr(cls, name)))


def detect_format(cls: type, target: str) -> tuple[str, str]:
    """The `env.format` that `cls` is written in (env.format=auto): the first adapter style
    whose `detect` accepts it (in `ENV_FORMATS`' order: skyrl, gymnasium, trl), else this
    protocol; and, for the latter, the line saying why no other style fits (its methods, each
    style's needs), for the error should it not be this protocol's either."""
    for entry in ENV_FORMATS:
        if entry.detect is not None and entry.detect(cls):
            return entry.name, ""
    has = ", ".join(public_methods(cls)) or "no public method"
    needs = "; ".join(f"{e.name} needs {e.needs}" for e in ENV_FORMATS
                      if e.name != "reasonrl" and e.needs)  # not a class: agent
    return "reasonrl", f"; nor does it match another style (env.format): it has {has}; {needs}"


def environment_spec(cfg: EnvConfig) -> EnvSpec | None:
    """The run's environment (None: env.name=none, single-turn), checked now: a user class of
    `env.fn` (imported, in the style of `env.format`, detected when `auto`, through that
    style's adapter) or a registered one built from the section; ConfigError naming the key
    otherwise."""
    if cfg.format == "agent":  # a program, not a class (reasonrl.envs.agent)
        return ENV_FORMATS.get("agent")(cfg)
    if cfg.fn:
        from reasonrl.rewards.verifiers import load_target

        try:
            cls = load_target(cfg.fn)
        except Exception as err:
            raise ConfigError(f"env.fn: cannot load {cfg.fn!r}: {type(err).__name__}: {err}") from None
        check_is_class(cls, cfg.fn)
        style, other_styles = (cfg.format, "") if cfg.format != "auto" else detect_format(cls, cfg.fn)
        if style == "reasonrl":
            return reasonrl_environment(cls, cfg, other_styles)
        return ENV_FORMATS.get(style)(cls, cfg)
    if cfg.name == "none":
        return None
    entry = ENVIRONMENTS[cfg.name]
    if entry.check is not None:
        entry.check(cfg)
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
    agent = rollouts.episodes.agent
    if agent is not None:  # an agent program (env.format=agent): its reward replaces the task's
        given, dropped = agent["given"].bool(), agent["dropped"].bool()
        total = torch.where(given, reward, scores.total + reward).masked_fill(dropped, 0.0)
        components, applied = {**scores.components, "env": reward.clone()}, scores.applied
        if bool(dropped.any()):  # unscored: advantage 0, outside its group's statistics
            applied = {name: ~dropped & (scores.applied or {}).get(name, torch.ones_like(dropped))
                       for name in components}
        return dataclasses.replace(scores, total=total, applied=applied, components=components)
    return dataclasses.replace(scores, total=scores.total + reward,
                               components={**scores.components, "env": reward.clone()})
