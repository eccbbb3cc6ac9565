"""The entry points: `reasonrl report RUN [RUN ...] [-o FILE]` and the report the trainer writes
at the end of a run.

Where the file goes, and that it is replaced atomically; at the end of training a failed
report is a warning, never a lost run.
"""

from __future__ import annotations

import os
from pathlib import Path

from reasonrl import console
from reasonrl.errors import ReportError
from reasonrl.report.load import load_run
from reasonrl.report.page import render_html


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
        console.warning(f"report.html not written ({type(err).__name__}: {err}); "
                        f"retry with `reasonrl report {run_dir}`")
        return None
