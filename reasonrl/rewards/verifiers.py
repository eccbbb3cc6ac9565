"""Task verifiers: which function scores the `correct` component of a sample, how it runs, and
the start-up check of every ground truth against it.

A verifier is called in the batch form (`scoring.call_reward`), the one `reward.batch_fn` has:

    fn(completions: list[str], ground_truths: list[str], groups: list[int],
       extra_infos: list[dict], **options) -> list[float | dict[str, float]]

one score (or dict with "score") per completion, in order; `groups[i]` is the prompt (group)
index of completion i. It runs like `reward.fn` (a worker process with a time limit of
`reward.timeout` seconds per completion, unless `reward.isolate_fn=false`); a call that
raises, returns the wrong number of scores or runs out of time scores every completion 0 and
counts each in `reward/errors` or `reward/timeouts`.

The task verifiers and `reward.fn` have the per-sample form, a convenience the scoring turns
into the batch form (`scoring.per_sample`; isolated: one worker call per sample, each with
its own timeout):

    fn(completion: str, ground_truth: str, extra_info: dict, **options) -> float | dict[str, float]

A dict must hold "score" (the reward) and may hold named parts (partial credits, flags) that
`reasonrl reward` prints. `extra_info` is the example's `extra_info`/`meta` record (plus
"origin", its file:line). Raising `GroundTruthError` marks a data bug and stops the run;
any other exception scores 0 and is counted in `reward/errors`.

The task of a sample comes from `reward.fn` (a custom function for all samples), else
`reward.task`, else (`reward.task=auto`) the example's `data_source`: see `task_for_source`.

`reward.fn`, `reward.batch_fn` and each `reward.fns` entry may also be written as TRL, verl
or OpenRLHF write theirs: `function_verifier` resolves the function's style (`styles.py`,
`reward.fn_style`) and `check_functions` refuses, before training, a function that fits no
style or cannot take its style's call.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reasonrl.errors import ConfigError, GroundTruthError
from reasonrl.registry import VERIFIERS
from reasonrl.rewards.pool import MAX_MEMORY_MB, Call, get_pool
from reasonrl.rewards.styles import BATCH_STYLES, check_call, resolve, trl_columns

# The verifiers' own modules register them (`@VERIFIERS.register`, `reasonrl.registry`
# names the modules). `isolated`: runs in a worker process with a hard timeout; `options`:
# the verifier's keyword -> the RewardConfig field it comes from; `check`: reads a ground
# truth, raising GroundTruthError when it cannot (run on every example before training). The
# check of an isolated verifier has the verifier signature, options included, and runs in the
# worker pool too.

@dataclass(frozen=True)
class Verifier:
    """How `correct` is computed: the function, its options, and where it runs."""

    task: str  # a VERIFIERS name, or "custom"
    target: str  # "module:function" or "path/to/file.py:function"
    options: tuple[tuple[str, Any], ...] = ()
    isolated: bool = False  # True: a worker process with a hard per-sample timeout
    timeout: float = 5.0
    workers: int = 2
    batch: bool = False  # reward.batch_fn: one call for every sample of a batch
    max_memory_mb: int = MAX_MEMORY_MB  # isolated: each worker's memory bound (0: none)
    # a reward function of the config: its `styles.STYLES` name ("" for the task verifiers' and
    # reward.batch_fn's forms above), the key naming it ("reward.fn", "reward.fns.<name>") and
    # reward.fn_kwargs as JSON text (kept hashable)
    style: str = ""
    name: str = ""
    kwargs: str = ""

    def fn(self) -> Callable[..., Any]:
        return load_target(self.target)

    def call_kwargs(self) -> dict[str, Any]:
        """The keyword arguments a call adds: the verifier's options, reward.fn_kwargs over them."""
        return {**dict(self.options), **(json.loads(self.kwargs) if self.kwargs else {})}


def task_for_source(data_source: str) -> str:
    """The task for `reward.task=auto`: "verl_gsm8k" for exactly "openai/gsm8k" (verl's
    `default_compute_score` sends that data_source, and only it, to its GSM8K score); else the
    data_source's last path part, if it starts with a task name ("gsm8k", "math500",
    "lighteval/MATH", "countdown_3to4"), else "numeric" (arithmetic and unknown sources: the
    original number check); "reasoning_gym" for reasoning_gym/<task>."""
    if data_source == "openai/gsm8k":
        return "verl_gsm8k"
    if data_source.startswith("reasoning_gym/"):  # reasoning_gym/<task>: rewards/reasoning_gym.py
        return "reasoning_gym"
    name = data_source.lower().rsplit("/", 1)[-1]
    for task in ("gsm8k", "math", "countdown", "piecewise"):
        if name.startswith(task):
            return task
    return "numeric"


def task_verifier(task: str, options: dict[str, Any], timeout: float = 5.0, workers: int = 2,
                  max_memory_mb: int = MAX_MEMORY_MB) -> Verifier:
    """The verifier of a `VERIFIERS` task with these option values."""
    entry = VERIFIERS[task]
    target = f"{entry.fn.__module__}:{entry.fn.__name__}"
    return Verifier(task, target, tuple(sorted(options.items())), entry.isolated, timeout, workers,
                    max_memory_mb=max_memory_mb)


def make_verifier(task: str, cfg) -> Verifier:
    """The verifier for `task` with the options of a RewardConfig `cfg`."""
    if task == "custom":
        return function_verifier(cfg, "reward.fn", cfg.fn)
    options = {kw: getattr(cfg, field) for kw, field in VERIFIERS[task].options.items()}
    return task_verifier(task, options, cfg.timeout, cfg.num_workers, cfg.max_memory_mb)


def verifier_for(data_source: str, cfg) -> Verifier:
    """reward.batch_fn > reward.fn > reward.task > the data_source (reward.task=auto)."""
    if cfg.batch_fn:
        return function_verifier(cfg, "reward.batch_fn", cfg.batch_fn)
    if cfg.fn:
        return make_verifier("custom", cfg)
    task = cfg.task if cfg.task != "auto" else task_for_source(data_source)
    return make_verifier(task, cfg)


def function_verifier(cfg, key: str, target: str) -> Verifier:
    """The verifier of one reward function of a RewardConfig `cfg` (`key`: reward.fn,
    reward.batch_fn, reward.fns.<name>): imported here, its style resolved (reward.fn_style, or
    told by its parameter names; reward.batch_fn is reasonrl's batch form), one call per batch
    for a batch style, in the reward worker pool unless reward.isolate_fn=false. ConfigError,
    naming the key, when it cannot be imported or fits no style."""
    try:
        wanted = "reasonrl_batch" if key == "reward.batch_fn" else cfg.fn_style
        style = resolve(load_target(target), wanted)
    except Exception as err:
        raise ConfigError(f"{key}: cannot use {target!r}: {type(err).__name__}: {err}") from None
    kwargs = json.dumps(cfg.fn_kwargs, sort_keys=True) if cfg.fn_kwargs else ""
    task = "batch" if key == "reward.batch_fn" else "custom"
    return Verifier(task, target, (), cfg.isolate_fn, cfg.timeout, cfg.num_workers,
                    batch=style in BATCH_STYLES, max_memory_mb=cfg.max_memory_mb, style=style, name=key,
                    kwargs=kwargs)


def function_verifiers(cfg) -> dict[str, Verifier]:
    """reward.fns as component name -> its function's verifier."""
    return {name: function_verifier(cfg, f"reward.fns.{name}", target) for name, target in cfg.fns.items()}


def check_functions(examples: list, cfg) -> None:
    """Every reward function of `cfg` (reward.fn / reward.batch_fn, reward.fns) imported, its style
    resolved and its signature checked against its style's call (`styles.check_call`; a TRL
    function's required columns against the records'), an OpenRLHF one given text prompts only:
    ConfigError naming the key, the function and why, before training."""
    functions = [(k, t) for k, t in (("reward.fn", cfg.fn), ("reward.batch_fn", cfg.batch_fn)) if t]
    functions += [(f"reward.fns.{name}", target) for name, target in cfg.fns.items()]
    for key, target in functions:
        verifier = function_verifier(cfg, key, target)
        try:
            explicit = cfg.fn_style != "auto" or key == "reward.batch_fn"
            check_call(load_target(target), verifier.style, dict(cfg.fn_kwargs),
                       trl_columns(e.meta for e in examples), explicit)
            chat = next((e for e in examples if not isinstance(e.prompt, str)), None)
            if verifier.style == "openrlhf" and chat is not None:
                raise TypeError(f"{chat.meta.get('origin', chat.data_source)}: the prompt is a list of chat "
                                "messages, and OpenRLHF's reward_func reads text (prompts, and queries = "
                                "prompt + completion); give text prompts")
        except TypeError as err:
            raise ConfigError(f"{key}: cannot use {target!r}: {err}") from None


_LOADED: dict[str, Callable[..., Any]] = {}


FILE_MODULE = "reasonrl_custom_"  # the name's prefix of a module `load_target` loads from a file by its path


def load_target(target: str) -> Callable[..., Any]:
    """Import "package.module:function" or "path/to/file.py:function" (cached).

    A module path is imported with the working directory on sys.path, so `my_rewards:fn`
    finds ./my_rewards.py as it would with `python -c`.
    """
    if target in _LOADED:
        return _LOADED[target]
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{target!r} is not of the form module:function or file.py:function")
    if module_name.endswith(".py"):
        path = Path(module_name).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{module_name}: no such file")
        name = f"{FILE_MODULE}{abs(hash(str(path)))}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise AttributeError(f"{module_name} has no function {attr!r}")
    _LOADED[target] = fn
    return fn


def as_score(value: Any) -> tuple[float, dict[str, float]]:
    """A verifier's return value as (score, parts); raises TypeError/ValueError if malformed."""
    parts: dict[str, float] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"a reward dict needs a 'score' key, got keys {sorted(value)}")
        parts = {str(k): float(v) for k, v in value.items() if k != "score"}
        value = value["score"]
    if isinstance(value, str) or value is None:
        raise TypeError(f"a reward must be a number or a dict with 'score', got {value!r}")
    score = float(value)
    if not math.isfinite(score):
        raise ValueError(f"reward is {score}")
    return score, parts


def check_examples(examples: list, cfg) -> None:
    """Fail before training on ground truths a verifier cannot read, or a broken reward.fn /
    reward.batch_fn / reward.fns.

    Each verifier's `check` reads every ground truth: in-process for the tasks whose ground
    truth has a fixed shape (numbers for numeric/gsm8k, JSON for countdown/piecewise); in the
    reward worker pool for isolated verifiers (math: math-verify must read it as more than its
    own text), each distinct ground truth once, within `reward.timeout`. `reward.fn`,
    `reward.batch_fn` and `reward.fns` are imported and their signatures checked. Raises
    GroundTruthError naming file:line, or ConfigError for reward.fn / reward.batch_fn /
    reward.fns (`check_functions`). (reward.model loads when the judge role is built.)
    """
    check_functions(examples, cfg)
    if cfg.fn or cfg.batch_fn:  # `correct` is that function's: no task verifier reads the ground truths
        return
    tasks: dict[str, str] = {}
    remote: dict[str, dict[str, object]] = {}  # task -> ground truth -> its first example
    for e in examples:
        if e.data_source not in tasks:
            tasks[e.data_source] = verifier_for(e.data_source, cfg).task
        task = tasks[e.data_source]
        entry = VERIFIERS[task]
        check = entry.check
        if check is None:
            continue
        if entry.isolated:
            remote.setdefault(task, {}).setdefault(e.ground_truth, e)
            continue
        try:
            check(e.ground_truth)
        except GroundTruthError as err:
            raise GroundTruthError(f"{e.meta.get('origin', e.data_source)}: field 'ground_truth': "
                                   f"{err} (task {task})") from None
    for task, firsts in remote.items():
        check = VERIFIERS[task].check
        target = f"{check.__module__}:{check.__name__}"
        options = dict(make_verifier(task, cfg).options)  # the check reads as the verifier will
        calls = [Call(target, "", truth, options=options) for truth in firsts]
        outcomes = get_pool(cfg.num_workers, cfg.max_memory_mb).run(calls, cfg.timeout)
        for e, out in zip(firsts.values(), outcomes, strict=True):
            if out.ground_truth_error or out.timed_out or out.error is not None:
                why = (out.error if out.ground_truth_error else
                       f"not read within reward.timeout={cfg.timeout:g} s" if out.timed_out else
                       f"the check failed: {out.error}")
                raise GroundTruthError(f"{e.meta.get('origin', e.data_source)}: field 'ground_truth': "
                                       f"{why} (task {task})")
