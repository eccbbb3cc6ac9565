"""Decoding through the transformers modules: the plain path, for any causal LM.

The same `prefill` / `repeat` / `select` / `step` interface as `LeanLlama`, with two CPU
tricks that touch transformers' cache internals (hence here, not in `reasonrl.rollout`):
a KV cache that appends into preallocated room (`GrowingLayer`, a `DynamicLayer` subclass)
and, on CPU, linear layers computing with transposed copies of their weights
(`transposed_linear_weights`). A transformers upgrade that changes `DynamicLayer` breaks
this file and tests/accel/test_accel.py, nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


@contextlib.contextmanager
def transposed_linear_weights(model: nn.Module) -> Iterator[None]:
    """Within the block every `nn.Linear` of `model` computes with a column-major copy of its
    weight (same values, `W.t().contiguous().t()`), which the CPU's GEMM reads much faster at
    decode's small batch sizes; the original parameters are put back on exit. Weights tied
    between modules share one copy."""
    swapped: list[tuple[nn.Linear, nn.Parameter]] = []
    copies: dict[int, nn.Parameter] = {}
    try:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.Linear) and module.weight.dim() == 2:
                    w = module.weight
                    if id(w) not in copies:
                        copies[id(w)] = nn.Parameter(w.t().contiguous().t(), requires_grad=False)
                    swapped.append((module, w))
                    module.weight = copies[id(w)]
        yield
    finally:
        for module, w in swapped:
            module.weight = w


class GrowingLayer(DynamicLayer):
    """A KV-cache layer that appends into preallocated room for `reserve` more tokens:
    transformers' DynamicLayer concatenates the whole cache at every step (a copy of all
    keys and values per token: ~20% of a CPU decode step at 32 x 250 tokens). `keys` and
    `values` are views of the room's filled part."""

    room: tuple[torch.Tensor, torch.Tensor] | None = None  # key and value buffers with spare length

    def __init__(self, reserve: int):
        super().__init__()
        self.reserve = reserve

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        if self.room is None or length + new > self.room[0].shape[-2]:
            shape = (*key_states.shape[:-2], length + new + self.reserve, key_states.shape[-1])
            room = (key_states.new_empty(shape), value_states.new_empty(shape))
            if length:
                room[0][..., :length, :] = self.keys
                room[1][..., :length, :] = self.values
            self.room = room
        self.room[0][..., length: length + new, :] = key_states
        self.room[1][..., length: length + new, :] = value_states
        self.keys = self.room[0][..., : length + new, :]
        self.values = self.room[1][..., : length + new, :]
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.room = None  # the next update moves the compact result into a new room

    def batch_select_indices(self, indices) -> None:
        super().batch_select_indices(indices)
        self.room = None


def growing_cache(config, reserve: int) -> DynamicCache:
    """The model's DynamicCache with `GrowingLayer`s in place of its plain DynamicLayers."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


class ModulesDecoder:
    """Decoding through the transformers modules (any causal LM), with the same interface as
    `reasonrl.accel.lean_decode.LeanLlama`: `prefill`, `repeat`, `select`, `step`."""

    def __init__(self, model, max_new_tokens: int):
        self.model = model
        self.cache = growing_cache(model.config, max_new_tokens)
        self.mask: torch.Tensor | None = None  # [B, columns]: 1 = a real token
        self.positions: torch.Tensor | None = None  # [B, 1] the next token's position

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True, logits_to_keep=1)
        self.mask, self.positions = mask, mask.sum(1, keepdim=True)
        return out.logits[:, -1]

    def repeat(self, n: int) -> None:
        self.cache.batch_repeat_interleave(n)
        self.mask = self.mask.repeat_interleave(n, 0)
        self.positions = self.positions.repeat_interleave(n, 0)

    def select(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.positions = self.mask[rows], self.positions[rows]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.size(0), 1)], dim=1)
        out = self.model(input_ids=tokens.unsqueeze(1), attention_mask=self.mask, position_ids=self.positions,
                         past_key_values=self.cache, use_cache=True)
        self.positions = self.positions + 1
        return out.logits[:, -1]
