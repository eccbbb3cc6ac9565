"""The `rollout.engine` registry: each entry builds an engine from the policy's model.

`logprobs`: the engine reports the sampler's per-token log-probs (`algo.tis_cap` needs
them). `missing`: a function saying why the engine cannot run here (a missing extra), or
None. vLLM itself (an optional extra) is imported only when its engine is built.
"""

from __future__ import annotations

from reasonrl.config import RolloutConfig
from reasonrl.errors import MissingExtraError
from reasonrl.registry import ENGINES
from reasonrl.rollout.base import RolloutEngine
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.vllm import VLLMEngine, vllm_missing


@ENGINES.register("hf", logprobs=False, missing=lambda: None)
def hf_engine(model, tokenizer, options, threads: int = 0) -> RolloutEngine:
    """transformers: generation with the policy's own model (shared when colocated)"""
    return HFEngine(model, tokenizer, decoder=options.hf_decoder, reuse_kv=options.hf_reuse_kv)


@ENGINES.register("vllm", logprobs=True, missing=vllm_missing)
def vllm_engine(model, tokenizer, options, threads: int = 0) -> RolloutEngine:
    """vLLM in this process, from a copy of the policy's weights"""
    return VLLMEngine(model, tokenizer, options.vllm, threads=threads)


def make_engine(name: str, model, tokenizer, options: RolloutConfig | None = None,
                threads: int = 0) -> RolloutEngine:
    """The engine `rollout.engine=name`. `options` is the `rollout` config section (None: its
    defaults); `threads` the CPU threads the trainer uses (0 = torch's)."""
    options = options if options is not None else RolloutConfig()
    entry = ENGINES[name]
    problem = entry.info["missing"]()
    if problem is not None:
        raise MissingExtraError(problem)
    return entry.fn(model, tokenizer, options, threads)
