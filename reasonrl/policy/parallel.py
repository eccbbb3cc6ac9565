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
its default average. Checked in tests/test_scaling.py (2 gloo ranks vs 1 process).

FSDP gathers and reduces inside every forward and backward, so all ranks must run the same
number of them: a rank with fewer micro-batches pads with copies whose loss mask is zero
(they contribute exactly 0 to the loss and gradient), and ranks use plain micro-batches (one
forward each; `optim.share_prompt` is not used by them). Log-probs without gradients (the old
policy and reference for several updates per step, `sequence_kl`, entropies) are computed
by every rank for the whole batch: the same forwards everywhere, no coordination needed.

The rank processes themselves are started by `reasonrl.placement` (Ray actors).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from reasonrl.policy.worker import (
    MicroBatch,
    PolicySettings,
    PolicyWorker,
    completion_logprobs,
    make_micro_batches,
)

ROOT_PREFIX = "lm."  # ShardRoot's name for the HF model
MAX_KEYS = ("grad_norm", "skipped_update")  # the same on every rank (or any rank decides): max


class ShardRoot(nn.Module):
    """FSDP2's root unit around an HF causal LM.

    The root gathers its own parameters (embeddings, final norm, LM head) in its forward and
    keeps them gathered until backward; `completion_logprobs` calls `get_decoder()(...)` and
    `get_output_embeddings()(...)`, so the decoder call is routed through this module's
    forward and the LM head then finds its weight gathered.
    """

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm
        self.config = lm.config

    def forward(self, **kwargs):
        return self.lm.get_decoder()(**kwargs)

    def get_decoder(self) -> ShardRoot:
        return self

    def get_output_embeddings(self) -> nn.Module:
        return self.lm.get_output_embeddings()


def init_process_group(backend: str, init_method: str, rank: int, world: int, timeout_s: float) -> None:
    """Join the policy ranks' process group (blocks until all `world` ranks joined)."""
    import datetime

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def shard_model(model: nn.Module, device: torch.device) -> ShardRoot:
    """`model` on `device`, each decoder layer and then the rest sharded over the default
    process group with FSDP2, gradients summed over ranks (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    root = ShardRoot(model.to(device))
    for layer in model.get_decoder().layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)
    return root


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


class RankPolicyWorker(PolicyWorker):
    """One data-parallel rank. Its public methods are collective: every rank must call them
    in the same order (the placement's policy group does); results are the same on every
    rank except where noted (rank 0 writes files)."""

    def __init__(self, model: ShardRoot, pad_id: int, settings: PolicySettings, rank: int, world: int,
                 ref_model: ShardRoot | None = None):
        # Plain micro-batches: one forward each. A shared prompt skips the completion forward
        # when all completions are one token long, and FSDP needs the same calls on every rank.
        plain = dataclasses.replace(settings.optim, share_prompt=False)
        settings = dataclasses.replace(settings, optim=plain)
        super().__init__(model, pad_id, settings, ref_model=ref_model)
        self.rank, self.world = rank, world
        self._my_tokens = 0

    # ---- the training step --------------------------------------------------------------

    def train_micro_batches(self, prompt_ids: list[list[int]],
                            completion_ids: list[list[int]]) -> list[MicroBatch]:
        """This rank's contiguous slice of the mini-batch, padded with zero-mask micro-batches
        to the largest count on any rank."""
        mine = torch.arange(len(prompt_ids)).tensor_split(self.world)[self.rank].tolist()
        self._my_tokens = sum(len(completion_ids[i]) for i in mine)
        batches = [dataclasses.replace(mb, rows=[mine[r] for r in mb.rows]) for mb in make_micro_batches(
            [prompt_ids[i] for i in mine], [completion_ids[i] for i in mine], self.optim.micro_batch_size,
            self.pad_id, self.optim.share_prompt)]
        count = torch.tensor([len(batches)], device=self.device)  # NCCL reduces only GPU tensors
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        if len(batches) < count.item():
            idle = make_micro_batches(prompt_ids[:1], completion_ids[:1], 1, self.pad_id,
                                      self.optim.share_prompt)[0]
            idle = dataclasses.replace(idle, mask=torch.zeros_like(idle.mask))
            batches += [idle] * (int(count.item()) - len(batches))
        return batches

    def _update(self, *args, **kwargs) -> dict[str, float]:
        """`PolicyWorker._update` on this rank's rows, its metrics combined over the ranks:
        sums of shares (the normalisers are global), max of `*_max`, min of `*_min`."""
        out = super()._update(*args, **kwargs)
        keys = sorted(out)
        if self._my_tokens == 0:  # no token here: this rank's extremes are placeholders
            out = {k: (-math.inf if k.endswith("_max") else math.inf if k.endswith("_min") else v)
                   for k, v in out.items()}
        ops = {"sum": [k for k in keys if not k.endswith(("_max", "_min")) and k not in MAX_KEYS],
               "max": [k for k in keys if k.endswith("_max") or k in MAX_KEYS],
               "min": [k for k in keys if k.endswith("_min")]}
        reduce_ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        for op, names in ops.items():
            if names:
                values = torch.tensor([out[k] for k in names], dtype=torch.float64, device=self.device)
                dist.all_reduce(values, op=reduce_ops[op])
                out.update(zip(names, values.tolist(), strict=True))
        for k in ("ratio_max", "ratio_min"):
            if k in out and not math.isfinite(out[k]):
                out[k] = 1.0
        return out

    # ---- weights (all collective: every rank gathers, rank 0 writes) ----------------------

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered) tensors by HF name, on the CPU."""
        for name, param in self.model.named_parameters():
            yield name.removeprefix(ROOT_PREFIX), _full(param.detach()).cpu()

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

    def save_pretrained(self, path, tokenizer=None) -> None:
        weights = dict(self.named_weights())
        if self.rank == 0:
            self.model.lm.save_pretrained(path, state_dict=weights)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)

    @torch.no_grad()
    def load_weights(self, tensors: dict[str, torch.Tensor]) -> None:
        """Each rank copies its shard of the full tensors (no communication)."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        params = {name.removeprefix(ROOT_PREFIX): p for name, p in self.model.named_parameters()}
        missing, unexpected = set(params) - set(tensors), set(tensors) - set(params)
        tied = {"lm_head.weight"} if getattr(self.model.lm.config, "tie_word_embeddings", False) else set()
        if missing or unexpected - tied:
            raise KeyError(f"checkpoint weights do not match the model: missing {sorted(missing)[:5]}, "
                           f"unexpected {sorted(unexpected - tied)[:5]}")
        for name, param in params.items():
            full = tensors[name].to(param.device, param.dtype)
            if isinstance(param, DTensor):
                full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.copy_(full)

    def state_dict(self) -> dict:
        """The full (unsharded) optimizer state by parameter name, scheduler and step."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        optim = get_optimizer_state_dict(self.model, self.optimizer,
                                         options=StateDictOptions(full_state_dict=True))
        optim = torch.utils._pytree.tree_map(  # on every rank (cpu_offload keeps it on rank 0 only)
            lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, optim)
        return {"optimizer": optim, "scheduler": self.scheduler.state_dict(), "step": self.step,
                "ranks": self.world}

    def load_state_dict(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if state.get("ranks") is None:
            raise ValueError("this checkpoint's optimizer state was written by one process; resume it "
                             "with placement.policy.ranks=1")
        set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
        for param_state in self.optimizer.state.values():  # the loader may share one `step`
            if isinstance(param_state.get("step"), torch.Tensor):  # tensor among all parameters:
                param_state["step"] = param_state["step"].clone()  # AdamW adds 1 to each
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]

    def close(self) -> None:
        """Leave the process group (collective: every rank calls it)."""
        if dist.is_initialized():
            dist.destroy_process_group()
