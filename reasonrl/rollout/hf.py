"""The transformers rollout engine: a lean batched decode loop over the HF model, no gradients.

Works on any causal LM transformers loads, on CPU and GPU. What it does that
`model.generate` does not, each measured on this project's 2-core CPU (docs/performance.md):

- Each prompt is prefilled once and its KV cache copied to its `n` samples (generate
  prefills every sample's copy of the prompt).
- A finished row leaves the batch (its cache rows are dropped), so late steps cost only
  the rows still decoding; the loop ends when every row has hit EOS.
- A row also ends at a stop string (`SamplingParams.stop`, a tool call's closing tag),
  checked on the decoded tail of each active row after every step (`_stop_hits`).
- Sampling draws one uniform number per row and inverts the cumulative distribution
  (`sample_tokens`), instead of `torch.multinomial`'s vocabulary-sized exponential draw.
  The uniform numbers of prompt i come from a CPU generator seeded with its seed
  (`rollout.base.prompt_seeds`: one draw from torch's global RNG per prompt, in prompt order):
  sample s of the prompt uses u[s, t] of `torch.rand(n, max_new_tokens)` at step t, so a
  prompt's completions are the same whichever prompts share its batch (rollout replicas).
- The decoder itself comes from `reasonrl.accel` (`rollout.hf_decoder`): a lean
  Llama-family forward, with or without MKL-packed weights, or the transformers modules;
  `auto` measures them on this machine and keeps the fastest.
- In a `session` (a multi-turn episode's turns, `rollout.hf_reuse_kv`), the KV cache of every
  row that ends (EOS or a stop string) is kept, keyed by its tokens; a later call whose prompt
  extends one of them prefills only the new tokens (the last sampled token and the
  environment's observation) against it (`LeanLlama.prefill_cached`), instead of the whole
  trajectory. The logits are those of a full prefill up to float rounding (tested); the
  transformers-modules decoder re-prefills.

Log-probs (`Generation.logprobs`): for each sampled token, log softmax(logits / temperature)
at that token, in float32 (`token_logprobs`): the quantity the policy worker computes for the
same completion (`reasonrl.model.forward.completion_logprobs` at `rollout.temperature`: the
temperature applied, no top-k / top-p renormalisation). On-policy, the ratio
exp(trainer - engine) is then 1 up to float rounding (two kernels: this decoder's forward and
the training forward), so `train/logprob_diff_*` and the IS corrections' weights measure only the
train/inference mismatch (kernels, weights not yet pushed), never the sampler's filtering. The
distribution actually sampled from also applies top-k / top-p; vLLM reports that one
(`logprobs_mode="processed_logprobs"`): with filtering, a token's log-prob there is the one
here plus -log(the kept probability mass), never smaller, so the two engines agree exactly
when top_k = 0 and top_p = 1 (the defaults). Cost: the logits are scaled once, for both the
sampler and the log-probs; unfiltered (the defaults), the log-probs are the log of the sampler's
own softmax at the sampled tokens (a gather per step into a preallocated [rows, max_new_tokens]
tensor: no measurable time); filtered, one more softmax over the active rows' logits per step
(small beside top-p's sort). Greedy decoding (evaluation) reports None, as vLLM's engine does:
no training step reads its rows, and it saves the work.

When the engine shares the policy's model object (colocated in one process, the default),
`load_weights` recognises the shared storage and copies nothing; given another model it
copies the tensors in.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch

from reasonrl import accel
from reasonrl.rollout.base import Generation, SamplingParams, prompt_seeds
from reasonrl.weights import weights_checksum


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
    return sample_probs(logits.softmax(dim=-1), uniform)


def sample_probs(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """`sample_tokens` given the probabilities softmax(logits) [B, V] (the engine reuses them
    for the log-probs)."""
    cdf = probs.cumsum(dim=-1)
    target = (uniform.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    index = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return index.clamp_(max=probs.size(-1) - 1)  # u * total rounding up onto the last edge


def token_logprobs(scaled: torch.Tensor, probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[B] float32 log softmax(`scaled`)[b, tokens[b]], where `scaled` [B, V] are the float32
    logits divided by the temperature, not filtered, and `probs` = softmax(`scaled`): what the
    policy worker's log-probs of the completion are (see the module docstring). The log of the
    gathered probability, equal to scaled_t - logsumexp(scaled) up to float rounding (a few ulp)
    at the cost of a gather; a probability that underflowed to 0 (a token the sampler can only
    reach by rounding onto the last edge) is recomputed as the latter, so it stays finite."""
    logp = probs.gather(1, tokens.unsqueeze(1)).squeeze(1).log()
    lost = torch.isneginf(logp)
    if bool(lost.any()):
        rows = lost.nonzero().squeeze(1)
        z = scaled[rows]
        exact = z.gather(1, tokens[rows].unsqueeze(1)).squeeze(1) - torch.logsumexp(z, -1)
        logp = logp.index_put((rows,), exact)
    return logp


class HFEngine:
    """Generation with the transformers model (any causal LM, CPU or GPU). `decoder` is
    `rollout.hf_decoder`: `auto` (the fastest measured here), `lean_mkl`, `lean` or
    `modules` (`reasonrl.accel.decode`)."""

    def __init__(self, model, tokenizer, decoder: str = "auto", reuse_kv: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.reuse_kv = reuse_kv
        self.kept: dict[tuple[int, ...], torch.Tensor] | None = None  # in a session: KV by tokens
        self.reused_tokens = 0  # tokens of the latest call served from kept caches (metrics, tests)
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = tokenizer.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self.requested = decoder
        self.last_path: str | None = None  # the decoder of the latest call (for metrics/tests)

    def decode_path(self, rows: int = 0) -> tuple[str, str | None]:
        """(decoder for a call of `rows` rows, why not the requested one): checked per call,
        since hooks or adapters may come after the engine."""
        return accel.choose(self.model, self.requested, rows)

    @contextlib.contextmanager
    def session(self):
        """Keep and reuse the KV caches of the block's calls (see the module docstring); off
        with `reuse_kv=False`. Left or not, the kept caches are dropped at the end."""
        self.kept = {} if self.reuse_kv else None
        try:
            yield self
        finally:
            self.kept = None

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> Generation:
        if not params.greedy and seeds is None:
            seeds = prompt_seeds(len(prompt_ids))
        if seeds is not None and len(seeds) != len(prompt_ids):
            raise ValueError(f"generate: {len(seeds)} seeds for {len(prompt_ids)} prompts")
        was_training = self.model.training
        self.model.eval()
        try:
            rows = self._decode(prompt_ids, params, seeds)
        finally:
            self.model.train(was_training)
        # greedy samples of a prompt are all the same: each prompt was decoded once
        copies = params.n if params.greedy else 1
        completions, truncated = [], []
        for ids, done, _ in rows:
            completions += [list(ids) for _ in range(copies)]
            truncated += [not done] * copies
        logprobs = None if params.greedy else [logp for _, _, logp in rows]
        return Generation(completion_ids=completions, truncated=truncated, logprobs=logprobs)

    @torch.inference_mode()
    def _decode(self, prompt_ids: list[list[int]], params: SamplingParams,
                seeds: list[int] | None) -> list[tuple[list[int], bool, torch.Tensor | None]]:
        """(completion ids up to and including EOS or a stop string, ended so, their log-probs
        [len] on the CPU or None when greedy) per row, prompt-major."""
        device = next(self.model.parameters()).device
        samples = 1 if params.greedy else params.n
        self.last_path, _ = self.decode_path(len(prompt_ids) * samples)
        keep = self.kept is not None and self.last_path in accel.KV_REUSE
        past, new_ids = self._reuse(prompt_ids) if keep and samples == 1 else (None, prompt_ids)
        if keep:
            self.kept = {}  # what is not reused now never will be: free it before decoding
        self.reused_tokens = 0 if past is None else sum(kv.size(3) for kv in past)
        width = max(len(p) for p in new_ids)
        # Left padding: every prompt ends at the same column, so decoding steps are batched.
        ids = torch.full((len(new_ids), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(new_ids), width), dtype=torch.long)
        for i, p in enumerate(new_ids):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        cached = 0 if past is None else max(kv.size(3) for kv in past)
        exported: dict[int, torch.Tensor] | None = {} if keep else None
        with accel.decoder(self.model, cached + width, params.max_new_tokens, self.last_path) as decoder:
            rows = self._sample(decoder, ids, mask, params, samples, device, seeds, past, exported)
        if exported is not None:  # a row's cache holds its prompt and all its tokens but the last
            self.kept = {tuple(prompt_ids[r // samples] + rows[r][0][:-1]): kv for r, kv in exported.items()}
        return rows

    def _reuse(self, prompt_ids: list[list[int]]) -> tuple[list[torch.Tensor] | None, list[list[int]]]:
        """(each prompt's kept cache, or an empty one; the tokens after it) when some prompt
        extends a kept row; (None, the prompts) when none does."""
        lengths = sorted({len(key) for key in self.kept}, reverse=True)
        hits = []
        for p in prompt_ids:
            hits.append(next((n for n in lengths if n < len(p) and tuple(p[:n]) in self.kept), 0))
        if not any(hits):
            return None, prompt_ids
        empty = next(iter(self.kept.values()))[:, :, :, :0]
        past = [self.kept[tuple(p[:n])] if n else empty for p, n in zip(prompt_ids, hits, strict=True)]
        return past, [p[n:] for p, n in zip(prompt_ids, hits, strict=True)]

    def _sample(self, decoder: accel.Decoder, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams,
                samples: int, device: torch.device, seeds: list[int] | None,
                past: list[torch.Tensor] | None = None,
                exported: dict[int, torch.Tensor] | None = None
                ) -> list[tuple[list[int], bool, torch.Tensor | None]]:
        """Sample from `decoder` after prefilling `ids` (after each row's `past` cache, if any):
        per row, its ids, whether it ended (EOS or a stop string), and the sampled tokens'
        log-probs (`token_logprobs`; None when greedy). `exported`, if given, receives the KV
        cache of each row that ends, by row."""
        uniform = None
        if not params.greedy:  # [rows, max_new_tokens]: row p * samples + s is sample s of prompt p
            uniform = torch.cat([torch.rand(samples, params.max_new_tokens,
                                            generator=torch.Generator().manual_seed(seed)) for seed in seeds])
            uniform = uniform.to(device)
        logits = decoder.prefill(ids, mask) if past is None else decoder.prefill_cached(past, ids, mask)
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
        logprobs = None
        if not params.greedy:  # filled like `tokens`: row r's first lengths[r] entries are read
            logprobs = torch.zeros((n_rows, params.max_new_tokens), dtype=torch.float32, device=device)
        for t in range(params.max_new_tokens):
            if params.greedy:
                nxt = logits.argmax(dim=-1)
            else:
                # scaled once, for the sampler (what filter_logits would do first) and the log-probs
                scaled = logits.float()
                if params.temperature != 1.0:
                    scaled = scaled / params.temperature
                filtered = filter_logits(scaled, 1.0, params.top_k, params.top_p)
                probs = filtered.softmax(dim=-1)
                nxt = sample_probs(probs, uniform[active, t])
                if filtered is not scaled:  # top-k / top-p renormalised the sampler's: not the trainer's
                    probs = scaled.softmax(dim=-1)
                logprobs[active, t] = token_logprobs(scaled, probs, nxt)
            tokens[active, t] = nxt
            done = torch.isin(nxt, eos)
            if params.stop:
                done |= self._stop_hits(tokens, active, t, params.stop)
            if bool(done.any()):
                ended = active[done]
                if exported is not None:
                    exported.update(zip(ended.tolist(), decoder.rows_cache(done.nonzero().squeeze(1)),
                                        strict=True))
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
        if logprobs is not None:
            logprobs = logprobs.cpu()
        return [(tokens[r][: lengths[r]], finished[r],
                 None if logprobs is None else logprobs[r, : lengths[r]].clone()) for r in range(n_rows)]

    def _stop_hits(self, tokens: torch.Tensor, active: torch.Tensor, t: int,
                   stop: tuple[str, ...]) -> torch.Tensor:
        """[len(active)] bool: the row's sampled text ends a stop string at step t. Read on the
        decoded tail of its last `window` tokens: every token holds at least one byte, so the tail
        holds the longest stop string, and a string completed earlier was caught then."""
        window = max(len(s.encode()) for s in stop)
        tails = self.tokenizer.batch_decode(tokens[active, max(0, t + 1 - window): t + 1].tolist())
        return torch.tensor([any(s in text for s in stop) for text in tails], device=tokens.device)

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        if self.kept:  # caches computed with the old weights
            self.kept = {}
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

    def probe_ids(self, push: int) -> list[int] | None:
        return None  # the checksum reads the very tensors the model computes with

    def check_probe(self, expected: torch.Tensor, when: str) -> float:
        raise NotImplementedError("the HF engine is verified by checksum alone (probe_ids is None)")

    def close(self) -> None:
        """Nothing of its own to free: the model belongs to the policy (or to the worker)."""
