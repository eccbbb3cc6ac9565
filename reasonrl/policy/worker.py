"""The policy worker: holds the trainable model (and the reference model when beta > 0 or
`log_kl`), computes completion log-probs, and turns one `TrainBatch` into optimizer steps.

It knows nothing about rollouts, rewards or where it runs; the trainer hands it token
ids and advantages. Micro-batches are bucketed by length so padding costs little, and
the loss is normalised by totals over each optimizer step so the gradient is the same
whatever `micro_batch_size` is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from reasonrl.accel import TrainingAccel, fused_adam_ok, recompute_norm_outputs
from reasonrl.algo import LossSettings, Metric, Totals, kl_estimate, policy_objective
from reasonrl.batch import TrainBatch
from reasonrl.config import AlgoConfig, Config, OptimConfig
from reasonrl.policy import lora
from reasonrl.policy.checkpointing import checkpoint_layers
from reasonrl.policy.head import fusable, head_logprobs
from reasonrl.weights import plan_buckets, reference_logprobs, weights_checksum


@dataclass
class PolicySettings:
    """What the policy worker reads: the `algo` and `optim` config sections, and three
    numbers from others."""

    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    total_steps: int = 1  # trainer.steps: the LR schedule's length
    max_response_length: int = 0  # rollout.max_new_tokens: Dr. GRPO's constant; 0 = the batch's longest
    temperature: float = 1.0  # rollout.temperature: log-probs are those of the sampling distribution

    @classmethod
    def from_config(cls, cfg: Config) -> PolicySettings:
        r = cfg.rollout
        return cls(cfg.algo, cfg.optim, cfg.trainer.steps, r.max_new_tokens, r.temperature)


def lr_multiplier(step: int, total_steps: int, schedule: str, warmup_ratio: float,
                  min_lr_ratio: float) -> float:
    """LR factor at optimizer step `step` (0-based): linear warmup over
    ceil(warmup_ratio * total) steps, then constant or cosine decay to `min_lr_ratio`
    (cosine as in SGDR, Loshchilov & Hutter 2017, without restarts)."""
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        span = max(total_steps - warmup - 1, 1)
        progress = min((step - warmup) / span, 1.0)
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    raise ValueError(f"optim.schedule: unknown schedule {schedule!r}; allowed: constant, cosine")


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
                       token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
    """Split rows into micro-batches of at most `size` rows, each padded only to its own
    maximum. Plain: rows of similar total length go together. `share_prompt`: rows with the
    same prompt (a GRPO group) go together and the prompt is computed once per micro-batch
    (see `MicroBatch`). `token_masks` (multi-turn episodes): the mask is 1 only on the
    model's tokens; the environment's are inputs (context) but never targets of the loss."""
    if share_prompt:
        return _shared_prompt_micro_batches(prompt_ids, completion_ids, size, pad_id, token_masks)
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]) + len(completion_ids[i]))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start: start + size]
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
        batches.append(MicroBatch(rows, ids, attn, positions, targets, mask))
    return batches


def _shared_prompt_micro_batches(prompt_ids: list[list[int]], completion_ids: list[list[int]],
                                 size: int, pad_id: int,
                                 token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
    # Rows ordered by prompt (length, then content) and, within a prompt, by completion length:
    # consecutive chunks then hold few distinct prompts and little completion padding.
    order = sorted(range(len(prompt_ids)), key=lambda i: (len(prompt_ids[i]), prompt_ids[i],
                                                          len(completion_ids[i])))
    batches = []
    for start in range(0, len(order), size):
        rows = order[start: start + size]
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
        batches.append(MicroBatch(rows, inputs, attn, positions, targets, mask, prompts, prompt_mask,
                                  prompt_of_row))
    return batches


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
    if fusable(lm_head):  # chunked: never the whole [M, T, vocab] (reasonrl.policy.head)
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


class PolicyWorker:
    def __init__(self, model, pad_id: int, settings: PolicySettings, ref_model=None):
        if settings.optim.gradient_checkpointing and settings.optim.share_prompt:
            # a recomputed layer would write the shared prompt's KV cache twice: plain rows instead
            plain = dataclasses.replace(settings.optim, share_prompt=False)
            settings = dataclasses.replace(settings, optim=plain)
        self.model, self.pad_id, self.settings = model, pad_id, settings
        self.algo, self.optim = a, o = settings.algo, settings.optim
        self.losses = LossSettings.of(a)
        self.accel = TrainingAccel(model, kernels=o.lean_kernels)
        if o.gradient_checkpointing:  # after the kernels: the recompute runs them too
            checkpoint_layers(model)
        self.model.train()
        self.device = next(model.parameters()).device  # micro-batches go where the weights are
        self.ref_model = ref_model  # given by a data-parallel rank (sharded like the model)
        if ref_model is None and (a.beta > 0 or a.log_kl):  # only then is it worth its memory
            self.ref_model = lora.reference_model(model)  # LoRA: the adapter switched off; else a copy
        trainable = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            trainable, lr=o.lr, betas=tuple(o.betas), eps=o.eps,
            weight_decay=o.weight_decay, fused=fused_adam_ok(trainable) or None)
        self.accel.attach(self.optimizer)  # gradients and AdamW moments in single buffers
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, settings.total_steps, o.schedule,
                                                    o.warmup_ratio, o.min_lr_ratio))
        self.step = 0

    # ---- log-probs without gradients (old policy, reference model, KL in reward) ------

    @torch.no_grad()
    def row_logprobs(self, model, prompt_ids: list[list[int]],
                     completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Each completion's token log-probs under `model`, one unpadded tensor per row."""
        return per_row(self.micro_batches(prompt_ids, completion_ids), completion_ids, self.device,
                       lambda mb: completion_logprobs(model, mb, self.settings.temperature)[0])

    @torch.no_grad()
    def row_entropies(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                      temperature: float = 1.0) -> list[torch.Tensor]:
        """Per-token entropy (nats) of softmax(logits / temperature) at each completion
        token's position, one unpadded tensor per row (`reasonrl eval` / `probe`)."""
        return per_row(self.micro_batches(prompt_ids, completion_ids), completion_ids, self.device,
                       lambda mb: completion_logprobs(self.model, mb, temperature, with_entropy=True)[1])

    @torch.no_grad()
    def reference_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                           rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """The reference model's token log-probs of each completion, one unpadded CPU tensor per
        row: the step's reference stage, run once, read by the KL in the reward (`token_kl`) and
        by the update's KL term (`TrainBatch.ref_logprobs`). `rows` [N] bool: only those rows,
        in micro-batches of exactly those rows as the update lays them out, so that its KL term
        is bitwise what it would compute itself; the other rows come back empty."""
        if self.ref_model is None:
            raise RuntimeError("reference_logprobs needs a reference model (algo.beta > 0 or algo.log_kl)")
        keep = [i for i in range(len(prompt_ids)) if rows is None or rows[i]]
        found = self.row_logprobs(self.ref_model, [prompt_ids[i] for i in keep],
                                  [completion_ids[i] for i in keep])
        out = [torch.zeros(0)] * len(prompt_ids)
        for i, logp in zip(keep, found, strict=True):
            out[i] = logp.cpu()
        return out

    @torch.no_grad()
    def token_kl(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 ref_logprobs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each completion's per-token KL estimate (`algo.kl_estimator`) of the policy to the
        reference log-probs `reference_logprobs` gave, one unpadded tensor per row: KL in the
        reward (summed per sequence, or per token for a critic's token rewards)."""
        def kl(mb: MicroBatch) -> torch.Tensor:
            logp, _ = completion_logprobs(self.model, mb, self.settings.temperature)
            ref = pad_like([ref_logprobs[i] for i in mb.rows], logp)
            return kl_estimate(logp, ref, self.algo.kl_estimator).cpu()

        return per_row(self.micro_batches(prompt_ids, completion_ids), completion_ids, self.device, kl)

    # ---- the updates of one training step ----------------------------------------------

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """`ppo_epochs` passes over `batch`, each split into `mini_batches` optimizer steps.

        With one update (the default) the update is on-policy: the old log-probs are the
        current ones (ratio = 1, no extra forward) and the gradient is the policy gradient
        A * grad log pi. With more, the old log-probs are computed once, before the first
        update, so later updates see ratio != 1 and the clip acts (PPO, Schulman et al.
        2017, sec. 5). Mini-batches are contiguous slices of the batch, the same in every
        epoch; each is normalised on its own (see `aggregate`). The LR schedule advances
        once per call, whatever the number of updates.
        """
        o = self.optim
        n = len(batch.advantages)
        keep = batch.loss_mask if batch.loss_mask is not None else torch.ones(n, dtype=torch.bool)
        rows = [i for i in range(n) if keep[i]]
        prompt_ids = [batch.prompt_ids[i] for i in rows]
        completion_ids = [batch.completion_ids[i] for i in rows]
        token_masks = None if batch.token_mask is None else [batch.token_mask[i] for i in rows]
        model_tokens = [len(c) if token_masks is None else sum(token_masks[k])
                        for k, c in enumerate(completion_ids)]
        advantages = batch.advantages[rows].float()
        engine_logp = None if batch.sampler_logprobs is None else [batch.sampler_logprobs[i] for i in rows]
        max_len = float(self.settings.max_response_length or max(model_tokens, default=1))
        lr = self.optimizer.param_groups[0]["lr"]

        old_logp = ref_logp = None
        if rows and o.ppo_epochs * o.mini_batches > 1:
            old_logp = self.row_logprobs(self.model, prompt_ids, completion_ids)
        if rows and self.ref_model is not None:  # the reference stage's, else computed here alike
            ref_logp = ([batch.ref_logprobs[i] for i in rows] if batch.ref_logprobs is not None
                        else self.reference_logprobs(prompt_ids, completion_ids))
        splits = [s.tolist() for s in torch.arange(len(rows)).tensor_split(o.mini_batches) if len(s)]
        updates = []
        for _ in range(o.ppo_epochs):
            for idx in splits:
                updates.append(self._update(
                    [prompt_ids[i] for i in idx], [completion_ids[i] for i in idx], advantages[idx],
                    None if old_logp is None else [old_logp[i] for i in idx],
                    None if ref_logp is None else [ref_logp[i] for i in idx], max_len,
                    None if engine_logp is None else [engine_logp[i] for i in idx],
                    None if token_masks is None else [token_masks[i] for i in idx]))
        with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()"
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()  # the schedule counts training steps, updated or skipped
        self.step += 1

        metrics = {"train/loss": 0.0, "train/pg_loss": 0.0, "train/grad_norm": 0.0,
                   "train/skipped_update": 1.0}  # stays so when no row entered the loss
        if updates:
            for key in updates[0]:
                values = [u[key] for u in updates]
                reduce = max if key.endswith("_max") else min if key.endswith("_min") else None
                metrics[f"train/{key}"] = reduce(values) if reduce else sum(values) / len(values)
        metrics.update({"train/lr": lr, "train/tokens": float(sum(model_tokens)),
                        "train/sequences": float(len(rows)), "train/updates": float(len(updates))})
        return metrics

    def micro_batches(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                      token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
        return make_micro_batches(prompt_ids, completion_ids, self.optim.micro_batch_size, self.pad_id,
                                  self.optim.share_prompt, token_masks)

    def train_micro_batches(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                            token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
        """The micro-batches this process trains on in one optimizer step: all of them. A
        data-parallel rank (`reasonrl.policy.parallel.DataParallelRank`) takes its share."""
        return self.micro_batches(prompt_ids, completion_ids, token_masks)

    def _update(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                advantages: torch.Tensor, old_logp: list[torch.Tensor] | None,
                ref_logp: list[torch.Tensor] | None, max_len: float,
                engine_logp: list[torch.Tensor] | None = None,
                token_masks: list[list[int]] | None = None) -> dict[str, float]:
        """One optimizer step on these rows: forward -> `policy_objective` -> backward per
        micro-batch; normalisers are totals over exactly these rows (their model tokens:
        `token_masks` leave an episode's environment tokens out)."""
        o = self.optim
        totals = Totals(float(sum(len(c) for c in completion_ids) if token_masks is None
                              else sum(sum(m) for m in token_masks)), float(len(completion_ids)), max_len)
        combined: dict[str, Metric] = {}
        self.optimizer.zero_grad(set_to_none=True)
        grad_buffer = self.accel.gradients()
        advantages = advantages.to(self.device)
        for mb in self.train_micro_batches(prompt_ids, completion_ids, token_masks):
            mb = mb.to(self.device)
            logp, entropy = completion_logprobs(self.model, mb, self.settings.temperature, with_entropy=True,
                                                entropy_grad=self.losses.entropy_coef != 0)
            old = logp.detach() if old_logp is None else pad_like([old_logp[i] for i in mb.rows], logp)
            ref = None if ref_logp is None else pad_like([ref_logp[i] for i in mb.rows], logp)
            engine = None if engine_logp is None else pad_like([engine_logp[i] for i in mb.rows], old)
            loss, metrics = policy_objective(logp, old, advantages[mb.rows], mb.mask, self.losses, totals,
                                             entropy, ref, engine)
            self.accel.before_backward()
            loss.backward()
            for name, m in metrics.items():
                c = combined.get(name)
                combined[name] = m if c is None else Metric(
                    {"sum": c.value + m.value, "max": max(c.value, m.value),
                     "min": min(c.value, m.value)}[m.reduce], m.reduce, m.empty)
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = o.max_grad_norm if o.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm).item() if params else 0.0
        skipped = not math.isfinite(grad_norm) or not math.isfinite(combined["loss"].value)
        if not skipped:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # the rollout phase runs without the gradients' memory
        del grad_buffer
        out = {k: m.empty if m.empty is not None and not math.isfinite(m.value) else m.value
               for k, m in combined.items()}
        return {**out, "grad_norm": grad_norm, "skipped_update": float(skipped)}

    # ---- weights ----------------------------------------------------------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's current tensors by HF name, for pushing to a rollout engine (LoRA:
        the merged weights W + scale * B A, which is what the engine serves)."""
        if lora.is_lora(self.model):
            yield from lora.merged_named_weights(self.model)
            return
        for name, param in self.model.named_parameters():
            yield name, param.detach()

    def sync_plan(self, bucket_bytes: int) -> list[list[str]]:
        """The weights training changes, in buckets (`reasonrl.weights.plan_buckets`): with
        LoRA the adapted layers (merged; the rest is the base model the engine loaded too),
        else every trainable tensor."""
        if lora.is_lora(self.model):
            base = dict(self.model.get_base_model().named_parameters())
            sizes = [(lora.served_name(n), base[n].numel() * base[n].element_size())
                     for n in lora.adapted_layers(self.model)]
        else:
            sizes = [(n, p.numel() * p.element_size())
                     for n, p in self.model.named_parameters() if p.requires_grad]
        return plan_buckets(sizes, bucket_bytes)

    def weight_bucket(self, names: list[str]) -> list[tuple[str, torch.Tensor]]:
        """The tensors of one `sync_plan` bucket by name, on the CPU (LoRA: merged)."""
        wanted = set(names)
        if lora.is_lora(self.model):
            found = dict(lora.merged_named_weights(self.model, wanted))
        else:
            found = {n: p.detach() for n, p in self.model.named_parameters() if n in wanted}
        missing = wanted - set(found)
        if missing:
            raise KeyError(f"weight_bucket: the policy has no weights {sorted(missing)[:5]}")
        return [(n, found[n].cpu()) for n in names]

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor:
        """fp32 log-probs of a probe sequence (`reasonrl.weights.reference_logprobs`), which an
        engine verified by probe must reproduce after a weight push."""
        return reference_logprobs(self.model, ids)

    def weights_checksum(self) -> float:
        """`reasonrl.weights.weights_checksum` of `named_weights`: what a synced engine must report."""
        return weights_checksum(self.named_weights())

    def save_pretrained(self, path, tokenizer=None) -> None:
        """The policy as an HF model folder (LoRA: the merged weights)."""
        if lora.is_lora(self.model):
            lora.save_merged(self.model, path, tokenizer)
            return
        self.model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    def save_adapter(self, path) -> bool:
        """LoRA: write the adapter folder (what a resume loads) and return True; else False."""
        if not lora.is_lora(self.model):
            return False
        lora.save_adapter(self.model, path)
        return True

    def close(self) -> None:
        """Nothing to free beyond the object's own memory (a data-parallel rank leaves its
        process group)."""

    # ---- checkpoint state (the weights travel separately, as the HF folder) -------------

    def state_dict(self) -> dict:
        """Optimizer, LR scheduler and step count: with the weights, an exact resume."""
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.accel.state_loaded(self.optimizer)
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy saved tensors (an HF folder's state dict) into the policy in place. Tied
        weights (lm_head = embeddings) may be absent; any other missing name is an error.
        A LoRA policy takes its adapter's tensors (`save_adapter`'s file)."""
        if lora.is_lora(self.model):
            lora.load_adapter(self.model, tensors)
            return
        params = dict(self.model.state_dict(keep_vars=True))
        missing = set(params) - set(tensors)
        tied = {n for n in missing if params[n].data_ptr() in
                {params[k].data_ptr() for k in tensors if k in params}}
        unexpected = set(tensors) - set(params)
        if missing - tied or unexpected:
            raise KeyError(f"checkpoint weights do not match the model: missing "
                           f"{sorted(missing - tied)[:5]}, unexpected {sorted(unexpected)[:5]}")
        for name, tensor in tensors.items():
            params[name].copy_(tensor)
