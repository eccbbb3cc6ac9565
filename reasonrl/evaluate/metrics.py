"""The evaluation's numbers: pure functions of a table of per-prompt results (`PromptResult`),
tested on hand-made tables, independent of any model.

pass@k (Chen et al. 2021), majority vote, the summary `reasonrl eval` and the trainer's
held-out eval report (overall and per data_source), and what `reasonrl probe` measures with
its verdict. A completion's answer (`final_answer`) is read by the extraction rule its
verifier registers (`answer` on the `VERIFIERS` entry).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from reasonrl.registry import VERIFIERS
from reasonrl.rewards.numeric import any_answer

ZERO_VARIANCE_TOL = 1e-12  # a prompt's rewards with population variance <= this are "all equal"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1 and its numerically stable form, Fig. 3):

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the probability that a random k-subset of the n samples holds at least one correct one.
    The product never forms the huge binomials. pass@1 = c / n, returned as that quotient (the
    product's roundings would make it differ from the share of right samples in the last bits).
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if k == 1:
        return c / n
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def final_answer(text: str, task: str, fallback_last_number: bool = True) -> str | None:
    """The answer a completion commits to, normalised, by the extraction rule of the task's
    verifier (the `answer` its `VERIFIERS` entry registers; a custom `reward.fn` /
    `reward.batch_fn`: `\\boxed{}` > `<answer>` > the last number, any text); None when no
    answer can be extracted. Numbers are compared as numbers ("18.0" = "$18"), other text
    with whitespace removed.
    """
    answer = VERIFIERS[task].answer if task in VERIFIERS else any_answer
    return answer(text, fallback_last_number)


def majority_vote(answers: Sequence[str | None], correct: Sequence[bool]) -> tuple[str | None, bool]:
    """(the most frequent answer, whether it is right) over one prompt's samples.

    Samples with no answer (None) do not vote; with no answer at all the vote is wrong.
    Ties go to the answer that appears first in sample order. The winning answer is right
    when the first sample that gave it is correct (equal normalised answers score alike under
    the numeric, gsm8k, math and countdown verifiers; with partial credit, as in piecewise,
    that first sample decides).
    """
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for i, answer in enumerate(answers):
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
            first.setdefault(answer, i)
    if not counts:
        return None, False
    winner = min(counts, key=lambda a: (-counts[a], first[a]))  # most votes, then earliest
    return winner, bool(correct[first[winner]])


@dataclass
class PromptResult:
    """The n samples of one prompt: rewards, verdicts, answers and generation facts."""

    data_source: str
    rewards: list[float]  # total reward per sample (the configured weighted sum)
    correct: list[bool]  # the `correct` component is full marks (>= 1)
    answers: list[str | None]  # `final_answer` per sample; None = format error
    lengths: list[int]  # the model's completion tokens per sample (EOS included)
    truncated: list[bool]  # hit max_new_tokens without EOS (multi-turn: cut by any episode limit)
    entropy_sums: list[float] = field(default_factory=list)  # summed per-token entropy per sample
    reward_errors: int = 0
    reward_timeouts: int = 0
    ks: tuple[int, ...] = ()  # the pass@k this prompt reports; () = those `summarize` is given
    # multi-turn episodes (empty for single-turn): per sample, model turns, tool calls, failed calls
    turns: list[int] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    tool_errors: list[int] = field(default_factory=list)


def mean_share_correct(results: Sequence[PromptResult]) -> float:
    """The mean over prompts of each prompt's share of right samples, c_i / n_i: `accuracy` and
    pass@1 alike (Chen et al. 2021 average pass@k over problems, so a prompt with more samples,
    a record's `extra_info.n`, counts once). With every n_i equal it is sum(c) / sum(n), the
    share of right samples, computed as that one quotient (exact to the last bit)."""
    if len({len(r.correct) for r in results}) == 1:
        return sum(sum(r.correct) for r in results) / sum(len(r.correct) for r in results)
    return float(np.mean([sum(r.correct) / len(r.correct) for r in results]))


def summarize(results: Sequence[PromptResult], ks: Sequence[int]) -> dict[str, float]:
    """Metrics of a set of prompts; prompt i has n_i samples (the same n for all unless records
    ask for their own, `extra_info.n` / `extra_info.pass@k`).

    - accuracy: `mean_share_correct`, the mean over prompts of each prompt's share of samples
      whose `correct` is full marks (the share of right samples when every n_i is equal); the
      same number as pass@1 when every prompt reports it.
    - reward_mean: mean total reward over all samples.
    - pass@k: mean of `pass_at_k(n_i, c_i, k)` over the prompts that report k (those whose `ks`
      hold it, or with empty `ks` those of `ks` up to n_i); pass@1 = `mean_share_correct` of them.
    - majority_accuracy: share of prompts whose `majority_vote` answer is right (maj@n).
    - entropy_mean: mean per-token entropy over all generated tokens (token-weighted, nats).
    - response_length_mean / _p95: completion tokens per sample; p95 by numpy's linear
      interpolation between order statistics.
    - truncated_frac: share of samples cut at max_new_tokens.
    - format_error_rate: share of samples for which `final_answer` found no answer (nothing
      extractable by the task's rule, or, for numeric tasks, text that is not a number).
    - reward_errors / reward_timeouts: counts of verifier calls that raised / ran out of time
      (scored 0).
    - multi-turn episodes (every result has `turns`): turns_mean and tool_calls_mean per sample,
      tool_call_share (samples that called a tool at least once), tool_error_rate (failed calls /
      calls; 0 without a call).
    """
    if not results:
        return {}
    reported = [r.ks or tuple(k for k in ks if k <= len(r.rewards)) for r in results]
    rewards = [x for r in results for x in r.rewards]
    lengths = [x for r in results for x in r.lengths]
    metrics = {"num_prompts": float(len(results)), "num_samples": float(len(rewards)),
               "accuracy": mean_share_correct(results),
               "reward_mean": float(np.mean(rewards))}
    for k in sorted({k for ks_i in reported for k in ks_i}):
        rs = [r for r, ks_i in zip(results, reported, strict=True) if k in ks_i]
        metrics[f"pass@{k}"] = mean_share_correct(rs) if k == 1 else float(np.mean(
            [pass_at_k(len(r.rewards), sum(r.correct), k) for r in rs]))
    metrics["majority_accuracy"] = float(np.mean([majority_vote(r.answers, r.correct)[1] for r in results]))
    if all(r.entropy_sums for r in results):
        tokens = sum(lengths)
        metrics["entropy_mean"] = sum(sum(r.entropy_sums) for r in results) / max(tokens, 1)
    metrics["response_length_mean"] = float(np.mean(lengths))
    metrics["response_length_p95"] = float(np.percentile(lengths, 95))
    metrics["truncated_frac"] = float(np.mean([x for r in results for x in r.truncated]))
    metrics["format_error_rate"] = float(np.mean([a is None for r in results for a in r.answers]))
    metrics["reward_errors"] = float(sum(r.reward_errors for r in results))
    metrics["reward_timeouts"] = float(sum(r.reward_timeouts for r in results))
    metrics.update(episode_summary(results))
    return metrics


def episode_summary(results: Sequence[PromptResult]) -> dict[str, float]:
    """Multi-turn episodes' metrics (empty unless every result has `turns`): turns_mean and
    tool_calls_mean per sample, tool_call_share (samples that called a tool at least once),
    tool_error_rate (failed calls / calls; 0 without a call)."""
    if not results or not all(r.turns for r in results):
        return {}
    calls = [x for r in results for x in r.tool_calls]
    return {"turns_mean": float(np.mean([x for r in results for x in r.turns])),
            "tool_calls_mean": float(np.mean(calls)),
            "tool_call_share": float(np.mean([x > 0 for x in calls])),
            "tool_error_rate": sum(x for r in results for x in r.tool_errors) / max(sum(calls), 1)}


def by_source(results: Sequence[PromptResult]) -> dict[str, list[PromptResult]]:
    groups: dict[str, list[PromptResult]] = {}
    for r in results:
        groups.setdefault(r.data_source, []).append(r)
    return dict(sorted(groups.items()))


def eval_metrics(results: Sequence[PromptResult], ks: Sequence[int]) -> dict[str, float]:
    """`summarize` overall, and per data_source as `<source>/<metric>` when there are several
    (a "/" in a source name becomes "_")."""
    metrics = summarize(results, ks)
    sources = by_source(results)
    if len(sources) > 1:
        for source, rs in sources.items():
            name = source.replace("/", "_")
            metrics.update({f"{name}/{k}": v for k, v in summarize(rs, ks).items()})
    return metrics


def probe_metrics(results: Sequence[PromptResult]) -> dict[str, float]:
    """What GRPO's learning signal depends on, over prompts with n samples each.

    - accuracy: `mean_share_correct` (the share of samples whose `correct` is full marks);
    - reward_variance: mean over prompts of the population variance (divide by n) of the
      prompt's total rewards (0/1 rewards with a share p right: p (1 - p), at most 0.25);
    - zero_variance_frac: share of prompts whose rewards are all equal (variance <=
      ZERO_VARIANCE_TOL): their group advantages are all 0, so they teach nothing. It splits
      into zero_variance_all_correct_frac + zero_variance_all_wrong_frac (every / no sample
      right) + zero_variance_other_frac (equal rewards over right and wrong samples, as other
      reward components can make them);
    - all_correct_frac / all_wrong_frac: prompts where every / no sample is right, whatever
      their rewards (a format component can make an all-wrong prompt's rewards differ, so
      all_wrong_frac may exceed zero_variance_all_wrong_frac);
    - entropy_mean: as in `summarize`;
    - multi-turn episodes: `episode_summary` (the share of samples that call a tool, ...).
    """
    if not results:
        return {}
    variances = [float(np.var(r.rewards)) for r in results]
    flat = [v <= ZERO_VARIANCE_TOL for v in variances]
    every = [all(r.correct) for r in results]
    none = [not any(r.correct) for r in results]
    count = len(results)
    metrics = {
        "num_prompts": float(count),
        "samples_per_prompt": float(len(results[0].rewards)),
        "accuracy": mean_share_correct(results),
        "reward_mean": float(np.mean([x for r in results for x in r.rewards])),
        "reward_variance": float(np.mean(variances)),
        "zero_variance_frac": sum(flat) / count,
        "zero_variance_all_correct_frac": sum(f and e for f, e in zip(flat, every, strict=True)) / count,
        "zero_variance_all_wrong_frac": sum(f and w for f, w in zip(flat, none, strict=True)) / count,
        "zero_variance_other_frac": sum(f and not e and not w
                                        for f, e, w in zip(flat, every, none, strict=True)) / count,
        "all_correct_frac": sum(every) / count,
        "all_wrong_frac": sum(none) / count,
    }
    if all(r.entropy_sums for r in results):
        tokens = sum(sum(r.lengths) for r in results)
        metrics["entropy_mean"] = sum(sum(r.entropy_sums) for r in results) / max(tokens, 1)
    metrics.update(episode_summary(results))
    return metrics


@dataclass(frozen=True)
class ProbeThresholds:
    """Where GRPO learns (the issue's rule of thumb): some but not all samples right, rewards
    that differ within a prompt, and a policy that is neither deterministic nor random."""

    min_accuracy: float = 0.10
    max_accuracy: float = 0.80
    min_variance: float = 0.05  # mean per-prompt reward variance must exceed this
    min_entropy: float = 0.2  # nats per token
    max_entropy: float = 0.8


@dataclass
class Verdict:
    status: str  # too_hard | too_easy | low_variance | fine
    suggestion: str
    checks: dict[str, bool]  # accuracy / variance / entropy: inside its range?
    notes: list[str] = field(default_factory=list)  # what is worth knowing but decides nothing


def probe_verdict(accuracy: float, variance: float, entropy: float | None,
                  th: ProbeThresholds = ProbeThresholds()) -> Verdict:
    """The verdict, from the first failing check in this order:

    1. accuracy < min_accuracy -> too_hard: SFT first, or easier data;
    2. accuracy > max_accuracy -> too_easy: harder data;
    3. variance <= min_variance -> low_variance: prompts are all right or all wrong; keep
       the ones the model sometimes solves, or sample more per prompt;
    4. otherwise fine. Bounds are inclusive (accuracy 0.10 and 0.80 pass).

    Accuracy and the reward variance measure GRPO's signal itself (a group's advantages are
    its rewards' differences); entropy does not decide: an entropy outside its range is a
    note. Too low an entropy shows as low variance already (samples that barely differ score
    alike), and a high one is what a small model has at T = 1 on tasks it learns (SmolLM2-135M
    on arithmetic: 1.67 nats/token at accuracy 0.17 and variance 0.12, trained 0.20 -> 0.82 in
    20 steps; docs/evaluation.md), nowhere near random sampling (ln of the vocabulary's size,
    10.8 nats for its 49,152 tokens). entropy None (not measured): no note.
    """
    checks = {
        "accuracy": th.min_accuracy <= accuracy <= th.max_accuracy,
        "variance": variance > th.min_variance,
        "entropy": entropy is None or th.min_entropy <= entropy <= th.max_entropy,
    }
    notes = []
    if entropy is not None and entropy < th.min_entropy:
        notes.append(f"entropy {entropy:.3f} nats/token is below {th.min_entropy:g}: the samples barely "
                     "differ; if the variance is low too, raise rollout.temperature")
    elif entropy is not None and entropy > th.max_entropy:
        notes.append(f"entropy {entropy:.3f} nats/token is above {th.max_entropy:g}, usual for a small model "
                     "at T = 1; it decides nothing while accuracy and variance are in range")
    if accuracy < th.min_accuracy:
        return Verdict("too_hard", "SFT first (or easier data): too few samples earn reward, so "
                       "most groups have no reward difference for GRPO to learn from", checks, notes)
    if accuracy > th.max_accuracy:
        return Verdict("too_easy", "use harder data: most samples are already right, so most "
                       "groups have no reward difference for GRPO to learn from", checks, notes)
    if not checks["variance"]:
        return Verdict("low_variance", "prompts are mostly all right or all wrong: keep the prompts the "
                       "model sometimes solves (or raise rollout.n / rollout.temperature)", checks, notes)
    return Verdict("fine", "fine: train with RL as is", checks, notes)
