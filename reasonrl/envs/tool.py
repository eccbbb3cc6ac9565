"""The tool environment (`env.name=tool`): the model calls the tools of `env.tools`, each
call's result is the next observation, and a turn without a call is the model's answer.

How the model calls (`env.call_format`):
- `tags`: `<calculator>347 * 29</calculator>`, `<python>print(2 ** 10)</python>`. The closing
  tags are the stop strings: the engine ends the turn right after one. The turn's last complete
  call runs.
- `tool_call`: the chat templates' tool-call block (Hermes, Qwen2.5):
  `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>`, stopping at
  `</tool_call>`; `arguments` may also be a JSON string (OpenAI's form).

How the result comes back (`env.observation_format`):
- `tagged`: `<output>\\n...\\n</output>\\n` appended inside the model's turn (models without a
  tool template);
- `chat`: a `tool` message rendered by the tokenizer's chat template, then the generation prompt.

Calls go through `reasonrl.tools.call_tool` (never raises; calculator parsed, python in the
sandbox). A failed call (refused arguments, an exception, a timeout, an unknown tool) comes back
as its output and an `error: ...` line, and is counted (`EnvStep.error`, `timed_out`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from reasonrl.batch import Example
from reasonrl.config import EnvConfig
from reasonrl.envs.base import EnvStep
from reasonrl.errors import ConfigError
from reasonrl.registry import ENVIRONMENTS, TOOLS
from reasonrl.tools import Limits, call_tool, sandbox_plan

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)
_FENCE = re.compile(r"^\s*```[A-Za-z0-9_+-]*[ \t]*\n(.*?)\n?```\s*$", re.S)


def parse_tag_call(turn: str, tools: Sequence[str]) -> tuple[str, str] | None:
    """The turn's last complete `<name>arguments</name>` call of one of `tools` as (name, text),
    the text stripped and without a Markdown code fence; None when there is none."""
    pattern = re.compile("<(" + "|".join(re.escape(t) for t in tools) + r")>(.*?)</\1>", re.S)
    matches = list(pattern.finditer(turn))
    if not matches:
        return None
    found = matches[-1]
    text = found.group(2).strip()
    fenced = _FENCE.match(text)
    return found.group(1), (fenced.group(1) if fenced else text)


def parse_tool_call(turn: str) -> tuple[str, Any] | str | None:
    """The turn's last `<tool_call>{"name": ..., "arguments": ...}</tool_call>` as (name,
    arguments); a string saying why when the block is there but malformed; None when there is none."""
    blocks = _TOOL_CALL.findall(turn)
    if not blocks:
        return None
    try:
        call = json.loads(blocks[-1])
    except ValueError as err:
        return f"the tool call is not JSON: {err}"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'the tool call must be a JSON object {"name": ..., "arguments": {...}}'
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # OpenAI's form: the arguments as a JSON string
        try:
            decoded = json.loads(arguments)
        except ValueError:
            decoded = None
        arguments = decoded if isinstance(decoded, dict) else arguments
    return call["name"], arguments


class ToolEnvironment:
    """One episode of tool use (see the module docstring). Stateless between turns: each call
    runs on its own (the python tool in a fresh sandbox)."""

    def __init__(self, tools: Sequence[str], call_format: str = "tags", observation_format: str = "tagged",
                 limits: Limits | None = None):
        unknown = [t for t in tools if t not in TOOLS]
        if unknown or not tools:
            raise ConfigError(f"env.tools: unknown tool(s) {unknown} or none given; tools: "
                              f"{', '.join(TOOLS.names())}")
        if call_format not in ("tags", "tool_call") or observation_format not in ("tagged", "chat"):
            raise ConfigError(f"env.call_format / env.observation_format: {call_format!r} / "
                              f"{observation_format!r}; allowed: tags, tool_call / tagged, chat")
        self.tools, self.call_format, self.observation_format = tuple(tools), call_format, observation_format
        self.limits = limits or Limits()
        self.stop_strings = (tuple(f"</{t}>" for t in self.tools) if call_format == "tags"
                             else (TOOL_CALL_CLOSE,))

    def reset(self, example: Example) -> None:
        """Nothing to set up: the example's prompt says what to do."""

    def step(self, turn: str) -> EnvStep:
        """Run the turn's call and answer with its result; no call: the episode is over."""
        if self.call_format == "tags":
            parsed: tuple[str, Any] | str | None = parse_tag_call(turn, self.tools)
        else:
            parsed = parse_tool_call(turn)
        if parsed is None:
            return EnvStep(done=True)
        if isinstance(parsed, str):  # a malformed call: counted, answered with why
            return EnvStep(observation=self.render(f"error: {parsed}"), call=TOOL_CALL_OPEN, error=parsed)
        name, arguments = parsed
        shown = arguments if isinstance(arguments, str) else json.dumps(arguments)
        if name not in self.tools:
            error = f"unknown tool {name!r}; tools: {', '.join(self.tools)}"
            return EnvStep(observation=self.render(f"error: {error}"), call=f"{name}: {shown}", error=error)
        result = call_tool(name, arguments, self.limits)
        text = result.output.rstrip("\n")
        if result.error is not None:
            text = f"{text}\nerror: {result.error}" if text else f"error: {result.error}"
        return EnvStep(observation=self.render(text), call=f"{name}: {shown}", error=result.error,
                       timed_out=result.timed_out)

    def render(self, text: str) -> str | dict:
        """A call's result as the observation of `observation_format`."""
        if self.observation_format == "chat":
            return {"role": "tool", "content": text}
        return f"<output>\n{text}\n</output>\n"


def check_tools(cfg: EnvConfig) -> None:
    """At start-up: the sandbox the python tool asks for works here (`sandbox_plan`: a
    SandboxError saying what to install otherwise), and prints which one runs the code."""
    if "python" in cfg.tools:
        sandbox_plan(cfg.sandbox)


@ENVIRONMENTS.register("tool", doc="the model calls env.tools (calculator, python); a turn without a call "
                                   "is its answer", check=check_tools)
def tool_environment(cfg: EnvConfig) -> ToolEnvironment:
    """A tool environment with the `env` section's tools, formats and tool limits."""
    limits = Limits(timeout=cfg.tool_timeout, memory_mb=cfg.tool_memory_mb, disk_mb=cfg.tool_disk_mb,
                    sandbox=cfg.sandbox)
    return ToolEnvironment(cfg.tools, cfg.call_format, cfg.observation_format, limits)
