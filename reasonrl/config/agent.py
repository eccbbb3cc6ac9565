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
    # serve (on-policy; asynchronous: the batch's version, max(0, t - trainer.max_staleness)); false
    # (asynchronous training only): calls are served by whatever version is loaded and tagged with it.
    # Weights load between rollouts, never inside one, so neither refuses nor tags another version
    # unless a load breaks that; every call carries its version (agent/staleness_mean, _max)
    pin_version: bool = True


def agent_rules(fn: str, style: str, name: str, a: AgentConfig, staleness: int = 0, critic: str = "",
                gamma: float = 1.0, kl_in_reward: bool = False) -> None:
    """env.format=agent needs exactly one of env.fn (a callable) and env.agent.command; env.agent.*
    keys need env.format=agent. env.agent.pin_version=false needs asynchronous training
    (`staleness` = trainer.max_staleness > 0): on-policy, a call of another version would be trained
    as the step's. A critic estimator (`critic`: algo.advantage's name, "" for a group estimator)
    trains a split episode's sequences each as its own, ending with the episode's reward: right
    when the reward-to-go of every token is that reward (algo.gamma = 1, no KL in the reward); a
    sequence that ended before the episode did would otherwise miss the discount and the KL of the
    tokens sampled after it."""
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
    if not a.pin_version and staleness == 0:
        raise ConfigError("env.agent.pin_version=false: on-policy training (trainer.max_staleness=0) trains "
                          "every call as the step's policy version's, so it refuses calls of another; set "
                          "trainer.max_staleness >= 1 or remove env.agent.pin_version")
    if critic and (gamma != 1.0 or kl_in_reward):
        why = f"algo.gamma={gamma:g}" if gamma != 1.0 else "algo.beta > 0 with algo.kl_in=reward"
        raise ConfigError(f"algo.advantage={critic} with env.format=agent and {why}: a split episode's "
                          "earlier sequences end before the episode, so their returns would miss the "
                          "discount and KL of the tokens sampled after them; set algo.gamma=1 and "
                          "algo.kl_in=loss (or algo.beta=0)")
