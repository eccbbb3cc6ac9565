"""The `rollout.engine` registry: each entry builds an engine from the policy's model.

`logprobs`: the engine reports the sampler's per-token log-probs (`algo.importance_correction` needs
them). `missing`: a function saying why the engine cannot run here (a missing extra), or
None. `machine_gpus`: a function of the `rollout` section giving (the GPUs one engine needs
on a single machine, the key that asks for them), (0, "") for none in particular: placement
checks them against the machine (local mode) or the Ray cluster's machines, without naming
an engine. The config's rules ask the entry too (`reasonrl.config.rules`): `tensor_parallel`:
one engine may spread over several GPUs (rollout.vllm.tensor_parallel_size > 1 is allowed);
`max_model_len`: a function of the `rollout` section giving (the engine's own limit on prompt +
completion tokens, the key that sets it), (0, "") for none, checked against the model's context.
`probes`: a function of the `rollout` section: whether pushes may be checked by the log-probs
of `reasonrl.weights.probe_ids` (`probe_ids` says which); asynchronous ray mode computes the
policy's for every version it publishes, since the replicas are busy generating then.
vLLM itself (an optional extra) is imported only when its engine is built.
"""

from __future__ import annotations

from reasonrl.config import RolloutConfig
from reasonrl.errors import MissingExtraError
from reasonrl.registry import ENGINES
from reasonrl.rollout.base import RolloutEngine
from reasonrl.rollout.hf import HFEngine
from reasonrl.rollout.vllm import VLLMEngine, vllm_missing


def no_machine_gpus(options: RolloutConfig) -> tuple[int, str]:
    """The HF engine runs on the device it is given: no GPU count of its own."""
    return 0, ""


def vllm_machine_gpus(options: RolloutConfig) -> tuple[int, str]:
    """vLLM's tensor parallelism spreads one engine over `tensor_parallel_size` GPUs of one
    machine; a size of 1 asks for no particular count (vLLM also runs on the CPU)."""
    tp = options.vllm.tensor_parallel_size
    return (tp, "rollout.vllm.tensor_parallel_size") if tp > 1 else (0, "")


def no_max_model_len(options: RolloutConfig) -> tuple[int, str]:
    """The HF engine generates as far as the model's context: no limit of its own."""
    return 0, ""


def vllm_max_model_len(options: RolloutConfig) -> tuple[int, str]:
    """vLLM's `max_model_len` (0 = the model's own limit)."""
    return options.vllm.max_model_len, "rollout.vllm.max_model_len"


@ENGINES.register("hf", logprobs=True, missing=lambda: None, machine_gpus=no_machine_gpus,
                  tensor_parallel=False, max_model_len=no_max_model_len, probes=lambda options: False)
def hf_engine(model, tokenizer, options, threads: int = 0) -> RolloutEngine:
    """transformers: generation with the policy's own model (shared when colocated); its
    log-probs are the policy worker's quantity (temperature applied, no top-k / top-p
    renormalisation; `reasonrl.rollout.hf`)"""
    return HFEngine(model, tokenizer, decoder=options.hf_decoder, reuse_kv=options.hf_reuse_kv)


@ENGINES.register("vllm", logprobs=True, missing=vllm_missing, machine_gpus=vllm_machine_gpus,
                  tensor_parallel=True, max_model_len=vllm_max_model_len,
                  probes=lambda options: options.vllm.probe_every > 0)
def vllm_engine(model, tokenizer, options, threads: int = 0) -> RolloutEngine:
    """vLLM in this process, from a copy of the policy's weights"""
    return VLLMEngine(model, tokenizer, options.vllm, threads=threads)


def make_engine(name: str, model, tokenizer, options: RolloutConfig | None = None,
                threads: int = 0) -> RolloutEngine:
    """The engine `rollout.engine=name`. `options` is the `rollout` config section (None: its
    defaults); `threads` the CPU threads the trainer uses (0 = torch's)."""
    options = options if options is not None else RolloutConfig()
    entry = ENGINES[name]
    problem = entry.missing()
    if problem is not None:
        raise MissingExtraError(problem)
    return entry.fn(model, tokenizer, options, threads)
