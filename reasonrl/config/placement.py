"""The `placement` section: where the workers run (this process, or Ray actors with their
resources, data-parallel ranks and rollout replicas). Docs: docs/scaling.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from reasonrl.config.fields import param


@dataclass
class WorkerPlacement:
    """Ray resources of one worker actor (each policy rank is one actor)."""

    num_cpus: float = param(1.0, ge=0)
    num_gpus: float = param(0.0, ge=0)  # may be fractional: 0.5 + 0.5 share one GPU
    resources: dict[str, float] = param({})  # custom resources, e.g. {node_a: 1}


@dataclass
class PolicyPlacement(WorkerPlacement):
    ranks: int = param(1, ge=1)  # data-parallel ranks (torch.distributed + FSDP2); > 1 needs mode=ray
    # FSDP2 ranks (ranks > 1): true = free each layer's gathered weights after its forward and gather
    # them again for the backward (ZeRO-3); false = keep them until the backward (ZeRO-2: fewer
    # all-gathers, a layer's full weights per layer in memory between forward and backward)
    reshard_after_forward: bool = True
    # FSDP2 ranks: keep the weight, gradient and AdamW shards in CPU memory, copied to the GPU per
    # layer for compute (FSDP2's CPUOffloadPolicy; DeepSpeed's offload); the optimizer steps on the CPU
    cpu_offload: bool = False


@dataclass
class RolloutPlacement(WorkerPlacement):
    replicas: int = param(1, ge=1)  # rollout actors, each with its own engine and these resources; > 1: ray


@dataclass
class PlacementConfig:
    # local: workers in this process; ray: each worker is a Ray actor (docs/scaling.md)
    mode: Literal["local", "ray"] = "local"
    # local mode: where the policy and the colocated rollout engine live. auto = cuda when
    # torch sees a GPU, else cpu; or cpu, cuda, cuda:N (ray mode: placement.<worker>.num_gpus)
    device: str = "auto"
    # ray: "" = start a Ray instance for this run; "auto" = the cluster of `ray start --head`
    # on this machine; or host:port / ray://host:10001
    address: str = ""
    num_cpus: int = param(0, ge=0)  # CPUs of the Ray instance a run starts itself (0 = all); not for address
    start_timeout: float = param(180.0, gt=0)  # seconds for a worker actor to be scheduled and built
    call_timeout: float = param(3600.0, gt=0)  # seconds for one remote call (a step, a sync, an eval chunk)
    # torch.distributed backend of the policy ranks; auto = nccl when the ranks have GPUs, else gloo
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    # ray mode: a weight sync moves the policy's weights to the rollout replicas in buckets of at most
    # this many MB (a tensor larger than that travels alone): the extra memory of a sync per process
    sync_bucket_mb: float = param(512.0, gt=0)
    policy: PolicyPlacement = field(default_factory=PolicyPlacement)
    rollout: RolloutPlacement = field(default_factory=RolloutPlacement)
    critic: PolicyPlacement = field(default_factory=PolicyPlacement)  # algo.advantage=gae
    teacher: WorkerPlacement = field(default_factory=WorkerPlacement)  # teacher.path (its own actor)
    # reward.weights' judge / classifier (reward.model): local, a process of its own on placement.device;
    # ray, an actor of its own with these resources
    judge: WorkerPlacement = field(default_factory=WorkerPlacement)
