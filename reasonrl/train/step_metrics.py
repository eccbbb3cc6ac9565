"""What a training step reports besides the update's own `train/` metrics: the batch's
`reward/`, `advantage/`, `rollout/` (and, multi-turn, `env/`) statistics and the process's
peak GPU memory; and the watch on a run whose rewards are all 0 (`ZeroRewardWatch`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasonrl.algo import zero_variance_groups
from reasonrl.batch import Rollouts, StepBatch
from reasonrl.envs.agent import agent_metrics


def batch_metrics(batch: StepBatch, advantages: torch.Tensor, trainable: torch.Tensor | None = None,
                  trained_version: int | None = None) -> dict[str, float]:
    """reward/, advantage/ and rollout/ metrics of the batch that is trained on. Tokens per
    second count every generated token, dropped resampled groups included. A component a TRL
    reward function scores is the mean over the rows it applied to, `reward/unscored` counts
    the rows none applied to, and each value the reward functions logged is its mean over the
    rows that logged it (`reward/verl/acc`). Token advantages
    [N, T] (a critic's) are summarised over the model tokens of the `trainable` rows. Response
    lengths count the model's tokens; multi-turn episodes add `episode_metrics`. An agent episode
    that trains as several rows (`Rollouts.episode`) counts once, by its first row (its final call's
    sequence; its advantage is its episode's), every sampled token in tokens per second; its calls'
    staleness is taken against `trained_version`, the version the step's update starts from."""
    if batch.rollouts.episode is not None:
        first = batch.rollouts.episode_rows()[0]
        stats = {"rollout/generated_tokens": batch.rollouts.model_lengths.sum().item(), **batch.stats}
        batch = StepBatch(batch.rollouts.take(first), batch.scores.take(first), batch.rewards[first],
                          batch.trainable[first], stats, batch.seconds)
        advantages = advantages[first]
        trainable = None if trainable is None else trainable[first]
    rollouts, scores = batch.rollouts, batch.scores
    lengths = rollouts.model_lengths
    if advantages.dim() == 2:
        valid = torch.zeros(advantages.shape, dtype=torch.bool)
        for i, mask in enumerate(rollouts.token_mask):
            valid[i, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
        if trainable is not None and bool(trainable.any()):
            valid &= trainable[:, None]
        advantages = advantages[valid]
    stats = dict(batch.stats)
    generated = stats.pop("rollout/generated_tokens", lengths.sum().item())
    metrics = {
        "reward/mean": scores.total.mean().item(),
        "reward/std": scores.total.std().item() if len(scores.total) > 1 else 0.0,
        "reward/errors": float(scores.errors),
        "reward/timeouts": float(scores.timeouts),
        "reward/zero_std_groups": float(zero_variance_groups(scores.total, rollouts.group)),
        "advantage/mean": advantages.mean().item(),
        "advantage/std": advantages.std().item() if len(advantages) > 1 else 0.0,
        "advantage/min": advantages.min().item(),
        "advantage/max": advantages.max().item(),
        "rollout/response_length_mean": lengths.mean().item(),
        "rollout/response_length_max": lengths.max().item(),
        "rollout/truncated_frac": rollouts.truncated.float().mean().item(),
        "rollout/tokens_per_s": generated / max(batch.seconds.get("rollout", 0.0), 1e-9),
        **stats,
    }
    applied = scores.applied or {}
    for name, values in scores.components.items():
        rows = applied.get(name, torch.ones(len(values), dtype=torch.bool))
        if bool(rows.any()):  # a TRL function's mean over the completions it applied to (TRL's nanmean)
            metrics[f"reward/{name}"] = values[rows].mean().item()
    if scores.applied is not None:  # completions no reward function applied to: advantage 0
        metrics["reward/unscored"] = float(scores.unscored.sum().item())
    for key, values in logged_values(scores.logged).items():
        metrics[f"reward/{key}"] = sum(values) / len(values)
    if "correct" in scores.components:
        # solved = full marks: partial credit (countdown's format score) is not accuracy
        metrics["reward/accuracy"] = (scores.components["correct"] >= 1.0).float().mean().item()
    if rollouts.episodes is not None:
        metrics.update(episode_metrics(rollouts))
        if rollouts.episodes.agent is not None:  # an agent program's episodes (docs/agents.md)
            metrics.update(agent_metrics(rollouts.episodes.agent, trained_version))
    return metrics


def logged_values(logged: list[dict[str, float]] | None) -> dict[str, list[float]]:
    """Each key the reward functions logged (`Scores.logged`) -> its values over the rows that
    have it, in the order the keys are first met."""
    values: dict[str, list[float]] = {}
    for row in logged or ():
        for key, value in row.items():
            values.setdefault(key, []).append(value)
    return values


def episode_metrics(rollouts: Rollouts) -> dict[str, float]:
    """env/ metrics of multi-turn episodes (`rollouts.episodes`): model turns and tool calls
    per episode (means), the share of episodes that called a tool, tool calls that failed or
    timed out (and the failed share of all calls: errors / calls, 0 without a call) and
    environment steps that failed or timed out (counts in the batch), the environment's reward
    per episode (mean), and the model's vs the environment's tokens per episode (means)."""
    model, ep = rollouts.model_lengths, rollouts.episodes
    return {
        "env/turns_mean": ep.num_turns.float().mean().item(),
        "env/tool_calls_mean": ep.tool_calls.float().mean().item(),
        "env/tool_call_share": (ep.tool_calls > 0).float().mean().item(),
        "env/tool_errors": float(ep.tool_errors.sum().item()),
        "env/tool_error_rate": ep.tool_errors.sum().item() / max(ep.tool_calls.sum().item(), 1),
        "env/tool_timeouts": float(ep.tool_timeouts.sum().item()),
        "env/step_errors": float(ep.step_errors.sum().item()),
        "env/step_timeouts": float(ep.step_timeouts.sum().item()),
        "env/reward_mean": ep.reward.mean().item(),
        "env/model_tokens_mean": model.mean().item(),
        "env/env_tokens_mean": (rollouts.completion_lengths - model).mean().item(),
    }


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def reset_gpu_peak() -> None:
    """Start a new peak for `gpu_memory_metrics` (nothing when this process uses no GPU)."""
    if _cuda_in_use():
        for i in range(torch.cuda.device_count()):
            torch.cuda.reset_peak_memory_stats(i)


def gpu_memory_metrics() -> dict[str, float]:
    """`mem/` metrics: the peak GPU memory of this process since `reset_gpu_peak`, in GiB,
    summed over its GPUs (tensors allocated, and what PyTorch's caching allocator reserved).
    Empty when this process uses no GPU (a CPU run, or ray mode: the workers are elsewhere)."""
    if not _cuda_in_use():
        return {}
    count, gib = torch.cuda.device_count(), float(2 ** 30)
    return {"mem/gpu_peak_allocated_gib": sum(torch.cuda.max_memory_allocated(i) for i in range(count)) / gib,
            "mem/gpu_peak_reserved_gib": sum(torch.cuda.max_memory_reserved(i) for i in range(count)) / gib}


ZERO_REWARD_STEPS = 3  # steps in a row whose every reward is 0 before the run says so


@dataclass
class ZeroRewardWatch:
    """Counts the steps in a row whose every reward is 0 (reward/mean and reward/std both 0,
    and no environment reward): no sample was right, so every group's advantages are 0 and the
    update has nothing to follow (its gradient norm is 0 without a KL or entropy term). A run
    in that state learns nothing, however long it runs. `update` is True once per run, at
    the `after`-th such step in a row; the trainer then prints `zero_reward_warning`."""

    after: int = ZERO_REWARD_STEPS
    streak: int = 0
    first: int | None = None  # the first step of the current streak
    warned: bool = False

    def update(self, step: int, metrics: dict[str, float]) -> bool:
        zero = (metrics.get("reward/mean") == 0.0 and metrics.get("reward/std", 0.0) == 0.0
                and metrics.get("env/reward_mean", 0.0) == 0.0)
        self.streak = self.streak + 1 if zero else 0
        self.first = (step if self.streak == 1 else self.first) if zero else None
        if zero and self.streak >= self.after and not self.warned:
            self.warned = True
            return True
        return False


def zero_reward_warning(first: int, last: int, metrics: dict[str, float], max_new_tokens: int,
                        task: str, run_dir: str) -> str:
    """The one warning of `ZeroRewardWatch`: the steps, what it means, the likely causes (the
    truncation first when most completions hit rollout.max_new_tokens) and `reasonrl probe`."""
    grad = metrics.get("train/grad_norm")
    symptom = "every reward was 0" + (f" and the gradient norm {grad:.3g}" if grad is not None else "")
    truncated = metrics.get("rollout/truncated_frac", 0.0)
    cut = (f"rollout.max_new_tokens={max_new_tokens} cuts the completions off before their answer "
           f"({truncated:.0%} of step {last}'s hit it)")
    causes = ["the task is too hard for this model (SFT first, or easier data)",
              f"the completions do not give the answer in the form the reward reads (reward.task={task})"]
    causes.insert(0 if truncated >= 0.5 else 2, cut)
    return (f"steps {first}-{last}: {symptom}: no sample was right, so the policy "
            f"has no reward to learn from (a group's advantages are all 0). Likely: {'; or '.join(causes)}. "
            f"Check the task with `reasonrl probe --config {run_dir}/config.yaml` and read the completions "
            f"in {run_dir}/samples.jsonl")
