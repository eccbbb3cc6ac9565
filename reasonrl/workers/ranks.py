"""Data-parallel policy ranks: torch.distributed (gloo on CPU, NCCL on GPU) + FSDP2.

Each of N ranks holds a `RankPolicyWorker` whose model is sharded with `fully_shard`
(every decoder layer one unit, the embeddings / final norm / LM head in the root unit).
Every rank receives the whole `TrainBatch` (token ids and advantages: a few KiB) and runs
the same `PolicyWorker.train_step`, so the mini-batch split and the loss normalisers
(tokens, sequences, the longest completion) are those of the whole optimizer step on every
rank. Only the micro-batches differ: rank r trains on the r-th of N contiguous slices of
each mini-batch. Each rank's loss is its rows' share of the full-batch loss (the normalisers are
global), so the *sum* over ranks of the gradients is the gradient one process would get on
the whole batch: FSDP's gradient reduce-scatter is set to sum (divide factor 1) instead of
its default average. Checked in tests/workers/test_scaling.py (2 gloo ranks vs 1 process).

FSDP gathers and reduces inside every forward and backward, so all ranks must run the same
number of them: a rank with fewer micro-batches pads with copies whose loss mask is zero
(they contribute exactly 0 to the loss and gradient), and ranks use plain micro-batches (one
forward each; `optim.share_prompt` is not used by them). Log-probs without gradients (the old
policy for several updates per step, the reference stage's `reference_logprobs`, `token_kl`,
entropies) are computed by every rank for the whole batch: the same forwards everywhere, no
coordination needed. (One process computes the reference in the update's own micro-batches,
bitwise; a rank's update trains on its slice, so its reference values are those of the
whole-batch layout, within float32 round-off of its slice's: test_scaling's bounds.)

A LoRA policy is sharded the same way (A and B in the unit of the layer they adapt; only they
get gradients); its reference is the sharded model with the adapter switched off. Weights
leave the ranks without a full copy on each: `sync_plan` / `weight_bucket` send the served
weights (LoRA: each rank merges its own rows of W + s B A) to rank 0 alone, one tensor at a
time into the bucket asked for, and `weights_checksum` adds the ranks' sums over their own
rows. The sharding itself (`ShardRoot`, `ShardOptions`, `shard_model`) is `model/sharding.py`.

The rank processes themselves are started by `reasonrl.placement` (Ray actors).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from reasonrl.accel import release_free_memory
from reasonrl.algo import Metric
from reasonrl.config import CriticConfig, OptimConfig
from reasonrl.model import lora
from reasonrl.model.forward import MicroBatch, completion_logprobs, make_micro_batches
from reasonrl.model.precision import compute_dtype
from reasonrl.model.sharding import ROOT_PREFIX, ShardRoot
from reasonrl.model.shards import full_tensor, gather_rows, local_rows, sample_sum
from reasonrl.model.value import ValueModel
from reasonrl.weights import combine_sums, plan_buckets
from reasonrl.workers.critic import CriticWorker
from reasonrl.workers.policy import PolicySettings, PolicyWorker


class DataParallel:
    """The learner's strategy on one of N data-parallel ranks (`reasonrl.learn.learner.Local`
    is the one-process one). Each rank trains on its contiguous slice of every mini-batch,
    padded with zero-mask micro-batches to the largest count on any rank (FSDP runs the same
    collectives everywhere), and an update's metrics are combined over the ranks by their
    reductions: shares added, extremes by max / min, per-update values (grad norm, skip) by
    max. The optimizer state of a checkpoint is the full one, by parameter name. Every method
    is collective: all ranks call it, in the same order (the placement's group does)."""

    plain = True  # one forward per micro-batch: no shared prompt

    def __init__(self, rank: int, world: int, device: torch.device, role: str = "policy"):
        self.rank, self.world = rank, world
        # the compute device, where the collectives run (NCCL reduces only GPU tensors; with
        # cpu_offload the shards live on the CPU)
        self.device = device
        self.role = role  # placement.<role>.ranks, in the messages

    def micro_batches(self, make, prompt_ids: list[list[int]], completion_ids: list[list[int]],
                      token_masks: list[list[int]] | None) -> list[MicroBatch]:
        mine = torch.arange(len(prompt_ids)).tensor_split(self.world)[self.rank].tolist()
        batches = [dataclasses.replace(mb, rows=[mine[r] for r in mb.rows]) for mb in make(
            [prompt_ids[i] for i in mine], [completion_ids[i] for i in mine],
            None if token_masks is None else [token_masks[i] for i in mine])]
        count = torch.tensor([len(batches)], device=self.device)  # NCCL reduces only GPU tensors
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        if len(batches) < count.item():
            idle = make(prompt_ids[:1], completion_ids[:1], None)[0]
            idle = dataclasses.replace(idle, mask=torch.zeros_like(idle.mask))
            batches += [idle] * (int(count.item()) - len(batches))
        return batches

    def combine(self, metrics: dict[str, Metric]) -> dict[str, Metric]:
        """Each metric over the ranks: a rank without a token holds -inf / +inf extremes, which
        the others' values replace."""
        out = dict(metrics)
        for op, kinds in ((dist.ReduceOp.SUM, ("sum",)), (dist.ReduceOp.MAX, ("max", "mean")),
                          (dist.ReduceOp.MIN, ("min",))):
            names = sorted(k for k, m in metrics.items() if m.reduce in kinds)
            if names:
                values = torch.tensor([metrics[k].value for k in names], dtype=torch.float64,
                                      device=self.device)
                dist.all_reduce(values, op=op)
                out.update({k: dataclasses.replace(metrics[k], value=v)
                            for k, v in zip(names, values.tolist(), strict=True)})
        return out

    def optimizer_state(self, model, optimizer: torch.optim.Optimizer) -> dict:
        """The full (unsharded) optimizer state by parameter name, on the CPU of every rank
        (cpu_offload keeps it on rank 0 only), and the number of ranks that wrote it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optim = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
        optim = torch.utils._pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, optim)
        return {"optimizer": optim, "ranks": self.world}

    def load_optimizer_state(self, model, optimizer: torch.optim.Optimizer, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if state.get("ranks") is None:
            raise ValueError(f"this checkpoint's {self.role} state was written by one process; resume it "
                             f"with placement.{self.role}.ranks=1")
        set_optimizer_state_dict(model, optimizer, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
        for param_state in optimizer.state.values():  # the loader may share one `step`
            if isinstance(param_state.get("step"), torch.Tensor):  # tensor among all parameters:
                param_state["step"] = param_state["step"].clone()  # AdamW adds 1 to each

    def close(self) -> None:
        """Leave the process group (collective: every rank calls it)."""
        if dist.is_initialized():
            dist.destroy_process_group()


class RankPolicyWorker(PolicyWorker):
    """One data-parallel rank of the policy: the policy worker with the `DataParallel` strategy
    (plain micro-batches: a shared prompt skips the completion forward when all completions
    are one token long, and FSDP needs the same calls on every rank), and the served weights
    read from the shards. Results are the same on every rank except where noted (rank 0
    writes files)."""

    def __init__(self, model: ShardRoot, pad_id: int, settings: PolicySettings, rank: int, world: int,
                 ref_model=None, device: torch.device | None = None):
        device = device or next(model.parameters()).device
        super().__init__(model, pad_id, settings, ref_model, DataParallel(rank, world, device))
        self.rank, self.world = rank, world
        self.lora = lora.is_lora(model.lm)
        # the weights a rollout engine computes with: bf16 under bf16-mixed (FSDP2's compute
        # copy; the fp32 shards are the masters), what one process serves from its bf16 model too
        self.served_dtype = compute_dtype(settings.precision)

    # ---- weights -----------------------------------------------------------------------
    # Every method here is collective (all ranks call it, in the same order). The served
    # weights are the plain HF model's (LoRA: W + scale * B A for the adapted layers); each
    # rank computes its own rows of them (a LoRA row from its rows of W and B and the whole
    # A, r x in: each merged row is computed once, by the rank that holds it).

    def _resharded(self) -> None:
        """Every FSDP unit back to its shards: with reshard_after_forward=False a forward
        without a backward (log-probs, the probe) leaves the units' full weights in place."""
        from torch.distributed.fsdp import FSDPModule

        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()

    def _served(self, names: set[str] | None = None,
                masters: bool = False) -> Iterator[tuple[str, torch.Tensor, int, torch.Size]]:
        """(HF name, this rank's rows in the compute dtype (`masters`: as the shards hold them,
        fp32 under bf16-mixed), index of its first row, full shape) of each served weight (only
        `names` when given), in the model's order."""
        for name, local, start, shape in self._served_rows(names):
            cast = not masters and local.is_floating_point() and local.dtype != self.served_dtype
            yield name, local.to(self.served_dtype) if cast else local, start, shape

    def _served_rows(self, names: set[str] | None) -> Iterator[tuple[str, torch.Tensor, int, torch.Size]]:
        self._resharded()
        if not self.lora:
            for name, param in self.model.named_parameters():
                name = name.removeprefix(ROOT_PREFIX)
                if names is None or name in names:
                    local, start = local_rows(param.detach())
                    yield name, local, start, param.shape
            return
        peft_model = self.model.lm
        adapted = lora.adapted_layers(peft_model)
        for name, param in peft_model.get_base_model().named_parameters():
            served = lora.served_name(name)
            if ".lora_" in name or names is not None and served not in names:
                continue
            local, start = local_rows(param.detach())
            if name in adapted:
                local = self._merged_rows(adapted[name], local, start)
            yield served, local, start, param.shape

    @torch.no_grad()
    def _merged_rows(self, layer, w_rows: torch.Tensor, start: int) -> torch.Tensor:
        """Rows [start, start + len(w_rows)) of W + scale * B A for a LoRA layer (peft's
        `get_delta_weight` for a Linear): B's rows are this rank's (sharded like W), A is
        gathered whole (r x in)."""
        if getattr(layer, "fan_in_fan_out", False):
            raise ValueError(f"LoRA on data-parallel ranks: {type(layer).__name__} stores W transposed "
                             "(fan_in_fan_out); use placement.policy.ranks=1 for this model")
        a = gather_rows(*self._rows_of(layer.lora_A[lora.ADAPTER].weight), self.device, everywhere=True)
        b_rows, b_start = local_rows(layer.lora_B[lora.ADAPTER].weight.detach())
        if (b_start, b_rows.shape[0]) != (start, w_rows.shape[0]):
            raise ValueError("LoRA on data-parallel ranks: B is not sharded like W")
        delta = (b_rows.to(self.device) @ a) * layer.scaling[lora.ADAPTER]
        return (w_rows.to(self.device) + delta.to(w_rows.dtype)).to(w_rows.device)

    @staticmethod
    def _rows_of(param: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(this rank's rows of `param`, its number of rows): `gather_rows`'s first two arguments."""
        return local_rows(param.detach())[0], param.shape[0]

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The served weights by HF name, whole on every rank (all-gathered one at a time),
        on the CPU. A weight sync uses `sync_plan` / `weight_bucket` instead (rank 0 alone)."""
        for name, local, _, shape in self._served():
            yield name, gather_rows(local, shape[0], self.device, everywhere=True).reshape(shape).cpu()

    def weights_checksum(self) -> float:
        """`weights_checksum` of the served weights without gathering them: each rank sums the
        sampled elements in its rows (`sample_sum`), the sums are added over the ranks."""
        names, parts = [], []
        for name, local, start, shape in self._served():
            names.append(name)
            parts.append(sample_sum(local, start, shape))
        sums = torch.tensor(parts, dtype=torch.float64, device=self.device)
        dist.all_reduce(sums)
        return combine_sums(dict(zip(names, sums.tolist(), strict=True)))

    def sync_plan(self, bucket_bytes: int) -> list[list[str]]:
        """What a sync sends (`PolicyWorker.sync_plan`): LoRA's adapted layers, else every
        trainable weight; the same on every rank (no communication)."""
        if self.lora:
            base = dict(self.model.lm.get_base_model().named_parameters())
            sizes = [(lora.served_name(n), base[n].numel() * base[n].element_size())
                     for n in lora.adapted_layers(self.model.lm)]
        else:
            sizes = [(n.removeprefix(ROOT_PREFIX), p.numel() * p.element_size())
                     for n, p in self.model.named_parameters() if p.requires_grad]
        return plan_buckets(sizes, bucket_bytes)

    def weight_bucket(self, names: list[str], masters: bool = False) -> list[tuple[str, torch.Tensor]]:
        """The full tensors of `names` on rank 0 (each gathered there alone, one at a time, then
        on the CPU); the other ranks send their rows and return []. Rank 0's extra memory is
        the bucket; the other ranks' is one tensor's rows. `masters`: at the shards' precision
        (a checkpoint's), else in the compute dtype (what an engine serves)."""
        release_free_memory()  # the previous bucket's buffers (sent by now) back to the system, not kept
        out = {}
        for name, local, _, shape in self._served(set(names), masters):
            full = gather_rows(local, shape[0], self.device, everywhere=False)
            if full is not None:
                out[name] = full.reshape(shape).cpu()
        if self.rank != 0:
            return []
        missing = sorted(set(names) - set(out))
        if missing:
            raise KeyError(f"weight_bucket: the policy has no weights {missing[:5]}")
        return [(n, out[n]) for n in names]

    def probe_logprobs(self, ids: list[int]) -> torch.Tensor:
        """fp32 log-probs of ids[1:] given the preceding ids, through the sharded model."""
        mb = make_micro_batches([ids[:1]], [ids[1:]], 1, self.pad_id)[0].to(self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                logp, _ = completion_logprobs(self.model, mb)
        finally:
            self.model.train(was_training)
        return logp[0].float().cpu()

    def _all_served_names(self) -> list[str]:
        if not self.lora:
            return [n.removeprefix(ROOT_PREFIX) for n, _ in self.model.named_parameters()]
        return [lora.served_name(n) for n, _ in self.model.lm.get_base_model().named_parameters()
                if ".lora_" not in n]

    def save_pretrained(self, path, tokenizer=None) -> None:
        """The served weights as an HF folder (LoRA: merged), gathered on rank 0, which writes."""
        weights = dict(self.weight_bucket(self._all_served_names(), masters=True))
        if self.rank == 0:
            model = self.model.lm.get_base_model() if self.lora else self.model.lm
            model.save_pretrained(path, state_dict=weights)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)

    def _adapter_params(self) -> list[tuple[str, torch.Tensor]]:
        """The LoRA A and B weights by the peft model's parameter names (sharded)."""
        self._resharded()
        return [(n.removeprefix(ROOT_PREFIX), p) for n, p in self.model.named_parameters() if ".lora_" in n]

    def save_adapter(self, path) -> bool:
        """LoRA: peft's adapter folder (the A and B weights gathered on rank 0, which writes it);
        True. Full fine-tuning: False."""
        if not self.lora:
            return False
        state = {}
        for name, param in self._adapter_params():
            full = gather_rows(*self._rows_of(param), self.device, everywhere=False)
            if full is not None:
                state[name] = full.reshape(param.shape).cpu()
        if self.rank == 0:
            self.model.lm.save_pretrained(path, state_dict=state)
        return True

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Each rank copies its rows of the full tensors (no communication): an HF state dict,
        or with LoRA the adapter's (`save_adapter`'s file)."""
        if self.lora:
            params = {}
            for name, param in self._adapter_params():  # peft's file names drop the adapter's name
                params[name.replace(f".{lora.ADAPTER}.", ".")] = param
            tied: set[str] = set()
        else:
            self._resharded()
            params = {name.removeprefix(ROOT_PREFIX): p for name, p in self.model.named_parameters()}
            tie = getattr(self.model.lm.config, "tie_word_embeddings", False)
            tied = {"lm_head.weight"} if tie else set()
        missing, unexpected = set(params) - set(tensors), set(tensors) - set(params)
        if missing or unexpected - tied:
            raise KeyError(f"checkpoint weights do not match the model: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected - tied)[:5]}")
        for name, param in params.items():
            local, start = local_rows(param.detach())
            local.copy_(tensors[name][start: start + local.shape[0]].to(local.device, local.dtype))



class RankCriticWorker(CriticWorker):
    """One data-parallel rank of the critic: the critic worker with the `DataParallel`
    strategy (plain micro-batches, the full optimizer state for checkpoints), the full
    weights gathered for checkpoints (rank 0 writes)."""

    def __init__(self, model: ValueModel, pad_id: int, critic: CriticConfig, optim: OptimConfig,
                 rank: int, world: int, device: torch.device | None = None):
        device = device or next(model.parameters()).device
        super().__init__(model, pad_id, critic, optim, DataParallel(rank, world, device, role="critic"))
        self.rank, self.world = rank, world

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, param in self.model.named_parameters():
            yield name, full_tensor(param.detach()).cpu()

    def save(self, folder) -> None:
        weights = dict(self.named_weights())
        if self.rank == 0:
            from safetensors.torch import save_file

            from reasonrl.workers.critic import WEIGHTS_FILE

            Path(folder).mkdir(parents=True, exist_ok=True)
            save_file({k: v.contiguous() for k, v in weights.items()}, str(Path(folder) / WEIGHTS_FILE))

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = dict(self.model.named_parameters())
        if set(params) - set(tensors) or set(tensors) - set(params):
            raise KeyError(f"critic weights do not match the value model: missing "
                           f"{sorted(set(params) - set(tensors))[:5]}, unexpected "
                           f"{sorted(set(tensors) - set(params))[:5]}")
        for name, param in params.items():
            full = tensors[name].to(param.device, param.dtype)
            if isinstance(param, DTensor):
                full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.copy_(full)


def rank_policy(cfg, host) -> RankPolicyWorker:
    """A policy rank (`placement.policy.ranks` > 1, `host`: its rank, world and rendezvous): join
    the process group, load the model (with LoRA: wrapped by the same adapter as every other
    rank's and one process's, A drawn from `trainer.seed`) and shard it onto `host.device`. The
    reference model is a sharded copy, or with LoRA the sharded model itself run with the
    adapter switched off."""
    from reasonrl.model import sharding
    from reasonrl.model.colocate import load_model

    sharding.init_process_group(host.backend, host.init_method, host.rank, host.world,
                                cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    settings, lo = PolicySettings.from_config(cfg), cfg.model.lora
    wants_ref = cfg.algo.beta > 0 or cfg.algo.log_kl
    ref = lora.reference_model(model) if wants_ref and lo.rank == 0 else None  # LoRA: AdapterDisabled below
    if lo.rank > 0:
        model = lora.apply_lora(model, lo.rank, lo.alpha, lo.dropout, lo.target_modules,
                                seed=cfg.trainer.seed)
    device = torch.device(host.device)
    options = sharding.ShardOptions.of(cfg.placement.policy, cfg.model.precision)
    root = sharding.shard_model(model, device, options)
    if ref is not None:
        ref = sharding.shard_model(ref, device, options)
    elif wants_ref:
        ref = lora.AdapterDisabled(root, adapters=model)
    return RankPolicyWorker(root, tokenizer.pad_token_id, settings, host.rank, host.world, ref, device=device)


def rank_critic(cfg, host) -> RankCriticWorker:
    """A critic rank (`placement.critic.ranks` > 1): join the critic's own process group, build
    the value model from the policy's (or critic.path's) model and shard it."""
    from reasonrl.model import sharding
    from reasonrl.model.colocate import critic_lm, load_model
    from reasonrl.model.value import value_model

    sharding.init_process_group(host.backend, host.init_method, host.rank, host.world,
                                cfg.placement.call_timeout)
    model, tokenizer = load_model(cfg)
    lm = critic_lm(cfg, model, "cpu")
    device = torch.device(host.device)
    sharded = sharding.shard_value_model(value_model(cfg, lm), device,
                                         sharding.ShardOptions.of(cfg.placement.critic, cfg.model.precision))
    return RankCriticWorker(sharded, tokenizer.pad_token_id, cfg.critic, cfg.optim, host.rank, host.world,
                            device=device)
