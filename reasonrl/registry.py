"""Registries: every choice a config key makes is one entry of one registry.

A registry maps names (the values a config key allows) to what they select: an advantage
estimator, a loss aggregation, a KL estimator, an engine, a verifier, a reward component.
The module that implements a choice fills its registry with a decorator, next to the code:

    @ADVANTAGES.register("grpo", needs_groups=True)
    def grpo(rewards, group, std_eps): ...

and `reasonrl.config` checks a value against `ADVANTAGES.names()` at load time, so adding
an estimator is one decorated function (and its test): the config's allowed values, its
error messages and the dispatch all follow. verl's `register_adv_est` is the model, without
its indirection.

The registries are declared here, at the bottom of the package, so that the config (which
imports only this and `errors`) can name them. Each one knows the module that fills it
(`homes`); asking for its names or an entry imports those modules, once. That is the only
import by name in the package: it keeps the config below the code it configures.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from reasonrl.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Any  # the function or class this name selects
    info: dict[str, Any] = field(default_factory=dict)  # what callers ask about it (needs_groups, ...)
    doc: str = ""  # one line: what it is, for error messages and --help


class Registry:
    def __init__(self, key: str, *homes: str):
        self.key = key  # the config key whose values this registry holds, e.g. "algo.advantage"
        self.homes = homes  # the modules that register the entries
        self._entries: dict[str, Entry] = {}
        self._loaded = False

    def register(self, name: str, doc: str = "", **info: Any) -> Callable[[Any], Any]:
        """Decorator: `fn` is selected by `name`; `info` is what callers may ask of it."""
        def add(fn: Any) -> Any:
            if name in self._entries and self._entries[name].fn is not fn:
                raise ValueError(f"{self.key}: {name!r} is registered twice")
            text = doc or (fn.__doc__ or "").strip().split("\n")[0]
            self._entries[name] = Entry(name, fn, dict(info), text)
            return fn
        return add

    def _filled(self) -> dict[str, Entry]:
        if not self._loaded:  # entries may be registered before: import every home once
            for home in self.homes:
                importlib.import_module(home)
            # in the order of `homes` (then of registration), whatever imported them first
            rank = {home: i for i, home in enumerate(self.homes)}
            def home_rank(entry: Entry) -> int:
                return rank.get(getattr(entry.fn, "__module__", ""), len(rank))

            order = sorted(self._entries.values(), key=home_rank)
            self._entries = {e.name: e for e in order}
            self._loaded = True
        return self._entries

    def names(self) -> tuple[str, ...]:
        return tuple(self._filled())

    def __contains__(self, name: object) -> bool:
        return name in self._filled()

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._filled().values())

    def __getitem__(self, name: str) -> Entry:
        entries = self._filled()
        if name not in entries:
            raise ConfigError(f"{self.key}: unknown value {name!r}; allowed: {', '.join(entries)}")
        return entries[name]

    def get(self, name: str) -> Any:
        """The function or class `name` selects."""
        return self[name].fn


ADVANTAGES = Registry("algo.advantage", "reasonrl.algo.advantages", "reasonrl.algo.gae")
POLICY_LOSSES = Registry("algo.policy_loss", "reasonrl.algo.policy_loss")
RATIO_LEVELS = Registry("algo.ratio_level", "reasonrl.algo.policy_loss")
IMPORTANCE_CORRECTIONS = Registry("algo.importance_correction", "reasonrl.algo.importance")
IMPORTANCE_LEVELS = Registry("algo.importance_level", "reasonrl.algo.importance")
LOSS_AGGREGATIONS = Registry("algo.loss_agg", "reasonrl.algo.aggregation")
KL_ESTIMATORS = Registry("algo.kl_estimator", "reasonrl.algo.kl")
VALUE_LOSSES = Registry("critic.value_loss", "reasonrl.algo.value_loss")
LR_SCHEDULES = Registry("optim.schedule", "reasonrl.policy.schedules")
ENGINES = Registry("rollout.engine", "reasonrl.rollout.engines")
DATA_TASKS = Registry("data.task", "reasonrl.data.tasks", "reasonrl.envs.verifiers_tasks")
DATA_FORMATS = Registry("data.format", "reasonrl.data.formats")
VERIFIERS = Registry("reward.task", *(f"reasonrl.rewards.{m}" for m in (
    "numeric", "gsm8k", "math_equiv", "countdown", "piecewise", "reasoning_gym", "verifiers_taskset")))
# `judge` and `classifier` are scored by reward.model, the judge role (reasonrl.policy.reward_model)
REWARD_COMPONENTS = Registry("reward.weights", "reasonrl.rewards.components", "reasonrl.policy.reward_model")
COUNTDOWN_SCORING = Registry("reward.countdown_rule", "reasonrl.rewards.countdown")
PIECEWISE_SCORING = Registry("reward.piecewise_rule", "reasonrl.rewards.piecewise")
MATH_SCORING = Registry("reward.math_rule", "reasonrl.rewards.math_equiv", "reasonrl.rewards.math_rules")
TOOLS = Registry("env.tools", "reasonrl.tools.calculator", "reasonrl.tools.python_tool")
ENVIRONMENTS = Registry("env.name", "reasonrl.envs.tool", "reasonrl.envs.feedback", "reasonrl.envs.openenv")
# env.fn's class: reasonrl's protocol, or another framework's style through its adapter; detected in
# this order: OpenEnv's classes (a `state` property) before Gymnasium's (the same reset(seed=...))
ENV_FORMATS = Registry("env.format", "reasonrl.envs.base", "reasonrl.envs.openenv", "reasonrl.envs.gym_env",
                       "reasonrl.envs.trl_env", "reasonrl.envs.agent")
# who plays an environment's episodes instead of the turn loop (`EnvSpec.runner`): an agent program's
# through the OpenAI-compatible endpoint (env.format=agent)
EPISODE_RUNNERS = Registry("env.format runner", "reasonrl.serve.agent_episodes")


def needs_critic(advantage: str) -> bool:
    """Whether advantage estimator `advantage` reads a critic's values: declared once, as
    `critic=True` on its `ADVANTAGES` entry, and read here by every module that asks (the
    config's rules, placement, the advantage stage)."""
    return bool(ADVANTAGES[advantage].info.get("critic", False))
