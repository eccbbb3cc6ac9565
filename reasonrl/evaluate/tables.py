"""The evaluation's reports as text and JSON: the `reasonrl eval` table (a column per
data_source), `--compare` side by side with deltas, the `reasonrl probe` verdict, and the JSON
records both commands write. Pure functions of the metrics (`evaluate.metrics`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from reasonrl.evaluate.metrics import (
    ProbeThresholds,
    PromptResult,
    by_source,
    probe_metrics,
    probe_verdict,
    summarize,
)

DEFAULT_THRESHOLDS = ProbeThresholds()
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


def eval_report(results: Sequence[PromptResult], record: dict, ks: Sequence[int]) -> dict:
    """The `reasonrl eval` JSON: settings, times, metrics overall and per data_source, prompts."""
    return {"command": "eval", **{k: v for k, v in record.items() if k != "prompts"},
            "overall": summarize(results, ks),
            "sources": {s: summarize(rs, ks) for s, rs in by_source(results).items()},
            "prompts": record["prompts"]}


def probe_report(results: Sequence[PromptResult], record: dict,
                 th: ProbeThresholds = DEFAULT_THRESHOLDS) -> dict:
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
    """The probe's verdict with each check, its value and its range, and its notes. The
    zero-variance prompts are split into their parts (all right + all wrong + other, which
    add up), and the prompts with no / every sample right are a line of their own when other
    reward components make them differ from those parts."""
    m, v = report["overall"], report["verdict"]
    th = v["thresholds"]
    ok = {True: "ok", False: "OUT"}
    entropy = m.get("entropy_mean")
    zero = (f"zero-variance prompts {m['zero_variance_frac']:.2f} (all right "
            f"{m['zero_variance_all_correct_frac']:.2f} + all wrong {m['zero_variance_all_wrong_frac']:.2f}")
    zero += (f" + equal rewards over right and wrong samples {m['zero_variance_other_frac']:.2f})"
             if m["zero_variance_other_frac"] else ")")
    lines = [
        f"accuracy        {m['accuracy']:.3f}  (want {th['min_accuracy']:.2f}-{th['max_accuracy']:.2f})"
        f"  {ok[v['checks']['accuracy']]}",
        f"reward variance {m['reward_variance']:.3f}  (want > {th['min_variance']:.2f})"
        f"  {ok[v['checks']['variance']]}",
        zero,
    ]
    if (m["all_correct_frac"], m["all_wrong_frac"]) != (m["zero_variance_all_correct_frac"],
                                                        m["zero_variance_all_wrong_frac"]):
        lines.append(f"no sample right in {m['all_wrong_frac']:.2f} of the prompts, every sample right in "
                     f"{m['all_correct_frac']:.2f} (some of them with rewards that differ through other "
                     "components: reward.weights)")
    lines.append(f"entropy         {'-' if entropy is None else f'{entropy:.3f}'}  "
                 f"(usual {th['min_entropy']:.2f}-{th['max_entropy']:.2f}; a note, not a check)")
    if "turns_mean" in m:  # multi-turn episodes
        lines.append(f"episodes        {m['turns_mean']:.2f} turns; tool calls in "
                     f"{m['tool_call_share']:.2f} of samples ({m['tool_calls_mean']:.2f} each), "
                     f"{m['tool_error_rate']:.2f} of them failed")
    lines += [f"note: {note}" for note in v.get("notes", [])]
    lines.append(f"verdict: {v['status']}: {v['suggestion']}")
    return "\n".join(lines)
