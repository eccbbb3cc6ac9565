"""Collecting a step's batch: rollouts, their scores and shaped rewards, in one record.

`collect_batch` samples prompts, generates `rollout.n` completions each and scores them.
Rewards are the task score (plus, in multi-turn episodes, the environment's rewards) plus
DAPO's overlong penalty (`algo.overlong_buffer`, over the model's tokens). With
`algo.dynamic_sampling` (DAPO, Yu et al. 2025, sec. 3.2), groups whose shaped rewards are
all equal (std <= `dynamic_sampling_tol`) are dropped and new prompts sampled for the
missing groups, for at most `max_resample` extra rounds; a batch still short after that
trains on the groups it has. If no group at all was informative, the last round is returned
with no trainable row (the step makes no update).
"""

from __future__ import annotations

import time

import torch

from reasonrl.algo import informative_groups, overlong_penalty
from reasonrl.batch import Rollouts, Scores, StepBatch
from reasonrl.config import Config
from reasonrl.data import PromptSampler
from reasonrl.envs import with_env_reward
from reasonrl.rewards import score_rollouts
from reasonrl.rollout import SamplingParams


def renumber_groups(group: torch.Tensor) -> torch.Tensor:
    """Group ids 0..k-1 in order of first appearance (after rows were dropped)."""
    ids: dict[int, int] = {}
    return torch.tensor([ids.setdefault(int(g), len(ids)) for g in group], dtype=torch.long)


def collect_batch(rollout, sampler: PromptSampler, sampling: SamplingParams, cfg: Config) -> StepBatch:
    """The batch of one step (see the module docstring); `rollout` is a rollout worker."""
    algo, want = cfg.algo, cfg.trainer.batch_size // cfg.rollout.n
    parts: list[tuple[Rollouts, Scores, torch.Tensor]] = []
    seconds = {"rollout": 0.0, "reward": 0.0}
    kept = dropped = rounds = 0
    generated, sampled_rewards = 0.0, []
    while True:
        t = time.perf_counter()
        rollouts = rollout.rollout(sampler.next(want - kept), sampling)
        seconds["rollout"] += time.perf_counter() - t
        t = time.perf_counter()
        scores = score_rollouts(rollouts.texts, rollouts.examples, cfg.reward, groups=rollouts.group.tolist())
        scores = with_env_reward(scores, rollouts)
        rewards = scores.total + overlong_penalty(rollouts.model_lengths, sampling.max_new_tokens,
                                                  algo.overlong_buffer, algo.overlong_penalty)
        seconds["reward"] += time.perf_counter() - t
        if rollouts.episodes is not None:  # part of the rollout's time: its environment steps
            seconds["env"] = seconds.get("env", 0.0) + rollouts.episodes.seconds
        generated += rollouts.model_lengths.sum().item()
        sampled_rewards.append(scores.total)
        if not algo.dynamic_sampling:
            parts.append((rollouts, scores, rewards))
            break
        keep = informative_groups(rewards, rollouts.group, algo.dynamic_sampling_tol)
        kept_here = len(torch.unique(rollouts.group[keep]))
        if kept_here:
            rows = torch.nonzero(keep).flatten().tolist()
            part = rollouts.take(rows)
            part.group = renumber_groups(part.group) + kept  # after the groups kept so far
            parts.append((part, scores.take(rows), rewards[rows]))
        kept, dropped = kept + kept_here, dropped + int(rollouts.group.max().item()) + 1 - kept_here
        if kept >= want or rounds >= algo.max_resample:
            break
        rounds += 1
    if parts:
        rollouts, scores = Rollouts.concat([p[0] for p in parts]), Scores.concat([p[1] for p in parts])
        rewards = torch.cat([p[2] for p in parts])
    # nothing informative: the last round stays for the metrics, no row is trained on
    trainable = torch.full((len(rollouts),), bool(parts), dtype=torch.bool)
    stats = {"rollout/dropped_groups": float(dropped), "rollout/resample_rounds": float(rounds),
             "rollout/groups": float(len(torch.unique(rollouts.group[trainable]))),
             "rollout/generated_tokens": generated}
    if algo.overlong_buffer > 0:
        stats["reward/overlong_penalty"] = (rewards - scores.total).mean().item()
    if algo.dynamic_sampling:
        stats["reward/mean_before_filter"] = torch.cat(sampled_rewards).mean().item()
    return StepBatch(rollouts, scores, rewards, trainable, stats, seconds)
