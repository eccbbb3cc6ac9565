"""Run outputs: metrics.jsonl and samples.jsonl (always), the console progress bar, and
TensorBoard / Weights & Biases when `tracking.backends` names them.

`progress_bar` is the one console bar (training's steps, the evaluations' samples), and
`ticking` keeps its elapsed time moving while one long call (a batch's generation) runs.

Every backend receives the same metric names, namespaced by stage (`rollout/`, `reward/`,
`advantage/`, `train/`, `eval/`, `time/`), so a curve is called the same in metrics.jsonl,
TensorBoard, WandB and `report.html`. TensorBoard and WandB are optional extras: they are
imported only when selected, and a missing one is reported by `missing_extra` at start-up.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reasonrl.errors import MissingExtraError

if TYPE_CHECKING:
    from reasonrl.config import TrackingConfig, WandbConfig

# backend -> (module that must be importable, pip extra that installs it)
EXTRAS = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def missing_extra(backend: str) -> str | None:
    """None when `backend` can run here, else one line naming the extra to install."""
    if backend not in EXTRAS:
        return None
    module, extra = EXTRAS[backend]
    if importlib.util.find_spec(module) is None:
        return (f"the {backend} backend needs the optional extra: pip install 'reasonrl[{extra}]' "
                f"(or remove {backend} from tracking.backends)")
    return None


def _require(backend: str) -> None:
    problem = missing_extra(backend)
    if problem is not None:
        raise MissingExtraError(problem)


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; null keeps the line valid
    return value


def _number(value: Any) -> float | None:
    """A finite float, or None for anything a scalar plot cannot show."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


# what a failed log write becomes: (the OSError, the log's path, the bytes it was writing) -> the
# exception that ends the run (the trainer words it as a StorageError naming where to resume from)
WriteError = Callable[[OSError, Path, int], BaseException]


class LogFile:
    """An append-only JSONL file whose every line is whole: a line is written with os.write (no
    buffer that a later flush could half-write) and a write that fails (a full disk, a quota, a
    lost permission) is cut back to where the file ended before it, so no torn line is left,
    then ends the run with `write_error`'s exception (default: the OSError itself)."""

    def __init__(self, path: Path, write_error: WriteError | None = None):
        self.path, self.write_error = Path(path), write_error
        self.fd: int | None = None
        try:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as err:
            raise self._failure(err, 0) from err

    def _failure(self, err: OSError, size: int) -> BaseException:
        return err if self.write_error is None else self.write_error(err, self.path, size)

    def append(self, text: str) -> None:
        """Write `text` (whole lines) at the end of the file: all of it, or nothing."""
        data = text.encode("utf-8")
        start = os.lseek(self.fd, 0, os.SEEK_END)  # one writer per run directory (its lock)
        try:
            left = memoryview(data)
            while left:
                left = left[os.write(self.fd, left):]
        except OSError as err:
            try:
                os.ftruncate(self.fd, start)  # frees what was written: works on a full disk too
            except OSError:
                pass  # a resume cuts the log back to its checkpoint's offset all the same
            raise self._failure(err, len(data)) from err

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class JsonlBackend:
    """metrics.jsonl (one line per step) and samples.jsonl (one line per logged completion), each
    line whole or absent (`LogFile`)."""

    def __init__(self, run_dir: Path, write_error: WriteError | None = None):
        self.metrics_file = LogFile(run_dir / "metrics.jsonl", write_error)
        try:
            self.samples_file = LogFile(run_dir / "samples.jsonl", write_error)
        except BaseException:
            self.metrics_file.close()
            raise

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        self.metrics_file.append(json.dumps(record) + "\n")

    def samples(self, step: int, rows: list[dict]) -> None:
        if rows:  # a step's rows in one write: all of them or none
            self.samples_file.append("".join(json.dumps({"step": step, **row}) + "\n" for row in rows))

    def close(self) -> None:
        self.metrics_file.close()
        self.samples_file.close()


class TensorBoardBackend:
    """Scalars under their metric names (TensorBoard groups them by the prefix before `/`)
    and the logged completions as text, via `torch.utils.tensorboard`."""

    def __init__(self, log_dir: Path):
        _require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            number = _number(value)
            if number is not None:
                self.writer.add_scalar(name, number, global_step=step)
        self.writer.flush()

    def samples(self, step: int, rows: list[dict]) -> None:
        if not rows:
            return
        # Indented blocks render verbatim in TensorBoard's markdown: model output stays text.
        parts = []
        for row in rows:
            body = (f"prompt: {row.get('prompt', '')}\nground truth: {row.get('ground_truth', '')}\n"
                    f"completion: {row.get('completion', '')}")
            parts.append(f"**reward {row.get('reward', float('nan')):.3f}**\n\n"
                         + "\n".join("    " + line for line in body.splitlines()))
        self.writer.add_text("samples", "\n\n".join(parts), global_step=step)

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """`wandb.log(metrics, step=step)` with the same names; the logged completions go into
    one `samples` table at the end. `mode=offline` needs no network: the run is written
    under <run>/wandb/ and can be uploaded later with `wandb sync`."""

    def __init__(self, run_dir: Path, settings: WandbConfig, config: dict | None):
        _require("wandb")
        import wandb

        self.wandb = wandb
        id_file = run_dir / "wandb_run_id"  # a resumed run continues the same WandB run
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:8]
        id_file.write_text(run_id + "\n")
        self.run = wandb.init(
            project=settings.project, entity=settings.entity or None,
            name=settings.name or run_dir.name, group=settings.group or None,
            tags=settings.tags or None, mode=settings.mode, dir=str(run_dir), config=config,
            id=run_id, resume="allow")
        self.rows: list[list] = []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: v for k, v in metrics.items() if _number(v) is not None}, step=step)

    def samples(self, step: int, rows: list[dict]) -> None:
        for row in rows:
            self.rows.append([step, str(row.get("prompt", "")), str(row.get("ground_truth", "")),
                              str(row.get("completion", "")), row.get("reward")])

    def close(self) -> None:
        if self.rows:
            table = self.wandb.Table(columns=["step", "prompt", "ground_truth", "completion", "reward"],
                                     data=self.rows)
            self.run.log({"samples": table})
        self.run.finish()


def progress_bar(total: int, desc: str, unit: str, enabled: bool = True, initial: int = 0,
                 leave: bool = True):
    """The console's progress bar (tqdm on stderr, as wide as the terminal): training's steps
    and the evaluations' samples look alike. `enabled` False: a bar that prints nothing."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stderr,
                disable=not enabled, leave=leave)


@contextmanager
def ticking(bar, interval: float = 1.0) -> Iterator[None]:
    """Within the block, redraw `bar` every `interval` seconds from a daemon thread, so that its
    elapsed time moves while one long call runs (tqdm redraws only on an update, and the first
    update of an evaluation may come minutes later, after its first batch). Nothing for a
    disabled bar."""
    if getattr(bar, "disable", True):
        yield
        return
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(interval):
            bar.refresh()

    thread = threading.Thread(target=tick, name="progress-ticker", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def counted(n: float, noun: str) -> str:
    """`1 step`, `2 steps`: a count with its noun in the right number (nouns that take an -s)."""
    return f"{n:g} {noun}" if n == 1 else f"{n:g} {noun}s"


class Tracker:
    """Fans each step's metrics and sample completions out to the selected backends and
    keeps a tqdm bar current. metrics.jsonl / samples.jsonl are always written (the report
    is built from them); `tracking.backends` adds console, tensorboard and wandb. A write to
    those two that fails leaves them whole and raises `write_error`'s exception (`LogFile`)."""

    def __init__(self, run_dir: Path, total_steps: int, progress: bool = True, start_step: int = 0,
                 *, tracking: TrackingConfig | None = None, config: dict | None = None,
                 write_error: WriteError | None = None):
        from reasonrl.config import TrackingConfig

        tracking = tracking if tracking is not None else TrackingConfig()
        self.run_dir = Path(run_dir)
        self.jsonl = JsonlBackend(self.run_dir, write_error)
        self.metrics_file, self.samples_file = self.jsonl.metrics_file, self.jsonl.samples_file
        self.backends: list[Any] = [self.jsonl]
        try:
            if "tensorboard" in tracking.backends:
                self.backends.append(TensorBoardBackend(
                    Path(tracking.tensorboard_dir) if tracking.tensorboard_dir
                    else self.run_dir / "tensorboard"))
            if "wandb" in tracking.backends:
                self.backends.append(WandbBackend(self.run_dir, tracking.wandb, config))
        except BaseException:
            self._close_backends(quiet=True)
            raise
        self.bar = None
        if progress and "console" in tracking.backends:
            self.bar = progress_bar(total_steps, "train", "step", initial=start_step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for backend in self.backends:
            backend.log(step, metrics)

    def samples(self, step: int, rows: list[dict]) -> None:
        for backend in self.backends:
            backend.samples(step, rows)

    def progress(self, metrics: dict[str, float]) -> None:
        if self.bar is None:
            return
        shown = {"reward": metrics.get("reward/mean"), "acc": metrics.get("reward/accuracy"),
                 "loss": metrics.get("sft/loss"), "s/step": metrics.get("time/step")}
        self.bar.set_postfix({k: f"{v:.3f}" if k != "s/step" else f"{v:.1f}"
                              for k, v in shown.items() if v is not None}, refresh=False)
        self.bar.update(1)

    def write(self, text: str) -> None:
        """Print a line without breaking the progress bar."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def _close_backends(self, quiet: bool = False) -> None:
        errors = []
        for backend in self.backends:  # one failing backend must not leave the others open
            try:
                backend.close()
            except Exception as err:
                errors.append(err)
        self.backends = []
        if errors and not quiet:
            raise errors[0]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._close_backends()
