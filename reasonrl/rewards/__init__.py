"""Rewards for tasks whose answer a program can check: correctness plus format shaping.

A reward component is a function (completion, ground_truth) -> float. `score` runs a
weighted set of components over a batch and reports each one's raw scores for logging.
The `correct` component is task-specific: each sample's task verifier (numeric, gsm8k,
math, countdown, piecewise, or a custom `reward.fn` / `reward.batch_fn`; see
`verifiers.py`) scores it. Components are summed with their weights; `reward.gate` (or
`reward.combine=all`) makes the total 0 unless the gate components score above 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from reasonrl.batch import Scores
from reasonrl.errors import ConfigError, GroundTruthError
from reasonrl.registry import REWARD_COMPONENTS, VERIFIERS
from reasonrl.rewards.extract import (
    extract_answer,
    extract_answer_tag,
    extract_boxed,
    extract_last_number,
)
from reasonrl.rewards.failures import describe_exception, describe_verifier
from reasonrl.rewards.format import (
    answer_present_reward,
    boxed_format_reward,
    paired_tags_format_reward,
    r1_zero_format_reward,
    think_answer_format_reward,
)
from reasonrl.rewards.numeric import numbers_equal, numeric_reward, parse_number
from reasonrl.rewards.pool import Call, get_pool
from reasonrl.rewards.verifiers import (
    Verifier,
    as_score,
    check_batch_signature,
    check_signature,
    load_target,
    make_verifier,
    task_for_source,
    verifier_for,
)

RewardFn = Callable[[str, str], float]  # (completion, ground_truth) -> score


def make_reward_fn(name: str, fallback_last_number: bool = True) -> RewardFn:
    """The (completion, ground_truth) -> float function of a `REWARD_COMPONENTS` name.

    `fallback_last_number` only matters for "correct": off, an answer must be boxed or tagged.
    """
    return partial(REWARD_COMPONENTS.get(name), fallback_last_number=fallback_last_number)


@dataclass
class RewardResult:
    """Weighted totals per sample, raw per-component scores, and what went wrong.

    `parts[i]` holds the named parts a task verifier returned for sample i (partial credits,
    flags); `failures[i]` says why sample i's `correct` scored 0 without a verdict ("timeout"
    or the exception), for the samples where that happened.
    """

    total: list[float]
    components: dict[str, list[float]]
    errors: int
    timeouts: int = 0
    parts: list[dict[str, float]] = field(default_factory=list)
    failures: dict[int, str] = field(default_factory=dict)


def _run_batch(verifier: Verifier, rows: list[int], completions: list[str], ground_truths: list[str],
               groups: list[int], extra_infos: list[dict], scores: list[float], result: RewardResult) -> None:
    """`reward.batch_fn` once over `rows`: its scores into `scores`; a call that raises, times
    out (`timeout` seconds per completion) or returns the wrong number of scores leaves every
    row at 0 and counts each in `result.errors` / `result.timeouts`."""
    batch = {"completions": [completions[i] for i in rows], "ground_truths": [ground_truths[i] for i in rows],
             "groups": [int(groups[i]) for i in rows], "extra_infos": [extra_infos[i] for i in rows]}
    failure = None
    if verifier.isolated:
        call = Call(verifier.target, "", "", options=dict(verifier.options), batch=batch)
        out = get_pool(verifier.workers).run([call], verifier.timeout * len(rows))[0]
        if out.ground_truth_error:
            err = GroundTruthError(out.error)
            err.index = None
            raise err
        value, failure = out.value, "timeout" if out.timed_out else out.error
    else:
        try:
            value = verifier.fn()(*batch.values(), **dict(verifier.options))
        except GroundTruthError as err:
            err.index = None
            raise
        except (Exception, SystemExit) as err:
            failure = describe_exception(err)
    if failure is None:
        try:
            if not isinstance(value, (list, tuple)) or len(value) != len(rows):
                size = len(value) if isinstance(value, (list, tuple)) else "-"
                raise ValueError(f"reward.batch_fn must return one score per completion ({len(rows)}), "
                                 f"got {type(value).__name__} of length {size}")
            parsed = [as_score(v) for v in value]
        except (TypeError, ValueError) as err:
            failure = f"{type(err).__name__}: {err}"
    if failure is not None:
        for i in rows:
            result.failures[i] = failure
        if failure == "timeout":
            result.timeouts += len(rows)
        else:
            result.errors += len(rows)
        return
    for i, (s, parts) in zip(rows, parsed, strict=True):
        scores[i], result.parts[i] = s, parts


def _run_verifiers(completions: list[str], ground_truths: list[str], verifiers: list[Verifier],
                   extra_infos: list[dict], groups: list[int] | None = None
                   ) -> tuple[list[float], RewardResult]:
    """`correct` for every sample; isolated verifiers go to the worker pool as one batch, a
    batch reward (`reward.batch_fn`) is one call over its samples."""
    n = len(completions)
    scores, result = [0.0] * n, RewardResult([], {}, 0, 0, [{} for _ in range(n)], {})
    remote: dict[tuple[float, int], list[int]] = {}
    batched = [i for i, v in enumerate(verifiers) if v.batch]
    if batched:
        _run_batch(verifiers[batched[0]], batched, completions, ground_truths,
                   groups if groups is not None else list(range(n)), extra_infos, scores, result)
    for i, v in enumerate(verifiers):
        if v.batch:
            continue
        if v.isolated:
            remote.setdefault((v.timeout, v.workers), []).append(i)
            continue
        try:
            scores[i], result.parts[i] = as_score(
                v.fn()(completions[i], ground_truths[i], extra_infos[i], **dict(v.options)))
        except GroundTruthError as err:
            err.index = i
            raise
        except (Exception, SystemExit) as err:
            result.errors += 1
            result.failures[i] = describe_exception(err)
    for (timeout, workers), idx in remote.items():
        calls = [Call(verifiers[i].target, completions[i], ground_truths[i], extra_infos[i],
                      dict(verifiers[i].options)) for i in idx]
        for i, out in zip(idx, get_pool(workers).run(calls, timeout), strict=True):
            if out.ground_truth_error:
                err = GroundTruthError(out.error)
                err.index = i
                raise err
            if out.timed_out:
                result.timeouts += 1
                result.failures[i] = "timeout"
                continue
            try:
                if out.error is not None:
                    raise RuntimeError(out.error)
                scores[i], result.parts[i] = as_score(out.value)
            except Exception as err:
                result.errors += 1
                result.failures[i] = str(err) if out.error else f"{type(err).__name__}: {err}"
    return scores, result


def score(completions: list[str], ground_truths: list[str], weights: dict[str, float],
          fallback_last_number: bool = True, *, verifiers: list[Verifier] | None = None,
          extra_infos: list[dict] | None = None, groups: list[int] | None = None,
          gate: tuple[str, ...] | list[str] = ()) -> RewardResult:
    """total[i] = sum_k weights[k] * component_k(completions[i], ground_truths[i])
                  * prod_{g in gate} [component_g(completions[i], ground_truths[i]) > 0].

    The gate makes the sum all-or-nothing: with `gate=("format_r1_zero",)` and weights
    {correct: 1, format_r1_zero: 0} the reward is 1 only when the format is right and the
    answer is (ReasonRL's strict reward). Every component named in `weights` is computed and
    reported, weight 0 included, so it can be logged without shaping the reward; a gate must
    be one of them. `groups[i]` is sample i's prompt index (for `reward.batch_fn`; default:
    each sample its own). `correct` is sample i's task verifier
    (`verifiers[i]`; default: the numeric check); the other components are format checks.
    A component that raises scores 0 for that sample and is counted in `errors`, one that
    runs past its timeout scores 0 and is counted in `timeouts`: one odd completion must not
    kill a training run. A GroundTruthError (bad ground truth, a ValueError) propagates:
    that is a data bug.
    """
    if len(completions) != len(ground_truths):
        raise ValueError(f"{len(completions)} completions but {len(ground_truths)} ground truths")
    unknown = [k for k in weights if k not in REWARD_COMPONENTS]
    if unknown:
        raise ValueError(f"unknown reward weights {unknown}; allowed: {', '.join(REWARD_COMPONENTS.names())}")
    ungated = [g for g in gate if g not in weights]
    if ungated:
        raise ValueError(f"reward gate {ungated} is not in the weights {list(weights)}: a gate must be "
                         "computed")
    n = len(completions)
    total = [0.0] * n
    components: dict[str, list[float]] = {}
    result = RewardResult(total, components, 0, 0, [{} for _ in range(n)], {})
    for name, weight in weights.items():
        if name == "correct":
            if verifiers is None:
                verifiers = [make_verifier("numeric", _Options(fallback_last_number))] * n
            scores, found = _run_verifiers(completions, ground_truths, verifiers,
                                           extra_infos or [{} for _ in range(n)], groups)
            result.errors += found.errors
            result.timeouts += found.timeouts
            result.parts, result.failures = found.parts, found.failures
        else:
            fn = make_reward_fn(name, fallback_last_number)
            scores = []
            for completion, truth in zip(completions, ground_truths, strict=True):
                try:
                    scores.append(float(fn(completion, truth)))
                except GroundTruthError:
                    raise
                except Exception:
                    scores.append(0.0)
                    result.errors += 1
        for i, s in enumerate(scores):
            total[i] += weight * s
        components[name] = scores
    for g in gate:
        for i, s in enumerate(components[g]):
            if s <= 0:
                total[i] = 0.0
    return result


@dataclass
class _Options:
    """The RewardConfig fields `make_verifier("numeric", ...)` reads, for callers without a config."""

    fallback_last_number: bool = True
    timeout: float = 5.0
    num_workers: int = 2


def gate_of(cfg) -> tuple[str, ...]:
    """The components that gate the total: `reward.gate`, or every weighted component with
    `reward.combine=all`."""
    return tuple(cfg.weights) if cfg.combine == "all" else tuple(cfg.gate)


def score_examples(completions: list[str], examples: list, cfg, always_correct: bool = False,
                   groups: list[int] | None = None) -> RewardResult:
    """`score` for completions of `examples` (batch.Example) under a RewardConfig `cfg`.

    Each example's verifier comes from reward.batch_fn / reward.fn / reward.task / its
    data_source, and its `meta` is the verifier's `extra_info`; `groups[i]` is completion i's
    prompt index (`reward.batch_fn`). `always_correct` adds `correct` at weight 0 when the
    weights leave it out (evaluation always reports accuracy). A bad ground truth is reported
    with the example's origin (file:line).
    """
    weights = dict(cfg.weights)
    if always_correct and "correct" not in weights:
        weights = {"correct": 0.0, **weights}
    cache: dict[str, Verifier] = {}
    for e in examples:
        if e.data_source not in cache:
            cache[e.data_source] = verifier_for(e.data_source, cfg)
    verifiers = [cache[e.data_source] for e in examples]
    try:
        return score(completions, [e.ground_truth for e in examples], weights, cfg.fallback_last_number,
                     verifiers=verifiers, extra_infos=[e.meta for e in examples], groups=groups,
                     gate=gate_of(cfg))
    except GroundTruthError as err:
        index = getattr(err, "index", 0)
        if index is None:  # raised by reward.batch_fn: no one record to name
            raise GroundTruthError(f"reward.batch_fn {cfg.batch_fn}: {err}") from None
        bad = examples[index]
        where = bad.meta.get("origin", bad.data_source)
        raise GroundTruthError(f"{where}: field 'ground_truth': {err}") from None


def check_examples(examples: list, cfg) -> None:
    """Fail before training on ground truths a verifier cannot read, or a broken reward.fn /
    reward.batch_fn.

    Each verifier's `check` reads every ground truth: in-process for the tasks whose ground
    truth has a fixed shape (numbers for numeric/gsm8k, JSON for countdown/piecewise); in the
    reward worker pool for isolated verifiers (math: math-verify must read it as more than its
    own text), each distinct ground truth once, within `reward.timeout`. `reward.fn` and
    `reward.batch_fn` are imported and their signatures checked. Raises GroundTruthError naming
    file:line, or ConfigError for reward.fn / reward.batch_fn.
    """

    for key, target, check in (("reward.fn", cfg.fn, check_signature),
                               ("reward.batch_fn", cfg.batch_fn, check_batch_signature)):
        if target:
            try:
                check(load_target(target), target)
            except Exception as err:
                raise ConfigError(f"{key}: cannot use {target!r}: {type(err).__name__}: {err}") from None
            return
    tasks: dict[str, str] = {}
    remote: dict[str, dict[str, object]] = {}  # task -> ground truth -> its first example
    for e in examples:
        if e.data_source not in tasks:
            tasks[e.data_source] = verifier_for(e.data_source, cfg).task
        task = tasks[e.data_source]
        entry = VERIFIERS[task]
        check = entry.info.get("check")
        if check is None:
            continue
        if entry.info["isolated"]:
            remote.setdefault(task, {}).setdefault(e.ground_truth, e)
            continue
        try:
            check(e.ground_truth)
        except GroundTruthError as err:
            raise GroundTruthError(f"{e.meta.get('origin', e.data_source)}: field 'ground_truth': "
                                   f"{err} (task {task})") from None
    for task, firsts in remote.items():
        check = VERIFIERS[task].info["check"]
        target = f"{check.__module__}:{check.__name__}"
        outcomes = get_pool(cfg.num_workers).run([Call(target, "", truth) for truth in firsts], cfg.timeout)
        for e, out in zip(firsts.values(), outcomes, strict=True):
            if out.ground_truth_error or out.timed_out or out.error is not None:
                why = (out.error if out.ground_truth_error else
                       f"not read within reward.timeout={cfg.timeout:g} s" if out.timed_out else
                       f"the check failed: {out.error}")
                raise GroundTruthError(f"{e.meta.get('origin', e.data_source)}: field 'ground_truth': "
                                       f"{why} (task {task})")


__all__ = [
    "GroundTruthError",
    "RewardFn",
    "RewardResult",
    "Verifier",
    "answer_present_reward",
    "boxed_format_reward",
    "check_examples",
    "extract_answer",
    "extract_answer_tag",
    "extract_boxed",
    "extract_last_number",
    "gate_of",
    "make_reward_fn",
    "make_verifier",
    "numbers_equal",
    "numeric_reward",
    "paired_tags_format_reward",
    "parse_number",
    "r1_zero_format_reward",
    "score",
    "score_examples",
    "score_rollouts",
    "task_for_source",
    "think_answer_format_reward",
    "verifier_for",
]


def score_rollouts(texts: list[str], examples: list, cfg, always_correct: bool = False,
                   groups: list[int] | None = None):
    """`score_examples` packed as the `Scores` batch record (tensors aligned with the rollouts);
    each failed sample's `failures` entry names the reward function and what went wrong."""
    result = score_examples(texts, examples, cfg, always_correct, groups)
    failures: list[str | None] = [None] * len(texts)
    for i, why in result.failures.items():
        if why == "timeout":
            limit = cfg.timeout * (len(texts) if cfg.batch_fn else 1)
            why = f"timed out (reward.timeout: {limit:g} s)"
        failures[i] = f"{describe_verifier(verifier_for(examples[i].data_source, cfg))}: {why}"
    return Scores(total=torch.tensor(result.total, dtype=torch.float32),
                  components={k: torch.tensor(v, dtype=torch.float32)
                              for k, v in result.components.items()},
                  errors=result.errors, timeouts=result.timeouts, failures=failures)
