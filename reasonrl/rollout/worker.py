"""The rollout worker: turns examples into `Rollouts` with any engine.

It owns what every engine shares: prompt rendering and its length check, decoding of the
sampled ids, the group index, and the policy version its rollouts come from. A weight push
goes through `load_weights`, which checks by checksum (and, for engines that ask, a probe
sequence's log-probs) that the engine serves exactly the policy's weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from reasonrl.batch import Example, Rollouts
from reasonrl.data import render_prompt
from reasonrl.errors import DataError, WeightSyncError
from reasonrl.rollout.base import RolloutEngine, SamplingParams
from reasonrl.weights import checksums_match


class RolloutWorker:
    """Renders prompts, calls the engine, decodes, and returns group-major `Rollouts`."""

    def __init__(self, engine: RolloutEngine | None, tokenizer, apply_chat_template: bool = True,
                 system_prompt: str = "", max_prompt_tokens: int = 256):
        self.engine, self.tokenizer = engine, tokenizer
        self.apply_chat_template, self.system_prompt = apply_chat_template, system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        self.policy_version = 0  # the policy step whose weights the engine serves
        self.pushes = 0  # weight pushes so far (an engine may verify every k-th by a probe)

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
            policy_version=self.policy_version,
        )

    def probe_due(self) -> list[int] | None:
        """The probe token ids when the engine wants the coming push verified by log-probs,
        else None; the caller passes the policy's `reference_logprobs` of them as
        `expected_probe`."""
        return self.engine.probe_ids(self.pushes + 1)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None,
                     expected_checksum: float | None = None,
                     expected_probe: torch.Tensor | None = None) -> None:
        """Push the policy's weights (of policy step `version`) into the engine. With
        `expected_checksum` (the policy's `weights_checksum`), check that the engine now
        serves exactly those weights and raise `WeightSyncError` if not: a rollout engine
        must never silently generate with stale weights. With `expected_probe` (the
        policy's log-probs of `probe_due()`'s ids) the engine's must match them too."""
        self.engine.load_weights(named_tensors)
        self.pushes += 1
        if expected_checksum is not None:
            served = self.engine.weights_checksum()
            if not checksums_match(served, expected_checksum):
                raise WeightSyncError(
                    f"weight sync to policy version {version}: the rollout engine "
                    f"({type(self.engine).__name__}) serves weights with checksum {served!r}, the "
                    f"policy's is {expected_checksum!r}; the push was skipped or incomplete")
        if expected_probe is not None:
            self.engine.check_probe(expected_probe, f"after pushing policy version {version}")
        if version is not None:
            self.policy_version = version

    def close(self) -> None:
        """Free the engine (vLLM's memory and process state); the worker is unusable after."""
        self.engine.close()
