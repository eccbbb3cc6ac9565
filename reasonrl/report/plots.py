"""The report's plots: which metrics each one draws, and drawing them as PNGs.

Each `Plot` names its metrics and how to read them; `draw_plot` overlays the runs given,
`draw_time` stacks the seconds of each stage of a step (`STAGES`, in `Trainer.step`'s order),
`draw_staleness` the fractions of a step's samples at each policy lag (asynchronous training).
Drawn with matplotlib's object API (no pyplot: no global state, no display) and returned as
base64 PNGs for the page to inline; None where no run logged the plot's metrics.
"""

from __future__ import annotations

import base64
import io
import math
import re
from dataclasses import dataclass, field

from reasonrl.report.load import Run, eval_description


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
    eval_settings: bool = False  # the title says how the held-out eval sampled (`eval_description`)


PLOTS = [
    Plot("reward", "Training reward", [("reward/mean", "mean reward"),
                                       ("reward/accuracy", "accuracy (full marks)")],
         band="reward/std", smooth=True),
    Plot("eval_accuracy", "Held-out accuracy", [("eval/accuracy", "accuracy")],
         unit_interval=True, hint="no held-out set (data.val_path / val_size)",
         extra_prefix="eval/", eval_settings=True),
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

# the distillation panel: only for runs with a teacher (teacher.path, docs/teachers.md)
DISTILL_PLOTS = [
    Plot("distill_reverse_kl", "Reverse KL to the teacher (nats/token)",
         [("distill/reverse_kl", "log pi_student - log pi_teacher")], smooth=True,
         note="token mean over the sampled tokens (k1): 0 when the student scores them as the teacher does"),
    Plot("distill_logprobs", "Log-prob of the sampled tokens (mean per token)",
         [("distill/teacher_logprob", "teacher"), ("distill/student_logprob", "student")],
         note="the student's samples as each model scores them; the gap is the reverse KL"),
    Plot("distill_prefers", "Tokens the teacher finds likelier", [("distill/teacher_prefers", "fraction")],
         unit_interval=True, note="where the distillation term raises the sampled token's probability"),
]

# the supervised fine-tuning panel: only for `reasonrl sft` runs (docs/sft.md)
SFT_PLOTS = [
    Plot("sft_loss", "SFT loss (token-mean cross-entropy, nats)", [("sft/loss", "training records"),
                                                                   ("eval/loss", "held-out records")],
         smooth=True, note="over the trained tokens: completions, assistant turns"),
    Plot("sft_perplexity", "Held-out perplexity", [("eval/perplexity", "exp(held-out loss)")]),
]

# time/<stage> in the order of Trainer.step; "other" = the rest of time/step
STAGES = ["rollout", "reward", "logprobs", "reference", "teacher", "values", "advantage", "critic", "update",
          "sync", "eval"]
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf", "#aec7e8"]
STYLES = ["-", "--", ":", "-."]


def _figure(width: float = 6.0, height: float = 3.3):
    from matplotlib.figure import Figure  # no pyplot: no global state, no display backend

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    return fig, fig.add_subplot()



def stacked_per_step(ax, steps: list[int], heights: list[list[float]], colors: list,
                     labels: list[str]) -> None:
    """One stacked bar per step (a layer per row of `heights`); stacked areas past 300 steps,
    where bars are too thin to see and slow to draw."""
    if len(steps) > 300:
        ax.stackplot(steps, heights, colors=colors, labels=labels, step="mid")
        return
    bottom = [0.0] * len(steps)
    for label, h, color in zip(labels, heights, colors, strict=True):
        ax.bar(steps, h, bottom=bottom, width=0.8, color=color, label=label)
        bottom = [b + x for b, x in zip(bottom, h, strict=True)]


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


def plot_series(plot: Plot, runs: list[Run]) -> list[tuple[str, str]]:
    series = list(plot.series)
    if plot.extra_prefix and len(runs) == 1:  # per-source eval accuracy of a mixed held-out set
        suffix = plot.series[0][0].rsplit("/", 1)[1]
        for key in sorted(runs[0].keys()):
            parts = key.split("/")
            if len(parts) == 3 and key.startswith(plot.extra_prefix) and parts[2] == suffix:
                series.append((key, parts[1]))
    return series


def plot_title(plot: Plot, runs: list[Run]) -> tuple[str, dict[str, str]]:
    """(the plot's title, a legend suffix per run name). A held-out plot says how its eval
    sampled (`eval_description` of the run's config): in the title when the runs agree, else
    after each run's legend entries."""
    if not plot.eval_settings or not runs:
        return plot.title, {}
    described = {run.name: eval_description(run.config) for run in runs}
    if len(set(described.values())) == 1:
        return f"{plot.title} ({next(iter(described.values()))})", {}
    return f"{plot.title} (eval settings differ by run)", {k: f" ({v})" for k, v in described.items()}


def draw_plot(plot: Plot, runs: list[Run]) -> str | None:
    """A base64 PNG, or None when no run logged any of the plot's metrics."""
    from matplotlib.ticker import MaxNLocator

    series = plot_series(plot, runs)
    if not any(run.has(key) for run in runs for key, _ in series):
        return None
    fig, ax = _figure()
    many = len(runs) > 1
    title, settings = plot_title(plot, runs)
    for r, run in enumerate(runs):
        for s, (key, label) in enumerate(series):
            steps, values = run.series(key)
            if not steps:
                continue
            color = COLORS[(r if many else s) % len(COLORS)]
            style = STYLES[s % len(STYLES)] if many else "-"
            name = _label(f"{run.name}: {label}" if many else label) + settings.get(run.name, "")
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
    ax.set_title(title, fontsize=11)
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
        stacked_per_step(ax, steps, heights, [COLORS[i % len(COLORS)] for i in range(len(stages))], stages)
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


STALENESS_KEY = re.compile(r"async/staleness_(\d+)")  # async/staleness_<k>: the fraction at lag k


def staleness_histogram(run: Run) -> tuple[list[int], dict[int, list[float]]]:
    """(lags 0..K, step -> the fraction of its samples at each lag): the `async/staleness_<k>`
    metrics of asynchronous training (K = trainer.max_staleness); a lag a step did not log is 0."""
    found = [m for key in run.keys() if (m := STALENESS_KEY.fullmatch(key))]
    if not found:
        return [], {}
    lags = list(range(max(int(m.group(1)) for m in found) + 1))
    table: dict[int, list[float]] = {}
    for step in sorted(run.metrics):
        m = run.metrics[step]
        row = [m.get(f"async/staleness_{k}") for k in lags]
        ok = [isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in row]
        if any(ok):
            table[step] = [float(v) if good else 0.0 for v, good in zip(row, ok, strict=True)]
    return (lags, table) if table else ([], {})


def draw_staleness(run: Run, named: bool = False) -> str | None:
    """Stacked bars, one per step, of the fraction of its samples at each lag (0: on-policy),
    titled with the run's name when `named` (a comparison); None when the run logged no
    `async/staleness_<k>`."""
    from matplotlib.ticker import MaxNLocator

    lags, table = staleness_histogram(run)
    if not table:
        return None
    fig, ax = _figure(12.0, 3.6)
    steps = sorted(table)
    heights = [[table[t][k] for t in steps] for k in lags]
    colors = [COLORS[k % len(COLORS)] for k in lags]
    labels = [f"lag {k}" + (" (on-policy)" if k == 0 else "") for k in lags]
    stacked_per_step(ax, steps, heights, colors, labels)
    ax.set_ylim(0.0, 1.03)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("fraction of the step's samples")
    title = "Staleness per step: policy versions behind the learner"
    ax.set_title(f"{_label(run.name)}: {title}" if named else title, fontsize=11)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, ncols=len(lags), loc="upper left", bbox_to_anchor=(0, -0.18))
    return _png(fig)
