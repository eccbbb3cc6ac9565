"""What the policy and a rollout engine compare to prove they hold the same weights: a
checksum of the tensors, and the log-probs of a fixed probe sequence.

Below both workers: the policy computes the expected values, the engine's worker checks
the served ones against them (`reasonrl.rollout.worker.RolloutWorker.load_weights`).
"""

from __future__ import annotations

import math
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
    sums: dict[str, float] = {}
    for name, tensor in named_tensors:
        if name in sums:
            continue
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // CHECKSUM_SAMPLE)
        sums[name] = flat[::stride].to("cpu", torch.float64).sum().item()
    return math.fsum((rank + 1) * sums[name] for rank, name in enumerate(sorted(sums)))


def checksums_match(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


# A fixed token sequence whose log-probs an engine and the policy must agree on, for
# engines whose checksum cannot see everything they compute with (vLLM's packed layers).
PROBE_TEXT = ("<|im_start|>user\nWhat is 12 + 7?<|im_end|>\n<|im_start|>assistant\n12 + 7 equals 19. "
              "The quick brown fox jumps over the lazy dog; 3 * (4 - 1) = 9.<|im_end|>")


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
