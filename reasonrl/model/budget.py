"""The token budget of a micro-batch: `optim.max_tokens_per_micro_batch`, or the one derived
from the model and the machine when that is 0 (auto).

A micro-batch's activation memory grows with the positions it runs through the model (padding
included, `reasonrl.model.forward.layout_tokens`), not with its rows: cutting micro-batches by
a token budget (verl's `use_dynamic_bsz` with `ppo_max_token_len_per_gpu`) bounds the update's
memory whatever the response length. The auto budget is the smaller of

- what fits: an eighth of the device's memory (the GPU's; on a CPU the machine's RAM, or the
  cgroup's limit when lower) divided by the activations one position keeps for the backward,
  `activation_bytes_per_token` (`bytes x layers x 6 x (hidden + intermediate)`: 1.45 MiB for
  SmolLM2-135M in float32, where `bench/lengths.py --budgets` measured 1.48 MiB per position
  between 2,048 and 4,096; the total memory, not the free memory, so that the budget of a run
  does not change when it resumes on the same machine);
- what keeps the device busy: on a CPU, 2,048 positions (a forward and backward costs 4.8-5.6 ms
  per position from 512 to 4,096 positions, least at 2,048, and 6.1 at 8,192 on AMD EPYC:
  bench/lengths.py --budgets); on a GPU 16,384, verl's default `ppo_max_token_len_per_gpu`.

It is rounded down to a multiple of 256 and is at least 256. A row longer than the budget is a
micro-batch of its own. Every forward that trains or scores uses the same budget (policy update,
old and reference log-probs, critic values and update), so the reference stage lays its rows out
as the update does.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CPU_BUSY_TOKENS = 2048  # a CPU's forward + backward cost per position is flat from ~1k up
GPU_BUSY_TOKENS = 16384  # verl's default ppo_max_token_len_per_gpu
MEMORY_SHARE = 8  # the activations of one micro-batch may take 1/8 of the device's memory
ROUND = 256


def activation_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes one position keeps for the backward in a decoder of `config`'s shape: per layer
    about 6 hidden-size vectors (norm inputs, q/k/v/o, residual) and 6 intermediate-size ones
    (gate, up, their activations and product, the down projection's input, the backward's
    buffers), in the weights' dtype. Fitted to the measurement (module docstring)."""
    hidden = config.hidden_size
    inter = getattr(config, "intermediate_size", None) or 4 * hidden
    size = torch.empty((), dtype=dtype).element_size()
    return size * config.num_hidden_layers * 6 * (hidden + inter)


def device_memory(device: torch.device) -> int:
    """Total bytes of `device`: a GPU's memory, or this machine's RAM (the cgroup's limit when
    that is lower: a container's share)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def auto_budget(config, dtype: torch.dtype, device: torch.device, memory: int | None = None) -> int:
    """The auto budget (module docstring) for a model of `config`'s shape on `device`."""
    memory = device_memory(device) if memory is None else memory
    fits = memory // MEMORY_SHARE // activation_bytes_per_token(config, dtype)
    busy = GPU_BUSY_TOKENS if device.type == "cuda" else CPU_BUSY_TOKENS
    return max(ROUND, min(busy, fits) // ROUND * ROUND)


def token_budget(model, device: torch.device, configured: int) -> int:
    """`configured` (`optim.max_tokens_per_micro_batch`) when > 0, else the auto budget of
    `model` (its config and its weights' dtype) on `device`."""
    if configured > 0:
        return configured
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_hidden_layers"):
        return 0  # not a transformer decoder we can size: the row cap alone
    dtype = next(model.parameters()).dtype
    return auto_budget(config, dtype, device)
