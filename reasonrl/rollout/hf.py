"""The transformers rollout engine: a lean batched decode loop over the HF model, no gradients.

Works on any causal LM transformers loads, on CPU and GPU. What it does that
`model.generate` does not, each measured on this project's 2-core CPU (docs/performance.md):

- Each prompt is prefilled once and its KV cache copied to its `n` samples (generate
  prefills every sample's copy of the prompt).
- A finished row leaves the batch (its cache rows are dropped), so late steps cost only
  the rows still decoding; the loop ends when every row has hit EOS.
- Sampling draws one uniform number per row and inverts the cumulative distribution
  (`sample_tokens`), instead of `torch.multinomial`'s vocabulary-sized exponential draw.
- On CPU the linear layers decode with a transposed copy of their weights, made at the
  start of each `generate` call and dropped at its end: small-batch matrix products
  `x @ W.T` run ~2.5x faster when `W.T` is contiguous (bench/roofline.py); the policy's own
  parameters are untouched.

When the engine shares the policy's model object (colocated in one process, the default),
`load_weights` recognises the shared storage and copies nothing; given another model it
copies the tensors in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from reasonrl.policy.memory import release_free_memory
from reasonrl.rollout import Generation, SamplingParams, weights_checksum
from reasonrl.rollout.llama import LeanLlama, unsupported_reason


def filter_logits(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0) -> torch.Tensor:
    """Temperature, then top-k, then nucleus (top-p) filtering, in that order and with the
    same tie and boundary rules as transformers' TemperatureLogitsWarper, TopKLogitsWarper
    and TopPLogitsWarper (Holtzman et al. 2020, "The Curious Case of Neural Text
    Degeneration"): top-p keeps the smallest set of most likely tokens whose probability
    reaches `top_p`, and always at least one token. Filtered logits become -inf."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    if 0 < top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove = cumulative <= (1 - top_p)
        remove[..., -1:] = False  # keep the most likely token
        logits = logits.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    return logits


def sample_tokens(logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """One token per row of `logits` [B, V], distributed as softmax(logits): inverse-CDF
    sampling with one uniform number per row (`uniform` [B] in [0, 1)): the first index whose
    cumulative probability exceeds u * total. Exact in distribution, like
    `torch.multinomial(softmax(logits), 1)`, at a fraction of its cost on CPU."""
    cdf = logits.softmax(dim=-1).cumsum(dim=-1)
    target = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_(max=logits.size(-1) - 1)  # u * total rounding up onto the last edge


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
    `reasonrl.rollout.llama.LeanLlama`: `prefill`, `repeat`, `select`, `step`."""

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


class HFEngine:
    """`lean`: decode Llama-family models with `reasonrl.rollout.llama.LeanLlama` (same
    mathematics, fewer and larger operations); other models, or `lean=False`, run the
    transformers modules (`ModulesDecoder`)."""

    def __init__(self, model, tokenizer, lean: bool = True):
        self.model, self.tokenizer = model, tokenizer
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.want_lean = lean

    @property
    def lean_off_reason(self) -> str | None:
        """Why this call decodes through the transformers modules (None: it uses LeanLlama);
        checked per call, since hooks or adapters may come after the engine."""
        return unsupported_reason(self.model) if self.want_lean else "rollout.hf_lean=false"

    @property
    def lean(self) -> bool:
        return self.lean_off_reason is None

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> Generation:
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        lean = self.lean
        # the lean decoder makes its own weight copies; the modules path decodes with
        # transposed copies swapped in on CPU (see the module docstring)
        cpu_modules = not lean and device.type == "cpu"
        layout = transposed_linear_weights(self.model) if cpu_modules else contextlib.nullcontext()
        try:
            with layout:
                rows = self._decode(prompt_ids, params, device, lean)
        finally:
            self.model.train(was_training)
        if device.type == "cpu":  # the decoder's weight copies are gone: give their pages back
            release_free_memory()
        # greedy samples of a prompt are all the same: each prompt was decoded once
        copies = params.n if params.greedy else 1
        completions, truncated = [], []
        for ids, done in rows:
            completions += [list(ids) for _ in range(copies)]
            truncated += [not done] * copies
        return Generation(completion_ids=completions, truncated=truncated)

    @torch.inference_mode()
    def _decode(self, prompt_ids: list[list[int]], params: SamplingParams, device: torch.device,
                lean: bool) -> list[tuple[list[int], bool]]:
        """(completion ids up to and including EOS, ended with EOS) per row, prompt-major."""
        samples = 1 if params.greedy else params.n
        width = max(len(p) for p in prompt_ids)
        # Left padding: every prompt ends at the same column, so decoding steps are batched.
        ids = torch.full((len(prompt_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        if lean:
            decoder = LeanLlama(self.model, width + params.max_new_tokens)
        else:
            decoder = ModulesDecoder(self.model, params.max_new_tokens)
        logits = decoder.prefill(ids, mask)
        if samples > 1:  # every sample of a prompt continues from the prompt's one prefill
            decoder.repeat(samples)
            logits = logits.repeat_interleave(samples, 0)
        n_rows = logits.size(0)
        eos = torch.tensor(sorted(self.eos_ids), device=device)
        active = torch.arange(n_rows, device=device)  # rows still decoding, by original index
        tokens = torch.full((n_rows, params.max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        # a row's length is set when it ends with EOS; rows that never do end at the limit
        lengths = torch.full((n_rows,), params.max_new_tokens, dtype=torch.long, device=device)
        finished = torch.zeros(n_rows, dtype=torch.bool, device=device)
        for t in range(params.max_new_tokens):
            if params.greedy:
                nxt = logits.argmax(dim=-1)
            else:
                filtered = filter_logits(logits, params.temperature, params.top_k, params.top_p)
                nxt = sample_tokens(filtered, torch.rand(active.numel(), device=device))
            tokens[active, t] = nxt
            done = torch.isin(nxt, eos)
            if bool(done.any()):
                ended = active[done]
                finished[ended] = True
                lengths[ended] = t + 1
                keep = (~done).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                decoder.select(keep)
                active, nxt = active[keep], nxt[keep]
            if t + 1 == params.max_new_tokens:
                break
            logits = decoder.step(nxt)
        tokens, lengths, finished = tokens.tolist(), lengths.tolist(), finished.tolist()
        return [(tokens[r][: lengths[r]], finished[r]) for r in range(n_rows)]

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
