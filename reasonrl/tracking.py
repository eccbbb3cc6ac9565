"""Run outputs: metrics.jsonl, samples.jsonl and the console progress bar."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null keeps the line valid
    return value


class Tracker:
    """Appends one JSON line per step to metrics.jsonl and keeps a tqdm bar current."""

    def __init__(self, run_dir: Path, total_steps: int, progress: bool = True, start_step: int = 0):
        self.run_dir = Path(run_dir)
        self.metrics_file = (self.run_dir / "metrics.jsonl").open("a", encoding="utf-8")
        self.samples_file = (self.run_dir / "samples.jsonl").open("a", encoding="utf-8")
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                            dynamic_ncols=True, file=sys.stderr)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self.metrics_file.write(json.dumps(record) + "\n")
        self.metrics_file.flush()

    def samples(self, step: int, rows: list[dict]) -> None:
        for row in rows:
            self.samples_file.write(json.dumps({"step": step, **row}) + "\n")
        self.samples_file.flush()

    def progress(self, metrics: dict[str, float]) -> None:
        if self.bar is None:
            return
        shown = {"reward": metrics.get("reward/mean"), "acc": metrics.get("reward/accuracy"),
                 "s/step": metrics.get("time/step")}
        self.bar.set_postfix({k: f"{v:.3f}" if k != "s/step" else f"{v:.1f}"
                              for k, v in shown.items() if v is not None}, refresh=False)
        self.bar.update(1)

    def write(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.metrics_file.close()
        self.samples_file.close()
