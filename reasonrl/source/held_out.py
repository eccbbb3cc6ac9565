"""The held-out eval of a policy version, one way for every source: `reasonrl.evaluate` on the
rollout worker that serves that version (the trainer's own, on-policy; the rollout side's, in
its command stream, ahead), with the `eval` section's settings."""

from __future__ import annotations

import time

from reasonrl.batch import Example
from reasonrl.config import RewardConfig
from reasonrl.evaluate import EvalSettings, eval_metrics, evaluate


def held_out_metrics(rollout, examples: list[Example], settings: EvalSettings,
                     reward: RewardConfig, judge=None) -> dict[str, float]:
    """The `eval/` metrics (pass@k overall and per data_source) of `rollout`'s engine on the
    held-out `examples`, and `time/eval`: the same function and numbers as `reasonrl eval` with
    these settings (`--greedy` by default), with its progress bar when `settings.progress`; `judge`:
    the judge role's worker, when reward.weights names one."""
    t = time.perf_counter()
    found = evaluate(rollout, None, examples, settings, reward, desc="held-out eval", leave=False,
                     judge=judge)
    metrics = {f"eval/{k}": v for k, v in eval_metrics(found.results, settings.ks).items()}
    return {**metrics, "time/eval": time.perf_counter() - t}
