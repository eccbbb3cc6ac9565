"""The rows of a tensor sharded by FSDP2 over the data-parallel ranks: this rank's rows, the
full tensor gathered (on every rank, or on rank 0 alone), and this rank's part of a weight
checksum. FSDP2 shards dim 0 as `torch.chunk` does: ceil(rows / N) rows per rank, the last
ranks fewer or none. Used by the ranks' weight I/O (`reasonrl.workers.ranks`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from reasonrl.weights import sample_stride


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor on every rank (a collective for a sharded one); a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_rows(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this rank's rows of `tensor`, the index of its first row): FSDP2 shards dim 0 as
    `torch.chunk` does (ceil(rows / N) rows per rank, the last ranks fewer or none); a plain
    tensor is all rows."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(tensor, DTensor):
        return tensor, 0
    if tuple(tensor.placements) != (Shard(0),):
        raise ValueError(f"expected a tensor sharded on dim 0, got placements {tensor.placements}")
    local = tensor.to_local()
    chunk = -(-tensor.shape[0] // dist.get_world_size())
    start = min(dist.get_rank() * chunk, tensor.shape[0])
    if local.shape[0] != min(chunk, tensor.shape[0] - start):
        raise ValueError(f"a shard of {tuple(local.shape)} rows at row {start} of {tuple(tensor.shape)}: "
                         "not torch.chunk's split")
    return local, start


def gather_rows(local: torch.Tensor, rows: int, device: torch.device,
                everywhere: bool) -> torch.Tensor | None:
    """The full tensor of `rows` rows from every rank's `local` rows (`local_rows`), through
    `device` (NCCL reduces only GPU tensors): on every rank (`everywhere`), or on rank 0 alone
    (the others send their rows and get None). At most one full tensor is allocated, there."""
    world, rank = dist.get_world_size(), dist.get_rank()
    chunk = -(-rows // world)
    padded = local.to(device)
    if padded.shape[0] != chunk:  # collectives move equal pieces
        padded = torch.cat([padded, padded.new_zeros((chunk - padded.shape[0], *padded.shape[1:]))])
    full = torch.empty((chunk * world, *padded.shape[1:]), dtype=padded.dtype, device=device) \
        if everywhere or rank == 0 else None
    if everywhere:
        dist.all_gather(list(full.chunk(world)), padded)
    elif rank == 0:  # each rank's rows straight into their place (a gather would stage them in a copy)
        pieces = full.chunk(world)
        pieces[0].copy_(padded)
        for src in range(1, world):
            dist.recv(pieces[src], src=src)
    else:
        dist.send(padded.contiguous(), dst=0)
    return None if full is None else full[:rows]


def sample_sum(local: torch.Tensor, start_row: int, shape: torch.Size) -> float:
    """The float64 sum of the elements of `local` (rows from `start_row` of a tensor of `shape`)
    that `reasonrl.weights.weights_checksum` samples from the full tensor: summed over the
    ranks, the full tensor's sample sum (in another order: float64 round-off, ~1e-16 of the
    sum of magnitudes, far inside `checksums_match`'s 1e-12)."""
    row = math.prod(shape[1:])
    stride = sample_stride(math.prod(shape))
    first = (-start_row * row) % stride
    return local.reshape(-1)[first::stride].to("cpu", torch.float64).sum().item()
