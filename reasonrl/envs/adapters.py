"""What the adapters of other frameworks' environment classes share (`trl_env.py`,
`gym_env.py`): the dataset row such a class is handed, a prompt with text appended to its
last user message, a call cut to what a user's method accepts, a method that may be a
coroutine, a reward checked, and where a method is defined (for one-line errors).

The adapters translate at the boundary: each wraps the user's class in an object of
reasonrl's own protocol (`reasonrl.envs.base`: `reset(example)`, `step(turn) -> EnvStep`,
`end()`), so the episode loop, its limits, timeouts, masks and metrics are the same for every
style and nothing inside learns their names.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any

from reasonrl.batch import Example
from reasonrl.rewards.scoring import MAX_ABS_REWARD


def example_row(example: Example) -> dict[str, Any]:
    """`example` as the dataset row other frameworks hand an environment: the record's extra
    fields (what reasonrl keeps of a record's `extra_info` / `meta`, its `origin` left out) at
    the top level, then `prompt`, `ground_truth` and `data_source`."""
    row = {k: v for k, v in example.meta.items() if k != "origin"}
    row.update(prompt=example.prompt, ground_truth=example.ground_truth, data_source=example.data_source)
    return row


def accepted(fn: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` cut to what `fn` accepts: all of them when it takes `**kwargs`, else those its
    parameters name (a class written for a dataset with other columns still gets its own)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # no signature to read: hand it everything
        return dict(kwargs)
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return dict(kwargs)
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in kwargs.items() if k in names}


def run(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, awaited on an event loop of its own when it is a coroutine
    function (TRL's tools and `get_reward` may be async). Runs in the step's thread
    (`reasonrl.envs.run_calls`), which has no loop running."""
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        return asyncio.run(_await(value))
    return value


async def _await(value: Any) -> Any:
    return await value


def as_reward(value: Any, what: str) -> float | None:
    """A reward a user's method returned as a float (None stays None): a real number (NumPy's
    included), finite, within +-MAX_ABS_REWARD (as `reasonrl.envs.base.as_step` checks a
    step's); ValueError naming `what` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{what} returned {type(value).__name__} {value!r}; expected a number")
    reward = float(value)
    if not math.isfinite(reward) or abs(reward) > MAX_ABS_REWARD:
        raise ValueError(f"{what} returned {reward!r}; expected a finite number within +-{MAX_ABS_REWARD:g}")
    return reward


def append_to_prompt(prompt: str | list[dict[str, str]], text: str, separator: str = "") -> str | list[dict]:
    """`prompt` with `text` appended to its last user message (after `separator`); a plain
    prompt is that message. A prompt without a user message gets one."""
    if isinstance(prompt, str):
        return prompt + separator + text if prompt else text
    messages = [dict(m) for m in prompt]
    for message in reversed(messages):
        if message["role"] == "user":
            message["content"] = message["content"] + separator + text if message["content"] else text
            return messages
    return [*messages, {"role": "user", "content": text}]


def where_defined(fn: Any) -> str:
    """`file.py:line` of a function or method, for an error message ("?" where unknown)."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (OSError, TypeError):
        return "?"


def has_method(cls: type, name: str) -> bool:
    return callable(getattr(cls, name, None)) and not inspect.isclass(getattr(cls, name))


def parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """`fn`'s parameters (`self` skipped when `fn` is read off a class), None when unreadable."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return params[1:] if params and params[0].name == "self" else params


def required_positional(params: list[inspect.Parameter]) -> list[str]:
    return [p.name for p in params
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def takes_var_keyword(params: list[inspect.Parameter]) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in params)
