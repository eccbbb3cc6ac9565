"""Collecting a step's batch: rollouts, their scores and shaped rewards, in one record.

`collect_batch` samples prompts, generates `rollout.n` completions each and scores them.
Rewards are the task score (plus, in multi-turn episodes, the environment's rewards) plus
DAPO's overlong penalty (`algo.overlong_buffer`, over the model's tokens); with
`reward.combine=gdpo` they are GDPO's instead (`step_rewards`: those same terms as components,
each normalised within its group, then weighted and summed). With
`algo.dynamic_sampling` (DAPO, Yu et al. 2025, sec. 3.2), groups whose shaped rewards are
all equal (std <= `dynamic_sampling_tol`) are dropped and new prompts sampled for the
missing groups, for at most `max_resample` extra rounds; a batch still short after that
trains on the groups it has. If no group at all was informative, the last round is returned
with no trainable row (the step makes no update).

An agent program's episode may be several rows (`Rollouts.episode`: one per sequence, when it
rewrote its history): everything above sees one row per episode, its first (the one holding its
final call: scored once, one reward per episode, its group's statistics over episodes), and the
batch returned has every row, each with its episode's scores and reward (`split_rows`).
"""

from __future__ import annotations

import dataclasses
import time

import torch

from reasonrl.algo import flat_group_count, gdpo_rewards, informative_groups, overlong_penalty
from reasonrl.batch import Rollouts, Scores, StepBatch
from reasonrl.config import Config
from reasonrl.data import PromptSampler
from reasonrl.envs import with_env_reward
from reasonrl.rewards import gate_of, score_rollouts
from reasonrl.rollout import SamplingParams, prompt_cuts


def renumber_groups(group: torch.Tensor) -> torch.Tensor:
    """Group ids 0..k-1 in order of first appearance (after rows were dropped)."""
    ids: dict[int, int] = {}
    return torch.tensor([ids.setdefault(int(g), len(ids)) for g in group], dtype=torch.long)


def gdpo_components(scores: Scores, rollouts: Rollouts, max_new_tokens: int,
                    cfg: Config) -> dict[str, tuple[float, torch.Tensor]]:
    """The components reward.combine=gdpo normalises, name -> (weight, [N] values): each
    reward.weights component as the gate leaves it (a row that fails `reward.gate` scores 0 on
    every one, as its weighted sum would be 0), the environment's reward `env` of multi-turn
    episodes (weight 1: the sum adds it as it is), and DAPO's overlong penalty `overlong` (the
    penalty at algo.overlong_penalty = 1, in [-1, 0], weighted by algo.overlong_penalty)."""
    algo, passed = cfg.algo, torch.ones(len(scores.total), dtype=torch.bool)
    for g in gate_of(cfg.reward):
        passed &= scores.components[g] > 0
    out = {name: (weight, torch.where(passed, scores.components[name], 0.0))
           for name, weight in cfg.reward.weights.items()}
    if "env" in scores.components:
        out["env"] = (1.0, scores.components["env"])
    if algo.overlong_buffer > 0:
        out["overlong"] = (algo.overlong_penalty, overlong_penalty(rollouts.model_lengths, max_new_tokens,
                                                                   algo.overlong_buffer, 1.0))
    return out


def step_rewards(scores: Scores, rollouts: Rollouts, max_new_tokens: int, cfg: Config) -> torch.Tensor:
    """[N] the reward each row's advantage is estimated from. reward.combine=sum or all: the
    scores' total plus DAPO's overlong penalty; gdpo: `gdpo_rewards` of `gdpo_components` (each
    normalised within its prompt's group with algo.std_ddof and algo.std_eps, as `grpo` does),
    which the configured `algo.advantage` then reads (the paper's batch normalisation:
    reinforce_pp)."""
    algo = cfg.algo
    if cfg.reward.combine != "gdpo":
        return scores.total + overlong_penalty(rollouts.model_lengths, max_new_tokens, algo.overlong_buffer,
                                               algo.overlong_penalty)
    parts = gdpo_components(scores, rollouts, max_new_tokens, cfg).values()
    return gdpo_rewards(torch.stack([values for _, values in parts], dim=1), [w for w, _ in parts],
                        rollouts.group, algo.std_eps, algo.std_ddof)


def collect_batch(rollout, sampler: PromptSampler, sampling: SamplingParams, cfg: Config,
                  judge=None) -> StepBatch:
    """The batch of one step (see the module docstring); `rollout` is a rollout worker, `judge`
    the judge role's (reward.weights' judge or classifier; None without one)."""
    algo, want = cfg.algo, cfg.trainer.batch_size // cfg.rollout.n
    parts: list[tuple[Rollouts, Scores, torch.Tensor]] = []
    seconds = {"rollout": 0.0, "reward": 0.0}
    kept = dropped = rounds = cut = 0
    generated, sampled_rewards = 0.0, []
    while True:
        t = time.perf_counter()
        examples = sampler.next(want - kept)
        rollouts = rollout.rollout(examples, sampling)
        seconds["rollout"] += time.perf_counter() - t
        full = rollouts  # every row; `rollouts` below: one per episode (`split_rows`)
        if full.episode is not None:  # an agent's episodes: scored once each, by their first row
            rollouts = full.take(full.episode_rows()[0])
        if cfg.data.truncate_prompts == "left":  # the prompts sampled that lost their start
            cut += sum(n > 0 for n in prompt_cuts(rollout, examples, cfg.data.max_prompt_tokens))
        t = time.perf_counter()
        scores = score_rollouts(rollouts.texts, rollouts.examples, cfg.reward, groups=rollouts.group.tolist(),
                                completion_ids=rollouts.completion_ids, judge=judge)
        scores = with_env_reward(scores, rollouts)
        rewards = step_rewards(scores, rollouts, sampling.max_new_tokens, cfg)
        seconds["reward"] += time.perf_counter() - t
        if rollouts.episodes is not None:  # part of the rollout's time: its environment steps
            seconds["env"] = seconds.get("env", 0.0) + rollouts.episodes.seconds
        generated += full.model_lengths.sum().item()
        sampled_rewards.append(scores.total)
        if not algo.dynamic_sampling:
            parts.append((rollouts, scores, rewards, full))
            break
        keep = informative_groups(rewards, rollouts.group, algo.dynamic_sampling_tol)
        kept_here = len(torch.unique(rollouts.group[keep]))
        if kept_here:
            rows = torch.nonzero(keep).flatten().tolist()
            part = rollouts.take(rows)
            part.group = renumber_groups(part.group) + kept  # after the groups kept so far
            whole = part
            if full is not rollouts:  # the kept groups' every row, their groups numbered alike
                kept_rows = torch.isin(full.group, rollouts.group[keep])
                whole = full.take(torch.nonzero(kept_rows).flatten().tolist())
                whole.group = renumber_groups(whole.group) + kept
            parts.append((part, scores.take(rows), rewards[rows], whole))
        kept, dropped = kept + kept_here, dropped + int(rollouts.group.max().item()) + 1 - kept_here
        if kept >= want or rounds >= algo.max_resample:
            break
        rounds += 1
    if parts:
        rollouts, scores = Rollouts.concat([p[0] for p in parts]), Scores.concat([p[1] for p in parts])
        rewards = torch.cat([p[2] for p in parts])
        full = rollouts if parts[0][3] is parts[0][0] else Rollouts.concat([p[3] for p in parts])
    # nothing informative: the last round stays for the metrics, no row is trained on
    trainable = torch.full((len(rollouts),), bool(parts), dtype=torch.bool)
    stats = {"rollout/dropped_groups": float(dropped), "rollout/resample_rounds": float(rounds),
             "rollout/groups": float(len(torch.unique(rollouts.group[trainable]))),
             "rollout/generated_tokens": generated}
    if algo.overlong_buffer > 0:
        penalty = overlong_penalty(rollouts.model_lengths, sampling.max_new_tokens, algo.overlong_buffer,
                                   algo.overlong_penalty)
        stats["reward/overlong_penalty"] = penalty.mean().item()
    if cfg.reward.combine == "gdpo":  # the groups in which a component contributes nothing
        for name, (_, values) in gdpo_components(scores, rollouts, sampling.max_new_tokens, cfg).items():
            stats[f"reward/{name}_zero_std_groups"] = float(flat_group_count(values, rollouts.group))
    if algo.dynamic_sampling:
        stats["reward/mean_before_filter"] = torch.cat(sampled_rewards).mean().item()
    if cfg.data.truncate_prompts == "left":
        stats["data/truncated_prompts"] = float(cut)
    batch = StepBatch(rollouts, scores, rewards, trainable, stats, seconds)
    return batch if full is rollouts else split_rows(batch, full)


def split_rows(batch: StepBatch, full: Rollouts) -> StepBatch:
    """`batch` (one row per episode) over `full`'s rows (`Rollouts.episode`: an agent episode
    that rewrote its history trains each of its sequences as a row): every row of an episode gets
    its episode's scores, reward and trainable flag, so that the advantage stage gives them its
    episode's advantage (`reasonrl.train.advantage_stage.episode_advantages`)."""
    of = full.episode_rows()[1]
    if len(of) and int(of.max()) + 1 != len(batch.rollouts):
        raise ValueError(f"{int(of.max()) + 1} episodes in the rows, {len(batch.rollouts)} scored")
    return dataclasses.replace(batch, rollouts=full, scores=batch.scores.take(of.tolist()),
                               rewards=batch.rewards[of], trainable=batch.trainable[of])
