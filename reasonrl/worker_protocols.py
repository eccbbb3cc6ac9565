"""The worker APIs the trainer (and the evaluation) call, declared.

`PolicyWorker` (reasonrl.workers.policy, and its data-parallel ranks), `RolloutWorker`
(reasonrl.rollout.worker), `CriticWorker` (reasonrl.workers.critic), `TeacherWorker`
(reasonrl.workers.teacher), the reference served within the policy's worker
(reasonrl.workers.frozen.ReferenceOf) and `RewardModelWorker` (reasonrl.workers.judge)
implement them as plain objects; `reasonrl.placement.roles` names the role of each.
`reasonrl.placement` hands the trainer either those objects (local mode) or Ray proxies built
from these protocols, method by method (ray mode): a method missing from a worker fails when its
actor starts, not when the trainer first calls it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch

from reasonrl.batch import CriticBatch, Example, Rollouts, TrainBatch
from reasonrl.rollout.base import SamplingParams


class PolicyWorkerAPI(Protocol):
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """The optimizer steps of one training step; `train/` metrics."""
        ...

    def reference_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                           rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each completion's token log-probs under the reference model (the reference stage);
        `rows` [N] bool: only those, laid out as the update lays them out (others empty)."""
        ...

    def token_kl(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 ref_logprobs: list[torch.Tensor], logprobs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each completion's per-token KL of the policy's log-probs given (the log-probs stage's,
        every row) to the reference log-probs given (KL in the reward); no forward."""
        ...

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each completion's token log-probs under the policy now, without gradient (the
        log-probs stage: the KL in the reward, the teacher stage's student side, the update's
        old log-probs); `rows` [N] bool: only those, laid out as the update lays them out
        (others empty)."""
        ...

    def row_entropies(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                      temperature: float = 1.0) -> list[torch.Tensor]:
        """Per-token entropies of each completion (evaluation)."""
        ...

    def named_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The weights a rollout engine serves, by HF name (LoRA: merged)."""
        ...

    def sync_plan(self, bucket_bytes: int) -> list[list[str]]:
        """The names of the weights a sync sends (those training changes: with LoRA only the
        adapted layers, merged), in buckets of at most `bucket_bytes` that keep each decoder
        layer whole (a larger layer or tensor is a bucket of its own)."""
        ...

    def weight_bucket(self, names: list[str]) -> list[tuple[str, torch.Tensor]]:
        """The full tensors of `names` (one bucket of `sync_plan`), on the CPU. Data-parallel
        ranks: collective, gathered on rank 0 alone (the other ranks return [])."""
        ...

    def weights_checksum(self) -> float: ...

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor: ...

    def save_pretrained(self, path: Path, tokenizer=None) -> None: ...

    def save_adapter(self, path: Path) -> bool: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None: ...

    def close(self) -> None: ...


class CriticWorkerAPI(Protocol):
    """The value model of critic estimators (algo.advantage=gae)."""

    def values(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Each completion's per-token values V(s_t)."""
        ...

    def train_step(self, batch: CriticBatch) -> dict[str, float]: ...

    def save(self, folder: Path) -> None: ...

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


class TeacherWorkerAPI(Protocol):
    """The teacher of on-policy distillation (teacher.path): a frozen model
    (reasonrl.workers.frozen.FrozenModel) that scores the student's samples and is never trained
    nor given a weight sync."""

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each completion's token log-probs under the teacher (the teacher stage); `rows` [N]
        bool: only those (others empty)."""
        ...

    def weights_checksum(self) -> float:
        """The teacher's weights' checksum: the same all run long."""
        ...

    def close(self) -> None: ...


class ReferenceWorkerAPI(Protocol):
    """The reference model (algo.beta > 0 or algo.log_kl): a frozen model served within the
    policy's worker, laid out as the policy's update lays out its rows."""

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each completion's token log-probs under the reference model (the reference stage);
        `rows` [N] bool: only those, laid out as the update lays them out (others empty)."""
        ...

    def close(self) -> None: ...


class JudgeWorkerAPI(Protocol):
    """A reward model or judge (reward.weights' `judge` / `classifier`: reward.model): a frozen
    model (reasonrl.workers.frozen.FrozenModel) that scores one batch of rows per call, in a
    process of its own (each call has a deadline)."""

    def score(self, prompts: list, completions: list[str], ground_truths: list[str]) -> list[float | str]:
        """One score per row: a number, or a string saying why the row has none."""
        ...

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """A causal judge's token log-probs of each completion (a classifier has none: an error);
        `rows` [N] bool: only those (others empty)."""
        ...

    def close(self) -> None: ...


class RolloutWorkerAPI(Protocol):
    def encode(self, example: Example, whole: bool = False) -> list[int]:
        """The prompt's token ids (DataError when it is longer than allowed, or its last
        data.max_prompt_tokens under data.truncate_prompts=left); `whole`: all, unchecked."""
        ...

    def rollout(self, examples: list[Example], params: SamplingParams,
                seeds: list[int] | None = None) -> Rollouts:
        """Example i's completions from `seeds[i]` (None: drawn from torch's RNG per example)."""
        ...

    def probe_due(self) -> list[int] | None: ...

    def load_weight_bucket(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """A part of a streamed push, loaded unchecked; `load_weights` ends the push and checks."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None,
                     expected_checksum: float | None = None,
                     expected_probe: torch.Tensor | None = None) -> None: ...

    def close(self) -> None: ...


def api_methods(api: type) -> tuple[str, ...]:
    """The public methods a protocol declares."""
    return tuple(sorted(n for n, v in vars(api).items() if callable(v) and not n.startswith("_")))


def missing_methods(worker: object, api: type) -> list[str]:
    return [name for name in api_methods(api) if not callable(getattr(worker, name, None))]
