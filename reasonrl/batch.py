"""The records that cross stage boundaries, one dataclass per boundary.

data -> `Example`; rollout engine -> `Rollouts`; rewards -> `Scores`; the trainer then
packs rollouts + advantages into a `TrainBatch` for the policy worker. Everything that
is per completion is aligned by index (row i of every tensor is completion i).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


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
class Rollouts:
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
class Scores:
    """Rewards aligned with `Rollouts`: the weighted total and each raw component."""

    total: torch.Tensor  # [N] float
    components: dict[str, torch.Tensor]  # name -> [N] float, unweighted
    errors: int = 0  # reward calls that raised and were scored 0
    timeouts: int = 0  # reward calls that ran past reward.timeout and were scored 0


@dataclass
class TrainBatch:
    """What the policy worker needs for one optimizer step."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    advantages: torch.Tensor  # [N] float, one per completion
    loss_mask: torch.Tensor | None = None  # [N] bool: rows that enter the loss (None = all)
    sampler_logprobs: list[torch.Tensor] | None = None  # engine's per-token log-probs (mismatch, TIS)
