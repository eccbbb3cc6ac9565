"""Where a step's batch comes from: one interface, `BatchSource`, so that the trainer's step
reads the same whatever the placement and the staleness. Two sources (`SOURCES`):

- `OnPolicy` (trainer.max_staleness = 0): collected when the step asks, by the current policy;
- `Ahead` (K > 0): collected ahead on a rollout side of its own (a process, or a thread
  driving the rollout replicas), by the policy up to K versions back, on a fixed schedule.

One module per job:

    schedule.py    which version makes which batch (`version_for`), which batches a version
                   allows, the cores shared by the trainer and the rollout side
    channel.py     the ordered command stream to the rollout side, and its command loop
    sides.py       the rollout side of each placement (`SIDES`: process, ray thread)
    held_out.py    the held-out eval of a version, one way for every source
    on_policy.py   `OnPolicy`
    ahead.py       `Ahead`, the trainer's handle on the rollout side

Every weight move goes through the run's `placement.WeightSync` (`push`, or `snapshot` and
`receive`), every worker is built by `reasonrl.placement`.
"""

from __future__ import annotations

import os
from typing import Protocol

from reasonrl.batch import Example, StepBatch
from reasonrl.config import Config
from reasonrl.evaluate import EvalSettings
from reasonrl.placement import Workers, side_beside
from reasonrl.rollout import SamplingParams
from reasonrl.source.ahead import Ahead
from reasonrl.source.on_policy import OnPolicy
from reasonrl.source.schedule import batches_allowed, split_threads, version_for
from reasonrl.source.sides import SIDES, ProcessSide, RaySide, SideParts

__all__ = ["SIDES", "SOURCES", "Ahead", "BatchSource", "OnPolicy", "ProcessSide", "RaySide", "SideParts",
           "batches_allowed",
           "make_source", "source_name", "split_threads", "trainer_threads", "version_for"]


class BatchSource(Protocol):
    def take(self, step: int) -> tuple[StepBatch, dict[str, float]]:
        """The batch step `step` (0-based) trains on, made by policy version
        `version_for(step, K)` (checked), and the metrics of its making (`async/`)."""
        ...

    def publish(self, version: int, evaluate: bool = False) -> None:
        """Policy version `version` exists (the policy worker holds it): push it or snapshot it
        for the batches it makes; `evaluate`: its held-out eval will be asked for."""
        ...

    def evaluate(self, version: int) -> dict[str, float]:
        """The held-out `eval/` metrics of version `version`, with `time/eval`."""
        ...

    def state(self, step: int) -> tuple[dict, dict | None]:
        """(the prompt sampler's state, the batches in flight as plain data or None), for a
        checkpoint after `step` steps."""
        ...

    def restore(self, sampler: dict, in_flight: dict | None) -> None:
        """A checkpoint's `state`, before the first step."""
        ...

    def close(self) -> None:
        """Stop what the source runs (a rollout side); safe to call twice."""
        ...


SOURCES: dict[str, type] = {"on_policy": OnPolicy, "ahead": Ahead}


def source_name(cfg: Config) -> str:
    """The source trainer.max_staleness asks for: `ahead` when K > 0, else `on_policy`."""
    return "ahead" if cfg.trainer.max_staleness > 0 else "on_policy"


def trainer_threads(cfg: Config) -> int:
    """The trainer's torch threads: trainer.threads (0 = every core); with the rollout process
    beside it on this machine (local placement, ahead), `split_threads`' share."""
    t = cfg.trainer
    if side_beside(cfg):
        return split_threads(t.threads, cfg.rollout.threads)[0]
    return t.threads or os.cpu_count() or 1


def make_source(cfg: Config, workers: Workers, examples: list[Example], held_out: list[Example],
                settings: EvalSettings, sampling: SamplingParams) -> BatchSource:
    """The run's batch source (`SOURCES[source_name(cfg)]`) over the workers `placement` built."""
    threads = split_threads(cfg.trainer.threads, cfg.rollout.threads)[1]  # the rollout process's
    parts = SideParts(examples, held_out, settings, threads, judge=workers.judge)
    return SOURCES[source_name(cfg)].build(cfg, workers, parts, sampling)
