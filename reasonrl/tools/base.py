"""Calling a tool: one signature for every tool, arguments checked, every call timed and counted.

A tool is a function `call(arguments, limits) -> Observation` registered in `TOOLS`
(`reasonrl.registry`, config key `env.tools`): `arguments` is what the model wrote, the raw
text of the call or the JSON object of a chat template's tool call. A tool answers bad
arguments with an error observation; `call_tool` adds what a caller needs around any tool:
the name looked up, the seconds measured, an exception turned into an error observation, the
call counted in a `ToolStats`. Nothing a model writes can make a call raise.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reasonrl.errors import ConfigError
from reasonrl.registry import TOOLS
from reasonrl.tools.sandbox import Limits, Observation

ToolFn = Callable[[Any, Limits], Observation]


class ToolArgumentError(ValueError):
    """A tool call's arguments are not what the tool takes; the message says what it takes."""


def text_argument(arguments: Any, key: str, *, max_chars: int) -> str:
    """The one text argument of a tool: `arguments` itself when it is a string, else the string
    under `key` of a JSON object ({key: "..."}, nothing else). ToolArgumentError otherwise."""
    if isinstance(arguments, dict):
        extra = sorted(str(k) for k in arguments if k != key)
        if key not in arguments:
            raise ToolArgumentError(f'arguments must be text or {{"{key}": "..."}}; got an object with '
                                    f"keys {extra}")
        if extra:
            raise ToolArgumentError(f'arguments must be {{"{key}": "..."}} only; unexpected keys {extra}')
        arguments = arguments[key]
    if not isinstance(arguments, str):
        raise ToolArgumentError(f'arguments must be text or {{"{key}": "..."}}; '
                                f"got {type(arguments).__name__}")
    if not arguments.strip():
        raise ToolArgumentError(f"{key} is empty")
    if len(arguments) > max_chars:
        raise ToolArgumentError(f"{key} too long: {len(arguments)} characters (at most {max_chars})")
    return arguments


@dataclass
class ToolStats:
    """Counts of tool calls, thread-safe, for a caller that wants them (the episode loop counts
    its own for the `env/tool_*` metrics, per episode). `errors` counts
    every call that came back with an error, timeouts included; `timeouts` those the
    wall-clock limit ended."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    seconds: float = 0.0
    by_tool: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, name: str, observation: Observation) -> None:
        """Count one call of tool `name` that gave `observation`."""
        with self._lock:
            self.calls += 1
            self.errors += observation.error is not None
            self.timeouts += observation.timed_out
            self.seconds += observation.seconds
            self.by_tool[name] = self.by_tool.get(name, 0) + 1

    def as_dict(self) -> dict[str, float]:
        """{"calls", "errors", "timeouts", "seconds"} as numbers."""
        with self._lock:
            return {"calls": self.calls, "errors": self.errors, "timeouts": self.timeouts,
                    "seconds": self.seconds}


def call_tool(name: str, arguments: Any, limits: Limits | None = None,
              stats: ToolStats | None = None) -> Observation:
    """Call tool `name` with `arguments` under `limits` and return its observation, timed
    (`seconds` is the whole call) and counted in `stats`. Never raises: an unknown name, bad
    arguments, a tool that raises, or an in-process tool's call that outlives `limits.timeout`
    (it cannot be interrupted; its answer is then discarded) come back as errors. Sandboxed
    tools enforce the timeout themselves, by killing the process group."""
    limits = limits or Limits()
    start = time.monotonic()
    in_process = False
    try:
        tool: ToolFn = TOOLS.get(name)
    except ConfigError:
        observation = Observation(error=f"unknown tool {name!r}; tools: {', '.join(TOOLS.names())}")
    else:
        in_process = not TOOLS[name].sandboxed
        try:
            observation = tool(arguments, limits)
            if not isinstance(observation, Observation):
                observation = Observation(error=f"tool {name!r} returned {type(observation).__name__}, "
                                                f"not an Observation")
        except Exception as err:  # a tool bug must not end an episode, let alone a run
            observation = Observation(error=f"tool {name!r} failed: {type(err).__name__}: {err}")
    seconds = time.monotonic() - start
    if in_process and seconds > limits.timeout and not observation.timed_out:
        observation = Observation(error=f"timed out after {limits.timeout:g} s (wall clock)", timed_out=True,
                                  exit_code=observation.exit_code)
    observation = dataclasses.replace(observation, seconds=seconds)
    if stats is not None:
        stats.record(name, observation)
    return observation
