"""The transformers rollout engine: `model.generate` with a KV cache, no gradients.

Works everywhere transformers does. When the engine shares the policy's model object
(colocated in one process, the default), `load_weights` recognises the shared storage
and copies nothing; given another model it copies the tensors in.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from reasonrl.rollout import Generation, SamplingParams, weights_checksum


class HFEngine:
    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)

    @torch.inference_mode()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Generation:
        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompt_ids)
        # Left padding so every prompt ends at the same position and decoding is batched.
        ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p):] = torch.tensor(p)
            mask[i, width - len(p):] = 1
        # Greedy samples of a prompt are all the same (and transformers rejects greedy with
        # num_return_sequences > 1): decode each prompt once and repeat its row n times.
        copies = params.n if params.greedy else 1
        kwargs = dict(max_new_tokens=params.max_new_tokens, num_return_sequences=params.n // copies,
                      eos_token_id=sorted(self.eos_ids), pad_token_id=self.pad_id, use_cache=True)
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k or None)
        was_training = self.model.training
        self.model.eval()
        try:
            out = self.model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                      **kwargs)
        finally:
            self.model.train(was_training)
        completions, truncated = [], []
        for row in out[:, width:].tolist():
            end = next((j for j, t in enumerate(row) if t in self.eos_ids), None)
            ids = row if end is None else row[: end + 1]
            completions += [list(ids) for _ in range(copies)]
            truncated += [end is None] * copies
        return Generation(completion_ids=completions, truncated=truncated)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        params.update(dict(self.model.named_buffers()))
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"load_weights: the rollout model has no parameter {name!r}")
            target = params[name]
            if target.data_ptr() == tensor.data_ptr():
                continue  # shared with the policy: already up to date
            target.copy_(tensor)

    def weights_checksum(self) -> float:
        return weights_checksum(self.model.named_parameters())
