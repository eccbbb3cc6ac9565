"""Host-memory layout of the update: fewer bytes held by the C allocator at the peak.

On CPU every tensor comes from glibc's malloc. Tensors of a few MB (a micro-batch's
activations and their gradients) land in its heap, and what they leave behind when freed
stays mapped, in holes between live blocks, so the process's resident size exceeds what is
live. Measured on the bench work (docs/performance.md): a live peak of 3.8 GiB showed as 4.7
GiB of RSS. Three things here bring it down, none changing a value:

- `release_free_memory()` (glibc's `malloc_trim`) right before each micro-batch's backward:
  the forward's freed temporaries go back to the system before the backward allocates its
  own. -0.34 GiB of peak, 0.06 s per call; trimming more often (inside the backward) costs
  ~15 % of the update in page faults for another -0.15 GiB, so it is not done.
- `FlatBuffers`: the gradients and AdamW's two moments as views of three buffers, each one
  allocation (a private mapping of its own, outside the heap), not ~270 heap blocks
  interleaved with the activations. The gradient buffer is made at the start of each update
  and dropped at its end (`zero_grad(set_to_none=True)` semantics: the rollout phase runs
  without it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import torch


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        return libc if libc is not None and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def release_free_memory() -> bool:
    """Return the C heap's free pages to the system (glibc only; elsewhere a no-op, False)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def plain_parameters(params: list[torch.Tensor]) -> bool:
    """Every parameter a plain `nn.Parameter` (not one of FSDP2's DTensor shards)."""
    from torch.distributed.tensor import DTensor

    return bool(params) and all(type(p) is torch.nn.Parameter and not isinstance(p.data, DTensor)
                                for p in params)


def flat_ok(params: list[torch.Tensor]) -> bool:
    """Views of one buffer need plain parameters of one device and dtype (FSDP2's shards and
    mixed dtypes keep torch's own per-parameter tensors)."""
    return plain_parameters(params) and all(
        p.device == params[0].device and p.dtype == params[0].dtype for p in params)


def views(buffer: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive slices of `buffer` shaped like `params`."""
    out, offset = [], 0
    for p in params:
        out.append(buffer[offset: offset + p.numel()].view_as(p))
        offset += p.numel()
    return out


def new_buffer(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)


def attach_gradient_buffer(params: list[torch.Tensor]) -> torch.Tensor:
    """Give every parameter a zero `.grad` that is a view of one new buffer (returned);
    autograd then accumulates into it in place."""
    buffer = new_buffer(params)
    for p, v in zip(params, views(buffer, params), strict=True):
        p.grad = v
    return buffer


def flatten_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Put AdamW's `exp_avg` and `exp_avg_sq` of every parameter into two buffers (copying
    any existing values), creating the state a first `step` would create (zero moments,
    step 0) where there is none yet. `step` is then the same computation as with torch's
    own lazily made tensors (tests/workers/test_policy_worker.py)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    fused = any(group.get("fused") for group in optimizer.param_groups)
    for key in ("exp_avg", "exp_avg_sq"):
        buffer = new_buffer(params)
        for p, v in zip(params, views(buffer, params), strict=True):
            state = optimizer.state[p]
            if key in state:
                v.copy_(state[key])
            state[key] = v
    for p in params:
        if "step" not in optimizer.state[p]:  # as torch.optim.AdamW._init_group makes it
            optimizer.state[p]["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if fused
                                          else torch.tensor(0.0, dtype=torch.float32))
