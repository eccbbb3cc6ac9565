"""Gym-style text environments (`env.fn=file.py:Class`, `env.format=skyrl|gymnasium` or
detected): a class written for SkyRL-Gym or Gymnasium trains here unchanged, neither installed.

**SkyRL-Gym** (`skyrl_gym/envs/base_text_env.py`: `BaseTextEnv`, `BaseTextEnvStepOutput`;
`skyrl_gym/core.py`: `Env`; built by `skyrl/train/generators/skyrl_gym_generator.py` as
`skyrl_gym.make(env_class, env_config=..., extras=row)`, the row being the dataset record
less its prompt and `env_class`, plus `max_turns`):

- the class is built per episode as `Class(env_config={}, extras=row)` (or `Class()` when its
  constructor takes neither), the row holding the record's `extra_info` fields, `data_source`,
  `extra_info`, `reward_spec = {"method": "rule", "ground_truth": ...}` (SkyRL's dataset layout)
  and `max_turns = env.max_turns`;
- `init(prompt)` gets the prompt as chat messages and returns `(prompt, metadata)`: a prompt
  it changed is the episode's (rendered again; `reasonrl.envs.base`: reset returns an `Example`);
- `step(action)` gets the turn's text and returns a `BaseTextEnvStepOutput` dict:
  `observations` (chat messages, rendered by the chat template after the model's turn; [] adds
  nothing), `reward` (summed over the episode, added to the task reward), `done`, `metadata`
  (kept nowhere). A `postprocessed_action` is not applied: reasonrl trains on the ids the model
  sampled (SkyRL itself warns that it breaks token-in/token-out); the turn's log says so;
- `close()` when the episode is over (`end()`).

**Gymnasium** (`gymnasium.Env`: `reset(*, seed=None, options=None) -> (observation, info)`,
`step(action) -> (observation, reward, terminated, truncated, info)`, `close()`):

- the class is built per episode with no arguments; `reset` gets `seed` (a hash of the
  example's prompt and ground truth, so the `rollout.n` episodes of a prompt start from the
  same state, and a rerun from the same one) and `options` (the example's row, as for TRL:
  `adapters.example_row`), each only where its signature takes it. A text observation it returns
  is appended to the prompt's last user message after a blank line;
- `step(action)` gets the turn's text; the 5-tuple's observation (text) is the next user
  message, `reward` is summed, `terminated or truncated` ends the episode. The environment's
  `truncated` (its own time limit) is not reasonrl's `truncated`, which marks a model turn cut
  by a token limit (the overlong penalty and `algo.mask_truncated` read it);
- `close()` when the episode is over.

Refused, each in one line: at start-up a class that does not build the way its style builds
it, lacks its style's methods, or whose `step` takes no action; while running (an error
observation, counted in `env/step_errors`, as for any environment): a step answer of the wrong
shape (a 4-tuple: gym's old API; a non-text observation; a reward that is no finite number).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import inspect
import json
from typing import Any

from reasonrl.batch import Example
from reasonrl.config import EnvConfig
from reasonrl.envs.adapters import (
    accepted,
    append_to_prompt,
    as_reward,
    example_row,
    has_method,
    parameters,
    required_positional,
    run,
    takes_var_keyword,
)
from reasonrl.envs.base import BadStep, EnvSpec, EnvStep, public_methods
from reasonrl.errors import ConfigError
from reasonrl.registry import ENV_FORMATS

SEED_BOUND = 2**31 - 1  # Gymnasium seeds numpy's generator: a non-negative int


def chat_prompt(prompt: str | list[dict[str, str]]) -> list[dict[str, str]]:
    """A prompt as chat messages (a plain prompt is one user message)."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def example_seed(example: Example) -> int:
    """The `seed` Gymnasium's `reset` gets for `example`: the first 8 bytes of BLAKE2b of its
    prompt and ground truth (JSON) mod 2**31 - 1. The same for the n episodes of a prompt, and
    for a rerun, so a group of episodes starts from one state."""
    text = json.dumps([example.prompt, example.ground_truth], sort_keys=True)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % SEED_BOUND


def _check_builds(cls: type, where: str, style: str, **kwargs: Any) -> None:
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as err:
        built = f"{cls.__name__}({', '.join(f'{k}=...' for k in kwargs)})"
        raise ConfigError(f"{where}: {style} builds {built}: {err}") from None
    except ValueError:
        pass


def _check_action(cls: type, where: str, style: str) -> None:
    if parameters(cls.step) == []:
        raise ConfigError(f"{where}: {cls.__name__}.step takes no action; {style}'s step(action) gets the "
                          "model's turn")


# ---- SkyRL-Gym --------------------------------------------------------------------------------

def skyrl_kwargs(cls: type) -> bool:
    """Whether the class's constructor takes SkyRL's (env_config, extras) (else: no arguments)."""
    if cls.__init__ is object.__init__:
        return False
    params = parameters(cls.__init__) or []
    return any(p.name == "extras" for p in params) or takes_var_keyword(params)


class SkyRLEnvironment:
    """One episode of a SkyRL-Gym text environment (see the module docstring)."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, cls: type, max_turns: int):
        self.cls, self.max_turns, self.env = cls, max_turns, None

    def reset(self, example: Example) -> Example | None:
        """Build the class with the example as its `extras`, then `init(prompt)`."""
        row = {k: v for k, v in example.meta.items() if k != "origin"}
        row.update(data_source=example.data_source, extra_info=dict(row), max_turns=self.max_turns,
                   reward_spec={"method": "rule", "ground_truth": example.ground_truth})
        self.env = self.cls(env_config={}, extras=row) if skyrl_kwargs(self.cls) else self.cls()
        prompt = chat_prompt(example.prompt)
        out = run(self.env.init, copy.deepcopy(prompt))
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f"init returned {type(out).__name__}; SkyRL's init returns (prompt, metadata)")
        new = out[0]
        if not isinstance(new, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                and isinstance(m.get("content"), str) for m in new):
            raise TypeError("init's prompt is not a list of chat messages {'role': str, 'content': str}")
        if new == prompt:
            return None
        return dataclasses.replace(example, prompt=[{"role": m["role"], "content": m["content"]}
                                                    for m in new])

    def step(self, turn: str) -> EnvStep:
        """`step(action)`'s `BaseTextEnvStepOutput` as an EnvStep."""
        out = run(self.env.step, turn)
        if not isinstance(out, dict) or not {"observations", "reward", "done"} <= set(out):
            shown = sorted(out) if isinstance(out, dict) else type(out).__name__
            raise BadStep(f"step returned {shown}; SkyRL's step returns a BaseTextEnvStepOutput dict with "
                          "observations, reward, done (and metadata)")
        observations = out["observations"]
        if not isinstance(observations, list):
            raise BadStep(f"step's observations is {type(observations).__name__}; SkyRL's is a list of chat "
                          "messages")
        done = out["done"]
        done = bool(done) if type(done).__name__ == "bool_" else done  # NumPy's bool; else as_step checks it
        note = None
        if out.get("postprocessed_action") is not None:
            note = "postprocessed_action not applied: reasonrl trains on the ids the model sampled"
        return EnvStep(observation=observations or None, reward=as_reward(out["reward"], "step's reward"),
                       done=done, error=note)

    def end(self) -> None:
        """`close()`: the episode is over."""
        if self.env is not None and has_method(type(self.env), "close"):
            run(self.env.close)


def detect_skyrl(cls: type) -> bool:
    """A SkyRL-Gym class: it has `init` and `step`."""
    return has_method(cls, "init") and has_method(cls, "step")


@ENV_FORMATS.register("skyrl", doc="SkyRL-Gym's BaseTextEnv: init(prompt) -> (prompt, metadata), "
                                   "step(action) -> {observations, reward, done, metadata}",
                      needs="init(prompt) and step(action)", detect=detect_skyrl)
def skyrl_environment(cls: type, cfg: EnvConfig) -> EnvSpec:
    """The spec of a SkyRL-Gym class, checked now (its methods, its constructor's arguments)."""
    where = f"env.fn={cfg.fn}"
    missing = [m for m in ("init", "step") if not has_method(cls, m)]
    if missing:
        raise ConfigError(f"{where}: {cls.__name__} has no {' or '.join(missing)}; a SkyRL-Gym environment "
                          f"implements init(prompt) and step(action) (it has: "
                          f"{', '.join(public_methods(cls)) or 'no public method'})")
    if skyrl_kwargs(cls):
        _check_builds(cls, where, "SkyRL", env_config={}, extras={})
    else:
        _check_builds(cls, where, "SkyRL")
    _check_action(cls, where, "SkyRL")

    def make() -> SkyRLEnvironment:
        return SkyRLEnvironment(cls, cfg.max_turns)

    return EnvSpec(cfg.fn, make, (), cfg, chat_roles=("user",))


# ---- Gymnasium --------------------------------------------------------------------------------

class GymnasiumEnvironment:
    """One episode of a Gymnasium environment over text (see the module docstring)."""

    stop_strings: tuple[str, ...] = ()

    def __init__(self, cls: type):
        self.env = cls()

    def reset(self, example: Example) -> Example | None:
        """`reset(seed=..., options=row)`; its text observation joins the prompt."""
        reset = self.env.reset
        out = run(reset, **accepted(reset, {"seed": example_seed(example), "options": example_row(example)}))
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f"reset returned {type(out).__name__}; Gymnasium's reset returns "
                            "(observation, info)")
        observation = out[0]
        if observation is None or observation == "":
            return None
        if not isinstance(observation, str):
            raise TypeError(f"reset's observation is {type(observation).__name__}; a text environment's "
                            "is text")
        return dataclasses.replace(example, prompt=append_to_prompt(example.prompt, observation, "\n\n"))

    def step(self, turn: str) -> EnvStep:
        """`step(action)`'s 5-tuple as an EnvStep: the observation is the next user message."""
        out = run(self.env.step, turn)
        if not isinstance(out, tuple) or len(out) != 5:
            size = f"a tuple of {len(out)} items" if isinstance(out, tuple) else type(out).__name__
            old = " (gym's old API: observation, reward, done, info)" \
                if isinstance(out, tuple) and len(out) == 4 else ""
            raise BadStep(f"step returned {size}{old}; Gymnasium's step returns (observation, reward, "
                          "terminated, truncated, info)")
        observation, reward, terminated, truncated, _info = out
        if observation is not None and not isinstance(observation, str):
            raise BadStep(f"step's observation is {type(observation).__name__}; a text environment's is text")
        done = bool(terminated) or bool(truncated)
        message = {"role": "user", "content": observation} if observation else None
        return EnvStep(observation=message, reward=as_reward(reward, "step's reward"), done=done)

    def end(self) -> None:
        """`close()`: the episode is over."""
        if has_method(type(self.env), "close"):
            run(self.env.close)


def detect_gymnasium(cls: type) -> bool:
    """A Gymnasium class: it has `step`, and a `reset` that needs no positional argument and
    takes `seed` (or `**kwargs`), as `gymnasium.Env.reset(*, seed=None, options=None)` does."""
    if not (has_method(cls, "step") and has_method(cls, "reset")):
        return False
    params = parameters(cls.reset)
    return params is not None and not required_positional(params) and \
        (any(p.name == "seed" for p in params) or takes_var_keyword(params))


@ENV_FORMATS.register("gymnasium", doc="Gymnasium's Env over text: reset(seed, options) -> (obs, info), "
                                       "step(action) -> (obs, reward, terminated, truncated, info)",
                      needs="reset(seed=None, options=None) and step(action)", detect=detect_gymnasium)
def gymnasium_environment(cls: type, cfg: EnvConfig) -> EnvSpec:
    """The spec of a Gymnasium class, checked now: it builds with no arguments, has `reset`
    (needing no positional argument) and `step(action)`."""
    where = f"env.fn={cfg.fn}"
    missing = [m for m in ("reset", "step") if not has_method(cls, m)]
    if missing:
        raise ConfigError(f"{where}: {cls.__name__} has no {' or '.join(missing)}; a Gymnasium environment "
                          f"implements reset(seed=None, options=None) and step(action) (it has: "
                          f"{', '.join(public_methods(cls)) or 'no public method'})")
    _check_builds(cls, where, "the Gymnasium adapter")
    params = parameters(cls.reset)
    if params is not None and required_positional(params):
        raise ConfigError(f"{where}: {cls.__name__}.reset needs {', '.join(required_positional(params))}; "
                          "Gymnasium's reset(seed=None, options=None) needs no argument")
    _check_action(cls, where, "Gymnasium")
    try:
        cls()
    except Exception as err:
        raise ConfigError(f"{where}: building {cls.__name__}() failed: {type(err).__name__}: {err}") from None

    def make() -> GymnasiumEnvironment:
        return GymnasiumEnvironment(cls)

    return EnvSpec(cfg.fn, make, (), cfg, chat_roles=("user",))
