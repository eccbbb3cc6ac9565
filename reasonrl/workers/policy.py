"""The policy worker: holds the trainable model (and the reference model when beta > 0 or
`log_kl`: the reference role, a `reasonrl.workers.frozen.FrozenModel` served within this worker),
computes completion log-probs, and turns one `TrainBatch` into optimizer steps.

It knows nothing about rollouts, rewards or where it runs; the trainer hands it token
ids and advantages. Its training is its `Learner` (`reasonrl.learn.learner`, shared with
the critic) running forward -> `reasonrl.algo.objective.policy_objective` -> backward per
micro-batch; the loss is normalised by totals over each optimizer step so the gradient is
the same whatever `micro_batch_size` is. Data-parallel ranks are this class given another
strategy (`reasonrl.workers.ranks`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from reasonrl.algo import LossSettings, Metric, Totals, kl_estimate, policy_objective
from reasonrl.algo.objective import PolicyLoss
from reasonrl.batch import TrainBatch
from reasonrl.config import AlgoConfig, Config, OptimConfig
from reasonrl.errors import ConfigError
from reasonrl.learn.learner import Learner, LearnerSettings, copy_weights
from reasonrl.model import lora
from reasonrl.model.forward import MicroBatch, completion_logprobs, pad_like, per_row, pick
from reasonrl.registry import POLICY_LOSSES
from reasonrl.weights import plan_buckets, reference_logprobs, weights_checksum
from reasonrl.workers.frozen import FrozenModel, rows_logprobs


@dataclass
class PolicySettings:
    """What the policy worker reads: the `algo` and `optim` config sections, and three
    numbers from others."""

    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    total_steps: int = 1  # trainer.steps: the LR schedule's length
    max_response_length: int = 0  # rollout.max_new_tokens: Dr. GRPO's constant; 0 = the batch's longest
    temperature: float = 1.0  # rollout.temperature: log-probs are those of the sampling distribution
    precision: str = "fp32"  # model.precision, resolved (`reasonrl.model.precision`)

    @classmethod
    def from_config(cls, cfg: Config) -> PolicySettings:
        r = cfg.rollout
        return cls(cfg.algo, cfg.optim, cfg.trainer.steps, r.max_new_tokens, r.temperature,
                   cfg.model.precision)


LOSS_ARGS = ("logp", "old_logp", "advantages", "mask", "ctx")  # every policy loss's positional arguments


def policy_loss_fn(algo: AlgoConfig) -> PolicyLoss:
    """The policy loss the objective calls: `algo.policy_loss`'s `POLICY_LOSSES` entry, or the
    out-of-tree function `algo.loss_fn` ("module:function" or "path/file.py:function", loaded as
    `reward.fn` is: `reasonrl.rewards.verifiers.load_target`) with `algo.loss_kwargs` bound as
    keyword arguments, as prime-rl's custom loss (`CustomLossConfig`: `import_path`, `kwargs`,
    called `fn(inputs, **kwargs)`). Checked when the worker is built, before any step: a missing
    file, module or function, or one that does not accept (logp, old_logp, advantages, mask, ctx)
    and the keywords of `algo.loss_kwargs`, is a ConfigError naming algo.loss_fn."""
    if not algo.loss_fn:
        return POLICY_LOSSES.get(algo.policy_loss)
    from reasonrl.rewards.verifiers import load_target  # only for an out-of-tree loss

    try:
        fn = load_target(algo.loss_fn)
        try:
            inspect.signature(fn).bind(*LOSS_ARGS, **algo.loss_kwargs)
        except TypeError as err:
            keywords = f" and the keywords of algo.loss_kwargs ({', '.join(algo.loss_kwargs)})" \
                if algo.loss_kwargs else ""
            raise TypeError(f"a policy loss must accept ({', '.join(LOSS_ARGS)}){keywords}: {err}") from None
        except ValueError:  # builtins without a signature: trust them
            pass
    except Exception as err:
        raise ConfigError(f"algo.loss_fn: cannot use {algo.loss_fn!r}: {type(err).__name__}: {err}") from None
    return functools.partial(fn, **algo.loss_kwargs) if algo.loss_kwargs else fn


class PolicyWorker:
    """The policy: its model and `Learner`, the reference model when there is one, and the
    forwards without gradient the trainer and the evaluation ask for."""

    def __init__(self, model, pad_id: int, settings: PolicySettings, ref_model=None, strategy=None):
        a, o = settings.algo, settings.optim
        self.loss_fn = policy_loss_fn(a)  # algo.loss_fn checked before the learner is built
        learning = LearnerSettings.for_policy(o, settings.total_steps, settings.precision)
        self.learner = Learner(model, pad_id, learning, strategy)
        if o.share_prompt != self.learner.share_prompt:  # the layout the learner can use
            settings = dataclasses.replace(settings, optim=dataclasses.replace(o, share_prompt=False))
        self.model, self.pad_id, self.settings = model, pad_id, settings
        self.algo, self.optim, self.losses = a, settings.optim, LossSettings.of(a)
        self.device = self.learner.device  # micro-batches go where the weights compute
        # the reference role (`reasonrl.workers.frozen`): `ref_model` given by a data-parallel rank
        # (sharded like the model); else taken now, after the learner cast the model to the run's
        # compute precision, and only when it is worth its memory. It lays out its rows as the
        # learner does (`micro_batches`), so the update reads its own values bitwise.
        if ref_model is None and (a.beta > 0 or a.log_kl):
            ref_model = lora.reference_model(model)  # LoRA: the adapter switched off; else a copy
        self.reference = (None if ref_model is None
                          else FrozenModel(ref_model, self.micro_batches, self.device, settings.temperature))

    @property
    def ref_model(self):
        """The reference model (None: the run has none)."""
        return None if self.reference is None else self.reference.model

    def micro_batches(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                      token_masks: list[list[int]] | None = None) -> list[MicroBatch]:
        return self.learner.micro_batches(prompt_ids, completion_ids, token_masks)

    # ---- log-probs without gradients (the log-probs and reference stages, KL in reward) ---

    @torch.no_grad()
    def row_logprobs(self, model, prompt_ids: list[list[int]],
                     completion_ids: list[list[int]]) -> list[torch.Tensor]:
        """Each completion's token log-probs under `model`, one unpadded tensor per row."""
        return per_row(self.micro_batches(prompt_ids, completion_ids), completion_ids, self.device,
                       lambda mb: completion_logprobs(model, mb, self.settings.temperature)[0])

    @torch.no_grad()
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 rows: torch.Tensor | None = None) -> list[torch.Tensor]:
        """Each completion's token log-probs under the policy now (float32, on the CPU), one
        unpadded tensor per row: the step's log-probs stage (`reasonrl.batch.PolicyLogprobs`),
        read by the KL in the reward (`token_kl`), the teacher stage's student side and the
        update's old log-probs (`TrainBatch.old_logprobs`). `rows` [N] bool: only those rows, in
        micro-batches of exactly those rows as the update lays them out, so that its old
        log-probs are bitwise what it would compute itself; the other rows come back empty."""
        return rows_logprobs(self.model, self.micro_batches, self.device, self.settings.temperature,
                             prompt_ids, completion_ids, rows)

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
        row: the step's reference stage (the reference role, `reasonrl.workers.frozen.ReferenceOf`),
        run once, read by the KL in the reward (`token_kl`) and by the update's KL term
        (`TrainBatch.ref_logprobs`). `rows` [N] bool: only those rows, in micro-batches of exactly
        those rows as the update lays them out, so that its KL term is bitwise what it would
        compute itself; the other rows come back empty."""
        if self.reference is None:
            raise RuntimeError("reference_logprobs needs a reference model (algo.beta > 0 or algo.log_kl)")
        return self.reference.logprobs(prompt_ids, completion_ids, rows)

    @torch.no_grad()
    def token_kl(self, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                 ref_logprobs: list[torch.Tensor], logprobs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each completion's per-token KL estimate (`algo.kl_estimator`) of the policy's
        log-probs `logprobs` to the reference log-probs `ref_logprobs`, one unpadded tensor per
        row: KL in the reward (summed per sequence, or per token for a critic's token rewards).
        No forward: both come from their stages (`logprobs`: the log-probs stage's `every_row`,
        as verl's `apply_kl_penalty` reads the `old_log_probs` its `compute_log_prob` stage
        computed, verl/trainer/ppo/ray_trainer.py). The estimate runs per micro-batch of every
        row on the worker's device, on [M, T] tensors shaped as that micro-batch's forward
        returned them, so each value is bitwise what it was computed from the forward's own."""
        def kl(mb: MicroBatch) -> torch.Tensor:
            fill = torch.zeros(mb.targets.shape, dtype=torch.float32, device=self.device)
            logp = pad_like([logprobs[i] for i in mb.rows], fill)
            ref = pad_like([ref_logprobs[i] for i in mb.rows], logp)
            return kl_estimate(logp, ref, self.algo.kl_estimator).cpu()

        return per_row(self.micro_batches(prompt_ids, completion_ids), completion_ids, self.device, kl)

    # ---- the updates of one training step ----------------------------------------------

    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """`ppo_epochs` passes over `batch`, each split into `mini_batches` optimizer steps
        (`Learner.train`), each forward -> `policy_objective` -> backward per micro-batch.

        With one update (the default) the update is on-policy: the old log-probs are the
        current ones (ratio = 1, no extra forward) and the gradient is the policy gradient
        A * grad log pi. With more, the old log-probs are those before the first update, so
        later updates see ratio != 1 and the clip acts (PPO, Schulman et al. 2017, sec. 5):
        the log-probs stage's (`batch.old_logprobs`, computed once per step and read by every
        consumer, as verl's `compute_log_prob` stage, verl/trainer/ppo/ray_trainer.py), else
        computed here, once, in the same micro-batches (the rows of `loss_mask`). Each mini-batch
        is normalised on its own: its totals (`Totals`) are those of exactly its rows' model
        tokens (`token_mask` leaves an episode's environment tokens out). The LR schedule
        advances once per call.
        """
        n = len(batch.advantages)
        keep = batch.loss_mask if batch.loss_mask is not None else torch.ones(n, dtype=torch.bool)
        rows = [i for i in range(n) if keep[i]]
        prompt_ids, completion_ids = pick(batch.prompt_ids, rows), pick(batch.completion_ids, rows)
        token_masks, engine_logp = pick(batch.token_mask, rows), pick(batch.sampler_logprobs, rows)
        model_tokens = [len(c) if token_masks is None else sum(token_masks[k])
                        for k, c in enumerate(completion_ids)]
        advantages = batch.advantages[rows].float().to(self.device)
        max_len = float(self.settings.max_response_length or max(model_tokens, default=1))
        lr = self.learner.lr
        old_logp = ref_logp = None
        if rows and self.optim.ppo_epochs * self.optim.mini_batches > 1:  # the stage's, else alike
            old_logp = (pick(batch.old_logprobs, rows) if batch.old_logprobs is not None
                        else self.row_logprobs(self.model, prompt_ids, completion_ids))
        if rows and self.reference is not None:  # the reference stage's, else computed here alike
            ref_logp = (pick(batch.ref_logprobs, rows) if batch.ref_logprobs is not None
                        else self.reference_logprobs(prompt_ids, completion_ids))

        def update(idx: list[int]) -> dict[str, Metric]:
            totals = Totals.of([model_tokens[i] for i in idx], max_len)
            objective = functools.partial(self.objective, totals, advantages[idx], pick(old_logp, idx),
                                          pick(ref_logp, idx), pick(engine_logp, idx))
            return self.learner.update(pick(prompt_ids, idx), pick(completion_ids, idx),
                                       pick(token_masks, idx), objective)

        found, updates = self.learner.train(len(rows), update)
        metrics = {"train/loss": 0.0, "train/pg_loss": 0.0, "train/grad_norm": 0.0,
                   "train/skipped_update": 1.0}  # stays so when no row entered the loss
        metrics.update({f"train/{k}": v for k, v in found.items()})
        metrics.update({"train/lr": lr, "train/tokens": float(sum(model_tokens)),
                        "train/sequences": float(len(rows)), "train/updates": float(updates)})
        return metrics

    def objective(self, totals: Totals, advantages: torch.Tensor, old_logp: list[torch.Tensor] | None,
                  ref_logp: list[torch.Tensor] | None, engine_logp: list[torch.Tensor] | None,
                  mb: MicroBatch) -> tuple[torch.Tensor, dict[str, Metric]]:
        """One micro-batch's forward and `policy_objective`, the per-row inputs of the update's
        rows (old, reference and engine log-probs: None when absent) laid into its layout."""
        logp, entropy = completion_logprobs(self.model, mb, self.settings.temperature, with_entropy=True,
                                            entropy_grad=self.losses.entropy_coef != 0)
        old = logp.detach() if old_logp is None else pad_like(pick(old_logp, mb.rows), logp)
        ref = None if ref_logp is None else pad_like(pick(ref_logp, mb.rows), logp)
        engine = None if engine_logp is None else pad_like(pick(engine_logp, mb.rows), old)
        return policy_objective(logp, old, advantages[mb.rows], mb.mask, self.losses, totals,
                                entropy, ref, engine, self.loss_fn)

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
        if self.learner.masters is not None:  # bf16-mixed: the fp32 masters, what a resume starts from
            self.model.save_pretrained(path, state_dict=self.learner.full_weights())
        else:
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
        """Nothing to free beyond the object's own memory (data-parallel ranks leave their
        process group: the strategy's `close`)."""
        self.learner.close()

    # ---- checkpoint state (the weights travel separately, as the HF folder) -------------

    def state_dict(self) -> dict:
        """Optimizer, LR scheduler and step count: with the weights, an exact resume."""
        return self.learner.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)

    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy saved tensors (an HF folder's state dict) into the policy in place (tied weights,
        lm_head = embeddings, may be absent). A LoRA policy takes its adapter's tensors
        (`save_adapter`'s file)."""
        if lora.is_lora(self.model):
            lora.load_adapter(self.model, tensors)
            return
        copy_weights(self.model, tensors, "checkpoint weights")
        self.learner.weights_loaded(tensors)


def policy_from_config(cfg, host) -> PolicyWorker:
    """The policy role in one process: `model.path`'s model (`colocate.base_model`: shared with
    the colocated rollout engine), wrapped in a LoRA adapter when `model.lora.rank` > 0 (its
    data-parallel ranks: `parallel.rank_policy`)."""
    from reasonrl.model.colocate import base_model

    model, tokenizer = base_model(cfg, host, "policy")
    lo = cfg.model.lora
    if lo.rank > 0:
        from reasonrl.model.lora import apply_lora

        model = apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules, seed=cfg.trainer.seed)
    return PolicyWorker(model, tokenizer.pad_token_id, PolicySettings.from_config(cfg))
