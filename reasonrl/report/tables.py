"""The report's numbers: the summary table, the held-out evaluations, asynchronous training's
staleness and idle times, which steps' samples to show, the config keys in which runs differ,
and how a number is written.

Plain values computed from a `Run` (strings and numbers; the summary rows' arrows are their
only HTML), apart from the page that lays them out (`reasonrl.report.page`), so that each
can be checked without drawing or rendering anything.
"""

from __future__ import annotations

import json
import math
import statistics

from reasonrl.report.load import Run


def fmt(value: object, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.2e}"
        if value.is_integer() and abs(value) >= 10:  # counts (num_examples) read as counts
            return str(int(value))
        return f"{value:.{digits}f}"
    return str(value)


def _first_last(run: Run, key: str, k: int = 5) -> str:
    """Mean of the first k and the last k training steps, as `a -> b`."""
    steps, values = run.series(key)
    pairs = [(t, v) for t, v in zip(steps, values, strict=True) if t > 0]
    if not pairs:
        return "not logged"
    k = max(1, min(k, len(pairs) // 2 or 1))
    first = sum(v for _, v in pairs[:k]) / k
    last = sum(v for _, v in pairs[-k:]) / k
    return f"{fmt(first)} &rarr; {fmt(last)}"


def summary_rows(run: Run) -> list[tuple[str, str]]:
    """(label, value) pairs; values are already HTML (numbers and arrows only)."""
    steps = [t for t in run.metrics if t > 0]
    evals = run.series("eval/accuracy")
    step_times = run.series("time/step")[1]
    eval_times = run.series("time/eval")[1]
    n = min(5, max(1, len(steps) // 2))
    rows = [
        ("training steps logged", str(len(steps))),
        ("held-out accuracy (first eval &rarr; last eval)",
         f"{fmt(evals[1][0])} &rarr; {fmt(evals[1][-1])} (steps {evals[0][0]} &rarr; {evals[0][-1]})"
         if evals[0] else "not logged"),
        (f"reward/mean (first {n} &rarr; last {n} step{'s' if n != 1 else ''})",
         _first_last(run, "reward/mean", n)),
        (f"reward/accuracy (first {n} &rarr; last {n})", _first_last(run, "reward/accuracy", n)),
        (f"response length mean (first {n} &rarr; last {n})",
         _first_last(run, "rollout/response_length_mean", n)),
        (f"truncated fraction (first {n} &rarr; last {n})", _first_last(run, "rollout/truncated_frac", n)),
        ("seconds per step (median)", fmt(statistics.median(step_times), 1) if step_times else "not logged"),
        ("wall time of steps + evals", f"{fmt((sum(step_times) + sum(eval_times)) / 60, 1)} min"
         if step_times else "not logged"),
    ]
    if run.skipped_lines:
        rows.append(("unreadable lines skipped", str(run.skipped_lines)))
    return rows


def _paired_sums(run: Run, part: str, whole: str) -> tuple[float, float, int]:
    """(sum of `part`, sum of `whole`, steps) over the steps that logged both."""
    wholes = dict(zip(*run.series(whole), strict=True))
    pairs = [(v, wholes[t]) for t, v in zip(*run.series(part), strict=True) if t in wholes]
    return sum(p for p, _ in pairs), sum(w for _, w in pairs), len(pairs)


def async_numbers(run: Run) -> dict[str, float | None]:
    """Asynchronous training (trainer.max_staleness > 0) over the run's steps, None where not
    logged: `staleness_mean` (policy versions behind, the mean of the steps' `async/staleness`);
    `learner_idle` = sum of async/wait / sum of time/step (`wait_s`, `step_s`); `generator_idle`
    = sum of async/producer_idle / sum of (time/rollout + async/producer_idle) (`producer_idle_s`,
    `generator_s`); `sync_pause_mean`, `sync_pause_max` (seconds the rollout process spent loading
    weights before a batch). Sums over the steps that logged both of their metrics."""
    staleness = run.series("async/staleness")[1]
    pauses = run.series("async/sync_pause")[1]
    wait, step, n_learner = _paired_sums(run, "async/wait", "time/step")
    idle, rollout, n_generator = _paired_sums(run, "async/producer_idle", "time/rollout")
    generator = rollout + idle
    return {
        "staleness_mean": statistics.fmean(staleness) if staleness else None,
        "learner_idle": wait / step if n_learner and step > 0 else None,
        "wait_s": wait if n_learner else None,
        "step_s": step if n_learner else None,
        "generator_idle": idle / generator if n_generator and generator > 0 else None,
        "producer_idle_s": idle if n_generator else None,
        "generator_s": generator if n_generator else None,
        "sync_pause_mean": statistics.fmean(pauses) if pauses else None,
        "sync_pause_max": max(pauses) if pauses else None,
    }


def async_rows(run: Run) -> list[tuple[str, str]]:
    """(label, value) pairs of the asynchronous-training table; plain text (escape both)."""
    n = async_numbers(run)

    def share(key: str, part: str, whole: str) -> str:
        if n[key] is None:
            return "not logged"
        return f"{100 * n[key]:.1f}% ({n[part]:.1f} s of {n[whole]:.1f} s)"

    def seconds(key: str) -> str:
        return "not logged" if n[key] is None else f"{fmt(n[key])} s"

    return [
        ("staleness, mean (policy versions behind)",
         "not logged" if n["staleness_mean"] is None else fmt(n["staleness_mean"])),
        ("learner idle (async/wait / time/step)", share("learner_idle", "wait_s", "step_s")),
        ("generator idle (async/producer_idle / (time/rollout + async/producer_idle))",
         share("generator_idle", "producer_idle_s", "generator_s")),
        ("weight-sync pause, mean (async/sync_pause)", seconds("sync_pause_mean")),
        ("weight-sync pause, max", seconds("sync_pause_max")),
    ]


def eval_table(run: Run) -> tuple[list[str], list[tuple[int, dict]]]:
    """Columns (eval/ metrics) and (step, metrics) rows of every held-out evaluation."""
    rows = [(t, {k: v for k, v in m.items() if k.startswith("eval/")})
            for t, m in sorted(run.metrics.items())]
    rows = [(t, m) for t, m in rows if m]
    first = ["eval/accuracy", "eval/reward_mean", "eval/response_length_mean", "eval/truncated_frac",
             "eval/num_prompts", "eval/num_examples"]
    seen = {k for _, m in rows for k in m}
    columns = [k for k in first if k in seen] + sorted(seen - set(first))
    return columns, rows


def sample_steps(run: Run) -> list[int]:
    """The first, middle and last step that has logged samples."""
    steps = sorted({s["step"] for s in run.samples})
    if not steps:
        return []
    return sorted({steps[0], steps[len(steps) // 2], steps[-1]})


def _flatten(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        out: dict[str, object] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: tree}


def config_differences(runs: list[Run]) -> list[tuple[str, list[str]]]:
    flat = [_flatten(run.config) for run in runs]
    keys = sorted({k for f in flat for k in f})
    missing = object()
    out = []
    for key in keys:
        values = [f.get(key, missing) for f in flat]
        if any(v != values[0] for v in values):
            out.append((key, ["(absent)" if v is missing else json.dumps(v) for v in values]))
    return out
