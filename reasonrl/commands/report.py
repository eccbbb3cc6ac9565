"""`reasonrl report RUN [RUN ...] [-o report.html]`: one run's report.html, or several runs'
curves overlaid (`reasonrl.report.write_report`)."""

from __future__ import annotations

import argparse

from reasonrl import console


def add_parser(sub) -> None:
    """The `report` subcommand of the CLI's parser."""
    p = sub.add_parser(
        "report", help="write report.html (curves, timings, samples, config) for runs",
        description="One self-contained HTML file (plots inlined, no network needed) from run "
                    "directories: training curves, seconds per stage per step, held-out results, "
                    "completions at the first, middle and last step, and the resolved config. "
                    "One run: RUN/report.html (also written at the end of training); several: "
                    "their curves overlaid, in compare-A-vs-B.html beside the first run.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (with metrics.jsonl)")
    p.add_argument("-o", "--output", help="where to write the HTML file")
    p.set_defaults(func=report_command)


def report_command(args: argparse.Namespace) -> int:
    from reasonrl.report import write_report

    path = write_report(args.runs, args.output)
    console.info(f"wrote {path}", path=str(path))
    return 0
