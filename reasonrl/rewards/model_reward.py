"""The `judge` and `classifier` components of a scoring: reward.model's rows cut into batches, each
batch one call of its scoring function (`reasonrl.policy.reward_model`) on its host, and each row
read back as a score or as a counted failure.

Where the model runs is reward.model.placement (`REWARD_MODEL_HOSTS`), never in the process that
scores, so a model that hangs cannot hang the run:
- `process`: one reward-model worker process (`python -m reasonrl.rewards.worker`, the rule
  rewards' worker, without their memory cap), started by the process that scores (the trainer,
  or the rollout process of asynchronous training);
- `ray`: a Ray actor with reward.model.num_cpus / num_gpus (`reasonrl.placement.model_host`).
A host loads the model once, when it starts (within reward.model.load_timeout); if that first
load fails the model cannot score at all and a `ModelLoadError` stops the run: at start-up for a
process host (`check_reward_model`, from `check_examples`), at the first scoring for a Ray actor
(Ray runs only once the workers are built).

Each batch of reward.model.batch_size rows gets reward.model.timeout seconds (a worker's own timer
at that, a kill at `pool.hard_deadline`). A batch past it scores 0 on each of its rows, counted
in reward/timeouts, and the next batch goes to a fresh worker, which loads the model again; a
batch that raises scores 0 on its rows, counted in reward/errors; a row whose answer cannot be
read (no number, a number out of range, a text longer than the model's context) fails alone.
Never a crash: the run goes on with the rows that scored.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import math
from typing import Any

from reasonrl.errors import ModelLoadError
from reasonrl.registry import REWARD_COMPONENTS, REWARD_MODEL_HOSTS
from reasonrl.rewards.pool import Call, Outcome, WorkerPool

_HOSTS: dict[str, Any] = {}  # spec -> its host, in this process


def is_model_component(name: str) -> bool:
    """Whether reward.weights' `name` is scored by reward.model (`judge`, `classifier`)."""
    return name in REWARD_COMPONENTS and bool(REWARD_COMPONENTS[name].info.get("model", False))


def spec_of(kind: str, model_cfg) -> dict:
    """reward.model (a RewardModelConfig) as the plain dict its worker is given, with the kind."""
    return {"kind": kind, **dataclasses.asdict(model_cfg)}


def describe(spec: dict) -> str:
    """How failures name the model: "the judge (reward.model.path=...)"."""
    return f"the {spec['kind']} (reward.model.path={spec['path'] or 'the embedded model'})"


def _target(kind: str) -> str:
    fn = REWARD_COMPONENTS.get(kind)
    return f"{fn.__module__}:{fn.__name__}"


@REWARD_MODEL_HOSTS.register("process")
def process_host(spec: dict) -> WorkerPool:
    """a reward-model worker process beside the process that scores"""
    return WorkerPool(1, max_memory_mb=0, load_timeout=spec["load_timeout"])  # a model: no memory bound


def host_for(spec: dict):
    """The host of `spec` in this process, started (and its model loaded) on first use. A host
    has `load(target, warmup) -> error or None`, `run(calls, timeout) -> outcomes`, `close()`."""
    key = json.dumps(spec, sort_keys=True)
    if key not in _HOSTS:
        host = REWARD_MODEL_HOSTS.get(spec["placement"])(spec)
        error = host.load(_target(spec["kind"]), {"spec": spec})
        if error is not None:
            host.close()
            cause = error.split(": ModelLoadError: ", 1)
            raise ModelLoadError(cause[1] if len(cause) == 2 else
                                 f"{describe(spec)} cannot be loaded: {error}")
        _HOSTS[key] = host
    return _HOSTS[key]


def check_reward_model(cfg) -> None:
    """Start-up: load reward.model now (a RewardConfig `cfg` naming `judge` or `classifier`), so
    that a model that cannot load stops the run before any step. A Ray actor is left to the
    first scoring (Ray is not running yet)."""
    for name in cfg.weights:
        if is_model_component(name) and cfg.model.placement == "process":
            host_for(spec_of(name, cfg.model))


def _read(out: Outcome, spec: dict, size: int) -> list[tuple[float, str | None]]:
    """One batch's Outcome as (score, why it failed or None) per row."""
    if out.timed_out:
        why = f"timed out (reward.model.timeout: {spec['timeout']:g} s per batch of {size})"
        return [(0.0, why)] * size
    if out.error is not None:
        return [(0.0, out.error)] * size
    if not isinstance(out.value, list) or len(out.value) != size:
        got = len(out.value) if isinstance(out.value, list) else type(out.value).__name__
        return [(0.0, f"ValueError: {size} rows gave {got} scores")] * size
    rows = []
    for value in out.value:
        if isinstance(value, str):
            rows.append((0.0, f"ValueError: {value}"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            rows.append((float(value), None))
        else:
            rows.append((0.0, f"ValueError: a score must be a finite number, got {value!r}"))
    return rows


def score_with_model(kind: str, model_cfg, prompts: list, completions: list[str], ground_truths: list[str],
                     rows: list[int]) -> tuple[list[float], list[str | None], list[bool]]:
    """The `kind` component (`judge` / `classifier`) of reward.model (`model_cfg`) for `rows` of
    these completions; the other rows score 0 and are not sent (rows a gate zeroes). Returns per
    row (score, failure message naming the model or None, whether it timed out)."""
    if model_cfg is None:
        raise ValueError(f"reward.weights names {kind!r}, which reward.model scores: pass its settings "
                         "(model=)")
    n = len(completions)
    scores, failures, timed_out = [0.0] * n, [None] * n, [False] * n
    if not rows:
        return scores, failures, timed_out
    spec = spec_of(kind, model_cfg)
    host, target, size = host_for(spec), _target(kind), spec["batch_size"]
    chunks = [rows[start: start + size] for start in range(0, len(rows), size)]
    calls = [Call(target, "", "", options={"prompts": [prompts[i] for i in chunk], "spec": spec},
                  batch={"completions": [completions[i] for i in chunk],
                         "ground_truths": [ground_truths[i] for i in chunk],
                         "groups": list(range(len(chunk))), "extra_infos": [{} for _ in chunk]},
                  warmup={"spec": spec})
             for chunk in chunks]
    for chunk, out in zip(chunks, host.run(calls, spec["timeout"]), strict=True):
        for i, (value, why) in zip(chunk, _read(out, spec, len(chunk)), strict=True):
            scores[i] = value
            if why is not None:
                failures[i], timed_out[i] = f"{describe(spec)}: {why}", out.timed_out
    return scores, failures, timed_out


@atexit.register
def close_hosts() -> None:
    """Stop every host this process started (their workers or actors)."""
    for host in _HOSTS.values():
        host.close()
    _HOSTS.clear()
