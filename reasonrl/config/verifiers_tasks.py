"""The `data.verifiers` section: a taskset of the `verifiers` package (PrimeIntellect; its v1
API, `verifiers.v1`) as a run's data (`data.task=verifiers`) and its `@vf.reward` functions as
the `correct` reward (`reward.task=verifiers`), and the rules across their keys. Not to be
confused with reasonrl's own answer checkers (`reasonrl.rewards.verifiers`, `reward.task`'s
other values). Docs: docs/env-verifiers.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from reasonrl.config.fields import param
from reasonrl.errors import ConfigError


@dataclass
class VerifiersConfig:
    # an installed taskset's id (as verifiers' `--env.taskset.id`: reverse-text), or its Taskset class,
    # module:Class or path/file.py:Class
    taskset: str = ""
    # the taskset's config fields (its TasksetConfig), e.g. {dataset_split: train}
    args: dict[str, Any] = param({})
    # the held-out tasks: the same taskset with these fields changed ({dataset_split: test}); {} = none
    val_args: dict[str, Any] = param({})
    limit: int = param(0, ge=0)  # read at most this many tasks (0 = all; an INFINITE taskset needs one)
    # who plays a task: reasonrl, as verifiers' null harness (reply: its prompt, one reply, its rewards of the
    # transcript), or verifiers' own rollout (verifiers: setup, tools, hooks, runtime rewards) as an agent
    # episode (env.format=agent, env.fn=reasonrl.envs.verifiers_agent:agent)
    rollout: Literal["reply", "verifiers"] = "reply"


AGENT = "reasonrl.envs.verifiers_agent:agent"  # the agent function that plays verifiers' own rollout


def verifiers_rules(task: str, v: VerifiersConfig, reward_task: str, reward_fn: str, env_format: str = "auto",
                    env_fn: str = "") -> None:
    """data.verifiers.* only with data.task=verifiers, which needs a taskset and is scored by it;
    verifiers' own rollout (data.verifiers.rollout=verifiers) is played as an agent episode by
    `AGENT`, which plays nothing else."""
    plays = env_format == "agent" and env_fn == AGENT
    if plays and (task != "verifiers" or v.rollout != "verifiers"):
        raise ConfigError(f"env.fn={AGENT}: it plays verifiers' own rollout of a verifiers taskset's tasks: "
                          "set data.task=verifiers and data.verifiers.rollout=verifiers")
    default = VerifiersConfig()
    changed = [f"data.verifiers.{k}" for k, value in vars(v).items() if value != getattr(default, k)]
    if task != "verifiers":
        if changed:
            raise ConfigError(f"{', '.join(changed)}: set, but data.task={task}; they configure "
                              "data.task=verifiers")
        return
    if not v.taskset:
        raise ConfigError("data.verifiers.taskset: required when data.task=verifiers: an installed taskset "
                          "id (reverse-text) or its Taskset class, module:Class or path/file.py:Class")
    if reward_task != "verifiers" and not reward_fn:
        raise ConfigError(f"reward.task: {reward_task}, but data.task=verifiers is scored by its taskset's "
                          "own rewards: set reward.task=verifiers")
    if v.rollout == "verifiers" and not plays:
        raise ConfigError("data.verifiers.rollout=verifiers: verifiers' own rollout runs as an agent "
                          f"episode: set env.format=agent and env.fn={AGENT} (got env.format={env_format}, "
                          f"env.fn={env_fn!r})")
