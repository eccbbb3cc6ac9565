"""FSDP2 sharding of a policy or value model across data-parallel ranks: the process group
(`init_process_group`), FSDP2's root unit around an HF model (`ShardRoot`), its memory options
(`ShardOptions`: ZeRO-2 / ZeRO-3, CPU offload) and `shard_model` / `shard_value_model` (every
decoder layer one unit, the embeddings / final norm / LM head in the root unit). The ranks that
train on the sharded model are `reasonrl.workers.ranks`'s.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from reasonrl.model.value import ValueModel

ROOT_PREFIX = "lm."  # ShardRoot's name for the HF model


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


@dataclasses.dataclass(frozen=True)
class ShardOptions:
    """FSDP2's memory options (`placement.policy.reshard_after_forward` / `cpu_offload`).

    reshard_after_forward=True frees each decoder layer's gathered weights after its forward
    and gathers them again in the backward (ZeRO-3: a rank holds 1/N of the weights plus one
    layer's full weights); False keeps them from the forward to the backward (ZeRO-2: one
    all-gather per layer and micro-batch instead of two, every layer's full weights held
    between the two). The root unit (embeddings, final norm, LM head) keeps its full weights
    from forward to backward in both. cpu_offload keeps the weight, gradient and optimizer
    shards in CPU memory (`CPUOffloadPolicy`): each unit's shard is copied to the device for
    its all-gather, gradients come back to the CPU and AdamW steps there. None of them changes
    the gradient.

    mixed (model.precision=bf16-mixed): FSDP2's `MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)`: the fp32 shards are the master weights AdamW steps, each unit's
    all-gather casts them to bf16 for its forward and backward, and gradients are reduced
    (summed over ranks) in fp32, as `reasonrl.model.precision.MasterWeights` does in one process.
    """

    reshard_after_forward: bool = True
    cpu_offload: bool = False
    mixed: bool = False

    @classmethod
    def of(cls, placement, precision: str = "fp32") -> ShardOptions:
        return cls(placement.reshard_after_forward, placement.cpu_offload, precision == "bf16-mixed")


def _shard(root: nn.Module, layers, device: torch.device, options: ShardOptions = ShardOptions()) -> None:
    """Each decoder layer, then the rest (`root`), sharded over the default process group with
    FSDP2 (rows of every tensor split as `torch.chunk` splits them), gradients summed over
    ranks (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        FSDPModule,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
    )

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if options.cpu_offload else OffloadPolicy()
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if options.mixed
          else MixedPrecisionPolicy())
    for layer in layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=options.reshard_after_forward,
                    offload_policy=offload, mp_policy=mp)
    # the root keeps its weights from forward to backward either way (FSDP2's default for a root):
    # the LM head in it runs after the decoder's forward (`ShardRoot`)
    fully_shard(root, mesh=mesh, offload_policy=offload, mp_policy=mp)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # a plain SUM (gloo has no PREMUL_SUM)


def shard_model(model: nn.Module, device: torch.device, options: ShardOptions = ShardOptions()) -> ShardRoot:
    """`model` (an HF causal LM, or a peft model around one) on `device`, sharded (`_shard`)
    under a `ShardRoot`. A LoRA model's adapter weights are sharded with the layers they
    adapt; only they get gradients."""
    root = ShardRoot(model.to(device))
    _shard(root, model.get_decoder().layers, device, options)
    return root


def shard_value_model(model: ValueModel, device: torch.device,
                      options: ShardOptions = ShardOptions()) -> ValueModel:
    """A critic's value model on `device`, sharded (`_shard`) with itself as the root: its
    decoder call is routed through its forward (as `ShardRoot` does) so that the root's
    parameters (embeddings, final norm, value head) are gathered."""
    model = model.to(device)
    layers = model.get_decoder().layers
    model.route_through_forward = True
    _shard(model, layers, device, options)
    return model
