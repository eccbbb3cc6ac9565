"""The run directory, the unit of a run's output, and what may stop a run.

    runs/<name>/config.yaml        the resolved config
               metrics.jsonl       one line per step (tracking)
               samples.jsonl       completions per step (tracking)
               checkpoints/step_N  (reasonrl.checkpoint)
               summary.json        steps, held-out metrics before and after
               report.html         (reasonrl.report)

`RunDir` finds the run to resume, creates or reopens the folder (a resumed run cuts its logs
back to the checkpoint: a step logged after it is redone, not duplicated), writes and rotates
checkpoints. `StopSignals` turns SIGINT/SIGTERM into a request to stop after the current step.
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from reasonrl.checkpoint import (
    find_resume_point,
    list_checkpoints,
    remove_partial,
    rotate,
    truncate_log,
    write_checkpoint,
)
from reasonrl.config import Config, dump_yaml
from reasonrl.errors import ConfigError, TrainingInterrupted

LOGS = ("metrics.jsonl", "samples.jsonl")


@dataclass
class RunDir:
    path: Path | None  # None: a new run, named when it opens
    checkpoint: Path | None  # the checkpoint a resume starts from

    @classmethod
    def locate(cls, cfg: Config) -> RunDir:
        """The run `trainer.resume` names (and its newest checkpoint), or a new run."""
        t = cfg.trainer
        if not t.resume:
            return cls(None, None)
        try:
            return cls(*find_resume_point(t.resume, t.output_dir, t.run_name))
        except ValueError as err:
            raise ConfigError(str(err)) from err

    def open(self, cfg: Config, offsets: dict[str, int] | None) -> Path:
        """The run's folder, ready to log into: reopened at the checkpoint's log `offsets` when
        resuming, else new (an `auto` resume with no checkpoint starts its run over)."""
        if offsets is not None:
            remove_partial(self.path)
            for name, offset in offsets.items():
                truncate_log(self.path / name, offset)
        else:
            if self.path is not None:
                remove_partial(self.path)
                for name in LOGS:
                    (self.path / name).unlink(missing_ok=True)
            name = cfg.trainer.run_name or datetime.now().strftime("%Y%m%d-%H%M%S")
            self.path = Path(cfg.trainer.output_dir) / name
            if (self.path / "metrics.jsonl").exists():
                raise FileExistsError(f"{self.path} already holds a run; choose another trainer.run_name")
            self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "config.yaml").write_text(dump_yaml(cfg))
        return self.path

    def log_offsets(self) -> dict[str, int]:
        """The logs' sizes now: where a resume from a checkpoint written now cuts them back to."""
        return {name: (self.path / name).stat().st_size if (self.path / name).exists() else 0
                for name in LOGS}

    def save(self, step: int, policy, tokenizer, state: dict, merged: bool, keep_last: int,
             critic=None) -> Path:
        """checkpoints/step_N (layout in `reasonrl.checkpoint`), then the oldest beyond
        `keep_last` go. Call after the step's metrics and samples are logged."""
        target = self.path / "checkpoints" / f"step_{step}"
        write_checkpoint(target, policy, tokenizer, {**state, "step": step, "offsets": self.log_offsets()},
                         merged=merged, critic=critic)
        rotate(self.path, keep_last)
        return target

    def latest(self) -> Path | None:
        found = list_checkpoints(self.path)
        return found[-1] if found else None

    def write_summary(self, summary: dict) -> None:
        (self.path / "summary.json").write_text(json.dumps(summary, indent=2))

    def interrupted(self, signal_name: str, step: int | None = None) -> TrainingInterrupted:
        """The exception that ends a stopped run: where it can resume from. `step` None: the
        step in progress was lost, the run resumes from its newest checkpoint."""
        latest = self.latest()
        if step is None:
            step = int(latest.name.split("_")[1]) if latest is not None else 0
        code = 128 + signal.Signals[signal_name].value
        return TrainingInterrupted(signal_name, self.path, latest, step, code)


class StopSignals:
    """Within the block, SIGINT / SIGTERM set `requested` (the loop finishes its step, saves a
    checkpoint and stops); a second signal raises KeyboardInterrupt at once. Outside the main
    thread signals are left alone."""

    def __init__(self, describe=lambda: "the current step"):
        self.requested: str | None = None
        self.describe = describe
        self.handlers: dict = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:  # asked twice: abandon the step now
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        print(f"\n[reasonrl] {self.requested}: finishing {self.describe()}, then saving a checkpoint (send "
              "it again to stop at once and lose that step)", file=sys.stderr, flush=True)

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.handlers[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                break
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.handlers.items():
            signal.signal(sig, handler)
