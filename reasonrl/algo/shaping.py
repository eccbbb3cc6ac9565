"""Reward shaping that depends on the completion, not on the task: DAPO's overlong penalty."""

from __future__ import annotations

import torch


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int,
                     factor: float = 1.0) -> torch.Tensor:
    """Soft overlong punishment [N], added to the task reward (DAPO, Yu et al. 2025,
    sec. 3.4, eq. 13), with L_max = `max_length` and L_cache = `buffer`:

        0                                       if |y| <= L_max - L_cache
        factor * ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
        -factor                                 if |y| > L_max

    The penalty grows linearly over the last `buffer` tokens of the budget, so a
    completion that merely ran long is told so before it is cut off. `buffer` = 0: no
    penalty. (`factor` is verl's `overlong_buffer.penalty_factor`; the paper uses 1.)
    """
    lengths = lengths.float()
    if buffer <= 0:
        return torch.zeros_like(lengths)
    expected = max_length - buffer
    penalty = (expected - lengths) / buffer
    return factor * penalty.clamp(min=-1.0, max=0.0)
