"""The `env.agent` section: an agent program as the environment (`env.format=agent`), either a
Python callable `agent(client, task) -> reward | None` named by `env.fn`, or a command run per
episode (`env.agent.command`), each talking to the rollout engine through the OpenAI-compatible
endpoint. The rules across their keys. Docs: docs/agents.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from reasonrl.config.fields import param
from reasonrl.errors import ConfigError


@dataclass
class AgentConfig:
    # instead of env.fn: a command run once per episode (split like a shell line, no shell), with
    # OPENAI_BASE_URL (the episode's route), OPENAI_API_KEY and REASONRL_TASK (the task as JSON) in its
    # environment and the task as JSON on its stdin; the last line of its stdout, a number or null, is
    # its reward (null or nothing: the reward function scores the final answer)
    command: str = ""
    timeout: float = param(120.0, gt=0)  # seconds per episode; past it the episode fails (timeout)
    concurrency: int = param(8, ge=1)  # episodes that run at once
    # a failed episode (it raised, timed out, called no model, sent a request the endpoint refused):
    # zero = its reward is 0 (trained like any other); drop = no reward, advantage 0, outside its group's
    # statistics (as an unscored completion)
    on_failure: Literal["zero", "drop"] = "zero"
    # true: the endpoint refuses a call that the policy version the rollout started with would not
    # serve (on-policy); false: calls are served by whatever version is loaded and tagged with it
    pin_version: bool = True


def agent_rules(fn: str, style: str, name: str, a: AgentConfig) -> None:
    """env.format=agent needs exactly one of env.fn (a callable) and env.agent.command; env.agent.*
    keys need env.format=agent."""
    default = AgentConfig()
    changed = [f"env.agent.{k}" for k, v in vars(a).items() if v != getattr(default, k)]
    if style != "agent":
        if changed:
            raise ConfigError(f"{', '.join(changed)}: set, but they configure an agent program: "
                              "env.format=agent with env.fn=module:function or env.agent.command")
        return
    if name != "none":
        raise ConfigError(f"env.format=agent: an agent program is its own environment; remove "
                          f"env.name={name}")
    if bool(fn) == bool(a.command.strip()):
        raise ConfigError("env.format=agent: set one of env.fn (a function agent(client, task), "
                          "module:function or path/file.py:function) and env.agent.command (a command run "
                          "per episode)" + (", not both" if fn else ""))
