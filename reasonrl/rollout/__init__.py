"""Rollout engines behind one protocol, and the worker that turns examples into `Rollouts`.

An engine only maps token ids to token ids (`generate`), accepts new weights
(`load_weights`) and reports a checksum of the weights it serves (`weights_checksum`);
the `RolloutWorker` owns prompt rendering, decoding, bookkeeping and the policy version
its rollouts come from, so every engine yields identical `Rollouts`.
"""

from __future__ import annotations

import math
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

    def weights_checksum(self) -> float:
        """`weights_checksum` of the weights the engine generates with, by HF name."""
        ...


class WeightSyncError(RuntimeError):
    """The rollout engine does not serve the policy's weights after a push."""


CHECKSUM_SAMPLE = 65536  # elements read per tensor: cheap (~0.05 s for 135M) and exact


def weights_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
    """A cheap fingerprint of a set of weights: per tensor, the float64 sum of an evenly
    strided sample of at most CHECKSUM_SAMPLE elements, weighted by the tensor's rank in
    name order (so swapped tensors differ too); names seen twice (tied weights) count once.

    An optimizer step moves every element it touches by ~lr, far above float64 rounding
    (~1e-16 relative), so a skipped or partial push changes the value; two copies of the
    same weights give the same value whatever the thread count (`checksums_match`).
    """
    sums: dict[str, float] = {}
    for name, tensor in named_tensors:
        if name in sums:
            continue
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // CHECKSUM_SAMPLE)
        sums[name] = flat[::stride].to("cpu", torch.float64).sum().item()
    return math.fsum((rank + 1) * sums[name] for rank, name in enumerate(sorted(sums)))


def checksums_match(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# A fixed token sequence whose log-probs an engine and the policy must agree on, for
# engines whose checksum cannot see everything they compute with (vLLM's packed layers).
PROBE_TEXT = ("<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n12 + 7 equals 19. "
              "The quick brown fox jumps over the lazy dog; 3 * (4 - 1) = 9.<|im_end|>")


@torch.no_grad()
def reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """fp32 log-probs [len(ids) - 1] of ids[1:] given the preceding ids: one transformers
    forward of `model` in eval mode, log-softmax in float32, at temperature 1."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
    finally:
        model.train(was_training)
    targets = torch.tensor(ids[1:], device=device).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1).cpu()


class RolloutWorker:
    """Renders prompts, calls the engine, decodes, and returns group-major `Rollouts`."""

    def __init__(self, engine: RolloutEngine, tokenizer, apply_chat_template: bool = True,
                 system_prompt: str = "", max_prompt_tokens: int = 256):
        self.engine, self.tokenizer = engine, tokenizer
        self.apply_chat_template, self.system_prompt = apply_chat_template, system_prompt
        self.max_prompt_tokens = max_prompt_tokens
        self.policy_version = 0  # the policy step whose weights the engine serves
        self.pushes = 0  # weight pushes so far (the probe runs on every probe_every-th)

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
        """The probe token ids when the coming push should be verified by log-probs
        (engines with `check_probe`, on every `probe_every`-th push), else None; the
        caller passes the policy's `reference_logprobs` of them as `expected_probe`."""
        every = getattr(self.engine, "probe_every", 0)
        if hasattr(self.engine, "check_probe") and every > 0 and (self.pushes + 1) % every == 0:
            return list(self.engine.probe_ids)
        return None

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


ENGINES = ("hf", "vllm")
# engines whose `Generation.logprobs` are the sampler's (needed by algo.tis_cap)
ENGINES_WITH_LOGPROBS = ("vllm",)


def engine_problem(name: str) -> str | None:
    """Why `rollout.engine=name` cannot run here (a missing extra), or None."""
    if name == "vllm":
        from reasonrl.rollout.vllm import vllm_missing

        return vllm_missing()
    return None


def make_engine(name: str, model, tokenizer, options=None, threads: int = 0) -> RolloutEngine:
    """The engine named by `rollout.engine`; the only place that switches on it.

    `options` is the `rollout` config section (its `vllm` subsection configures vLLM;
    None = the defaults); `threads` the CPU threads the trainer uses (0 = torch's).
    The HF engine shares `model`; the vLLM engine starts from a copy of its weights.
    """
    if name == "hf":
        from reasonrl.rollout.hf import HFEngine

        return HFEngine(model, tokenizer, lean=options is None or options.hf_lean)
    if name == "vllm":
        from reasonrl.rollout.vllm import VLLMEngine

        if options is None:
            from reasonrl.config import RolloutConfig

            options = RolloutConfig()
        return VLLMEngine(model, tokenizer, options.vllm, threads=threads)
    raise ValueError(f"rollout.engine: unknown engine {name!r}; allowed: {', '.join(ENGINES)}")
