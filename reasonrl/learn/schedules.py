"""Learning-rate schedules: one function per `optim.schedule` (the `LR_SCHEDULES` registry), one
signature:

    schedule(step, warmup, total_steps, min_lr_ratio) -> the LR factor at 0-based `step`

called for the steps after the warm-up (`step >= warmup`); `lr_multiplier` puts the linear
warm-up in front, the same for every schedule. The learner's LR at a step is `optim.lr` times
this factor (torch's `LambdaLR`), advanced once per training step. Adding a schedule is one
decorated function here and its hand-computed test (`tests/algo/test_algo.py`): the config's allowed
values and the dispatch come from the registry.
"""

from __future__ import annotations

import math

from reasonrl.registry import LR_SCHEDULES


@LR_SCHEDULES.register("constant")
def constant(step: int, warmup: int, total_steps: int, min_lr_ratio: float) -> float:
    """Factor 1 after the warm-up: `optim.lr` throughout (the default; transformers'
    `get_constant_schedule_with_warmup`)."""
    return 1.0


@LR_SCHEDULES.register("cosine")
def cosine(step: int, warmup: int, total_steps: int, min_lr_ratio: float) -> float:
    """Cosine decay from 1 to `min_lr_ratio` over the steps after the warm-up, reaching it at the
    last step (SGDR, Loshchilov & Hutter 2017, "SGDR: Stochastic Gradient Descent with Warm
    Restarts", eq. 5, without restarts: eta_min = min_lr_ratio x lr):

        factor = min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi * p)) / 2,
        p = min((step - warmup) / max(total_steps - warmup - 1, 1), 1)

    transformers' `get_cosine_with_min_lr_schedule_with_warmup` divides by total_steps - warmup,
    so its floor comes one step after the last; here the last step trains at the floor."""
    span = max(total_steps - warmup - 1, 1)
    progress = min((step - warmup) / span, 1.0)
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lr_multiplier(step: int, total_steps: int, schedule: str, warmup_ratio: float,
                  min_lr_ratio: float) -> float:
    """LR factor at optimizer step `step` (0-based): a linear warm-up over
    ceil(warmup_ratio * total_steps) steps, (step + 1) / warmup (transformers'
    `get_*_schedule_with_warmup` start from 0; this one's first step already moves), then the
    `LR_SCHEDULES` entry `schedule`."""
    warmup = math.ceil(warmup_ratio * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    return LR_SCHEDULES.get(schedule)(step, warmup, total_steps, min_lr_ratio)
