"""`reasonrl report`: one self-contained report.html for a run, or overlaying several.

Everything comes from the run directory (metrics.jsonl, samples.jsonl, config.yaml,
summary.json): the curves of training, the seconds each stage took per step, held-out
results, asynchronous training's staleness and idle times (runs that logged `async/`), sample
completions at the first, middle and last step, and the resolved config.
Plots are drawn with matplotlib (Agg, no display) and inlined as base64 PNGs, so the file
opens anywhere with no network. Every string read from a run is HTML-escaped: completions
are model output.

One module per job, each using only those above it:

    load.py     a run directory read back (`Run`, `load_run`)
    plots.py    the plots (`PLOTS`, `CRITIC_PLOTS`, `DISTILL_PLOTS`, `SFT_PLOTS`, `STAGES`, the
                staleness histogram) drawn as PNGs
    tables.py   the numbers: summary, held-out evaluations, asynchronous training, sample steps,
                config differences
    page.py     the HTML page (`render_html`): everything escaped and inlined
    command.py  `write_report` (`reasonrl report`) and the end-of-training `report_after_training`
"""

from reasonrl.report.command import default_output, report_after_training, write_report
from reasonrl.report.load import Run, eval_description, load_run
from reasonrl.report.page import _samples_html, render_html
from reasonrl.report.plots import (
    CRITIC_PLOTS,
    DISTILL_PLOTS,
    PLOTS,
    STAGES,
    Plot,
    draw_plot,
    draw_staleness,
    draw_time,
    plot_title,
    stage_seconds,
    staleness_histogram,
)
from reasonrl.report.tables import (
    async_numbers,
    async_rows,
    config_differences,
    eval_table,
    sample_steps,
    summary_rows,
)

__all__ = [
    "CRITIC_PLOTS", "DISTILL_PLOTS", "PLOTS", "STAGES", "Plot", "Run", "_samples_html", "async_numbers",
    "async_rows", "config_differences", "default_output", "draw_plot", "draw_staleness", "draw_time",
    "eval_description", "eval_table", "load_run", "plot_title", "render_html", "report_after_training",
    "sample_steps", "staleness_histogram", "stage_seconds", "summary_rows", "write_report",
]
