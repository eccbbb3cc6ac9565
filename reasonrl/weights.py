"""What the policy and a rollout engine compare to prove they hold the same weights: a
checksum of the tensors (also from per-tensor parts, `sample_sums`, so that an engine can
update the parts a push brings and data-parallel ranks can sum their rows' parts), and the
log-probs of a fixed probe sequence; and how a streamed sync cuts the weights into buckets
(`plan_buckets`).

Below both workers: the policy computes the expected values, the engine's worker checks
the served ones against them (`reasonrl.rollout.worker.RolloutWorker.load_weights`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import torch

CHECKSUM_SAMPLE = 65536  # elements read per tensor: cheap (~0.05 s for 135M) and exact


def weights_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> float:
    """A cheap fingerprint of a set of weights: per tensor, the float64 sum of an evenly
    strided sample of at most CHECKSUM_SAMPLE elements, weighted by the tensor's rank in
    name order (so swapped tensors differ too); names seen twice (tied weights) count once.

    An optimizer step moves every element it touches by ~lr, far above float64 rounding
    (~1e-16 relative), so a skipped or partial push changes the value; two copies of the
    same weights give the same value whatever the thread count (`checksums_match`).
    """
    return combine_sums(sample_sums(named_tensors))


def sample_stride(numel: int) -> int:
    """The stride of a tensor's checksum sample: elements 0, stride, 2 stride, ... of it flattened."""
    return max(1, numel // CHECKSUM_SAMPLE)


def sample_sums(named_tensors: Iterable[tuple[str, torch.Tensor]],
                into: dict[str, float] | None = None) -> dict[str, float]:
    """Each tensor's sampled float64 sum by name (`weights_checksum`'s parts), added to `into`
    (a name already there is replaced: an engine keeps the sums of the weights it serves and
    updates those a push brings)."""
    sums: dict[str, float] = {} if into is None else into
    seen: set[str] = set()
    for name, tensor in named_tensors:
        if name in seen:
            continue
        seen.add(name)
        flat = tensor.detach().reshape(-1)
        sums[name] = flat[::sample_stride(flat.numel())].to("cpu", torch.float64).sum().item()
    return sums


def combine_sums(sums: dict[str, float]) -> float:
    """`weights_checksum` from the per-tensor sums: weighted by the rank of the name."""
    return math.fsum((rank + 1) * sums[name] for rank, name in enumerate(sorted(sums)))


_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")  # a decoder layer's weights: model.layers.7.*


def plan_buckets(named_bytes: list[tuple[str, int]], bucket_bytes: int) -> list[list[str]]:
    """The names of `named_bytes` (in their order) cut into buckets of at most `bucket_bytes`
    bytes each, keeping every decoder layer's weights (`*.layers.N.*`) in one bucket: an engine
    that fuses a layer's projections (vLLM's qkv and gate/up) must receive them in one load. A
    layer (or another tensor) larger than `bucket_bytes` is a bucket of its own, so a sync's
    extra memory is at most max(bucket_bytes, its largest layer or tensor)."""
    if bucket_bytes <= 0:
        raise ValueError(f"placement.sync_bucket_mb: must be > 0, got {bucket_bytes} bytes")
    groups: list[list] = []  # [layer or None, names, bytes]
    for name, size in named_bytes:
        match = _LAYER.match(name)
        key = match.group(1) if match else None
        if key is not None and groups and groups[-1][0] == key:
            groups[-1][1].append(name)
            groups[-1][2] += size
        else:
            groups.append([key, [name], size])
    buckets: list[list[str]] = []
    used = 0
    for _, names, size in groups:
        if buckets and used + size <= bucket_bytes:
            buckets[-1] += names
            used += size
        else:
            buckets.append(list(names))
            used = size
    return buckets


def checksums_match(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# A fixed token sequence whose log-probs an engine and the policy must agree on, for
# engines whose checksum cannot see everything they compute with (vLLM's packed layers).
PROBE_TEXT = ("<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n12 + 7 equals 19. "
              "The quick brown fox jumps over the lazy dog; 3 * (4 - 1) = 9.<|im_end|>")


def probe_ids(tokenizer) -> list[int]:
    """`PROBE_TEXT`'s token ids (no special tokens added): the sequence an engine that probes
    checks, and whose log-probs the policy gives it."""
    return tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """fp32 log-probs [len(ids) - 1] of ids[1:] given the preceding ids: one transformers
    forward of `model` in eval mode, log-softmax in float32, at temperature 1."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
    finally:
        model.train(was_training)
    targets = torch.tensor(ids[1:], device=device).unsqueeze(-1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets).squeeze(-1).cpu()
