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

An entry is a frozen dataclass of its registry's own kind (`Entry`, or a subclass naming what
callers ask of an entry: `AdvantageEntry.needs_groups`, `EngineEntry.max_model_len`, ...), made
from `register`'s keywords: a keyword the kind does not have, or a field it requires left out,
fails at registration. Callers read attributes (`ENGINES[name].logprobs`).

The registries are declared here, at the bottom of the package, so that the config (which
imports only this and `errors`) can name them. Each one knows the module that fills it
(`homes`); asking for its names or an entry imports those modules, once. That is the only
import by name in the package: it keeps the config below the code it configures.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from reasonrl.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One name of a registry: what it selects. The kind of a registry whose callers ask
    nothing else of an entry."""

    name: str
    fn: Any  # the function or class this name selects
    doc: str = ""  # one line: what it is, for error messages and --help


@dataclass(frozen=True, kw_only=True)
class AdvantageEntry(Entry):
    """`ADVANTAGES`: an advantage estimator."""

    needs_groups: bool  # it normalises within a prompt's group: config.rules requires rollout.n >= 2
    critic: bool = False  # it reads a critic's values: `needs_critic` (config, placement, advantage stage)


@dataclass(frozen=True, kw_only=True)
class RatioLevelEntry(Entry):
    """`RATIO_LEVELS`: the level of the policy ratio."""

    bounds: tuple[float, float]  # the log-ratio's clamp (algo.policy_loss.ratio_at_level)


@dataclass(frozen=True, kw_only=True)
class ImportanceEntry(Entry):
    """`IMPORTANCE_CORRECTIONS`: a correction for the sampler's log-probs."""

    off: bool = False  # no correction: the objective skips it, config.rules needs no engine log-probs


@dataclass(frozen=True, kw_only=True)
class KLEntry(Entry):
    """`KL_ESTIMATORS`: a per-token KL estimator."""

    bounded: bool = False  # clamps its log-ratio itself (algo.kl: the others' values are checked finite)


@dataclass(frozen=True, kw_only=True)
class EngineEntry(Entry):
    """`ENGINES`: a rollout engine. Each callable takes the `rollout` section (`RolloutConfig`)."""

    logprobs: bool  # reports the sampler's log-probs (config.rules: importance corrections need them)
    missing: Callable[[], str | None]  # the extra to install, or None (preflight, rollout.engines)
    machine_gpus: Callable[[Any], tuple[int, str]]  # (GPUs one engine needs on one machine, its key)
    tensor_parallel: bool  # may spread over GPUs (config.rules: rollout.tensor_parallel > 1)
    max_model_len: Callable[[Any], tuple[int, str]]  # (its own limit on prompt + completion or 0, its key)
    probes: Callable[[Any], bool]  # pushes checked by probe log-probs, which a snapshot carries (placement)


@dataclass(frozen=True, kw_only=True)
class DataTaskEntry(Entry):
    """`DATA_TASKS`: where a run's examples come from."""

    generated: bool  # makes its own problems (config.rules, reasonrl eval: no data files)
    system_prompt: str = ""  # its own, for data.system_prompt=auto (data.tasks)


@dataclass(frozen=True, kw_only=True)
class DataFormatEntry(Entry):
    """`DATA_FORMATS`: a dataset's record format (data.formats, data prepare)."""

    instruction: str  # the question's instruction (data.prepare)
    fields: tuple[str, ...]  # the record's keys that tell the format (data.formats)


@dataclass(frozen=True, kw_only=True)
class VerifierEntry(Entry):
    """`VERIFIERS`: a task's verifier (rewards.verifiers)."""

    isolated: bool  # runs in the worker pool (process, timeout)
    answer: Callable[..., str | None]  # the normalised answer a completion commits to (evaluate.metrics)
    options: Mapping[str, str] = field(default_factory=dict)  # its keyword -> the reward section's key
    check: Callable[[str], Any] | None = None  # run on every ground truth at start-up (check_ground_truths)


@dataclass(frozen=True, kw_only=True)
class RewardComponentEntry(Entry):
    """`REWARD_COMPONENTS`: a `reward.weights` key."""

    model: bool = False  # scored by reward.model, the judge role (rewards.model_reward, config.rules)


@dataclass(frozen=True, kw_only=True)
class CountdownRuleEntry(Entry):
    """`COUNTDOWN_SCORING`: a Countdown scoring rule."""

    options: tuple[str, ...] = ()  # the verifier's options it also takes (rewards.countdown)


@dataclass(frozen=True, kw_only=True)
class MathRuleEntry(Entry):
    """`MATH_SCORING`: a MATH answer-matching rule."""

    text_truth: bool = False  # also matches ground truths as text: the start-up check takes any (math_equiv)


@dataclass(frozen=True, kw_only=True)
class ToolEntry(Entry):
    """`TOOLS`: a tool of env.name=tool."""

    sandboxed: bool = False  # runs code in the sandbox (tools.base, reasonrl tool)


@dataclass(frozen=True, kw_only=True)
class EnvironmentEntry(Entry):
    """`ENVIRONMENTS`: an env.name environment."""

    check: Callable[[Any], None] | None = None  # what to probe at start-up, given the env section (envs.base)
    check_run: Callable[..., Any] | None = None  # what it needs of the whole run, run by the preflight


@dataclass(frozen=True, kw_only=True)
class EnvFormatEntry(Entry):
    """`ENV_FORMATS`: the adapter of an env.fn class's style (envs.base)."""

    needs: str | None  # what the style needs, for the refusal of a class that fits none (None: not a class)
    detect: Callable[[type], bool] | None  # tells the style for env.format=auto (None: never detected)


class Registry:
    def __init__(self, key: str, *homes: str, kind: type[Entry] = Entry):
        self.key = key  # the config key whose values this registry holds, e.g. "algo.advantage"
        self.homes = homes  # the modules that register the entries
        self.kind = kind  # the dataclass of its entries: what callers may ask of one
        self._entries: dict[str, Entry] = {}
        self._loaded = False

    def register(self, name: str, doc: str = "", **fields: Any) -> Callable[[Any], Any]:
        """Decorator: `fn` is selected by `name`; `fields` are the fields of the registry's
        `kind` (what callers ask of it), checked now."""
        def add(fn: Any) -> Any:
            if name in self._entries and self._entries[name].fn is not fn:
                raise ValueError(f"{self.key}: {name!r} is registered twice")
            text = doc or (fn.__doc__ or "").strip().split("\n")[0]
            self._entries[name] = self.entry(name, fn, text, **fields)
            return fn
        return add

    def entry(self, name: str, fn: Any, doc: str = "", **fields: Any) -> Entry:
        """An entry of this registry's kind (not registered): a TypeError names a field the kind
        does not have, or one it requires that `fields` lacks."""
        own = {f.name: f for f in dataclasses.fields(self.kind)} if self.kind is not Entry else {}
        own = {k: f for k, f in own.items() if k not in ("name", "fn", "doc")}
        unknown = sorted(set(fields) - set(own))
        missing = sorted(k for k, f in own.items() if k not in fields and f.default is dataclasses.MISSING
                         and f.default_factory is dataclasses.MISSING)
        if unknown or missing:
            said = [f"{what} field{'s' * (len(keys) > 1)} {', '.join(map(repr, keys))}"
                    for what, keys in (("unknown", unknown), ("missing", missing)) if keys]
            raise TypeError(f"{self.key}: entry {name!r}: {'; '.join(said)} ({self.kind.__name__} has: "
                            f"{', '.join(own) or 'no fields'})")
        return self.kind(name=name, fn=fn, doc=doc, **fields)

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


ADVANTAGES = Registry("algo.advantage", "reasonrl.algo.advantages", "reasonrl.algo.gae", kind=AdvantageEntry)
POLICY_LOSSES = Registry("algo.policy_loss", "reasonrl.algo.policy_loss")
RATIO_LEVELS = Registry("algo.ratio_level", "reasonrl.algo.policy_loss", kind=RatioLevelEntry)
IMPORTANCE_CORRECTIONS = Registry("algo.importance_correction", "reasonrl.algo.importance",
                                  kind=ImportanceEntry)
IMPORTANCE_LEVELS = Registry("algo.importance_level", "reasonrl.algo.importance")
LOSS_AGGREGATIONS = Registry("algo.loss_agg", "reasonrl.algo.aggregation")
KL_ESTIMATORS = Registry("algo.kl_estimator", "reasonrl.algo.kl", kind=KLEntry)
VALUE_LOSSES = Registry("critic.value_loss", "reasonrl.algo.value_loss")
LR_SCHEDULES = Registry("optim.schedule", "reasonrl.learn.schedules")
ENGINES = Registry("rollout.engine", "reasonrl.rollout.engines", kind=EngineEntry)
DATA_TASKS = Registry("data.task", "reasonrl.data.tasks", "reasonrl.envs.verifiers_tasks", kind=DataTaskEntry)
DATA_FORMATS = Registry("data.format", "reasonrl.data.formats", kind=DataFormatEntry)
VERIFIERS = Registry("reward.task", *(f"reasonrl.rewards.{m}" for m in (
    "numeric", "gsm8k", "math_equiv", "countdown", "piecewise", "reasoning_gym", "verifiers_taskset")),
                     kind=VerifierEntry)
# `judge` and `classifier` are scored by reward.model, the judge role (reasonrl.workers.judge)
REWARD_COMPONENTS = Registry("reward.weights", "reasonrl.rewards.components", "reasonrl.workers.judge",
                             kind=RewardComponentEntry)
COUNTDOWN_SCORING = Registry("reward.countdown_rule", "reasonrl.rewards.countdown", kind=CountdownRuleEntry)
PIECEWISE_SCORING = Registry("reward.piecewise_rule", "reasonrl.rewards.piecewise")
MATH_SCORING = Registry("reward.math_rule", "reasonrl.rewards.math_equiv", "reasonrl.rewards.math_rules",
                        kind=MathRuleEntry)
TOOLS = Registry("env.tools", "reasonrl.tools.calculator", "reasonrl.tools.python_tool", kind=ToolEntry)
ENVIRONMENTS = Registry("env.name", "reasonrl.envs.tool", "reasonrl.envs.feedback",
                        "reasonrl.envs.openenv_server", kind=EnvironmentEntry)
# env.fn's class: reasonrl's protocol, or another framework's style through its adapter; detected in
# this order: OpenEnv's classes (a `state` property) before Gymnasium's (the same reset(seed=...))
ENV_FORMATS = Registry("env.format", "reasonrl.envs.base", "reasonrl.envs.openenv", "reasonrl.envs.gym_env",
                       "reasonrl.envs.trl_env", "reasonrl.envs.agent", kind=EnvFormatEntry)
# who plays an environment's episodes instead of the turn loop (`EnvSpec.runner`): an agent program's
# through the OpenAI-compatible endpoint (env.format=agent)
EPISODE_RUNNERS = Registry("env.format runner", "reasonrl.serve.agent_episodes")


def needs_critic(advantage: str) -> bool:
    """Whether advantage estimator `advantage` reads a critic's values: declared once, as
    `critic=True` on its `ADVANTAGES` entry, and read here by every module that asks (the
    config's rules, placement, the advantage stage)."""
    return ADVANTAGES[advantage].critic
