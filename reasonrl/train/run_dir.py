"""The run directory, the unit of a run's output, and what may stop a run.

    runs/<name>/config.yaml        the resolved config
               metrics.jsonl       one line per step (tracking)
               samples.jsonl       completions per step (tracking)
               checkpoints/step_N  (reasonrl.checkpoint)
               summary.json        steps, held-out metrics before and after
               report.html         (reasonrl.report)
               run.lock            the lock of the process writing the run (its pid and host)

`RunDir` takes the run's lock (`RunLock`: one writer per run directory), finds the checkpoint
to resume (passing over damaged ones), creates or reopens the folder (a resumed run cuts its
logs back to the checkpoint: a step logged after it is redone, not duplicated), writes and
rotates checkpoints. `StopSignals` turns SIGINT/SIGTERM into a request to stop after the
current step.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from reasonrl import console
from reasonrl.checkpoint import (
    STATE_FILE,
    STEP_DIR,
    check_logs,
    find_resume_point,
    is_good,
    list_checkpoints,
    missing_logs,
    remove_partial,
    resume_target,
    rotate,
    set_aside,
    step_folders,
    storage_error,
    truncate_log,
    verify_checkpoint,
    write_checkpoint,
)
from reasonrl.config import Config, dump_yaml
from reasonrl.errors import ConfigError, NonFiniteWeights, RunLocked, TrainingAborted, TrainingInterrupted

LOGS = ("metrics.jsonl", "samples.jsonl")
LOCK_FILE = "run.lock"


def checkpoint_state(checkpoint: Path) -> dict | None:
    """A checkpoint's trainer_state.json (its step, its run's config, ...), read without its
    weights; None when unreadable (the resume that reads it in full then says why)."""
    try:
        state = json.loads((checkpoint / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


def checkpoint_step(checkpoint: Path) -> int | None:
    """The step a checkpoint was written after, None when its trainer_state.json cannot say."""
    step = (checkpoint_state(checkpoint) or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def planned_steps(run_dir: Path) -> int | None:
    """trainer.steps of the run's resolved config.yaml, None when it cannot be read."""
    import yaml

    try:
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        steps = config["trainer"]["steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def extend_command(run_dir: Path, done: int) -> str:
    """The command that trains a finished run further (its trainer.steps raised past `done`)."""
    return (f"reasonrl train --resume {run_dir} trainer.steps=N --allow-config-change trainer.steps "
            f"(N > {done})")


def run_state(run_dir: Path) -> tuple[str, int | None, int | None]:
    """(what a run folder holds, in words; its newest checkpoint's step; its trainer.steps):
    "finished: step 2 of 2", "stopped at step 1 of 2", or "no checkpoint"."""
    latest = list_checkpoints(run_dir)
    done = checkpoint_step(latest[-1]) if latest else None
    total = planned_steps(run_dir)
    if done is None:
        return "no checkpoint", None, total
    if total is not None and done >= total:
        return f"finished: step {done} of {total}", done, total
    return f"stopped at step {done}" + (f" of {total}" if total is not None else ""), done, total


def existing_run_message(run_dir: Path) -> str:
    """One line for a new run whose folder already holds one: what is there (`run_state`) and
    the ways on: resume (or extend) it, another trainer.run_name, or --overwrite. verl's
    trainer resumes such a folder silently (`trainer.resume_mode: auto`, its default) and TRL
    writes into it (transformers' `output_dir`: checkpoints of two runs mixed); here the user
    chooses."""
    state, done, total = run_state(run_dir)
    if done is None:  # nothing to resume from
        way_on = ""
    elif total is not None and done >= total:
        way_on = f"train it further with `{extend_command(run_dir, done)}`, "
    else:
        way_on = f"continue it with `reasonrl train --resume {run_dir}`, "
    return (f"{run_dir} already holds a run ({state}): {way_on}start another beside it with "
            f"trainer.run_name=NAME, or start this one over with --overwrite (deletes {run_dir})")


def fresh_run_dir(output_dir: Path) -> tuple[Path, RunLock]:
    """A new run's folder when trainer.run_name is empty, and its lock: the start time
    (`YYYYmmdd-HHMMSS`), or `-2`, `-3`, ... after it when a run started in the same second
    already holds (or is taking) that folder. An unnamed run never lands on another's folder:
    two runs started in one second (a script, a test) each get their own."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in itertools.count(1):
        path = Path(output_dir) / (stamp if n == 1 else f"{stamp}-{n}")
        if path.exists() and any(path.iterdir()):
            continue
        try:
            lock = RunLock.take(path)
        except RunLocked:
            continue
        if (path / "metrics.jsonl").exists():  # written between the look and the lock
            lock.release()
            continue
        return path, lock
    raise AssertionError("unreachable")


def clear_run(run_dir: Path) -> None:
    """Delete what a run folder holds (`--overwrite`), all but the lock this process holds."""
    for child in Path(run_dir).iterdir():
        if child.name == LOCK_FILE:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


@contextmanager
def _writing(what: str, path: Path) -> Iterator[None]:
    """An OSError for lack of space or permission while writing `path` becomes a
    `StorageError` naming it."""
    try:
        yield
    except OSError as err:
        problem = storage_error(err, what, path)
        if problem is None:
            raise
        raise problem from err


class RunLock:
    """An exclusive `flock` on `<run>/run.lock`, held while a process writes the run: a second
    trainer on the same run directory is refused (`RunLocked`, naming the holder's pid and
    host, which the file holds). The kernel drops the lock when its process dies, so a lock
    left by a crashed run is taken over; the file is left in place (deleting it would let two
    processes lock two different files)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def take(cls, run_dir: Path) -> RunLock:
        path = Path(run_dir) / LOCK_FILE
        with _writing("the run directory", run_dir):
            Path(run_dir).mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "a process that is starting"
            os.close(fd)
            raise RunLocked(f"{run_dir} is in use by another run ({holder}; lock {path}). Wait for it to "
                            f"end, stop it, or choose another trainer.run_name") from None
        previous = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        if previous:  # a clean release empties the file: its holder died with the lock
            console.warning(f"{path}: taking over the lock left by {previous} (that process has ended)",
                            label="")
        record = (f"pid {os.getpid()} on host {socket.gethostname()}, since "
                  f"{datetime.now().isoformat(timespec='seconds')}\n").encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except OSError as err:
            os.close(fd)
            problem = storage_error(err, "the run directory lock", path)
            if problem is None:
                raise
            raise problem from err
        return cls(path, fd)

    @staticmethod
    def held(run_dir: Path) -> bool:
        """Whether a process holds the run's lock now (asked without taking it: the file is not
        written)."""
        try:
            fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    def __del__(self) -> None:  # a lock its owner forgot is given back when it is collected
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)  # empty: nobody holds it
        except OSError:
            pass
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)
        self.fd = None


@dataclass
class RunDir:
    path: Path | None  # None: a new run, named when it opens
    checkpoint: Path | None  # the checkpoint a resume starts from
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # newer damaged checkpoints
    lock: RunLock | None = None  # from `locate` (resuming a run) or `open` (a new run) to `release`

    @classmethod
    def locate(cls, cfg: Config) -> RunDir:
        """The run `trainer.resume` names (and its newest intact checkpoint, the damaged newer
        ones printed and passed over), or a new run. An existing run's lock is taken first, so
        no other trainer writes (or rotates checkpoints) in it from here on; a new run takes
        its lock in `open`."""
        t = cfg.trainer
        if not t.resume:
            return cls(None, None)
        try:
            path, named = resume_target(t.resume, t.output_dir, t.run_name)
            auto = t.resume == "auto"
            if not path.is_dir():
                if auto:
                    return cls(path, None)  # nothing to resume: a new run
                find_resume_point(path, named, auto)  # raises: nothing there
        except ValueError as err:
            raise ConfigError(str(err)) from err
        run = cls(path, None, lock=RunLock.take(path))
        try:
            run.checkpoint, run.skipped = find_resume_point(path, named, auto)
        except ValueError as err:
            run.release()
            raise ConfigError(str(err)) from err
        except BaseException:
            run.release()
            raise
        for checkpoint, why in run.skipped:
            console.warning(f"passing over damaged checkpoint {checkpoint}: {why}", label="",
                            checkpoint=str(checkpoint))
        if run.skipped:
            console.warning(f"resuming from the newest intact checkpoint, {run.checkpoint}", label="",
                            checkpoint=str(run.checkpoint))
        return run

    def release(self) -> None:
        """Give the run directory's lock back (at the end of the run; again: nothing)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    @staticmethod
    def check_new(cfg: Config, overwrite: bool = False) -> None:
        """Before any model loads: a new run named by trainer.run_name whose folder already holds
        a run is refused (`existing_run_message`) unless `overwrite`. `open` checks again under
        the run's lock."""
        t = cfg.trainer
        path = Path(t.output_dir) / t.run_name
        if not t.resume and t.run_name and (path / "metrics.jsonl").exists() and not overwrite \
                and not RunLock.held(path):  # a run in use: `open`'s lock refuses it, naming the holder
            raise FileExistsError(existing_run_message(path))

    def open(self, cfg: Config, offsets: dict[str, int] | None, overwrite: bool = False) -> Path:
        """The run's folder, ready to log into: reopened at the checkpoint's log `offsets` when
        resuming (damaged newer checkpoints set aside), else new (an `auto` resume with no
        checkpoint starts its run over). A new run's folder that holds a run is refused
        (`existing_run_message`), or with `overwrite` emptied first."""
        if offsets is not None:
            check_logs(self.path, offsets, self.checkpoint)  # a log that lost lines: before anything changes
            for note in missing_logs(self.path, offsets, self.checkpoint, checkpoint_step(self.checkpoint)):
                console.warning(note)  # gone: started afresh
            remove_partial(self.path)
            self.set_aside_newer()
            with _writing("the run's logs in", self.path):
                for name, offset in offsets.items():
                    truncate_log(self.path / name, offset)
        else:
            if self.path is None and not cfg.trainer.run_name:
                self.path, self.lock = fresh_run_dir(Path(cfg.trainer.output_dir))
            elif self.path is None:
                self.path = Path(cfg.trainer.output_dir) / cfg.trainer.run_name
            if self.lock is None:  # before the checks below: two starts cannot both pass them
                self.lock = RunLock.take(self.path)
            if cfg.trainer.resume:  # `auto` with nothing to resume: the run starts over
                if step_folders(self.path):  # unless a run wrote some while this one started
                    raise RunLocked(f"{self.path}: another run saved checkpoints there while this one was "
                                    f"starting; start again to resume from them")
                remove_partial(self.path)
                for name in LOGS:
                    (self.path / name).unlink(missing_ok=True)
            if (self.path / "metrics.jsonl").exists():
                if not overwrite:
                    raise FileExistsError(existing_run_message(self.path))
                state = run_state(self.path)[0]
                clear_run(self.path)
                console.warning(f"--overwrite: deleted the run that was in {self.path} ({state})", label="")
        with _writing("the run directory", self.path):
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "config.yaml").write_text(dump_yaml(cfg))
        return self.path

    def set_aside_newer(self) -> None:
        """Checkpoints newer than the one resumed from are set aside: the damaged ones passed
        over as `step_N.damaged`, intact ones (a resume from an earlier checkpoint named
        explicitly) as `step_N.superseded`; their steps are redone, and a later resume or
        rotation must not take a checkpoint of the abandoned steps (its log offsets are gone)."""
        damaged = {path for path, _ in self.skipped}
        resumed = STEP_DIR.match(self.checkpoint.name)
        for path in step_folders(self.path):
            newer = resumed is not None and int(STEP_DIR.match(path.name).group(1)) > int(resumed.group(1))
            if path in damaged or newer:
                aside = set_aside(path, "damaged" if path in damaged else "superseded")
                console.warning(f"set {path.name} aside as {aside}", label="")
        self.skipped = []

    def log_offsets(self) -> dict[str, int]:
        """The logs' sizes now: where a resume from a checkpoint written now cuts them back to."""
        return {name: (self.path / name).stat().st_size if (self.path / name).exists() else 0
                for name in LOGS}

    def save(self, step: int, policy, tokenizer, state: dict, merged: bool, keep_last: int,
             critic=None, extra: dict | None = None) -> Path:
        """checkpoints/step_N (layout in `reasonrl.checkpoint`), then the oldest beyond
        `keep_last` go (never the newest good one). Call after the step's metrics and samples
        are logged. Non-finite weights end the run (`TrainingAborted`, nothing written)."""
        target = self.path / "checkpoints" / f"step_{step}"
        try:
            write_checkpoint(target, policy, tokenizer, {**state, "step": step,
                                                         "offsets": self.log_offsets()},
                             merged=merged, critic=critic, extra=extra)
        except NonFiniteWeights as err:
            raise TrainingAborted(f"{err}; stopping. Lower optim.lr or check the rewards; the last good "
                                  f"checkpoint is {self.last_good() or 'none'}") from err
        rotate(self.path, keep_last)
        return target

    def latest(self) -> Path | None:
        found = list_checkpoints(self.path)
        return found[-1] if found else None

    def last_good(self) -> Path | None:
        """The newest checkpoint written after a good step (`is_good`) whose manifest verifies."""
        return next((p for p in reversed(list_checkpoints(self.path))
                     if is_good(p) and verify_checkpoint(p) is None), None)

    def write_summary(self, summary: dict) -> None:
        """summary.json, whole or not at all (written beside, then renamed); a full disk is a
        `StorageError` naming it."""
        path, part = self.path / "summary.json", self.path / ".summary.json.part"
        try:
            with _writing("the run's summary", path):
                part.write_text(json.dumps(summary, indent=2))
                os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)

    def log_write_error(self, err: OSError, path: Path, size: int) -> BaseException:
        """What ends a run whose write of `size` bytes to a log (metrics.jsonl, samples.jsonl)
        failed, the log left whole (`tracking.LogFile`): for lack of space or permission a
        `StorageError` saying so and where the run resumes from (the checkpoint's log offsets cut
        the logs back, so a resume is bitwise and nothing is lost), else the OSError itself."""
        latest = self.latest()
        if latest is None:
            where = "no checkpoint was written yet, so the run must start again"
        else:
            where = (f"resume is bitwise from the last checkpoint, {latest}, so nothing is lost: "
                     f"reasonrl train --resume {self.path}")
        hint = f"; {path.name} is left whole (no torn line) and the run stopped: {where}"
        return storage_error(err, "the run's log", path, size, hint) or err

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
        console.warning(f"{self.requested}: finishing {self.describe()}, then saving a checkpoint (send "
                        "it again to stop at once and lose that step)", label="", lead="\n")

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
