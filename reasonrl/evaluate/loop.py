"""The one evaluation loop: the trainer's held-out eval and `reasonrl eval` / `probe` call
`evaluate`, with settings from one place.

Settings: the config's `eval` section is the one form a user writes (`reasonrl eval`'s
options fill the same section); `eval_settings` resolves it into the `EvalSettings` the loop
reads, and `EvalSettings.sampling` is what the rollout worker is asked for. The loop needs
only the worker protocols (`RolloutWorkerAPI.rollout`, `PolicyWorkerAPI.row_entropies`):
building the workers is the command's job (`reasonrl.commands.evaluation`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reasonrl.batch import Example
from reasonrl.config import Config
from reasonrl.errors import DataError
from reasonrl.evaluate.metrics import PromptResult, final_answer, majority_vote
from reasonrl.rollout.base import SamplingParams
from reasonrl.worker_protocols import PolicyWorkerAPI, RolloutWorkerAPI

GENERATE_BATCH = 64  # sequences per generate call (prompts per call = this // n)


@dataclass(frozen=True)
class EvalSettings:
    """The evaluation's resolved settings (`eval_settings`): the `eval` section's sampling with
    greedy decoding made explicit, pass@k values, and what the config does not hold."""

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

    def sampling(self, n: int) -> SamplingParams:
        """What the rollout worker samples for a prompt evaluated with `n` samples."""
        return SamplingParams(n=n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens, greedy=self.greedy)


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


@dataclass
class Evaluation:
    """What `evaluate` measured: per-prompt results, every prompt's completions, and times."""

    results: list[PromptResult]
    prompts: list[dict]  # per prompt: prompt, ground truth, majority answer, samples
    times: dict[str, float]  # generate_s, reward_s, entropy_s


def evaluate(rollout: RolloutWorkerAPI, policy: PolicyWorkerAPI, examples: list[Example],
             settings: EvalSettings, reward_cfg, desc: str = "eval", leave: bool = True,
             judge=None) -> Evaluation:
    """The evaluation of reasonrl, used by the trainer's held-out eval and by `reasonrl eval`
    and `probe` alike, so that the two can never disagree: `settings.n` samples per prompt
    (or the record's own, `record_plan`) through the rollout worker (`settings.batch_size`
    sequences per call, prompts with the same n together), scored with the training reward
    code, answers extracted by the task's rule, and (with `settings.entropy`) the policy's
    per-token entropy over the generated tokens (`judge`: the judge role's worker, when
    reward.weights names one). Results are in the order of `examples`.

    With `settings.progress`, the console's bar (`tracking.progress_bar`, titled `desc`; `leave`
    False: erased when done) counts samples done of the total, says which batch is at which
    stage (generating, scoring, entropy) and keeps its elapsed time moving while a batch
    generates (`tracking.ticking`)."""
    from reasonrl.rewards import score_examples, verifier_for
    from reasonrl.tracking import progress_bar, ticking

    plan = record_plan(examples, settings)
    entropy_temperature = 1.0 if settings.greedy else settings.temperature
    tasks = {e.data_source: verifier_for(e.data_source, reward_cfg).task for e in examples}
    by_n: dict[int, list[int]] = {}
    for i, (n, _) in enumerate(plan):
        by_n.setdefault(n, []).append(i)
    calls: list[tuple[int, list[int]]] = []  # (n, the prompts of one generate call), in order
    for n, indices in by_n.items():
        per_call = max(1, settings.batch_size // n)
        calls += [(n, indices[start: start + per_call]) for start in range(0, len(indices), per_call)]
    results: list[PromptResult | None] = [None] * len(examples)
    prompts: list[dict | None] = [None] * len(examples)
    times = {"generate_s": 0.0, "reward_s": 0.0, "entropy_s": 0.0}
    bar = progress_bar(sum(n for n, _ in plan), desc, "sample", enabled=settings.progress, leave=leave)
    try:
        with ticking(bar):
            for call, (n, chunk) in enumerate(calls, start=1):
                sampling = settings.sampling(n)
                batch = f"batch {call}/{len(calls)}"
                bar.set_postfix_str(f"{batch}: generating {len(chunk) * n}")
                t = time.perf_counter()
                rollouts = rollout.rollout([examples[i] for i in chunk], sampling)
                if rollouts.episode is not None:  # an agent's split episode: its final call's row
                    rollouts = rollouts.take(rollouts.episode_rows()[0])
                times["generate_s"] += time.perf_counter() - t
                bar.set_postfix_str(f"{batch}: scoring")
                t = time.perf_counter()
                scores = score_examples(rollouts.texts, rollouts.examples, reward_cfg, always_correct=True,
                                        groups=rollouts.group.tolist(),
                                        completion_ids=rollouts.completion_ids, judge=judge)
                times["reward_s"] += time.perf_counter() - t
                entropies = None
                if settings.entropy:
                    bar.set_postfix_str(f"{batch}: entropy")
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
            bar.set_postfix_str("done")
    finally:
        bar.close()
    return Evaluation(results, prompts, times)


def _prompt_result(example: Example, rows: list[int], rollouts, scores, entropies, task: str,
                   fallback_last_number: bool, first: bool) -> PromptResult:
    """One prompt's samples as a `PromptResult`. A format component that raised is counted
    once, on the chunk's first prompt (its row is not known)."""
    timeouts = scores.timed_out
    errors = [f is not None and not t for f, t in zip(scores.failures, timeouts, strict=True)]
    other_errors = scores.errors - sum(errors)
    total, correct = scores.total.tolist(), scores.components["correct"].tolist()
    episodes = rollouts.episodes  # multi-turn: the environment's reward and counts too
    return PromptResult(
        data_source=example.data_source,
        rewards=[total[i] + (episodes.reward[i].item() if episodes else 0.0) for i in rows],
        correct=[correct[i] >= 1.0 for i in rows],
        answers=[final_answer(rollouts.texts[i], task, fallback_last_number) for i in rows],
        lengths=[sum(rollouts.token_mask[i]) for i in rows],
        truncated=[bool(rollouts.truncated[i]) for i in rows],
        entropy_sums=[(entropies[i] * torch.tensor(rollouts.token_mask[i])).sum().item() for i in rows]
        if entropies else [],
        reward_errors=sum(errors[i] for i in rows) + (other_errors if first else 0),
        reward_timeouts=sum(timeouts[i] for i in rows),
        turns=[len(episodes.turns[i]) for i in rows] if episodes else [],
        tool_calls=[int(episodes.tool_calls[i]) for i in rows] if episodes else [],
        tool_errors=[int(episodes.tool_errors[i]) for i in rows] if episodes else [])


def _prompt_record(example: Example, rollouts, rows: list[int], r: PromptResult) -> dict:
    columns = zip(rows, r.rewards, r.correct, r.answers, r.lengths, r.truncated, strict=True)
    samples = [{"completion": rollouts.texts[i], "reward": reward, "correct": c, "answer": a, "length": n,
                "truncated": tr} for i, reward, c, a, n, tr in columns]
    if rollouts.episodes is not None:  # multi-turn: every turn (model, tool call, observation)
        for sample, i in zip(samples, rows, strict=True):
            sample["turns"] = [dataclasses.asdict(turn) for turn in rollouts.episodes.turns[i]]
    return {"prompt": example.prompt, "ground_truth": example.ground_truth,
            "data_source": example.data_source, "majority_answer": majority_vote(r.answers, r.correct)[0],
            "samples": samples}
