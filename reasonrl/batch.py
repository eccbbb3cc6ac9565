"""The records that cross stage boundaries, one dataclass per boundary.

data -> `Example`; rollout engine -> `Rollouts`; rewards -> `Scores`; the batch collected
for a step (rollouts, scores, shaped rewards, which rows train) -> `StepBatch`; the trainer
then packs rollouts + advantages into a `TrainBatch` for the policy worker. Everything that
is per completion is aligned by index (row i of every tensor is completion i), and a
per-completion record can be cut (`take`) and joined (`concat`) as a whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

R = TypeVar("R", bound="Rows")


class Rows:
    """A record with one entry per completion in each tensor, list or dict-of-tensors field;
    other fields (counts, versions) describe the whole record."""

    def take(self: R, rows: list[int]) -> R:
        """These rows, in this order; the other fields are kept."""
        values = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                values[f.name] = v[rows]
            elif isinstance(v, list):
                values[f.name] = [v[i] for i in rows]
            elif isinstance(v, dict):
                values[f.name] = {k: x[rows] for k, x in v.items()}
        return dataclasses.replace(self, **values)

    @classmethod
    def concat(cls: type[R], records: list[R]) -> R:
        """The rows of `records` in order; counts add up (or merge as the field's metadata
        says, e.g. the oldest policy version), a field None in any record is None."""
        if len(records) == 1:
            return records[0]
        values = {}
        for f in dataclasses.fields(cls):
            vs = [getattr(r, f.name) for r in records]
            if any(v is None for v in vs):
                values[f.name] = None
            elif isinstance(vs[0], torch.Tensor):
                values[f.name] = torch.cat(vs)
            elif isinstance(vs[0], list):
                values[f.name] = [x for v in vs for x in v]
            elif isinstance(vs[0], dict):
                values[f.name] = {k: torch.cat([v[k] for v in vs]) for k in vs[0]}
            elif isinstance(vs[0], (int, float)):
                values[f.name] = f.metadata.get("merge", sum)(vs)
        return dataclasses.replace(records[0], **values)


@dataclass(frozen=True)
class Example:
    """One task instance.

    `prompt` is what the model is asked: a plain question (the chat template is applied
    later), already-templated text, or a list of chat messages ({"role", "content"}).
    `ground_truth` is what the reward compares against; `meta` keeps anything else
    (e.g. the source file and line) for error messages and sample logs.
    """

    prompt: str | list[dict[str, str]]
    ground_truth: str
    data_source: str = "unknown"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Rollouts(Rows):
    """G completions for each of B prompts, flattened to N = B * G rows, group-major."""

    prompt_ids: list[list[int]]  # the prompt's token ids (no padding), per row
    completion_ids: list[list[int]]  # generated ids up to and including EOS, per row
    texts: list[str]  # completion text, special tokens removed
    group: torch.Tensor  # [N] long: which prompt (0..B-1) the row answers
    truncated: torch.Tensor  # [N] bool: hit max_new_tokens without EOS
    examples: list[Example]  # per row (the same object repeated within a group)
    sampler_logprobs: list[torch.Tensor] | None = None  # engine's per-token log-probs, if any
    # the policy step whose weights generated these rows (merged batches keep the oldest)
    policy_version: int = field(default=0, metadata={"merge": min})

    def __len__(self) -> int:
        return len(self.completion_ids)

    @property
    def completion_lengths(self) -> torch.Tensor:
        return torch.tensor([len(c) for c in self.completion_ids], dtype=torch.float32)


@dataclass
class Scores(Rows):
    """Rewards aligned with `Rollouts`: the weighted total and each raw component."""

    total: torch.Tensor  # [N] float
    components: dict[str, torch.Tensor]  # name -> [N] float, unweighted
    errors: int = 0  # reward calls that raised and were scored 0
    timeouts: int = 0  # reward calls that ran past reward.timeout and were scored 0


@dataclass
class StepBatch:
    """What a step trains on, as collected (`reasonrl.collect.collect_batch`)."""

    rollouts: Rollouts
    scores: Scores
    rewards: torch.Tensor  # [N] the task scores plus shaping (overlong penalty, KL in the reward)
    trainable: torch.Tensor  # [N] bool: rows that enter the loss
    stats: dict[str, float] = field(default_factory=dict)  # rollout/ and reward/ metrics of collecting
    seconds: dict[str, float] = field(default_factory=dict)  # time spent: rollout, reward


@dataclass
class TrainBatch:
    """What the policy worker needs for one optimizer step."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor  # [N] float, one per completion
    loss_mask: torch.Tensor | None = None  # [N] bool: rows that enter the loss (None = all)
    sampler_logprobs: list[torch.Tensor] | None = None  # engine's per-token log-probs (mismatch, TIS)
