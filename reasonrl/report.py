"""`reasonrl report`: one self-contained report.html for a run, or overlaying several.

Everything comes from the run directory (metrics.jsonl, samples.jsonl, config.yaml,
summary.json): the curves of training, the seconds each stage took per step, held-out
results, sample completions at the first, middle and last step, and the resolved config.
Plots are drawn with matplotlib (Agg, no display) and inlined as base64 PNGs, so the file
opens anywhere with no network. Every string read from a run is HTML-escaped: completions
are model output.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import yaml

from reasonrl.errors import ReportError


@dataclass
class Run:
    path: Path
    name: str
    metrics: dict[int, dict]  # step -> metrics (a step logged twice, e.g. after a resume: last wins)
    samples: list[dict]
    config_text: str
    config: dict
    summary: dict | None
    skipped_lines: int = 0  # unreadable lines (a run killed mid-write)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Steps at which `key` was logged as a finite number, and its values."""
        steps, values = [], []
        for step in sorted(self.metrics):
            value = self.metrics[step].get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                steps.append(step)
                values.append(float(value))
        return steps, values

    def has(self, key: str) -> bool:
        return bool(self.series(key)[0])

    def keys(self) -> set[str]:
        return {k for m in self.metrics.values() for k in m}


def _read_jsonl(path: Path) -> tuple[list[dict], int]:
    rows, bad = [], 0
    if not path.exists():
        return rows, bad
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not (path / "metrics.jsonl").is_file():
        raise ReportError(f"{path}: not a run directory (no metrics.jsonl)")
    records, bad = _read_jsonl(path / "metrics.jsonl")
    metrics: dict[int, dict] = {}
    for record in records:
        step = record.pop("step")
        metrics.setdefault(step, {}).update(record)
    samples, bad_samples = _read_jsonl(path / "samples.jsonl")
    config_text, config = "", {}
    if (path / "config.yaml").is_file():
        config_text = (path / "config.yaml").read_text(encoding="utf-8", errors="replace")
        try:
            config = yaml.safe_load(config_text) or {}
        except yaml.YAMLError:
            config = {}
    summary = None
    if (path / "summary.json").is_file():
        try:
            summary = json.loads((path / "summary.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            summary = None
    name = path.resolve().name
    return Run(path, name, metrics, samples, config_text, config if isinstance(config, dict) else {},
               summary, bad + bad_samples)


# ---- plots ------------------------------------------------------------------------------


@dataclass
class Plot:
    id: str
    title: str
    series: list[tuple[str, str]]  # (metric, label)
    ylabel: str = ""
    hint: str = ""  # shown when nothing was logged
    band: str = ""  # a metric drawn as +- band around the first series (std)
    smooth: bool = False  # add a moving average of the first series
    unit_interval: bool = False  # y from 0 to 1
    sci: bool = False  # scientific tick labels (learning rate)
    extra_prefix: str = field(default="")  # also plot every `<prefix>*/<suffix>` metric (per source)
    note: str = ""  # how to read the plot, under it


PLOTS = [
    Plot("reward", "Training reward", [("reward/mean", "mean reward"),
                                       ("reward/accuracy", "accuracy (full marks)")],
         band="reward/std", smooth=True),
    Plot("eval_accuracy", "Held-out accuracy (greedy)", [("eval/accuracy", "accuracy")],
         unit_interval=True, hint="no held-out set (data.val_path / val_size)",
         extra_prefix="eval/"),
    Plot("response_length", "Response length (tokens)", [("rollout/response_length_mean", "mean"),
                                                         ("rollout/response_length_max", "max")]),
    Plot("truncated", "Truncated at max_new_tokens", [("rollout/truncated_frac", "fraction")],
         unit_interval=True),
    Plot("entropy", "Policy entropy (nats/token)", [("train/entropy", "entropy")]),
    Plot("kl", "KL to the reference model", [("train/kl", "KL in loss"),
                                             ("train/kl_in_reward", "KL in reward")],
         hint="logged only with algo.beta > 0 or algo.log_kl=true"),
    Plot("clip_frac", "Clip fraction", [("train/clip_frac", "clipped tokens")],
         hint="logged by the policy update",
         note="0 with one update per batch (ratio = 1); optim.ppo_epochs or mini_batches > 1 move it"),
    Plot("grad_norm", "Gradient norm", [("train/grad_norm", "grad norm")]),
    Plot("lr", "Learning rate", [("train/lr", "lr")], sci=True),
]

# the critic panel: only for runs with a critic (algo.advantage=gae)
CRITIC_PLOTS = [
    Plot("critic_loss", "Value loss", [("critic/vf_loss", "clipped value loss")], smooth=True),
    Plot("critic_ev", "Explained variance", [("critic/explained_variance", "1 - Var(R - V) / Var(R)")],
         note="1: the critic predicts the returns; 0: no better than their mean"),
    Plot("critic_values", "Values and returns (mean over tokens)", [("critic/value_mean", "V"),
                                                                    ("critic/returns_mean", "return")]),
    Plot("critic_clip", "Value clip fraction", [("critic/vf_clipfrac", "clipped tokens")],
         unit_interval=True),
    Plot("critic_grad_norm", "Critic gradient norm", [("critic/grad_norm", "grad norm")]),
]

# time/<stage> in the order of Trainer.step; "other" = the rest of time/step
STAGES = ["rollout", "reward", "reference", "values", "advantage", "critic", "update", "sync", "eval"]
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf"]
STYLES = ["-", "--", ":", "-."]


def _figure(width: float = 6.0, height: float = 3.3):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _label(text: str) -> str:
    """Legend text as written: `$` would start mathtext, a leading `_` hides the entry."""
    text = text.replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _plot_series(plot: Plot, runs: list[Run]) -> list[tuple[str, str]]:
    series = list(plot.series)
    if plot.extra_prefix and len(runs) == 1:  # per-source eval accuracy of a mixed held-out set
        suffix = plot.series[0][0].rsplit("/", 1)[1]
        for key in sorted(runs[0].keys()):
            parts = key.split("/")
            if len(parts) == 3 and key.startswith(plot.extra_prefix) and parts[2] == suffix:
                series.append((key, parts[1]))
    return series


def draw_plot(plot: Plot, runs: list[Run]) -> str | None:
    """A base64 PNG, or None when no run logged any of the plot's metrics."""
    from matplotlib.ticker import MaxNLocator

    series = _plot_series(plot, runs)
    if not any(run.has(key) for run in runs for key, _ in series):
        return None
    fig, ax = _figure()
    many = len(runs) > 1
    for r, run in enumerate(runs):
        for s, (key, label) in enumerate(series):
            steps, values = run.series(key)
            if not steps:
                continue
            color = COLORS[(r if many else s) % len(COLORS)]
            style = STYLES[s % len(STYLES)] if many else "-"
            name = _label(f"{run.name}: {label}" if many else label)
            marker = "o" if len(steps) <= 30 else None
            faint = plot.smooth and s == 0 and len(steps) >= 10
            ax.plot(steps, values, style, color=color, marker=marker, markersize=3,
                    alpha=0.35 if faint else 1.0, label=None if faint and many else name)
            if faint:
                window = max(3, len(steps) // 10)
                ax.plot(steps, _moving_average(values, window), style, color=color, linewidth=2,
                        label=f"{name}, moving average of {window}")
            if plot.band and s == 0:
                band_steps, std = run.series(plot.band)
                by_step = dict(zip(steps, values, strict=True))
                pairs = [(t, by_step[t], d) for t, d in zip(band_steps, std, strict=True) if t in by_step]
                if pairs:
                    ax.fill_between([p[0] for p in pairs], [p[1] - p[2] for p in pairs],
                                    [p[1] + p[2] for p in pairs], color=color, alpha=0.12, linewidth=0)
    if plot.unit_interval:
        ax.set_ylim(-0.03, 1.03)
    if plot.sci:
        ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0), useOffset=False)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if plot.ylabel:
        ax.set_ylabel(plot.ylabel)
    ax.set_title(plot.title, fontsize=11)
    ax.grid(alpha=0.3)
    if many:  # a legend per run and series: below the plot, not over the curves
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=2)
    else:
        ax.legend(fontsize=7, loc="best")
    return _png(fig)


def stage_seconds(run: Run) -> dict[int, dict[str, float]]:
    """step -> {stage: seconds}; `other` is what time/step holds beyond the named stages."""
    table: dict[int, dict[str, float]] = {}
    for step in sorted(run.metrics):
        m = run.metrics[step]
        row = {s: float(m[f"time/{s}"]) for s in STAGES
               if isinstance(m.get(f"time/{s}"), (int, float)) and math.isfinite(m[f"time/{s}"])}
        total = m.get("time/step")
        if isinstance(total, (int, float)) and math.isfinite(total):
            rest = total - sum(v for k, v in row.items() if k != "eval")
            if rest > 1e-3:
                row["other"] = rest
        if row:
            table[step] = row
    return table


def draw_time(runs: list[Run]) -> str | None:
    """Stacked bars of seconds per stage: per step for one run, mean per step for several."""
    from matplotlib.ticker import MaxNLocator

    tables = [stage_seconds(run) for run in runs]
    if not any(tables):
        return None
    stages = [s for s in [*STAGES, "other"] if any(s in row for t in tables for row in t.values())]
    if len(runs) == 1:
        table = tables[0]
        fig, ax = _figure(12.0, 3.6)
        steps = sorted(table)
        heights = [[table[t].get(stage, 0.0) for t in steps] for stage in stages]
        colors = [COLORS[i % len(COLORS)] for i in range(len(stages))]
        if len(steps) > 300:  # bars too thin to see (and slow to draw): stacked areas
            ax.stackplot(steps, heights, colors=colors, labels=stages, step="mid")
        else:
            bottom = [0.0] * len(steps)
            for stage, h, color in zip(stages, heights, colors, strict=True):
                ax.bar(steps, h, bottom=bottom, width=0.8, color=color, label=stage)
                bottom = [b + x for b, x in zip(bottom, h, strict=True)]
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("seconds")
        ax.set_title("Seconds per stage per step (eval: steps with a held-out evaluation)", fontsize=11)
    else:
        fig, ax = _figure(12.0, 1.2 + 0.5 * len(runs))
        names = [_label(run.name) for run in runs]
        left = [0.0] * len(runs)
        for i, stage in enumerate(stages):
            widths = []
            for table in tables:
                train_steps = [t for t in table if t > 0] or list(table)
                widths.append(sum(table[t].get(stage, 0.0) for t in table) / max(len(train_steps), 1))
            ax.barh(names, widths, left=left, color=COLORS[i % len(COLORS)], label=stage)
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.invert_yaxis()
        ax.set_xlabel("seconds per training step (eval amortised over the steps)")
        ax.set_title("Seconds per stage", fontsize=11)
    ax.grid(alpha=0.3, axis="y" if len(runs) == 1 else "x")
    ax.legend(fontsize=8, ncols=len(stages), loc="upper left", bbox_to_anchor=(0, -0.18 if len(runs) == 1
                                                                               else -0.35))
    return _png(fig)


# ---- numbers ----------------------------------------------------------------------------


def _fmt(value: object, digits: int = 3) -> str:
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
    return f"{_fmt(first)} &rarr; {_fmt(last)}"


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
         f"{_fmt(evals[1][0])} &rarr; {_fmt(evals[1][-1])} (steps {evals[0][0]} &rarr; {evals[0][-1]})"
         if evals[0] else "not logged"),
        (f"reward/mean (first {n} &rarr; last {n} steps)", _first_last(run, "reward/mean", n)),
        (f"reward/accuracy (first {n} &rarr; last {n})", _first_last(run, "reward/accuracy", n)),
        (f"response length mean (first {n} &rarr; last {n})",
         _first_last(run, "rollout/response_length_mean", n)),
        (f"truncated fraction (first {n} &rarr; last {n})", _first_last(run, "rollout/truncated_frac", n)),
        ("seconds per step (median)", _fmt(statistics.median(step_times), 1) if step_times else "not logged"),
        ("wall time of steps + evals", f"{_fmt((sum(step_times) + sum(eval_times)) / 60, 1)} min"
         if step_times else "not logged"),
    ]
    if run.skipped_lines:
        rows.append(("unreadable lines skipped", str(run.skipped_lines)))
    return rows


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


# ---- HTML -------------------------------------------------------------------------------

CSS = """
body { font-family: -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 24px;
       color: #222; max-width: 1280px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px;
       border-bottom: 1px solid #ddd; padding-bottom: 4px; } h3 { font-size: 14px; }
.meta { color: #666; font-size: 13px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border: 1px solid #ddd; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.grid { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 12px; }
figure { margin: 0; border: 1px solid #e4e4e4; border-radius: 4px; padding: 6px; background: #fff; }
figure.wide { grid-column: 1 / -1; }
figure img { width: 100%; height: auto; display: block; }
figcaption { font-size: 12px; color: #555; margin-top: 4px; }
.not-logged { height: 200px; display: flex; flex-direction: column; align-items: center;
       justify-content: center; color: #888; background: #fafafa; font-size: 15px; }
.not-logged small { font-size: 12px; margin-top: 6px; }
.text { white-space: pre-wrap; word-break: break-word; font-family: "DejaVu Sans Mono", monospace;
       font-size: 12px; max-height: 12em; overflow: auto; }
pre.config { background: #f8f8f8; padding: 8px; font-size: 12px; max-height: 30em; overflow: auto; }
table.samples { width: 100%; table-layout: fixed; }
table.samples th:nth-child(1) { width: 22%; } table.samples th:nth-child(2) { width: 9%; }
table.samples th:nth-child(3) { width: 39%; } table.samples th:nth-child(n+4) { width: 7.5%; }
.scroll { overflow-x: auto; } nav a { margin-right: 12px; font-size: 13px; }
.turn { border-left: 3px solid #1f77b4; padding-left: 6px; margin-bottom: 6px; }
.who { font-size: 11px; color: #666; text-transform: uppercase; }
.turn-call { background: #fff6e0; } .turn-observation { background: #eef6ee; }
.turn-error { background: #fdecec; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _plot_figure(plot: Plot, runs: list[Run]) -> str:
    image = draw_plot(plot, runs)
    keys = [k for k, _ in _plot_series(plot, runs)]
    attrs = f'class="plot" id="plot-{plot.id}" data-metrics="{_e(",".join(keys))}"'
    if image is None:
        hint = f"<small>{_e(plot.hint)}</small>" if plot.hint else ""
        return (f'<figure {attrs} data-logged="false"><div class="not-logged"><b>{_e(plot.title)}</b>'
                f'<span>not logged</span>{hint}</div><figcaption>{_e(", ".join(keys))}: '
                f'not in metrics.jsonl</figcaption></figure>')
    absent = [run.name for run in runs if not any(run.has(k) for k in keys)]
    note = f"; not logged in {_e(', '.join(absent))}" if absent else ""
    note += f" &middot; {_e(plot.note)}" if plot.note else ""
    return (f'<figure {attrs} data-logged="true"><img alt="{_e(plot.title)}" '
            f'src="data:image/png;base64,{image}"><figcaption>{_e(", ".join(keys))}{note}'
            f'</figcaption></figure>')


def _time_figure(runs: list[Run]) -> str:
    image = draw_time(runs)
    if image is None:
        return ('<figure class="plot wide" id="plot-time" data-logged="false"><div class="not-logged">'
                '<b>Seconds per stage</b><span>not logged</span></div></figure>')
    return ('<figure class="plot wide" id="plot-time" data-logged="true"><img alt="Seconds per stage" '
            f'src="data:image/png;base64,{image}"><figcaption>{", ".join(f"time/{s}" for s in STAGES)}; '
            'other = time/step minus the named stages</figcaption></figure>')


def _summary_html(runs: list[Run]) -> str:
    tables = [summary_rows(run) for run in runs]
    head = "".join(f"<th>{_e(run.name)}</th>" for run in runs)
    body = ""
    for i, (label, _) in enumerate(tables[0]):
        cells = "".join(f'<td class="num">{t[i][1] if i < len(t) else ""}</td>' for t in tables)
        body += f"<tr><th>{label}</th>{cells}</tr>"
    return f'<table id="summary-table"><tr><th></th>{head}</tr>{body}</table>'


def _eval_html(run: Run) -> str:
    columns, rows = eval_table(run)
    parts = []
    if rows:
        head = "".join(f"<th>{_e(c.removeprefix('eval/'))}</th>" for c in columns)
        body = "".join("<tr><td class=\"num\">" + str(t) + "</td>"
                       + "".join(f'<td class="num">{_e(_fmt(m.get(c)))}</td>' for c in columns)
                       + "</tr>" for t, m in rows)
        parts.append(f'<div class="scroll"><table class="eval"><tr><th>step</th>{head}</tr>{body}'
                     "</table></div>")
    if run.summary:
        before, after = run.summary.get("eval_before") or {}, run.summary.get("eval_after") or {}
        keys = [k for k in dict.fromkeys([*before, *after]) if k.startswith("eval/")]
        if keys:
            body = "".join(f"<tr><th>{_e(k)}</th><td class=\"num\">{_e(_fmt(before.get(k)))}</td>"
                           f"<td class=\"num\">{_e(_fmt(after.get(k)))}</td></tr>" for k in keys)
            parts.append("<h3>summary.json</h3><table class=\"summary-json\"><tr><th></th>"
                         f"<th>before training</th><th>after training</th></tr>{body}</table>")
    return "".join(parts) or "<p>No held-out evaluation in this run.</p>"


def _completion_html(sample: dict) -> str:
    """A sample's completion; a multi-turn episode's (its `turns`) as one block per turn: the
    model's text, the tool call it made, what came back (or the error), each labelled, so that
    model and environment text are told apart. Everything escaped."""
    turns = sample.get("turns")
    if not isinstance(turns, list) or not turns:
        return f'<div class="text">{_e(sample.get("completion", ""))}</div>'
    parts = []
    for k, turn in enumerate(turns, 1):
        turn = turn if isinstance(turn, dict) else {"model": turn}
        parts.append(f'<div class="turn" data-turn="{k}"><span class="who">model, turn {k}</span>'
                     f'<div class="text turn-model">{_e(turn.get("model", ""))}</div>')
        if turn.get("call"):
            parts.append('<span class="who">tool call</span>'
                         f'<div class="text turn-call">{_e(turn["call"])}</div>')
        if turn.get("observation") is not None:
            parts.append('<span class="who">environment</span>'
                         f'<div class="text turn-observation">{_e(turn["observation"])}</div>')
        if turn.get("error"):
            parts.append('<span class="who">error</span>'
                         f'<div class="text turn-error">{_e(turn["error"])}</div>')
        parts.append("</div>")
    return "".join(parts)


def _samples_html(run: Run) -> str:
    steps = sample_steps(run)
    if not steps:
        return "<p>No samples.jsonl rows.</p>"
    which = dict(zip(steps, ["first", "middle", "last"] if len(steps) == 3 else
                     ["first", "last"] if len(steps) == 2 else ["only"], strict=True))
    out = []
    for step in steps:
        rows = [s for s in run.samples if s["step"] == step]
        body = ""
        for s in rows:
            components = s.get("components") or {}
            comp = ", ".join(f"{k}={_fmt(v)}" for k, v in components.items()) \
                if isinstance(components, dict) else str(components)
            if s.get("reward_error"):  # the reward function failed on this sample (scored 0)
                comp += f" (reward failed: {s['reward_error']})"
            body += ("<tr>"
                     f'<td><div class="text">{_e(s.get("prompt", ""))}</div></td>'
                     f'<td>{_e(s.get("ground_truth", ""))}</td>'
                     f'<td>{_completion_html(s)}</td>'
                     f'<td class="num">{_e(_fmt(s.get("reward")))}</td>'
                     f"<td>{_e(comp)}</td>"
                     f'<td class="num">{_e(_fmt(s.get("advantage")))}</td>'
                     f'<td>{_e("yes" if s.get("truncated") else "no")}</td></tr>')
        out.append(f'<h3 id="samples-{_e(run.name)}-step-{step}">step {step} ({which[step]})</h3>'
                   '<table class="samples" data-step="' + str(step) + '"><tr><th>prompt</th>'
                   "<th>ground truth</th><th>completion</th><th>reward</th><th>components</th>"
                   f"<th>advantage</th><th>truncated</th></tr>{body}</table>")
    return "".join(out)


def render_html(runs: list[Run]) -> str:
    many = len(runs) > 1
    title = "reasonrl report: " + (" vs ".join(run.name for run in runs))
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    paths = ", ".join(_e(run.path) for run in runs)
    plots = "".join(_plot_figure(p, runs) for p in PLOTS) + _time_figure(runs)
    sections = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{paths} &middot; generated {generated} by reasonrl report</p>',
        '<nav><a href="#summary">summary</a><a href="#plots">plots</a><a href="#eval">held-out eval</a>'
        '<a href="#samples">samples</a><a href="#config">config</a></nav>',
        f'<h2 id="summary">Summary</h2>{_summary_html(runs)}',
        f'<h2 id="plots">Training curves</h2><div class="grid">{plots}</div>',
        *([f'<h2 id="critic">Critic</h2><div class="grid">'
           f'{"".join(_plot_figure(p, runs) for p in CRITIC_PLOTS)}</div>']
          if any(run.has("critic/vf_loss") for run in runs) else []),
        '<h2 id="eval">Held-out evaluation</h2>',
    ]
    for run in runs:
        sections.append((f"<h3>{_e(run.name)}</h3>" if many else "") + _eval_html(run))
    sections.append('<h2 id="samples">Sample completions (first, middle and last step)</h2>')
    for run in runs:
        sections.append((f"<h3>{_e(run.name)}</h3>" if many else "") + _samples_html(run))
    sections.append('<h2 id="config">Resolved config</h2>')
    if many:
        diffs = config_differences(runs)
        head = "".join(f"<th>{_e(run.name)}</th>" for run in runs)
        body = "".join(f"<tr><th>{_e(k)}</th>" + "".join(f"<td>{_e(v)}</td>" for v in vs) + "</tr>"
                       for k, vs in diffs)
        sections.append("<h3>Differences</h3>" + (f'<table id="config-diff"><tr><th>key</th>{head}</tr>'
                                                   f"{body}</table>" if diffs else "<p>none</p>"))
    for run in runs:
        text = run.config_text or "(no config.yaml)"
        sections.append(f"<details{'' if many else ' open'}><summary>{_e(run.name)}/config.yaml"
                        f'</summary><pre class="config">{_e(text)}</pre></details>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>\n"
            + "\n".join(sections) + "\n</body></html>\n")


def default_output(run_dirs: list[Path]) -> Path:
    if len(run_dirs) == 1:
        return run_dirs[0] / "report.html"
    names = "-vs-".join(Path(p).resolve().name for p in run_dirs)
    return Path(run_dirs[0]).resolve().parent / f"compare-{names[:150]}.html"


def write_report(run_dirs: list[str | Path], output: str | Path | None = None) -> Path:
    """Build the report of one run (or the overlay of several) and write it atomically."""
    if not run_dirs:
        raise ReportError("give at least one run directory")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p) for p in paths]
    names = [run.name for run in runs]
    for i, run in enumerate(runs):  # two runs of the same name in different folders
        if names.count(run.name) > 1:
            run.name = f"{run.name} ({run.path.parent.name or i})"
    text = render_html(runs)
    target = Path(output) if output else default_output(paths)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    return target


def report_after_training(run_dir: Path) -> Path | None:
    """The end-of-training report. The run is complete by then: a failure here is a warning
    (`reasonrl report RUN` can redo it), never a lost run."""
    try:
        return write_report([run_dir])
    except Exception as err:  # matplotlib, disk, a malformed line: keep the finished run
        print(f"[reasonrl] warning: report.html not written ({type(err).__name__}: {err}); "
              f"retry with `reasonrl report {run_dir}`", file=sys.stderr, flush=True)
        return None
