"""The `judge` and `classifier` components of a scoring: reward.model's rows cut into batches, each
batch one `score` call of the judge worker, and each row read back as a score or as a counted
failure.

The judge is a role like the others (`reasonrl.placement.roles`: placement.judge), built with
the run's workers and passed in here; it is isolated (a process of its own in local placement,
an actor of its own in ray placement), so a model that hangs cannot hang the run. Its model loads
when it is built, within reward.model.load_timeout: a model that cannot load stops the run then
(`ModelLoadError`), before any step.

Each batch of reward.model.batch_size rows gets reward.model.timeout seconds (the worker's own
timer at that, a kill at `hard_deadline`: `WorkerTimeout`). A batch past it scores 0 on each of
its rows, counted in reward/timeouts, and the next batch goes to a fresh worker, which loads the
model again; a batch that raises (`WorkerCallError`) scores 0 on its rows, counted in
reward/errors; a row whose answer cannot be read (no number, a number out of range, a text
longer than the model's context) fails alone. Never a crash: the run goes on with the rows that
scored.
"""

from __future__ import annotations

import math

from reasonrl.errors import WorkerCallError, WorkerTimeout
from reasonrl.registry import REWARD_COMPONENTS
from reasonrl.rewards.failures import describe_exception
from reasonrl.rewards.pool import Outcome


def is_model_component(name: str) -> bool:
    """Whether reward.weights' `name` is scored by reward.model (`judge`, `classifier`)."""
    return name in REWARD_COMPONENTS and REWARD_COMPONENTS[name].model


def describe(kind: str, model_cfg) -> str:
    """How failures name the model: "the judge (reward.model.path=...)"."""
    return f"the {kind} (reward.model.path={model_cfg.path or 'the embedded model'})"


def _read(out: Outcome, model_cfg, size: int) -> list[tuple[float, str | None]]:
    """One batch's Outcome as (score, why it failed or None) per row."""
    if out.timed_out:
        why = f"timed out (reward.model.timeout: {model_cfg.timeout:g} s per batch of {size})"
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


def _call(judge, prompts: list, completions: list[str], ground_truths: list[str]) -> Outcome:
    """One batch through the judge worker, as an Outcome."""
    try:
        return Outcome(value=judge.score(prompts, completions, ground_truths))
    except WorkerTimeout:
        return Outcome(timed_out=True)
    except WorkerCallError as err:
        return Outcome(error=str(err))
    except Exception as err:  # a judge worker in this process (tests): what it raised
        return Outcome(error=describe_exception(err))


def score_with_model(kind: str, model_cfg, judge, prompts: list, completions: list[str],
                     ground_truths: list[str],
                     rows: list[int]) -> tuple[list[float], list[str | None], list[bool]]:
    """The `kind` component (`judge` / `classifier`) of reward.model (`model_cfg`, a
    RewardModelConfig) scored by `judge` (the judge role's worker) for `rows` of these
    completions, in batches of reward.model.batch_size; the other rows score 0 and are not sent
    (rows a gate zeroes). Returns per row (score, failure message naming the model or None,
    whether it timed out)."""
    if judge is None or model_cfg is None:
        raise ValueError(f"reward.weights names {kind!r}, which reward.model scores: pass the judge role's "
                         "worker (judge=, built by reasonrl.placement.build_workers) and reward.model "
                         "(model=)")
    n = len(completions)
    scores, failures, timed_out = [0.0] * n, [None] * n, [False] * n
    size = model_cfg.batch_size
    for chunk in (rows[start: start + size] for start in range(0, len(rows), size)):
        out = _call(judge, [prompts[i] for i in chunk], [completions[i] for i in chunk],
                    [ground_truths[i] for i in chunk])
        for i, (value, why) in zip(chunk, _read(out, model_cfg, len(chunk)), strict=True):
            scores[i] = value
            if why is not None:
                failures[i], timed_out[i] = f"{describe(kind, model_cfg)}: {why}", out.timed_out
    return scores, failures, timed_out
