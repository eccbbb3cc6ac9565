"""What every rollout engine takes and gives, and the protocol it implements.

An engine only maps token ids to token ids (`generate`, in a `session` when calls continue
each other), accepts new weights (`load_weights`), reports a checksum of the weights it
serves, may ask for a probe to verify a push, and frees what it holds (`close`). Everything
else (prompt rendering, decoding, bookkeeping) is the `RolloutWorker`'s, so every engine
yields identical `Rollouts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    greedy: bool = False  # argmax decoding (evaluation)
    # strings that also end a row, like EOS: the row ends with the token that completes one (kept,
    # with whatever else that token holds); a multi-turn episode's tool-call closing tags
    stop: tuple[str, ...] = ()


@dataclass
class Generation:
    """Engine output: for each prompt, `n` completions (ids up to and including EOS)."""

    completion_ids: list[list[int]]  # N = len(prompts) * n rows, prompt-major
    truncated: list[bool]  # row ended at max_new_tokens without EOS or a stop string
    logprobs: list[torch.Tensor] | None = None  # sampler's per-token log-probs, if known


SEED_BOUND = 2**31 - 1  # per-prompt seeds are drawn in [0, SEED_BOUND) (vLLM takes them as int32 too)


def prompt_seeds(count: int, generator: torch.Generator | None = None) -> list[int]:
    """One sampling seed per prompt, drawn in prompt order from torch's global RNG (which
    `trainer.seed` seeds and checkpoints save), or from `generator`. An engine samples prompt
    i's completions from seed i alone, so the samples do not depend on how the prompts are
    batched or split between rollout replicas."""
    return torch.randint(0, SEED_BOUND, (count,), generator=generator).tolist()


@runtime_checkable
class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> Generation:
        """`params.n` completions per prompt; prompt i's from `seeds[i]` alone (None: drawn
        here with `prompt_seeds`; ignored by greedy decoding)."""
        ...

    def session(self) -> AbstractContextManager:
        """A block of `generate` calls that continue each other (a multi-turn episode's turns:
        each call's prompts extend the previous call's prompts and completions), within which
        the engine may keep and reuse their KV caches. The weights do not change inside it."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def weights_checksum(self) -> float:
        """`reasonrl.weights.weights_checksum` of the weights the engine generates with."""
        ...

    def probe_ids(self, push: int) -> list[int] | None:
        """Token ids whose log-probs must match the policy's after push number `push`
        (1-based), or None: the checksum covers all this engine computes with."""
        ...

    def check_probe(self, expected: torch.Tensor, when: str) -> float:
        """Max |engine - expected| over the probe's log-probs; `WeightSyncError` above the
        engine's tolerance."""
        ...

    def close(self) -> None:
        """Free the engine's memory and process state; the engine is unusable after."""
        ...
