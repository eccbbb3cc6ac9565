"""The advantage stage: from a step's batch, and the forwards the trainer ran before it, to
the advantages the policy trains on. Pure: tensors in, tensors out; no worker is called here.

Every estimator (`algo.advantage`, the `ADVANTAGES` registry) is called the same way, with
one `AdvantageInputs` record (`reasonrl.algo.advantages`); what differs is what the record
holds:
- group estimators (grpo, rloo, ...): each completion's reward and group; with KL in the
  reward (`algo.beta` > 0, `algo.kl_in=reward`) the reward minus beta times the completion's
  summed KL;
- critic estimators (gae, PPO; `reasonrl.registry.needs_critic`): the critic's values and the
  token rewards (the score at the last token, -beta * KL at every token) over each row's
  model tokens; the advantages come back whitened over the batch's tokens when
  `algo.whiten_advantages`, and the critic's regression targets (the returns) as a
  `CriticBatch`.
A row no reward function applied to (`Scores.unscored`: every TRL-style function returned None)
has advantage 0 and stays out of its group's statistics, as TRL's GRPOTrainer leaves an
unscorable completion's NaN reward out (`scored_advantages`); under a critic its tokens get 0
and neither whiten the others nor train the critic.
With a teacher (on-policy distillation, `teacher.path`) the estimator's advantages, times
teacher.task_weight, gain each token's coef x (log pi_teacher - log pi_student) from the teacher
stage's log-probs (`distilled`, `reasonrl.algo.distill`): per-token advantages [N, T].
An agent episode that is several rows (`Rollouts.episode`) has one reward and one advantage,
estimated over episodes and given to each of its rows (`episode_advantages`: how the loss then
weighs them); a critic's runs over each row as its own sequence, the episode's reward at its end.
"""

from __future__ import annotations

import dataclasses

import torch

from reasonrl.algo import (
    AdvantageInputs,
    estimate,
    explained_variance,
    kl_penalised_rewards,
    masked_whiten,
    token_rewards,
)
from reasonrl.algo.distill import distill_advantages, reverse_kl
from reasonrl.batch import CriticBatch, Rollouts, StepBatch, TeacherScores
from reasonrl.config import AlgoConfig
from reasonrl.registry import needs_critic


def padded(rows: list[torch.Tensor], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [N, width], mask [N, width]) from per-row tensors of lengths <= width."""
    out, mask = torch.zeros(len(rows), width), torch.zeros(len(rows), width)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row.float()
        mask[i, : len(row)] = 1.0
    return out, mask


def estimate_advantages(batch: StepBatch, token_kl: list[torch.Tensor] | None,
                        values: list[torch.Tensor] | None, trainable: torch.Tensor, algo: AlgoConfig,
                        teacher: TeacherScores | None = None
                        ) -> tuple[torch.Tensor, CriticBatch | None, dict[str, float]]:
    """`task_advantages`, and with `teacher` (the teacher stage's scores) their per-token sum with
    the distillation term (`distilled`) and its `distill/` metrics."""
    advantages, critic_batch, metrics = task_advantages(batch, token_kl, values, trainable, algo)
    if teacher is not None:
        advantages, found = distilled(advantages, batch.rollouts, teacher, trainable)
        metrics.update(found)
    return advantages, critic_batch, metrics


def distilled(advantages: torch.Tensor, rollouts: Rollouts, teacher: TeacherScores,
              trainable: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """([N, T] advantages: `reasonrl.algo.distill.distill_advantages` of the task's and the teacher
    stage's log-probs over each trained row's model tokens, 0 elsewhere; its metrics): token means
    over those tokens of the reverse KL log pi_s - log pi_t (`distill/reverse_kl`), of the
    teacher's and the student's log-probs (`distill/teacher_logprob`, `distill/student_logprob`),
    and the share of the tokens the teacher finds likelier than the student does
    (`distill/teacher_prefers`: where the term raises the token's probability)."""
    width = max((len(c) for c in rollouts.completion_ids), default=0)
    mask = torch.zeros(len(rollouts), width)
    for i, m in enumerate(rollouts.token_mask):
        if trainable[i]:
            if len(teacher.teacher_logprobs[i]) != len(m) or len(teacher.student_logprobs[i]) != len(m):
                raise ValueError(f"row {i}: teacher stage log-probs for {len(teacher.teacher_logprobs[i])} / "
                                 f"{len(teacher.student_logprobs[i])} of its {len(m)} completion tokens")
            mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    student, _ = padded(teacher.student_logprobs, width)
    teacher_logp, _ = padded(teacher.teacher_logprobs, width)
    out = distill_advantages(advantages, student, teacher_logp, mask, teacher.coef, teacher.task_weight)
    tokens = mask.sum()
    if tokens == 0:  # no row trains this step: nothing was scored
        return out, {}

    def mean(x: torch.Tensor) -> float:
        return ((x * mask).sum() / tokens).item()

    kl = reverse_kl(student, teacher_logp)
    return out, {"distill/reverse_kl": mean(kl), "distill/teacher_logprob": mean(teacher_logp),
                 "distill/student_logprob": mean(student), "distill/teacher_prefers": mean((kl < 0).float())}


def scored_advantages(mode: str, inputs: AdvantageInputs, unscored: torch.Tensor) -> torch.Tensor:
    """Group estimator `mode`'s advantages [N] with the `unscored` rows left out: every group's
    statistics come from its other rows and an unscored row's advantage is 0. TRL's GRPOTrainer
    (`_generate_and_score_completions`) does the same to a completion every reward function
    returned None for: its reward is NaN, the group mean and std are nanmean / nanstd, and
    nan_to_num sets its advantage to 0."""
    if not bool(unscored.any()):
        return estimate(mode, inputs)[0]
    out, kept = torch.zeros_like(inputs.rewards), ~unscored
    if bool(kept.any()):
        group = torch.unique(inputs.group[kept], return_inverse=True)[1]  # ids 0..k-1 of the groups left
        out[kept] = estimate(mode, dataclasses.replace(inputs, rewards=inputs.rewards[kept], group=group))[0]
    return out


def task_advantages(batch: StepBatch, token_kl: list[torch.Tensor] | None,
                    values: list[torch.Tensor] | None, trainable: torch.Tensor,
                    algo: AlgoConfig) -> tuple[torch.Tensor, CriticBatch | None, dict[str, float]]:
    """(advantages [N] or [N, T], the critic's batch (critic estimators) or None, metrics).

    `token_kl`: each completion's per-token KL to the reference (the reference stage; None
    without KL in the reward); `values`: each completion's per-token values (the values
    stage; None without a critic). The mean summed KL is `train/kl_in_reward`; `batch` is
    not changed."""
    rollouts, unscored = batch.rollouts, batch.scores.unscored
    if rollouts.episode is not None and not needs_critic(algo.advantage):
        return episode_advantages(batch, token_kl, algo)
    metrics: dict[str, float] = {}
    if token_kl is not None:
        # the model's tokens only: an episode's environment tokens are context, not actions
        token_kl = [k * torch.tensor(m, dtype=k.dtype)
                    for k, m in zip(token_kl, rollouts.token_mask, strict=True)]
        metrics["train/kl_in_reward"] = torch.stack([k.sum() for k in token_kl]).mean().item()
    if not needs_critic(algo.advantage):
        rewards = batch.rewards
        if token_kl is not None:
            kl, mask = padded(token_kl, max(len(k) for k in token_kl))
            rewards = kl_penalised_rewards(rewards, kl, mask, algo.beta)
        inputs = AdvantageInputs(rewards.float(), rollouts.group, algo.std_eps, std_ddof=algo.std_ddof)
        return scored_advantages(algo.advantage, inputs, unscored), None, metrics
    # GAE runs over each row's model tokens in order (an episode's environment tokens are not
    # actions: the state after a turn's last token is the next turn's first), then goes back to
    # the completion positions, 0 on environment tokens; single-turn rows are all model tokens
    picks = [torch.tensor(m, dtype=torch.bool).nonzero().squeeze(1) for m in rollouts.token_mask]
    width = max(max(len(p) for p in picks), 1)
    values_t, mask = padded([v[p] for v, p in zip(values, picks, strict=True)], width)
    kl_t = None if token_kl is None else padded([k[p] for k, p in zip(token_kl, picks, strict=True)],
                                                width)[0]
    inputs = AdvantageInputs(batch.rewards.float(), rollouts.group, algo.std_eps,
                             token_rewards=token_rewards(batch.rewards, mask, kl_t, algo.beta),
                             values=values_t, mask=mask, gamma=algo.gamma, lam=algo.lam)
    advantages, returns = estimate(algo.advantage, inputs)
    trainable = trainable & ~unscored  # an unscored row: no advantage, no critic target
    valid = mask * trainable[:, None].float()
    metrics.update(critic_metrics(values_t, returns, advantages, valid))
    if algo.whiten_advantages:
        advantages = masked_whiten(advantages, valid)
    advantages = advantages * (~unscored)[:, None].float()
    full = torch.zeros(len(values), max(len(c) for c in rollouts.completion_ids))
    returns_full = []
    for i, (v, p) in enumerate(zip(values, picks, strict=True)):
        full[i, p] = advantages[i, : len(p)]
        row = torch.zeros(len(v))
        row[p] = returns[i, : len(p)]
        returns_full.append(row)
    critic_batch = CriticBatch(rollouts.prompt_ids, rollouts.completion_ids, returns_full, values, trainable,
                               rollouts.token_mask)
    return full, critic_batch, metrics


def _episode_kl(rollouts: Rollouts, token_kl: list[torch.Tensor]) -> torch.Tensor:
    """[E] each episode's KL to the reference summed over the model tokens of all its rows."""
    first, of = rollouts.episode_rows()
    rows = torch.stack([(k * torch.tensor(m, dtype=k.dtype)).sum()
                        for k, m in zip(token_kl, rollouts.token_mask, strict=True)])
    return torch.zeros(len(first), dtype=rows.dtype).index_add_(0, of, rows)


def episode_advantages(batch: StepBatch, token_kl: list[torch.Tensor] | None,
                       algo: AlgoConfig) -> tuple[torch.Tensor, None, dict[str, float]]:
    """([N] a group estimator's advantages, None, metrics) when an episode may be several rows
    (`Rollouts.episode`: an agent program that rewrote its history, each sequence a row):
    estimated over episodes, one reward each (its first row's: `reasonrl.source.collect.split_rows`
    gave its rows the same), grouped by prompt, with KL in the reward the KL summed over all its rows' model
    tokens; an unscored episode is left out of its group's statistics; then every row gets its
    episode's advantage. With one row per episode this is `task_advantages`' own estimate.

    How a split episode weighs in the loss: each of its rows is a sequence of the step with the
    episode's advantage on its model tokens. Under `algo.loss_agg=token` every sampled token
    weighs the same wherever it sits, so a split episode weighs by its sampled tokens, as if
    joined; under the sequence means (`sequence`, `seq_mean_token_sum`, Dr. GRPO's) it counts
    as as many sequences as it has rows, each normalised on its own (`Totals.of` counts rows).
    That is what prime-rl's interleaved trajectories do when the extension property breaks
    (PrimeIntellect-ai/prime-rl docs/training/trajectories.md: a new training sample from that
    step) and SkyRL's step-wise trajectories (NovaSky-AI/SkyRL, generator.step_wise_trajectories:
    one sample per step, the final step's advantage given to all, so longer trajectories
    contribute more samples)."""
    rollouts = batch.rollouts
    first, of = rollouts.episode_rows()
    rewards, metrics = batch.rewards[first].float(), {}
    if token_kl is not None:  # train/kl_in_reward: the mean over episodes
        kl = _episode_kl(rollouts, token_kl)
        rewards, metrics["train/kl_in_reward"] = rewards - algo.beta * kl, kl.mean().item()
    inputs = AdvantageInputs(rewards, rollouts.group[first], algo.std_eps, std_ddof=algo.std_ddof)
    return scored_advantages(algo.advantage, inputs, batch.scores.unscored[first])[of], None, metrics


def critic_metrics(values: torch.Tensor, returns: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor) -> dict[str, float]:
    """critic/ statistics of the values, returns and (unwhitened) advantages over valid tokens."""
    count = mask.sum().clamp(min=1)

    def mean(x: torch.Tensor) -> float:
        return ((x * mask).sum() / count).item()

    return {"critic/value_mean": mean(values), "critic/returns_mean": mean(returns),
            "critic/advantages_mean": mean(advantages),
            "critic/advantages_abs_mean": mean(advantages.abs()),
            "critic/explained_variance": explained_variance(values, returns, mask)}
