"""The records that cross stage boundaries, one dataclass per boundary.

data -> `Example`; rollout engine -> `Rollouts` (multi-turn: with `EpisodeStats`); rewards
-> `Scores`; the batch collected for a step (rollouts, scores, shaped rewards, which rows
train) -> `StepBatch`; the policy's log-probs without gradient (the log-probs stage) ->
`PolicyLogprobs`; the advantage stage (`reasonrl.train.advantage_stage`) -> the advantages and, for
a critic, a `CriticBatch`; the trainer then packs rollouts + advantages into a `TrainBatch`
for the policy worker. Everything that is per completion is aligned by index (row i of every
tensor is completion i), and a per-completion record can be cut (`take`) and joined
(`concat`) as a whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

R = TypeVar("R", bound="Rows")


class Rows:
    """A record with one entry per completion in each tensor, list or dict-of-tensors field
    (and in a field that is itself such a record); other fields (counts, versions, names)
    describe the whole record."""

    def take(self: R, rows: list[int]) -> R:
        """These rows, in this order; the other fields are kept."""
        values = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                values[f.name] = v[rows]
            elif isinstance(v, list):
                values[f.name] = [v[i] for i in rows]
            elif isinstance(v, dict):
                values[f.name] = {k: x[rows] for k, x in v.items()}
            elif isinstance(v, Rows):
                values[f.name] = v.take(rows)
        return dataclasses.replace(self, **values)

    @classmethod
    def concat(cls: type[R], records: list[R]) -> R:
        """The rows of `records` in order; counts add up (or merge as the field's metadata
        says, e.g. the oldest policy version), a field None in any record is None."""
        if len(records) == 1:
            return records[0]
        values = {}
        for f in dataclasses.fields(cls):
            vs = [getattr(r, f.name) for r in records]
            if any(v is None for v in vs):
                values[f.name] = None
            elif isinstance(vs[0], torch.Tensor):
                values[f.name] = torch.cat(vs)
            elif isinstance(vs[0], list):
                values[f.name] = [x for v in vs for x in v]
            elif isinstance(vs[0], dict):
                values[f.name] = {k: torch.cat([v[k] for v in vs]) for k in vs[0]}
            elif isinstance(vs[0], Rows):
                values[f.name] = type(vs[0]).concat(vs)
            elif isinstance(vs[0], (int, float)):
                values[f.name] = f.metadata.get("merge", sum)(vs)
        return dataclasses.replace(records[0], **values)


@dataclass(frozen=True)
class Example:
    """One task instance.

    `prompt` is what the model is asked: a plain question (the chat template is applied
    later), already-templated text, or a list of chat messages ({"role", "content"}).
    `ground_truth` is what the reward compares against; `meta` keeps anything else
    (e.g. the source file and line) for error messages and sample logs.
    """

    prompt: str | list[dict[str, str]]
    ground_truth: str
    data_source: str = "unknown"
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Turn:
    """One model turn of an episode and what the environment made of it (logs and the report)."""

    model: str  # the model's text of this turn (decoded from the ids it sampled)
    call: str | None = None  # the tool call the environment read in it ("calculator: 347 * 29"), if any
    observation: str | None = None  # the environment's answer as text; None: it gave none (the episode ended)
    error: str | None = None  # what failed: the tool call's error, or the environment's own
    reward: float | None = None  # the environment's reward for this turn, if it gave one


@dataclass
class EpisodeStats(Rows):
    """What multi-turn episodes add to their `Rollouts` (`Rollouts.episodes`; None for
    single-turn rows): each episode's turns and the counts behind the `env/` metrics."""

    environment: str  # the environment the episodes ran in (env.name, or env.fn's class)
    turns: list[list[Turn]]  # per row, the model's turns and what the environment made of each
    tool_calls: torch.Tensor  # [N] long: tool calls the environment ran
    tool_errors: torch.Tensor  # [N] long: of those, calls that failed (timeouts included)
    tool_timeouts: torch.Tensor  # [N] long: of those, calls the tool's timeout ended
    step_errors: torch.Tensor  # [N] long: environment steps that raised, hung or answered badly
    step_timeouts: torch.Tensor  # [N] long: of those, steps that ran past env.step_timeout
    reward: torch.Tensor  # [N] float: the environment's rewards, summed
    seconds: float = 0.0  # wall-clock seconds of environment steps (merged rollouts: summed)
    # an agent program's episodes (env.format=agent, docs/agents.md): per row, named counts logged as
    # agent/<name> (`reasonrl.envs.agent.agent_metrics`); `given` 1: the program's reward (or its
    # failure's 0) replaces the task's, `dropped` 1: the row is unscored. None: not an agent's
    agent: dict[str, torch.Tensor] | None = None

    @property
    def num_turns(self) -> torch.Tensor:
        """[N] long: the model's turns per episode."""
        return torch.tensor([len(t) for t in self.turns], dtype=torch.long)


@dataclass
class Rollouts(Rows):
    """G completions for each of B prompts, flattened to N = B * G rows, group-major.

    A row is an episode: its completion is one flat id sequence after the prompt, the model's
    turns and the environment's observations in order, with `token_mask` 1 exactly on the
    ids the model sampled. A single-turn row is the one-turn case: every id is the model's,
    and there are no episode statistics.
    """

    prompt_ids: list[list[int]]  # the prompt's token ids (no padding), per row
    completion_ids: list[list[int]]  # after the prompt: model turns (up to and including EOS) + observations
    texts: list[str]  # the model's last turn, special tokens removed: what the reward scores
    group: torch.Tensor  # [N] long: which prompt (0..B-1) the row answers
    truncated: torch.Tensor  # [N] bool: cut by a limit (max_new_tokens; multi-turn: env.max_turns, ...)
    examples: list[Example]  # per row (the same object repeated within a group)
    sampler_logprobs: list[torch.Tensor] | None = None  # engine's log-probs per completion id (0 on env ids)
    # the policy step whose weights generated these rows (merged batches keep the oldest)
    policy_version: int = field(default=0, metadata={"merge": min})
    # per row, aligned with completion_ids: 1 on the model's sampled ids, 0 on the environment's
    # (None at construction: all ones, a single-turn row)
    token_mask: list[list[int]] | None = None
    episodes: EpisodeStats | None = None  # multi-turn episodes' turns and counts (None: single-turn)
    # [N] long: which of its group's episodes (0..) the row is a sequence of, when an episode may
    # train as several rows (an agent program that rewrote its history, docs/agents.md): the rows of
    # one (group, episode) share its reward and advantage, and the first of them (the one holding
    # its final call) stands for the episode in scoring, metrics and samples (`episode_rows`).
    # None: every row is an episode of its own (every other environment)
    episode: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.token_mask is None:
            self.token_mask = [[1] * len(c) for c in self.completion_ids]

    def __len__(self) -> int:
        return len(self.completion_ids)

    def episode_rows(self) -> tuple[list[int], torch.Tensor]:
        """(the first row of each episode, in row order; [N] long: each row's episode, an index
        into that list). Without `episode`, every row is its own: (0..N-1, arange(N))."""
        if self.episode is None:
            return list(range(len(self))), torch.arange(len(self))
        first: list[int] = []
        index: dict[tuple[int, int], int] = {}
        keys = zip(self.group.tolist(), self.episode.tolist(), strict=True)
        of = [index.setdefault(key, len(index)) for key in keys]
        for i, e in enumerate(of):
            if e == len(first):
                first.append(i)
        return first, torch.tensor(of, dtype=torch.long)

    @property
    def completion_lengths(self) -> torch.Tensor:
        """[N] every completion id per row: model and environment tokens."""
        return torch.tensor([len(c) for c in self.completion_ids], dtype=torch.float32)

    @property
    def model_lengths(self) -> torch.Tensor:
        """[N] the ids the model sampled per row (what rollout.max_new_tokens counts)."""
        return torch.tensor([sum(m) for m in self.token_mask], dtype=torch.float32)


@dataclass
class Scores(Rows):
    """Rewards aligned with `Rollouts` (`rewards.scoring`): the weighted total and each raw
    component, and which reward calls failed."""

    total: torch.Tensor  # [N] float
    components: dict[str, torch.Tensor]  # name -> [N] float, unweighted
    errors: int = 0  # reward calls that raised and were scored 0
    timeouts: int = 0  # reward calls that ran past reward.timeout and were scored 0
    failures: list[str | None] | None = None  # why row i's reward failed (naming the function), or None
    timed_out: list[bool] | None = None  # row i's failure is a timeout (counted in `timeouts`)
    parts: list[dict[str, float]] | None = None  # row i's named parts from its verifier (partial credits)
    # name -> [N] bool: whether that component's function applied to row i (False: a TRL reward
    # function returned None, and the component is left out of row i's total); None: all applied
    applied: dict[str, torch.Tensor] | None = None
    # row i's values its reward functions asked to log (verl's dict keys, OpenRLHF's extra_logs, TRL's
    # log_metric), "<style or reward.fns name>/<key>" -> value; the step logs each key's mean
    logged: list[dict[str, float]] | None = None

    @property
    def unscored(self) -> torch.Tensor:
        """[N] bool: rows no reward component applied to (every function returned None, TRL's
        "unscorable" completion): their advantage is 0 and they stay out of their group's
        statistics (`reasonrl.train.advantage_stage`)."""
        rows = torch.zeros(len(self.total), dtype=torch.bool)
        if not self.applied:
            return rows
        if any(name not in self.applied for name in self.components):  # a component that always applies
            return rows
        return ~torch.stack([self.applied[name] for name in self.components]).any(dim=0)


@dataclass
class StepBatch:
    """What a step trains on, as collected (`reasonrl.source.collect.collect_batch`)."""

    rollouts: Rollouts
    scores: Scores
    # [N] the scores' totals (the environment's rewards included) plus DAPO's overlong penalty, or
    # with reward.combine=gdpo GDPO's reward (`reasonrl.source.collect.step_rewards`);
    # KL in the reward is not here: the advantage stage subtracts it (`reasonrl.train.advantage_stage`)
    rewards: torch.Tensor
    # [N] bool: rows that may enter the loss: all, or none when dynamic sampling found no
    # informative group (algo.mask_truncated then leaves truncated rows out)
    trainable: torch.Tensor
    stats: dict[str, float] = field(default_factory=dict)  # rollout/ and reward/ metrics of collecting
    seconds: dict[str, float] = field(default_factory=dict)  # rollout, reward (multi-turn: env) seconds


@dataclass
class TrainBatch:
    """What the policy worker needs for one optimizer step."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    # [N] float, one per completion; [N, T] per token (a critic's GAE, on-policy distillation)
    advantages: torch.Tensor
    loss_mask: torch.Tensor | None = None  # [N] bool: rows that enter the loss (None = all)
    sampler_logprobs: list[torch.Tensor] | None = None  # engine's per-token log-probs (mismatch, IS)
    # per row, aligned with completion_ids: 1 on model tokens (loss, KL, entropy), 0 on the
    # environment's (context only); None = every completion token is the model's
    token_mask: list[list[int]] | None = None
    # per row: the reference model's log-probs (the step's reference stage); rows outside
    # loss_mask may be empty. None: the worker computes them itself when it has a reference
    ref_logprobs: list[torch.Tensor] | None = None
    # per row: the policy's log-probs before the update (the step's log-probs stage,
    # `PolicyLogprobs.trained`), read as the old policy's when the step makes more than one
    # update (optim.ppo_epochs x optim.mini_batches > 1); rows outside loss_mask may be empty.
    # None: the worker computes them itself when it needs them
    old_logprobs: list[torch.Tensor] | None = None


@dataclass
class CriticBatch:
    """What the critic worker needs for one step: the value targets and the values before it."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    returns: list[torch.Tensor]  # per row [T_i]: the GAE returns, the regression targets
    old_values: list[torch.Tensor]  # per row [T_i]: the critic's values the advantages were computed from
    loss_mask: torch.Tensor | None = None  # [N] bool: rows that enter the loss (None = all)
    token_mask: list[list[int]] | None = None  # per row: 1 on model tokens (as TrainBatch); None = all


@dataclass
class PolicyLogprobs:
    """The log-probs stage's output: the policy's token log-probs of each completion without
    gradient, before the update (the policy now; with trainer.max_staleness > 0 not the version
    that sampled the batch), float32 on the CPU, one tensor per row. A float32 forward's values
    depend on the micro-batches its rows are laid out in, so there is one list per layout a
    consumer reads: `every_row`, every row in the micro-batches of every row (the KL in the
    reward, `PolicyWorker.token_kl`), and `trained`, the rows of the loss mask in theirs,
    the update's (the teacher stage's student side, the update's old log-probs), others empty.
    When the loss mask holds every row the two are one list, from one forward."""

    every_row: list[torch.Tensor] | None = None  # None: no consumer reads it this step
    trained: list[torch.Tensor] | None = None  # None: no consumer reads it this step


@dataclass
class TeacherScores:
    """The teacher stage's output (on-policy distillation, `teacher.path`): per row, the teacher's
    and the student's log-probs of each completion token (empty for a row the update does not
    train on), and the weights the advantage stage gives them (`reasonrl.algo.distill`)."""

    teacher_logprobs: list[torch.Tensor]  # per row [T_i]: log pi_teacher(y_t | prompt, y_<t)
    student_logprobs: list[torch.Tensor]  # per row [T_i]: log pi_student(y_t | ...), the policy now
    coef: float = 1.0  # teacher.coef: the negative reverse KL's weight
    task_weight: float = 1.0  # teacher.task_weight: the task advantage's weight (0: distillation alone)
