"""The decoding entry point: which decoder runs a `generate` call of the HF engine.

Three paths compute the same tokens (tests/accel/test_accel.py checks each against the
transformers model):

- `lean_mkl`: `LeanLlama` with its projections packed by MKL's GEMM for the decode batch
  (x86 torch builds with MKL, fp32 on CPU);
- `lean`: `LeanLlama` with plain layouts (`[in, out]`, column blocks): any CPU, any GPU;
- `modules`: the transformers modules (`ModulesDecoder`): any causal LM.

`rollout.hf_decoder=auto` picks the fastest on the machine at hand (`reasonrl.accel.calibrate`);
a path that cannot run a model (not Llama-family, wrapped by LoRA, hooks, no MKL) falls back
to the next one (`FALLBACK`) and says why.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch

from reasonrl.accel import lean_decode
from reasonrl.accel.lean_decode import LeanLlama, unsupported_reason
from reasonrl.accel.memory import release_free_memory
from reasonrl.accel.modules import ModulesDecoder, transposed_linear_weights

DECODERS = ("auto", "lean_mkl", "lean", "modules")
FALLBACK = {"lean_mkl": "lean", "lean": "modules"}
KV_REUSE = ("lean_mkl", "lean")  # the decoders with `rows_cache` / `prefill_cached`


class Decoder(Protocol):
    """The decode state of one `generate` call (see `LeanLlama`)."""

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor: ...

    def repeat(self, n: int) -> None: ...

    def select(self, rows: torch.Tensor) -> None: ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor: ...


class CachingDecoder(Decoder, Protocol):
    """A decoder (`KV_REUSE`) whose rows' KV caches can be taken out and prefilled after."""

    def rows_cache(self, rows: torch.Tensor) -> list[torch.Tensor]: ...

    def prefill_cached(self, past: list[torch.Tensor], ids: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor: ...


def _device(model) -> torch.device:
    return next(model.parameters()).device


def unavailable(model, path: str) -> str | None:
    """Why `path` cannot decode `model` here, in words; None when it can."""
    if path not in DECODERS or path == "auto":
        raise ValueError(f"rollout.hf_decoder: unknown decoder {path!r}; allowed: {', '.join(DECODERS)}")
    if path == "modules":
        return None
    reason = unsupported_reason(model)
    if reason is not None or path == "lean":
        return reason
    weight = model.get_output_embeddings().weight
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        return f"MKL packing needs fp32 weights on the CPU (these are {weight.dtype} on {weight.device.type})"
    if not lean_decode.mkl_packing():
        return "this torch has no MKL packed GEMM (not an x86 MKL build)"
    return None


@contextlib.contextmanager
def decoder(model, prompt_width: int, max_new_tokens: int, path: str) -> Iterator[Decoder]:
    """The decoder `path` for one `generate` call over prompts of `prompt_width` columns.

    The lean paths copy the weights into their own layouts; `modules` on CPU computes with
    transposed copies swapped into the model for the duration of the block. On CPU the
    copies' pages go back to the system afterwards (`release_free_memory`)."""
    cpu = _device(model).type == "cpu"
    try:
        if path == "modules":
            with transposed_linear_weights(model) if cpu else contextlib.nullcontext():
                yield ModulesDecoder(model, max_new_tokens)
        else:
            yield LeanLlama(model, prompt_width + max_new_tokens, mkl=path == "lean_mkl")
    finally:
        if cpu:
            release_free_memory()
