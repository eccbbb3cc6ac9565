"""The report as one HTML page: summary, plots, asynchronous training (runs that logged it),
held-out evaluation, samples, config.

Everything is inlined (the CSS, the plots as base64 PNGs), so the file opens anywhere with no
network. Every string read from a run is HTML-escaped here, where it is placed: completions
are model output.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from reasonrl.report.load import Run
from reasonrl.report.plots import (
    CRITIC_PLOTS,
    DISTILL_PLOTS,
    PLOTS,
    SFT_PLOTS,
    STAGES,
    Plot,
    draw_plot,
    draw_staleness,
    draw_time,
    plot_series,
    plot_title,
    staleness_histogram,
)
from reasonrl.report.tables import async_rows, config_differences, eval_table, fmt, sample_steps, summary_rows

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
    keys = [k for k, _ in plot_series(plot, runs)]
    title = plot_title(plot, runs)[0]
    attrs = f'class="plot" id="plot-{plot.id}" data-metrics="{_e(",".join(keys))}"'
    if image is None:
        hint = f"<small>{_e(plot.hint)}</small>" if plot.hint else ""
        return (f'<figure {attrs} data-logged="false"><div class="not-logged"><b>{_e(title)}</b>'
                f'<span>not logged</span>{hint}</div><figcaption>{_e(", ".join(keys))}: '
                f'not in metrics.jsonl</figcaption></figure>')
    absent = [run.name for run in runs if not any(run.has(k) for k in keys)]
    note = f"; not logged in {_e(', '.join(absent))}" if absent else ""
    note += f" &middot; {_e(plot.note)}" if plot.note else ""
    return (f'<figure {attrs} data-logged="true"><img alt="{_e(title)}" '
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


def _async_html(runs: list[Run]) -> str:
    """The asynchronous-training section: its table (a column per run) and, per run that
    logged it, the per-step staleness histogram."""
    tables = [async_rows(run) for run in runs]
    head = "".join(f"<th>{_e(run.name)}</th>" for run in runs)
    body = "".join(f"<tr><th>{_e(label)}</th>"
                   + "".join(f'<td class="num">{_e(t[i][1])}</td>' for t in tables) + "</tr>"
                   for i, (label, _) in enumerate(tables[0]))
    figures = []
    shown = [run for run in runs if run.has("async/staleness")]
    for i, run in enumerate(shown):
        lags = staleness_histogram(run)[0]
        keys = (f"async/staleness_0 .. async/staleness_{lags[-1]}" if lags
                else "async/staleness_0 .. async/staleness_K")
        attrs = (f'class="plot wide" id="plot-staleness{"" if len(shown) == 1 else f"-{i + 1}"}" '
                 f'data-run="{_e(run.name)}"')
        image = draw_staleness(run, named=len(runs) > 1)
        if image is None:
            figures.append(f'<figure {attrs} data-logged="false"><div class="not-logged"><b>Staleness per '
                           f'step{_e(f" ({run.name})" if len(runs) > 1 else "")}</b><span>not logged</span>'
                           f"</div><figcaption>{keys}: not in metrics.jsonl</figcaption></figure>")
            continue
        figures.append(f'<figure {attrs} data-logged="true"><img alt="Staleness per step" '
                       f'src="data:image/png;base64,{image}"><figcaption>{keys}: the fraction of the '
                       "step's samples generated by the policy k versions before the one it trains "
                       "(lag 0: on-policy)</figcaption></figure>")
    return (f'<table id="async-table"><tr><th></th>{head}</tr>{body}</table>'
            '<p class="meta">The batches are generated in a process of their own: the time/rollout and '
            "time/reward of the seconds-per-stage plot were spent there, beside the learner's step, "
            "which waited async/wait for its batch.</p>"
            f'<div class="grid">{"".join(figures)}</div>')


def _eval_html(run: Run) -> str:
    columns, rows = eval_table(run)
    parts = []
    if rows:
        head = "".join(f"<th>{_e(c.removeprefix('eval/'))}</th>" for c in columns)
        body = "".join("<tr><td class=\"num\">" + str(t) + "</td>"
                       + "".join(f'<td class="num">{_e(fmt(m.get(c)))}</td>' for c in columns)
                       + "</tr>" for t, m in rows)
        parts.append(f'<div class="scroll"><table class="eval"><tr><th>step</th>{head}</tr>{body}'
                     "</table></div>")
    if run.summary:
        before, after = run.summary.get("eval_before") or {}, run.summary.get("eval_after") or {}
        keys = [k for k in dict.fromkeys([*before, *after]) if k.startswith("eval/")]
        if keys:
            body = "".join(f"<tr><th>{_e(k)}</th><td class=\"num\">{_e(fmt(before.get(k)))}</td>"
                           f"<td class=\"num\">{_e(fmt(after.get(k)))}</td></tr>" for k in keys)
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
            comp = ", ".join(f"{k}={fmt(v)}" for k, v in components.items()) \
                if isinstance(components, dict) else str(components)
            if s.get("reward_error"):  # the reward function failed on this sample (scored 0)
                comp += f" (reward failed: {s['reward_error']})"
            body += ("<tr>"
                     f'<td><div class="text">{_e(s.get("prompt", ""))}</div></td>'
                     f'<td>{_e(s.get("ground_truth", ""))}</td>'
                     f'<td>{_completion_html(s)}</td>'
                     f'<td class="num">{_e(fmt(s.get("reward")))}</td>'
                     f"<td>{_e(comp)}</td>"
                     f'<td class="num">{_e(fmt(s.get("advantage")))}</td>'
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
    asynchronous = any(run.has("async/staleness") for run in runs)
    sections = [
        f"<h1>{_e(title)}</h1>",
        f'<p class="meta">{paths} &middot; generated {generated} by reasonrl report</p>',
        '<nav><a href="#summary">summary</a><a href="#plots">plots</a>'
        + ('<a href="#async">asynchronous training</a>' if asynchronous else "")
        + '<a href="#eval">held-out eval</a><a href="#samples">samples</a><a href="#config">config</a></nav>',
        f'<h2 id="summary">Summary</h2>{_summary_html(runs)}',
        f'<h2 id="plots">Training curves</h2><div class="grid">{plots}</div>',
        *([f'<h2 id="critic">Critic</h2><div class="grid">'
           f'{"".join(_plot_figure(p, runs) for p in CRITIC_PLOTS)}</div>']
          if any(run.has("critic/vf_loss") for run in runs) else []),
        *([f'<h2 id="distill">Distillation</h2><div class="grid">'
           f'{"".join(_plot_figure(p, runs) for p in DISTILL_PLOTS)}</div>']
          if any(run.has("distill/reverse_kl") for run in runs) else []),
        *([f'<h2 id="sft">Supervised fine-tuning</h2><div class="grid">'
           f'{"".join(_plot_figure(p, runs) for p in SFT_PLOTS)}</div>']
          if any(run.has("sft/loss") for run in runs) else []),
        *([f'<h2 id="async">Asynchronous training</h2>{_async_html(runs)}'] if asynchronous else []),
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
