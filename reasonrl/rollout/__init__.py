"""Rollout engines behind one protocol, and the worker that turns examples into `Rollouts`.

An engine only maps token ids to token ids (`generate`) and accepts new weights
(`load_weights`); the `RolloutWorker` owns prompt rendering, decoding and bookkeeping,
so every engine (transformers here, vLLM later) yields identical `Rollouts`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from reasonrl.batch import Example, Rollouts
from reasonrl.data import DataError, render_prompt


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    greedy: bool = False  # argmax decoding (evaluation)


@dataclass
class Generation:
    """Engine output: for each prompt, `n` completions (ids up to and including EOS)."""

    completion_ids: list[list[int]]  # N = len(prompts) * n rows, prompt-major
    truncated: list[bool]  # row ended at max_new_tokens without EOS
    logprobs: list[torch.Tensor] | None = None  # sampler's per-token log-probs, if known


class RolloutEngine(Protocol):
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Generation: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...


class RolloutWorker:
    """Renders prompts, calls the engine, decodes, and returns group-major `Rollouts`."""

    def __init__(self, engine: RolloutEngine, tokenizer, apply_chat_template: bool = True,
                 system_prompt: str = "", max_prompt_tokens: int = 256):
        self.engine, self.tokenizer = engine, tokenizer
        self.apply_chat_template, self.system_prompt = apply_chat_template, system_prompt
        self.max_prompt_tokens = max_prompt_tokens

    def encode(self, example: Example) -> list[int]:
        text = render_prompt(example, self.tokenizer, self.apply_chat_template, self.system_prompt)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            where = example.meta.get("origin", repr(str(example.prompt)[:60]))
            raise DataError(f"{where}: prompt has {len(ids)} tokens, more than "
                             f"data.max_prompt_tokens={self.max_prompt_tokens}; raise it or "
                             "shorten the prompt")
        return ids

    def rollout(self, examples: list[Example], params: SamplingParams) -> Rollouts:
        prompts = [self.encode(e) for e in examples]
        gen = self.engine.generate(prompts, params)
        n = params.n
        texts = self.tokenizer.batch_decode(gen.completion_ids, skip_special_tokens=True)
        return Rollouts(
            prompt_ids=[p for p in prompts for _ in range(n)],
            completion_ids=gen.completion_ids,
            texts=texts,
            group=torch.arange(len(examples)).repeat_interleave(n),
            truncated=torch.tensor(gen.truncated, dtype=torch.bool),
            examples=[e for e in examples for _ in range(n)],
            sampler_logprobs=gen.logprobs,
        )

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.load_weights(named_tensors)


def make_engine(name: str, model, tokenizer) -> RolloutEngine:
    """The engine named by `rollout.engine`; the only place that switches on it."""
    if name == "hf":
        from reasonrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer)
    raise ValueError(f"rollout.engine: unknown engine {name!r}; allowed: hf")
