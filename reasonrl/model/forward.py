"""Micro-batches and the forwards that read them: what the policy and the critic run per
micro-batch (`completion_logprobs`, `completion_hidden`) and how rows become micro-batches.

Micro-batches are bucketed by length so padding costs little (or, `share_prompt`, grouped by
prompt so that a GRPO group's prompt runs once), at most `size` rows and, with a token budget
(`optim.max_tokens_per_micro_batch`), at most that many positions each; `per_row` cuts a
forward's [M, T] output back to one unpadded tensor per completion, `pad_like` lays such rows
into a micro-batch again.

Why per-length groups and not packed rows: on a CPU, SDPA has no variable-length kernel, so
packing rows into one sequence needs a block-diagonal mask whose attention costs the square of
the packed length (measured in bench/lengths.py); sorting rows by length and cutting by the
budget leaves little padding (`train/pad_fraction`) at no such cost. verl's dynamic batch size
does the same (`use_dynamic_bsz`, `ppo_max_token_len_per_gpu`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch

from reasonrl.accel import recompute_norm_outputs
from reasonrl.model.head import fusable, head_logprobs


@dataclass
class MicroBatch:
    """Rows of one forward/backward. Two layouts:

    - plain (`prompts` is None): `input_ids` [M, L] is each row's prompt + completion,
      right-padded, and `positions` [M, T] index the hidden states predicting completion
      token t;
    - shared prompt: the U distinct prompts of the rows are run once (`prompts` [U, P],
      right-padded, `prompt_mask`), `prompt_of_row` [M] maps rows to them, and `input_ids`
      [M, C] are the completion tokens that are inputs (all but each row's last), so that
      `attention_mask` [M, P + C] covers the row's prompt and its completion. The hidden
      state predicting completion token 0 is the prompt's last; token t > 0 is predicted
      from completion input t - 1 (`positions` then index the [M, 1 + C] concatenation).
    """

    rows: list[int]  # indices into the step batch
    input_ids: torch.Tensor  # plain: [M, L] prompt+completion; shared: [M, C] completion inputs
    attention_mask: torch.Tensor  # plain: [M, L]; shared: [M, P + C]
    positions: torch.Tensor  # [M, T]: index of the hidden state that predicts completion token t
    targets: torch.Tensor  # [M, T]: completion token ids
    mask: torch.Tensor  # [M, T] float: valid completion tokens
    prompts: torch.Tensor | None = None  # shared: [U, P] distinct prompts, right-padded
    prompt_mask: torch.Tensor | None = None  # shared: [U, P]
    prompt_of_row: torch.Tensor | None = None  # shared: [M] long, row -> its prompt in `prompts`

    @property
    def computed_tokens(self) -> int:
        """Positions this micro-batch runs through the model, padding included
        (`layout_tokens` of its rows): what the token budget bounds."""
        return self.input_ids.numel() + (0 if self.prompts is None else self.prompts.numel())

    @property
    def real_tokens(self) -> int:
        """The computed positions that are not padding."""
        if self.prompts is None:
            return int(self.attention_mask.sum())
        # the distinct prompts once, then each row's completion inputs
        return int(self.prompt_mask.sum()) + int(self.attention_mask[:, self.prompts.size(1):].sum())

    def to(self, device: torch.device) -> MicroBatch:
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device)
                                            for f in dataclasses.fields(self)
                                            if f.name != "rows" and getattr(self, f.name) is not None})


def row_mask(token_masks: list[list[int]] | None, i: int, length: int) -> torch.Tensor:
    """Row i's token mask [length] as floats: 1 on the model's tokens (all of them when
    `token_masks` is None), 0 on an episode's environment tokens."""
    if token_masks is None:
        return torch.ones(length)
    if len(token_masks[i]) != length:
        raise ValueError(f"row {i}: a token mask of {len(token_masks[i])} for {length} completion tokens")
    return torch.tensor(token_masks[i], dtype=torch.float32)


def make_micro_batches(prompt_ids: list[list[int]], completion_ids: list[list[int]],
                       size: int, pad_id: int, share_prompt: bool = False,
                       token_masks: list[list[int]] | None = None, max_tokens: int = 0) -> list[MicroBatch]:
    """Split rows into micro-batches of at most `size` rows and, with `max_tokens` > 0, at most
    `max_tokens` positions run through the model (`layout_tokens`: padding included), each
    padded only to its own maximum. A row longer than the budget is a micro-batch of its own.
    Plain: rows of similar total length go together. `share_prompt`: rows with the same prompt
    (a GRPO group) go together and the prompt is computed once per micro-batch (see
    `MicroBatch`). `token_masks` (multi-turn episodes): the mask is 1 only on the model's
    tokens; the environment's are inputs (context) but never targets of the loss.

    The budget changes only which rows share a forward: every normaliser of the objective is
    the step's (`reasonrl.algo.objective`), so the gradient is the same whatever the split.
    Where the budget cuts a shared-prompt layout, rows may instead be ordered by completion
    length (prompts repeated across micro-batches, little padding): whichever of the two
    orders runs fewer positions (long responses of unequal lengths: the second)."""
    chunks = micro_batch_rows(prompt_ids, completion_ids, size, share_prompt, max_tokens)
    build = _shared_prompt_batch if share_prompt else _plain_batch
    return [build(rows, prompt_ids, completion_ids, pad_id, token_masks) for rows in chunks]


def layout_tokens(prompt_ids: list[list[int]], completion_ids: list[list[int]], rows: list[int],
                  share_prompt: bool) -> int:
    """Positions a micro-batch of `rows` runs through the model, padding included: rows x the
    longest prompt + completion (plain), or the distinct prompts x the longest of them plus rows
    x the longest completion's inputs (shared prompt). Activation memory and time scale with it."""
    if not share_prompt:
        return len(rows) * max(len(prompt_ids[i]) + len(completion_ids[i]) for i in rows)
    distinct = {tuple(prompt_ids[i]) for i in rows}
    return (len(distinct) * max(len(p) for p in distinct)
            + len(rows) * max(len(completion_ids[i]) - 1 for i in rows))


def micro_batch_rows(prompt_ids: list[list[int]], completion_ids: list[list[int]], size: int,
                     share_prompt: bool, max_tokens: int = 0) -> list[list[int]]:
    """The rows of each micro-batch (`make_micro_batches`): the rows in layout order, cut
    greedily where the next row would pass `size` rows or `max_tokens` positions."""
    def cut(order: list[int]) -> list[list[int]]:
        # the open chunk's `layout_tokens` kept row by row: its longest row (prompt + completion,
        # or the completion's inputs), and for a shared prompt its distinct prompts and the widest
        chunks: list[list[int]] = []
        chunk: list[int] = []
        longest = width = 0
        distinct: set[tuple[int, ...]] = set()
        for i in order:
            p, c = prompt_ids[i], completion_ids[i]
            row = len(c) - 1 if share_prompt else len(p) + len(c)
            key = tuple(p) if share_prompt else ()
            tokens = (len(chunk) + 1) * max(longest, row)
            if share_prompt:
                tokens += (len(distinct) + (key not in distinct)) * max(width, len(p))
            if chunk and (len(chunk) == size or 0 < max_tokens < tokens):
                chunks.append(chunk)
                chunk, longest, width, distinct = [], 0, 0, set()
            chunk.append(i)
            longest, width = max(longest, row), max(width, len(p))
            distinct.add(key)
        return chunks + [chunk] if chunk else chunks

    rows = range(len(prompt_ids))
    if not share_prompt:  # by total length: per-length groups, little padding
        return cut(sorted(rows, key=lambda i: len(prompt_ids[i]) + len(completion_ids[i])))
    # by prompt (length, then content) and, within a prompt, by completion length: consecutive
    # chunks then hold few distinct prompts and little completion padding
    by_prompt = cut(sorted(rows, key=lambda i: (len(prompt_ids[i]), prompt_ids[i], len(completion_ids[i]))))
    if max_tokens <= 0 or all(len(c) == size for c in by_prompt[:-1]):
        return by_prompt  # the budget did not cut: the layout of the row cap alone
    by_length = cut(sorted(rows, key=lambda i: (len(completion_ids[i]), len(prompt_ids[i]), prompt_ids[i])))

    def cost(chunks: list[list[int]]) -> int:
        return sum(layout_tokens(prompt_ids, completion_ids, c, True) for c in chunks)

    return by_length if cost(by_length) < cost(by_prompt) else by_prompt


def _plain_batch(rows: list[int], prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 pad_id: int, token_masks: list[list[int]] | None) -> MicroBatch:
    width = max(len(prompt_ids[i]) + len(completion_ids[i]) for i in rows)
    t_max = max(max(len(completion_ids[i]) for i in rows), 1)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    positions = torch.zeros((len(rows), t_max), dtype=torch.long)
    targets = torch.zeros((len(rows), t_max), dtype=torch.long)
    mask = torch.zeros((len(rows), t_max))
    for j, i in enumerate(rows):
        p, c = prompt_ids[i], completion_ids[i]
        ids[j, : len(p) + len(c)] = torch.tensor(p + c)
        attn[j, : len(p) + len(c)] = 1
        positions[j, : len(c)] = torch.arange(len(p) - 1, len(p) - 1 + len(c))
        targets[j, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[j, : len(c)] = row_mask(token_masks, i, len(c))
    return MicroBatch(rows, ids, attn, positions, targets, mask)


def _shared_prompt_batch(rows: list[int], prompt_ids: list[list[int]], completion_ids: list[list[int]],
                         pad_id: int, token_masks: list[list[int]] | None) -> MicroBatch:
    distinct: dict[tuple[int, ...], int] = {}
    prompt_of_row = torch.tensor([distinct.setdefault(tuple(prompt_ids[i]), len(distinct)) for i in rows])
    width = max(len(p) for p in distinct)
    prompts = torch.full((len(distinct), width), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(distinct), width), dtype=torch.long)
    for u, p in enumerate(distinct):
        prompts[u, : len(p)] = torch.tensor(p)
        prompt_mask[u, : len(p)] = 1
    t_max = max(max(len(completion_ids[i]) for i in rows), 1)
    inputs = torch.full((len(rows), t_max - 1), pad_id, dtype=torch.long)
    attn = torch.cat([prompt_mask[prompt_of_row],
                      torch.zeros((len(rows), t_max - 1), dtype=torch.long)], 1)
    targets = torch.zeros((len(rows), t_max), dtype=torch.long)
    mask = torch.zeros((len(rows), t_max))
    for j, i in enumerate(rows):
        c = completion_ids[i]
        inputs[j, : len(c) - 1] = torch.tensor(c[:-1], dtype=torch.long)
        attn[j, width: width + len(c) - 1] = 1
        targets[j, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[j, : len(c)] = row_mask(token_masks, i, len(c))
    positions = torch.arange(t_max).expand(len(rows), t_max).clone()
    return MicroBatch(rows, inputs, attn, positions, targets, mask, prompts, prompt_mask, prompt_of_row)


def _shared_prompt_hidden(model, mb: MicroBatch) -> torch.Tensor:
    """[M, 1 + C, H]: the hidden states predicting each row's completion tokens, computing
    each distinct prompt once. The prompt's keys and values are copied to its rows (an
    `index_select`, differentiable), so the gradient of every row reaches the shared prompt
    forward: the same values and gradient as running each row's prompt separately."""
    from transformers import DynamicCache

    decoder = model.get_decoder()
    prompt_len = mb.prompt_mask.sum(1)
    cache = DynamicCache(config=model.config)
    prompt_pos = torch.arange(mb.prompts.size(1), device=mb.prompts.device).expand_as(mb.prompts)
    out = decoder(input_ids=mb.prompts, attention_mask=mb.prompt_mask, position_ids=prompt_pos,
                  past_key_values=cache, use_cache=True).last_hidden_state
    last = out[torch.arange(out.size(0), device=out.device), prompt_len - 1][mb.prompt_of_row]  # [M, H]
    if mb.input_ids.size(1) == 0:  # every completion is one token long
        return last[:, None]
    cache.reorder_cache(mb.prompt_of_row)  # [U, ...] -> [M, ...]: each row gets its prompt's keys/values
    positions = prompt_len[mb.prompt_of_row, None] + torch.arange(mb.input_ids.size(1), device=last.device)
    hidden = decoder(input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=positions,
                     past_key_values=cache, use_cache=True).last_hidden_state
    return torch.cat([last[:, None], hidden], 1)


def completion_hidden(model, mb: MicroBatch) -> torch.Tensor:
    """[M, T, H]: the decoder's hidden state at each position that predicts a completion
    token (the log-probs read the LM head there, a critic its value head)."""
    with recompute_norm_outputs() if torch.is_grad_enabled() else contextlib.nullcontext():
        if mb.prompts is None:
            decoder = model.get_decoder()
            # no KV cache: nothing reads it, and a checkpointed layer must not write one twice
            hidden = decoder(input_ids=mb.input_ids, attention_mask=mb.attention_mask,
                             use_cache=False).last_hidden_state
        else:
            hidden = _shared_prompt_hidden(model, mb)
    index = mb.positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1))
    return torch.gather(hidden, 1, index)


def completion_logprobs(model, mb: MicroBatch, temperature: float = 1.0, with_entropy: bool = False,
                        entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs [M, T] of the completion tokens (and their entropies [M, T] if asked;
    differentiable only with `entropy_grad`, which keeps the [M, T, vocab] graph alive).

    The LM head runs only on the positions that predict completion tokens: for a
    135M model with a 49k vocabulary the head costs about a quarter of the forward,
    so skipping the prompt positions saves real time.
    """
    picked = completion_hidden(model, mb)
    lm_head = model.get_output_embeddings()
    if fusable(lm_head):  # chunked: never the whole [M, T, vocab] (reasonrl.model.head)
        token_logp, entropy = head_logprobs(picked, lm_head.weight, mb.targets, temperature,
                                            with_entropy, entropy_grad and torch.is_grad_enabled())
        return token_logp, entropy if with_entropy else None
    logits = lm_head(picked).float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    token_logp = torch.gather(log_probs, -1, mb.targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(log_probs.exp() * log_probs).sum(-1)
    return token_logp, entropy


def pad_like(rows: list[torch.Tensor], fill: torch.Tensor) -> torch.Tensor:
    """Per-row values (row j has len_j <= T entries) laid into a copy of `fill` [M, T].
    Positions past a row's end keep `fill`'s value: masked anyway, and finite there."""
    out = fill.detach().clone()
    for j, values in enumerate(rows):
        out[j, : len(values)] = values
    return out


def per_row(micro_batches: list[MicroBatch], completion_ids: list[list[int]], device: torch.device,
            fn) -> list[torch.Tensor]:
    """`fn(micro_batch) -> [M, T]` over the micro-batches (moved to `device`), cut back to one
    unpadded tensor per completion, in the completions' order."""
    out: list[torch.Tensor] = [torch.zeros(0)] * len(completion_ids)
    for mb in micro_batches:
        values = fn(mb.to(device))
        for j, i in enumerate(mb.rows):
            out[i] = values[j, : len(completion_ids[i])].clone()
    return out


def pick(values: list | None, rows: list[int]) -> list | None:
    """values[i] for the rows (None stays None): one row-aligned field of a batch, cut to some rows."""
    return None if values is None else [values[i] for i in rows]
