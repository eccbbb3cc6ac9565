"""The run's bad-step policy: which steps are bad, what the run says about them, and when it
stops.

A step is bad when its policy or critic update met a non-finite loss or gradient (the learner
skipped it) or when every reward call failed. Each bad step is printed with its likely cause;
`trainer.max_bad_steps` in a row stop the run (`TrainingAborted`, exit code 1) with the command
that resumes from the last good checkpoint, the learning rate lowered when it is the likely
cause. An update that left a weight NaN or inf from a finite loss and gradient (the learner
checks after each optimizer step) stops the run at once, before the sync would push those
weights or a checkpoint could hold them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from reasonrl import console
from reasonrl.config import Config
from reasonrl.errors import TrainingAborted

ROLES = (("policy", "train", "optim.lr"), ("critic", "critic", "critic.lr"))  # role, metrics prefix, its lr


class BadSteps:
    """The count of bad steps in a row (`count`, kept in checkpoints), what made the last one bad
    (`reason`) and the learning rate to lower after it (`lr`: optim.lr, critic.lr or None).
    `last_good()`: the run's last good checkpoint, or None."""

    def __init__(self, cfg: Config, last_good: Callable[[], Path | None], count: int = 0,
                 command: str = "train"):
        self.cfg, self.last_good, self.count = cfg, last_good, count
        self.command = command  # the `reasonrl` command whose --resume the messages name (train, sft)
        self.reason, self.lr = "", None

    def update(self, step: int, metrics: dict[str, float], failures: list[str | None] | None) -> None:
        """Step `step` (1-based, done) counted good or bad (`failures`: the rows' reward failures);
        `train/bad_steps` in `metrics`; a bad one printed with its likely causes."""
        skipped = [(role, prefix, lr) for role, prefix, lr in ROLES
                   if metrics.get(f"{prefix}/updates", 0) > 0
                   and metrics.get(f"{prefix}/skipped_update", 0) > 0]
        no_reward = bool(failures) and all(f is not None for f in failures)
        bad = bool(skipped) or no_reward
        self.count = self.count + 1 if bad else 0
        metrics["train/bad_steps"] = float(self.count)
        self.lr = None
        if skipped:
            role, prefix, self.lr = skipped[0]
            norm, reward = metrics.get(f"{prefix}/grad_norm", math.nan), metrics.get("reward/mean", math.nan)
            rewards = f" or rewards too large (reward/mean={reward:g})" if "reward/mean" in metrics else ""
            self.reason = (f"non-finite loss or gradient in the {role} update ({prefix}/grad_norm="
                           f"{norm:g}), update skipped: likely {self.lr}={self.learning_rate(self.lr):g} "
                           f"too high (the weights diverged){rewards}")
        elif no_reward:
            self.reason = f"every reward call failed, e.g. {failures[0]}"
        if bad:
            console.warning(f"step {step}: {self.reason} ({self.count} in a row; abort "
                            f"at {self.cfg.trainer.max_bad_steps})", label="", step=step)

    def learning_rate(self, key: str) -> float:
        """The configured value of `key`, optim.lr or critic.lr."""
        return self.cfg.optim.lr if key == "optim.lr" else self.cfg.critic.lr

    def way_on(self, lower: str | None) -> str:
        """How a run stopped by bad steps goes on: the command that resumes from the last good
        checkpoint (with the learning rate `lower`, optim.lr or critic.lr, lowered tenfold, and
        to at most the default 1e-5), and that checkpoint; without one, that the run starts again."""
        good = self.last_good()
        if good is None:
            again = f"lower {lower} and start the run again" if lower else "start the run again"
            return f"no good checkpoint was written yet: {again}; the last good checkpoint is none"
        change = "" if lower is None else (f" --allow-config-change {lower} "
                                           f"{lower}={min(self.learning_rate(lower) / 10, 1e-5):g}")
        return (f"resume with: reasonrl {self.command} --resume {good}{change}; the last good checkpoint is "
                f"{good}")

    def stop_if_weights_broke(self, step: int, metrics: dict[str, float]) -> None:
        """Step `step` (1-based, in progress): its policy or critic update left a weight NaN or inf
        (`nonfinite_weights`) although its loss and gradient were finite: the run stops now
        (`TrainingAborted`, exit code 1); every later step would compute on those weights."""
        for role, prefix, key in ROLES[::-1]:  # the critic updates first
            if metrics.get(f"{prefix}/nonfinite_weights"):
                raise TrainingAborted(
                    f"step {step}: the {role} update made weights non-finite (NaN or inf) "
                    f"from a finite loss and gradient ({prefix}/grad_norm="
                    f"{metrics.get(f'{prefix}/grad_norm', math.nan):g}): {key}="
                    f"{self.learning_rate(key):g} is far too high (AdamW moves each weight by up to about "
                    f"the learning rate per step); nothing of this step was synced or saved; "
                    f"{self.way_on(key)}")

    def abort_if_stuck(self, step: int) -> None:
        """`trainer.max_bad_steps` bad steps in a row (logged first) end the run, naming the last
        good checkpoint and the command that resumes from it."""
        if self.count >= self.cfg.trainer.max_bad_steps:
            fix = f"Lower {self.lr} or scale the rewards down" if self.lr else "Fix the reward function"
            raise TrainingAborted(f"{self.count} bad steps in a row (to step {step}), the last: "
                                  f"{self.reason}; stopping. {fix}; {self.way_on(self.lr)}")
