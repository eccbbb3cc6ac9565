"""Evaluation (`reasonrl eval`) and signal probing (`reasonrl probe`).

The metrics and the probe's verdict are pure functions of a table of per-prompt results
(`PromptResult`): tested on hand-made tables, independent of any model. `run` is the part
that touches a model: it builds the workers exactly as training does (`build_workers`, so
whatever `rollout.engine` the config names generates here too), samples `n` completions per
prompt, scores them with the training reward code, and measures the policy's entropy over
the generated tokens with one forward pass of the policy model.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reasonrl.batch import Example
from reasonrl.config import Config
from reasonrl.data import load_examples, load_files, take_per_source
from reasonrl.data.readers import is_hub_id
from reasonrl.errors import ConfigError, DataError
from reasonrl.registry import DATA_TASKS
from reasonrl.rewards.countdown import extract_equation
from reasonrl.rewards.extract import extract_answer
from reasonrl.rewards.gsm8k import extract_gsm8k_answer
from reasonrl.rewards.numeric import parse_number
from reasonrl.rng import seed_everything

GENERATE_BATCH = 64  # sequences per generate call (prompts per call = this // n)
ZERO_VARIANCE_TOL = 1e-12  # a prompt's rewards with population variance <= this are "all equal"

# ---- formulas -----------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, "Evaluating
    Large Language Models Trained on Code", eq. 1 and its numerically stable form, Fig. 3):

        pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)

    the probability that a random k-subset of the n samples holds at least one correct one.
    The product never forms the huge binomials. pass@1 = c / n.
    """
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _canonical(answer: str | None, numeric: bool) -> str | None:
    """An extracted answer in a form where equal answers compare equal as strings: a number
    (`parse_number`: "$1,000", "1000.0" -> "1000") or, for non-numeric tasks, the text with
    whitespace removed. None (no answer) for an empty string or, when `numeric`, for text
    that is not a number."""
    if answer is None:
        return None
    value = parse_number(answer)
    if value is not None:
        return f"{value:.12g}"
    if numeric:
        return None
    text = "".join(answer.split())
    return text or None


def final_answer(text: str, task: str, fallback_last_number: bool = True) -> str | None:
    """The answer a completion commits to, normalised, by the same extraction rule the
    task's verifier uses (`reasonrl.rewards`); None when no answer can be extracted.

    numeric (arithmetic): `\\boxed{}` > `<answer>` > the last number (if allowed), and it
    must parse as a number; gsm8k: the same with the `#### N` marker before the last number;
    piecewise: `\\boxed{}` / `<answer>` (no last-number fallback), parsed as a number; math and
    custom rewards: `\\boxed{}` > `<answer>` > last number, any non-empty text; countdown: the
    `<answer>` (else `\\boxed{}`) equation's left-hand side. Numbers are compared as numbers
    ("18.0" = "$18"), other text with whitespace removed.
    """
    if task == "gsm8k":
        return _canonical(extract_gsm8k_answer(text, fallback_last_number), numeric=True)
    if task == "countdown":
        return _canonical(extract_equation(text), numeric=False)
    if task == "piecewise":
        return _canonical(extract_answer(text, fallback_last_number=False)[0], numeric=True)
    answer, _ = extract_answer(text, fallback_last_number)
    return _canonical(answer, numeric=task == "numeric")


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


def summarize(results: Sequence[PromptResult], ks: Sequence[int]) -> dict[str, float]:
    """Metrics of a set of prompts; prompt i has n_i samples (the same n for all unless records
    ask for their own, `extra_info.n` / `extra_info.pass@k`).

    - accuracy: share of samples whose `correct` is full marks (= pass@1 when every n_i is equal).
    - reward_mean: mean total reward over all samples.
    - pass@k: mean of `pass_at_k(n_i, c_i, k)` over the prompts that report k (those whose `ks`
      hold it, or with empty `ks` those of `ks` up to n_i); pass@1 = mean share of correct samples.
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
               "accuracy": float(np.mean([c for r in results for c in r.correct])),
               "reward_mean": float(np.mean(rewards))}
    for k in sorted({k for ks_i in reported for k in ks_i}):
        metrics[f"pass@{k}"] = float(np.mean([pass_at_k(len(r.rewards), sum(r.correct), k)
                                              for r, ks_i in zip(results, reported, strict=True)
                                              if k in ks_i]))
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


def probe_metrics(results: Sequence[PromptResult]) -> dict[str, float]:
    """What GRPO's learning signal depends on, over prompts with n samples each.

    - accuracy: share of samples whose `correct` is full marks;
    - reward_variance: mean over prompts of the population variance (divide by n) of the
      prompt's total rewards (0/1 rewards with a share p right: p (1 - p), at most 0.25);
    - zero_variance_frac: share of prompts whose rewards are all equal (variance <=
      ZERO_VARIANCE_TOL): their group advantages are all 0, so they teach nothing;
      all_correct_frac / all_wrong_frac split off the prompts where every / no sample is right;
    - entropy_mean: as in `summarize`;
    - multi-turn episodes: `episode_summary` (the share of samples that call a tool, ...).
    """
    if not results:
        return {}
    variances = [float(np.var(r.rewards)) for r in results]
    metrics = {
        "num_prompts": float(len(results)),
        "samples_per_prompt": float(len(results[0].rewards)),
        "accuracy": float(np.mean([x for r in results for x in r.correct])),
        "reward_mean": float(np.mean([x for r in results for x in r.rewards])),
        "reward_variance": float(np.mean(variances)),
        "zero_variance_frac": float(np.mean([v <= ZERO_VARIANCE_TOL for v in variances])),
        "all_correct_frac": float(np.mean([all(r.correct) for r in results])),
        "all_wrong_frac": float(np.mean([not any(r.correct) for r in results])),
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
    status: str  # too_hard | too_easy | low_variance | low_entropy | high_entropy | fine
    suggestion: str
    checks: dict[str, bool]  # accuracy / variance / entropy: inside its range?


def probe_verdict(accuracy: float, variance: float, entropy: float | None,
                  th: ProbeThresholds = ProbeThresholds()) -> Verdict:
    """The verdict, from the first failing check in this order:

    1. accuracy < min_accuracy -> too_hard: SFT first, or easier data;
    2. accuracy > max_accuracy -> too_easy: harder data;
    3. variance <= min_variance -> low_variance: prompts are all right or all wrong; keep
       the ones the model sometimes solves, or sample more per prompt;
    4. entropy < min_entropy -> low_entropy: raise the temperature;
    5. entropy > max_entropy -> high_entropy: lower the temperature or SFT first;
    6. otherwise fine. Bounds are inclusive (accuracy 0.10 and 0.80 pass); entropy None
       (not measured) passes.
    """
    checks = {
        "accuracy": th.min_accuracy <= accuracy <= th.max_accuracy,
        "variance": variance > th.min_variance,
        "entropy": entropy is None or th.min_entropy <= entropy <= th.max_entropy,
    }
    if accuracy < th.min_accuracy:
        return Verdict("too_hard", "SFT first (or easier data): too few samples earn reward, so "
                       "most groups have no reward difference for GRPO to learn from", checks)
    if accuracy > th.max_accuracy:
        return Verdict("too_easy", "use harder data: most samples are already right, so most "
                       "groups have no reward difference for GRPO to learn from", checks)
    if not checks["variance"]:
        return Verdict("low_variance", "prompts are mostly all right or all wrong: keep the prompts the "
                       "model sometimes solves (or raise rollout.n / rollout.temperature)", checks)
    if entropy is not None and entropy < th.min_entropy:
        return Verdict("low_entropy", "the samples barely differ: raise rollout.temperature", checks)
    if entropy is not None and entropy > th.max_entropy:
        return Verdict("high_entropy", "the samples are close to random: lower rollout.temperature, "
                       "or SFT first", checks)
    return Verdict("fine", "fine: train with RL as is", checks)


# ---- printing ---------------------------------------------------------------------------

EVAL_ORDER = ("num_prompts", "num_samples", "accuracy", "reward_mean", "pass@*", "majority_accuracy",
              "entropy_mean", "response_length_mean", "response_length_p95", "truncated_frac",
              "format_error_rate", "reward_errors", "reward_timeouts")


def _ordered(keys) -> list[str]:
    keys = list(keys)
    out: list[str] = []
    for name in EVAL_ORDER:
        if name == "pass@*":
            out += sorted((k for k in keys if k.startswith("pass@")), key=lambda k: int(k[5:]))
        elif name in keys:
            out.append(name)
    return out + [k for k in keys if k not in out]


COUNTS = ("num_prompts", "num_samples", "samples_per_prompt", "reward_errors", "reward_timeouts")


def _fmt(value: float | None, key: str = "") -> str:
    if value is None:
        return "-"
    if key in COUNTS:
        return f"{value:.0f}"
    return f"{value:.1f}" if key.startswith("response_length") else f"{value:.3f}"


def format_table(report: dict) -> str:
    """Metrics as a text table: one row per metric, columns overall and each data_source."""
    columns = [("overall", report["overall"])]
    if len(report.get("sources", {})) > 1:
        columns += list(report["sources"].items())
    width = max(len(k) for k in report["overall"]) + 2
    lines = ["".ljust(width) + "".join(f"{name[:14]:>15}" for name, _ in columns)]
    for key in _ordered(report["overall"]):
        lines.append(key.ljust(width) + "".join(f"{_fmt(m.get(key), key):>15}" for _, m in columns))
    return "\n".join(lines)


def compare_rows(base: dict, new: dict) -> list[tuple[str, str, float | None, float | None]]:
    """(scope, metric, base value, new value) for every metric of either report, overall
    first, then each data_source; a metric one report lacks has None there."""
    rows = []
    scopes = [("overall", base.get("overall", {}), new.get("overall", {}))]
    for source in sorted(set(base.get("sources", {})) | set(new.get("sources", {}))):
        if len(base.get("sources", {})) > 1 or len(new.get("sources", {})) > 1:
            scopes.append((source, base.get("sources", {}).get(source, {}),
                           new.get("sources", {}).get(source, {})))
    for scope, a, b in scopes:
        for key in _ordered(set(a) | set(b)):
            rows.append((scope, key, a.get(key), b.get(key)))
    return rows


SETTINGS_COMPARED = ("data", "n", "greedy", "temperature", "max_new_tokens", "limit")


def format_compare(base: dict, new: dict, base_name: str = "base", new_name: str = "this") -> str:
    """Side-by-side table `base -> new` with deltas, and a note on settings that differ."""
    rows = compare_rows(base, new)
    width = max([len(f"{s}/{k}") for s, k, _, _ in rows] + [6]) + 2
    lines = ["".ljust(width) + f"{base_name[:14]:>15}{'':4}{new_name[:14]:<15}{'delta':>10}"]
    for scope, key, a, b in rows:
        name = key if scope == "overall" else f"{scope}/{key}"
        delta = "-" if a is None or b is None else f"{round(b - a, 3) + 0.0:+.3f}"  # no "-0.000"
        lines.append(f"{name.ljust(width)}{_fmt(a, key):>15} -> {_fmt(b, key):<15}{delta:>10}")
    sa, sb = base.get("settings", {}), new.get("settings", {})
    differ = [f"{k} {sa.get(k)!r} vs {sb.get(k)!r}" for k in SETTINGS_COMPARED if sa.get(k) != sb.get(k)]
    if differ:
        lines.append("note: the two evaluations differ in " + "; ".join(differ))
    return "\n".join(lines)


def compare_deltas(base: dict, new: dict) -> dict[str, float]:
    """{"metric" or "source/metric": new - base} for the metrics both reports have."""
    return {(k if s == "overall" else f"{s}/{k}"): b - a
            for s, k, a, b in compare_rows(base, new) if a is not None and b is not None}


# ---- running a model ----------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSettings:
    n: int = 1  # samples per prompt
    ks: tuple[int, ...] = (1,)
    greedy: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    limit: int = 0  # at most this many prompts (0 = all), shared evenly between data sources
    batch_size: int = GENERATE_BATCH  # sequences per generate call
    entropy: bool = True
    progress: bool = True
    record_overrides: bool = True  # a record's extra_info.n / extra_info.pass@k apply (`record_plan`)

    def check(self) -> None:
        if self.n < 1:
            raise ConfigError(f"--n: must be >= 1, got {self.n}")
        if self.greedy and self.n != 1:
            raise ConfigError(f"--greedy: greedy samples of a prompt are identical; use --n 1, got {self.n}")
        for k in self.ks:
            if not 1 <= k <= self.n:
                raise ConfigError(f"--k: pass@{k} needs 1 <= k <= n = {self.n} samples per prompt")
        if self.temperature <= 0:
            raise ConfigError(f"--temperature: must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ConfigError(f"--top-p must be in (0, 1] and --top-k >= 0, got {self.top_p}, {self.top_k}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens: must be >= 1, got {self.max_new_tokens}")
        if self.limit < 0 or self.batch_size < 1:
            raise ConfigError("--limit must be >= 0 and --batch-size >= 1")


def load_eval_examples(cfg: Config, data: str | None, limit: int = 0) -> tuple[list[Example], str]:
    """(examples, what they are). `data`: a file (JSONL/JSON/Parquet/CSV/`datasets` folder) or a
    Hub dataset id (with `data.val_subset`, `data.val_split`, `data.format`), several
    comma-separated; a built-in task name (its held-out split, from the config's section for
    that task), or None for the config's own held-out set."""
    seed = cfg.trainer.seed
    if data is None:
        if not DATA_TASKS[cfg.data.task].info["generated"]:  # only the held-out files: no training set needed
            if not cfg.data.val_path:
                raise DataError("the config has no held-out set (data.val_path is empty): pass --data FILE")
            d = cfg.data
            examples = load_files(d.val_path, d.fields, d.val_subset, d.val_split, d.format)
            examples = take_per_source(examples, d.val_size) if d.val_size else examples
        else:
            examples = load_examples(cfg.data, seed)[1]
            if not examples:
                raise DataError(f"data.task={cfg.data.task} has no held-out set: pass --data FILE")
        what = f"held-out set of data.task={cfg.data.task}"
        what += f" ({cfg.data.val_path})" if cfg.data.val_path else ""
    elif data in DATA_TASKS and DATA_TASKS[data].info["generated"]:
        d = dataclasses.replace(cfg.data, task=data, val_size=0)
        examples = load_examples(d, seed)[1]
        what = f"{data} held-out split (seed {seed})"
    elif all(Path(p.strip()).exists() or is_hub_id(p.strip()) for p in data.split(",") if p.strip()):
        d = cfg.data  # a Hub id takes the config's held-out subset, split and format
        examples = load_files(data, d.fields, d.val_subset, d.val_split, d.format)
        what = data
    else:
        generated = [e.name for e in DATA_TASKS if e.info["generated"]]
        raise DataError(f"--data {data}: no such file, and not a built-in task ({', '.join(generated)})")
    if limit:
        examples = take_per_source(examples, limit)
    return examples, what


def _eval_config(cfg: Config, s: EvalSettings) -> Config:
    """The config the workers are built from: the run's model, data and engine settings with
    the evaluation's sampling, and no reference model (nothing here needs one)."""
    return dataclasses.replace(
        cfg, algo=dataclasses.replace(cfg.algo, beta=0.0, log_kl=False),
        rollout=dataclasses.replace(cfg.rollout, n=s.n, temperature=s.temperature, top_p=s.top_p,
                                    top_k=s.top_k, max_new_tokens=s.max_new_tokens))


@dataclass
class Evaluation:
    """What `evaluate` measured: per-prompt results, every prompt's completions, and times."""

    results: list[PromptResult]
    prompts: list[dict]  # per prompt: prompt, ground truth, majority answer, samples
    times: dict[str, float]  # generate_s, reward_s, entropy_s


def sampling_for(settings: EvalSettings):
    from reasonrl.rollout import SamplingParams

    return SamplingParams(n=settings.n, temperature=settings.temperature, top_p=settings.top_p,
                          top_k=settings.top_k, max_new_tokens=settings.max_new_tokens,
                          greedy=settings.greedy)


def eval_settings(cfg: Config, **options) -> EvalSettings:
    """The evaluation settings of the config's `eval` section, shared by the trainer's held-out
    eval and `reasonrl eval` (whose options fill the same section): eval.n samples per prompt,
    greedy when eval.temperature is 0, pass@k for eval.k (default 1 and n), eval.max_new_tokens
    (0 = rollout.max_new_tokens). `options` sets what the config does not hold (limit,
    batch_size, entropy, progress, record_overrides)."""
    ev = cfg.eval
    ks = tuple(sorted(set(ev.k))) if ev.k else ((1,) if ev.n == 1 else (1, ev.n))
    return EvalSettings(n=ev.n, ks=ks, greedy=ev.temperature == 0, temperature=ev.temperature or 1.0,
                        top_p=ev.top_p, top_k=ev.top_k,
                        max_new_tokens=ev.max_new_tokens or cfg.rollout.max_new_tokens, **options)


def _record_int(example: Example, key: str) -> int | None:
    value = example.meta.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        where = example.meta.get("origin", example.data_source)
        raise DataError(f"{where}: field 'extra_info.{key}' must be an integer >= 1, got {value!r}")
    return value


def record_plan(examples: Sequence[Example], settings: EvalSettings) -> list[tuple[int, tuple[int, ...]]]:
    """(samples, pass@k values) of each example: `settings.n` and `settings.ks`, unless the
    record says otherwise in its `extra_info` (EasyRL's validation records): `n` sets its number
    of samples, `pass@k` adds its k (and, without `n`, raises its samples to at least k); a
    `settings.ks` value above the record's n is left out for it. DataError naming file:line for
    a value that is not an integer >= 1, a pass@k above the record's n, or n > 1 under greedy
    decoding (identical samples). With `settings.record_overrides` off, every record gets the
    settings' own."""
    plan = []
    for e in examples:
        n, ks = settings.n, settings.ks
        if settings.record_overrides:
            own_n, own_k = _record_int(e, "n"), _record_int(e, "pass@k")
            n = own_n if own_n is not None else max(n, own_k or 0)
            where = e.meta.get("origin", e.data_source)
            if own_k is not None and own_k > n:
                raise DataError(f"{where}: field 'extra_info.pass@k' is {own_k}, more than the record's "
                                f"extra_info.n={n} samples")
            if settings.greedy and n > 1:
                raise DataError(f"{where}: the record asks for {n} samples (extra_info.n / pass@k) but the "
                                "evaluation is greedy (eval.temperature=0): set eval.temperature > 0 "
                                "(reasonrl eval: --temperature)")
            ks = tuple(sorted({k for k in settings.ks if k <= n} | ({own_k} if own_k else set())))
        plan.append((n, ks))
    return plan


def evaluate(rollout, policy, examples: list[Example], settings: EvalSettings, reward_cfg) -> Evaluation:
    """The evaluation of reasonrl, used by the trainer's held-out eval and by `reasonrl eval`
    and `probe` alike, so that the two can never disagree: `settings.n` samples per prompt
    (or the record's own, `record_plan`) through the rollout worker (`settings.batch_size`
    sequences per call, prompts with the same n together), scored with the training reward
    code, answers extracted by the task's rule, and (with `settings.entropy`) the policy's
    per-token entropy over the generated tokens. Results are in the order of `examples`."""
    from tqdm.auto import tqdm

    from reasonrl.rewards import score_examples, verifier_for

    plan = record_plan(examples, settings)
    entropy_temperature = 1.0 if settings.greedy else settings.temperature
    tasks = {e.data_source: verifier_for(e.data_source, reward_cfg).task for e in examples}
    by_n: dict[int, list[int]] = {}
    for i, (n, _) in enumerate(plan):
        by_n.setdefault(n, []).append(i)
    results: list[PromptResult | None] = [None] * len(examples)
    prompts: list[dict | None] = [None] * len(examples)
    times = {"generate_s": 0.0, "reward_s": 0.0, "entropy_s": 0.0}
    bar = tqdm(total=sum(n for n, _ in plan), desc="generate", unit="sample", disable=not settings.progress)
    try:
        for n, indices in by_n.items():
            sampling = sampling_for(dataclasses.replace(settings, n=n))
            per_call = max(1, settings.batch_size // n)
            for start in range(0, len(indices), per_call):
                chunk = indices[start: start + per_call]
                t = time.perf_counter()
                rollouts = rollout.rollout([examples[i] for i in chunk], sampling)
                times["generate_s"] += time.perf_counter() - t
                t = time.perf_counter()
                scores = score_examples(rollouts.texts, rollouts.examples, reward_cfg, always_correct=True,
                                        groups=rollouts.group.tolist())
                times["reward_s"] += time.perf_counter() - t
                entropies = None
                if settings.entropy:
                    t = time.perf_counter()
                    entropies = policy.row_entropies(rollouts.prompt_ids, rollouts.completion_ids,
                                                     entropy_temperature)
                    times["entropy_s"] += time.perf_counter() - t
                for g, i in enumerate(chunk):
                    example, rows = examples[i], list(range(g * n, (g + 1) * n))
                    result = _prompt_result(example, rows, rollouts, scores, entropies,
                                            tasks[example.data_source], reward_cfg.fallback_last_number,
                                            first=g == 0)
                    result.ks = plan[i][1]
                    results[i], prompts[i] = result, _prompt_record(example, rollouts, rows, result)
                bar.update(len(rollouts))
    finally:
        bar.close()
    return Evaluation(results, prompts, times)


def _prompt_result(example: Example, rows: list[int], rollouts, scores, entropies, task: str,
                   fallback_last_number: bool, first: bool) -> PromptResult:
    """One prompt's samples as a `PromptResult`. A format component that raised is counted
    once, on the chunk's first prompt (its row is not known)."""
    timeouts = [scores.failures.get(i) == "timeout" for i in range(len(rollouts))]
    errors = [i in scores.failures and not timeouts[i] for i in range(len(rollouts))]
    other_errors = scores.errors - sum(errors)
    import torch

    episodes = bool(rollouts.environment)  # multi-turn: the environment's reward and counts too
    return PromptResult(
        data_source=example.data_source,
        rewards=[scores.total[i] + (rollouts.env_reward[i].item() if episodes else 0.0) for i in rows],
        correct=[scores.components["correct"][i] >= 1.0 for i in rows],
        answers=[final_answer(rollouts.texts[i], task, fallback_last_number) for i in rows],
        lengths=[sum(rollouts.token_mask[i]) for i in rows],
        truncated=[bool(rollouts.truncated[i]) for i in rows],
        entropy_sums=[(entropies[i] * torch.tensor(rollouts.token_mask[i])).sum().item() for i in rows]
        if entropies else [],
        reward_errors=sum(errors[i] for i in rows) + (other_errors if first else 0),
        reward_timeouts=sum(timeouts[i] for i in rows),
        turns=[int(rollouts.num_turns[i]) for i in rows] if episodes else [],
        tool_calls=[int(rollouts.tool_calls[i]) for i in rows] if episodes else [],
        tool_errors=[int(rollouts.tool_errors[i]) for i in rows] if episodes else [])


def _prompt_record(example: Example, rollouts, rows: list[int], r: PromptResult) -> dict:
    columns = zip(rows, r.rewards, r.correct, r.answers, r.lengths, r.truncated, strict=True)
    samples = [{"completion": rollouts.texts[i], "reward": reward, "correct": c, "answer": a, "length": n,
                "truncated": tr} for i, reward, c, a, n, tr in columns]
    if rollouts.environment:  # multi-turn: every turn (model, tool call, observation)
        for sample, i in zip(samples, rows, strict=True):
            sample["turns"] = [dataclasses.asdict(turn) for turn in rollouts.turns[i]]
    return {"prompt": example.prompt, "ground_truth": example.ground_truth,
            "data_source": example.data_source, "majority_answer": majority_vote(r.answers, r.correct)[0],
            "samples": samples}


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


def run(cfg: Config, settings: EvalSettings, data: str | None = None) -> tuple[list[PromptResult], dict]:
    """`reasonrl eval` / `probe`: build the workers as training does (`build_workers`, so
    whatever `rollout.engine` the config names generates here too), check that the engine
    serves the policy's weights, and `evaluate`.

    Returns the per-prompt results and a record {data, settings, model, times, prompts} where
    `prompts` holds every prompt's completions, rewards and answers.
    """
    import torch

    from reasonrl.placement import build_workers, preflight
    from reasonrl.rewards import check_examples, verifier_for
    from reasonrl.rollout import check_prompt_lengths

    settings.check()
    preflight(cfg)
    t_start = time.perf_counter()
    torch.set_num_threads(cfg.trainer.threads or os.cpu_count() or 1)
    examples, what = load_eval_examples(cfg, data, settings.limit)
    check_examples(examples, cfg.reward)
    record_plan(examples, settings)  # a record's bad extra_info.n / pass@k fails before the model loads
    cfg = _eval_config(cfg, settings)
    t = time.perf_counter()
    workers = build_workers(cfg)
    try:
        # The engine must serve exactly the policy's weights: the entropy pass reads the policy.
        workers.rollout.load_weights(workers.policy.named_weights(), version=0,
                                     expected_checksum=workers.policy.weights_checksum())
        seed_everything(cfg.trainer.seed)
        load_s = time.perf_counter() - t
        check_prompt_lengths(workers.rollout, examples, cfg.data.max_prompt_tokens)  # all of them, now
        evaluation = evaluate(workers.rollout, workers.policy, examples, settings, cfg.reward)
    finally:
        workers.close()
    times = {"load_s": load_s, **evaluation.times, "wall_s": time.perf_counter() - t_start}
    generated = sum(sum(r.lengths) for r in evaluation.results)
    times["generated_tokens_per_s"] = generated / max(times["generate_s"], 1e-9)
    record = {
        "model": cfg.model.path or "SmolLM2-135M-Instruct (embedded default)",
        "engine": cfg.rollout.engine,
        "settings": {"data": what, **{k: v for k, v in dataclasses.asdict(settings).items()
                                      if k not in ("progress",)},
                     "entropy_temperature": 1.0 if settings.greedy else settings.temperature,
                     "seed": cfg.trainer.seed, "reward_weights": dict(cfg.reward.weights),
                     "tasks": {e.data_source: verifier_for(e.data_source, cfg.reward).task
                               for e in examples}},
        "times": times,
        "prompts": evaluation.prompts,
    }
    record["settings"]["ks"] = list(settings.ks)
    return evaluation.results, record


def eval_report(results: Sequence[PromptResult], record: dict, ks: Sequence[int]) -> dict:
    """The `reasonrl eval` JSON: settings, times, metrics overall and per data_source, prompts."""
    return {"command": "eval", **{k: v for k, v in record.items() if k != "prompts"},
            "overall": summarize(results, ks),
            "sources": {s: summarize(rs, ks) for s, rs in by_source(results).items()},
            "prompts": record["prompts"]}


def probe_report(results: Sequence[PromptResult], record: dict,
                 th: ProbeThresholds = ProbeThresholds()) -> dict:
    """The `reasonrl probe` JSON: the probe metrics overall and per data_source, the verdict
    (on the overall metrics) with its thresholds."""
    overall = probe_metrics(results)
    verdict = probe_verdict(overall["accuracy"], overall["reward_variance"], overall.get("entropy_mean"), th)
    return {"command": "probe", **{k: v for k, v in record.items() if k != "prompts"},
            "overall": overall,
            "sources": {s: probe_metrics(rs) for s, rs in by_source(results).items()},
            "verdict": {**dataclasses.asdict(verdict), "thresholds": dataclasses.asdict(th)},
            "prompts": record["prompts"]}


def format_verdict(report: dict) -> str:
    """The probe's verdict with each check, its value and its range."""
    m, v = report["overall"], report["verdict"]
    th = v["thresholds"]
    ok = {True: "ok", False: "OUT"}
    entropy = m.get("entropy_mean")
    lines = [
        f"accuracy        {m['accuracy']:.3f}  (want {th['min_accuracy']:.2f}-{th['max_accuracy']:.2f})"
        f"  {ok[v['checks']['accuracy']]}",
        f"reward variance {m['reward_variance']:.3f}  (want > {th['min_variance']:.2f})"
        f"  {ok[v['checks']['variance']]}",
        f"zero-variance prompts {m['zero_variance_frac']:.2f} (all right {m['all_correct_frac']:.2f}, "
        f"all wrong {m['all_wrong_frac']:.2f})",
        f"entropy         {'-' if entropy is None else f'{entropy:.3f}'}  "
        f"(want {th['min_entropy']:.2f}-{th['max_entropy']:.2f})  {ok[v['checks']['entropy']]}",
        f"verdict: {v['status']}: {v['suggestion']}",
    ]
    if "turns_mean" in m:  # multi-turn episodes
        lines.insert(-1, f"episodes        {m['turns_mean']:.2f} turns; tool calls in "
                         f"{m['tool_call_share']:.2f} of samples ({m['tool_calls_mean']:.2f} each), "
                         f"{m['tool_error_rate']:.2f} of them failed")
    return "\n".join(lines)
