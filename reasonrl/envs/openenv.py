"""OpenEnv environments (docs/env-openenv.md), onto reasonrl's protocol (`reasonrl.envs.base`):
a class in this process (`env.fn=file.py:Class`, `env.format=openenv` or detected) or a server
(`env.name=openenv env.url=ws://host:port`: `reasonrl.envs.openenv_server`), one environment per
episode either way.

OpenEnv (github.com/meta-pytorch/OpenEnv, openenv-core 0.3.0) types an environment's input and
output: `Environment.reset(seed=None, episode_id=None, **kwargs) -> Observation`,
`step(action: Action) -> Observation` and a `state` property
(`openenv/core/env_server/interfaces.py`); `Action` and `Observation` are pydantic models, the
Observation carrying `done` and `reward` (`types.py`). The translation:

- the model's turn becomes the Action: its one text field (an `EchoAction(message: str)` gets
  the turn's text; `env.openenv.action_field` names another), or what
  `env.openenv.parse_action(turn)` returns (an Action, a dict of its fields, or None: the
  episode is over). The Action class is the annotation of `step`'s `action` parameter (or the
  class's `Environment[Action, ...]` argument, or `env.openenv.action`); a server's comes from
  its `/schema`;
- an Observation becomes the next message: its one field besides done, reward and metadata
  (`env.openenv.observation_field` names one; several: those fields as JSON; none: no message;
  `env.openenv.render(fields)` decides instead), in `env.observation_format` (`chat`: a user
  message; `tagged`: the text between newlines); its `reward` is the step's reward, its
  `done` ends the episode;
- `reset` gets `seed` (a hash of the example, as the gym adapters': the `rollout.n` episodes of
  a prompt start from the same state) and a record's `extra_info.reset` keyword arguments, each
  only where it accepts them (as OpenEnv's server filters them: `_get_valid_kwargs`); its
  observation, rendered as text, is appended to the prompt's last user message
  (`env.openenv.reset_observation`; OpenEnv's own loop reads it before the first action);
- `end()` (the episode is over) closes the environment, or the session.

The step timeouts, the masks, the error observations and the metrics are the episode loop's
(`reasonrl.rollout.episodes`): a step that raises (in the class, or an error the server
answers) is an error observation counted in `env/step_errors`; one that hangs is cut at
`env.step_timeout` and ends its episode (`env/step_timeouts`).

Refused at start-up, each in one line: a class that does not build with no arguments (OpenEnv's
server builds it so), whose Action cannot be told or has no single text field, that declares
`SUPPORTS_CONCURRENT_SESSIONS = False` (OpenEnv runs it one session at a time; a run plays a
group of episodes at once) or `REQUIRES_SINGLE_THREAD_EXECUTOR` (a step may run on another
thread than the last: serve it instead); a server that does not answer `/health` and `/schema`,
or that holds fewer sessions than a rollout call plays at once (`check_sessions`; the
setting `env.max_concurrent_episodes` plays them in waves).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reasonrl.batch import Example
from reasonrl.config import EnvConfig
from reasonrl.envs.adapters import accepted, append_to_prompt, has_method
from reasonrl.envs.base import EnvSpec, EnvStep
from reasonrl.envs.gym_env import example_seed
from reasonrl.errors import ConfigError
from reasonrl.registry import ENV_FORMATS
from reasonrl.rewards.verifiers import load_target

RESERVED = ("done", "reward", "metadata")  # Observation's own fields (openenv/core/env_server/types.py)
# reasonrl.evaluate.loop.GENERATE_BATCH: episodes per held-out eval call (a layer above this one;
# tests/envs/test_openenv.py checks they agree)
EVAL_EPISODES_PER_CALL = 64


def openenv_base() -> type | None:
    """OpenEnv's `Environment` base class where a loaded module already imported it (a class
    that subclasses it did), else None: importing openenv-core takes seconds, which a run whose
    env.fn class does not use it should not pay."""
    module = sys.modules.get("openenv.core.env_server.interfaces")
    return getattr(module, "Environment", None)


# ---- the model's turn -> an Action -----------------------------------------------------------

def class_fields(cls: type) -> list[tuple[str, bool, bool]]:
    """(name, is text, required) of each field of a pydantic model or dataclass `cls`, metadata
    left out; TypeError when it is neither."""
    if hasattr(cls, "model_fields"):
        items = [(n, f.annotation, f.is_required()) for n, f in cls.model_fields.items()]
    elif dataclasses.is_dataclass(cls):
        try:
            hints = typing.get_type_hints(cls)
        except Exception:
            hints = {}
        items = [(f.name, hints.get(f.name, f.type),
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls)]
    else:
        raise TypeError(f"{cls.__name__} is neither a pydantic model nor a dataclass")
    return [(n, t in (str, "str"), req) for n, t, req in items if n != "metadata"]


def schema_fields(schema: dict) -> list[tuple[str, bool, bool]]:
    """(name, is text, required) of each property of a JSON schema (a server's `/schema`
    action), metadata left out."""
    required = set(schema.get("required", []))

    def text(prop: dict) -> bool:
        return prop.get("type") == "string" or any(p.get("type") == "string" for p in prop.get("anyOf", []))
    return [(n, text(p), n in required) for n, p in schema.get("properties", {}).items() if n != "metadata"]


def text_field(fields: list[tuple[str, bool, bool]], chosen: str, what: str) -> str:
    """The field the turn's text fills: `chosen` (env.openenv.action_field), else the one text
    field when every other field is optional, else the one required field when it is text;
    ConfigError naming the fields otherwise."""
    names = [n for n, _, _ in fields]
    shown = ", ".join(f"{n} ({'text' if t else 'not text'}{', required' if r else ''})" for n, t, r in fields)
    if chosen:
        if chosen not in names:
            raise ConfigError(f"env.openenv.action_field: {what} has no field {chosen!r}; its fields: "
                              f"{shown or 'none'}")
        return chosen
    texts = [n for n, t, _ in fields if t]
    required = [(n, t) for n, t, r in fields if r]
    if len(texts) == 1 and all(n == texts[0] for n, _ in required):
        return texts[0]
    if len(required) == 1 and required[0][1]:
        return required[0][0]
    raise ConfigError(f"{what} has fields {shown or 'none'} (metadata aside): the turn's text fills one text "
                      "field; set env.openenv.action_field, or env.openenv.parse_action")


def step_action_class(cls: type) -> type | None:
    """The Action class of an Environment class: the annotation of its `step`'s first parameter
    after self, else the first argument of an `Environment[Action, Observation, State]` base."""
    try:
        params = list(inspect.signature(cls.step).parameters.values())[1:]
        hints = typing.get_type_hints(cls.step)
    except Exception:
        params, hints = [], {}
    found = hints.get(params[0].name) if params else None
    if inspect.isclass(found):
        return found
    for base in getattr(cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and inspect.isclass(args[0]):
            return args[0]
    return None


@dataclass(frozen=True)
class Actions:
    """How a turn becomes an action: `field` filled with the turn's text and `build` applied (the
    Action class in this process; a server takes the dict), or `parse` (parse_action)."""

    field: str | None
    build: Callable[[dict], Any]
    parse: Callable[[str], Any] | None = None

    def __call__(self, turn: str) -> Any:
        """The action of `turn`; None: the episode is over (parse_action said so)."""
        if self.parse is None:
            return self.build({self.field: turn})
        value = self.parse(turn)
        if value is None or not isinstance(value, dict):
            return value
        return self.build(value)


def as_fields(value: Any) -> dict:
    """An Action or Observation (pydantic model, dataclass, dict, object) as a dict of its fields."""
    if isinstance(value, dict):
        return dict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if hasattr(value, "__dict__"):
        return dict(vars(value))
    raise TypeError(f"the environment returned {type(value).__name__}; expected an Observation")


# ---- an Observation -> the next message ------------------------------------------------------

@dataclass(frozen=True)
class Renderer:
    """How an Observation's fields become a message (see the module docstring)."""

    field: str = ""  # env.openenv.observation_field
    render: Callable[[dict], Any] | None = None  # env.openenv.render
    chat: bool = False  # env.observation_format=chat

    def text(self, fields: dict) -> str | dict | None:
        """The observation's content (fields without done, reward and metadata): text, or what
        `render` returns (text, a chat message, None)."""
        if self.render is not None:
            return self.render(fields)
        if self.field:
            if self.field not in fields:
                raise KeyError(f"the observation has no field {self.field!r} "
                               f"(env.openenv.observation_field); it has {', '.join(fields) or 'none'}")
            value = fields[self.field]
        elif not fields:
            return None
        elif len(fields) == 1:
            value = next(iter(fields.values()))
        else:
            value = fields
        return value if isinstance(value, str) else json.dumps(value, default=str)

    def step(self, observation: Any) -> EnvStep:
        """The `EnvStep` of an Observation: the message, its reward and done."""
        fields = as_fields(observation)
        done, reward = fields.pop("done", False), fields.pop("reward", None)
        fields.pop("metadata", None)
        content = self.text(fields)
        if isinstance(content, str):
            content = {"role": "user", "content": content} if self.chat else f"\n{content}\n"
        return EnvStep(observation=content, reward=float(reward) if isinstance(reward, bool) else reward,
                       done=done)

    def prompt(self, example: Example, observation: Any) -> Example | None:
        """`example` with the reset observation's text appended to its last user message (None:
        there is none to append)."""
        fields = {k: v for k, v in as_fields(observation).items() if k not in RESERVED}
        content = self.text(fields)
        if isinstance(content, dict):
            content = content.get("content")
        if not isinstance(content, str) or not content.strip():
            return None
        return dataclasses.replace(example, prompt=append_to_prompt(example.prompt, content, "\n\n"))


def reset_kwargs(example: Example) -> dict[str, Any]:
    """What `reset` gets: `seed` (`example_seed`) and a record's `extra_info.reset` mapping."""
    extra = example.meta.get("reset", {})
    if not isinstance(extra, dict):
        raise ValueError(f"extra_info.reset must be a mapping of reset's keyword arguments, got {extra!r}")
    return {"seed": example_seed(example), **extra}


def loaded(key: str, target: str) -> Callable[..., Any] | None:
    """The function of `env.openenv.<key>` (None when unset); ConfigError when it cannot load."""
    if not target:
        return None
    try:
        return load_target(target)
    except Exception as err:
        raise ConfigError(f"env.openenv.{key}: cannot load {target!r}: {type(err).__name__}: {err}") from None


# ---- in this process: env.fn ------------------------------------------------------------------

class OpenEnvEpisode:
    """One episode of an OpenEnv Environment class, built at `reset`."""

    def __init__(self, make: Callable[[], Any], actions: Actions, renderer: Renderer, show_reset: bool,
                 stop_strings: tuple[str, ...]):
        self.make, self.actions, self.renderer, self.show_reset = make, actions, renderer, show_reset
        self.stop_strings = stop_strings
        self.env: Any = None

    def reset(self, example: Example) -> Example | None:
        self.env = self.make()
        reset = self.env.reset
        observation = reset(**accepted(reset, reset_kwargs(example)))
        return self.renderer.prompt(example, observation) if self.show_reset else None

    def step(self, turn: str) -> EnvStep:
        action = self.actions(turn)
        if action is None:
            return EnvStep(done=True)
        return self.renderer.step(self.env.step(action))

    def end(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def detect_openenv(cls: type) -> bool:
    """An OpenEnv Environment: a subclass of the package's base class where it is installed, or
    a class with `reset`, `step` and a `state` property (duck typing, without the package)."""
    base = openenv_base()
    if base is not None and issubclass(cls, base):
        return True
    return isinstance(inspect.getattr_static(cls, "state", None), property) and has_method(cls, "reset") \
        and has_method(cls, "step")


@ENV_FORMATS.register("openenv", doc="OpenEnv's Environment: reset(seed, episode_id) -> Observation, "
                                     "step(Action) -> Observation, a state property",
                      needs="reset(seed=None, episode_id=None), step(action) and a state property",
                      detect=detect_openenv)
def openenv_environment(cls: type, cfg: EnvConfig) -> EnvSpec:
    """The spec of an OpenEnv Environment class, checked now (see the module docstring)."""
    o, where = cfg.openenv, f"env.fn={cfg.fn}"
    missing = [m for m in ("reset", "step") if not has_method(cls, m)]
    if missing:
        raise ConfigError(f"{where}: {cls.__name__} has no {' or '.join(missing)}; an OpenEnv Environment "
                          "implements reset(), step(action) and a state property")
    if not getattr(cls, "SUPPORTS_CONCURRENT_SESSIONS", True):
        raise ConfigError(f"{where}: {cls.__name__}.SUPPORTS_CONCURRENT_SESSIONS is False: OpenEnv runs "
                          "it one session at a time (its server refuses max_concurrent_envs > 1), and a run "
                          "plays the rollout.n episodes of a prompt at once, each with an instance of its "
                          "own; set it True if instances share no state")
    if getattr(cls, "REQUIRES_SINGLE_THREAD_EXECUTOR", False):
        raise ConfigError(f"{where}: {cls.__name__}.REQUIRES_SINGLE_THREAD_EXECUTOR: its steps must run on "
                          "one thread, and an episode's steps run on the episode loop's worker threads; "
                          "serve it (OpenEnv's create_app) and train against env.name=openenv env.url=...")
    try:
        sample = cls()
    except Exception as err:
        raise ConfigError(f"{where}: building {cls.__name__}() failed (OpenEnv's server builds it with no "
                          f"arguments too): {type(err).__name__}: {err}") from None
    if callable(getattr(sample, "close", None)):
        sample.close()
    parse = loaded("parse_action", o.parse_action)
    action_cls = loaded("action", o.action) or step_action_class(cls)
    field = None
    if parse is None:
        if action_cls is None:
            raise ConfigError(f"{where}: cannot tell {cls.__name__}'s Action class (step's action parameter "
                              "has no annotation); set env.openenv.action=module:Class, or "
                              "env.openenv.parse_action")
        try:
            fields = class_fields(action_cls)
        except TypeError as err:
            raise ConfigError(f"{where}: its Action {err}") from None
        field = text_field(fields, o.action_field, f"{where}: its Action {action_cls.__name__}")

    def build(values: dict) -> Any:
        if action_cls is None:
            raise ValueError("env.openenv.parse_action returned a dict, and the Action class is unknown: set "
                             "env.openenv.action")
        return action_cls(**values)

    renderer = Renderer(o.observation_field, loaded("render", o.render), cfg.observation_format == "chat")
    stops = tuple(o.stop_strings)
    make = functools.partial(OpenEnvEpisode, cls, Actions(field, build, parse), renderer, o.reset_observation,
                             stops)
    return EnvSpec(cfg.fn, make, stops, cfg, chat_roles=("user",) if renderer.chat else ())
