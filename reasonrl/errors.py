"""Every error reasonrl raises on purpose, in one place at the bottom of the package.

Each names what the user can act on: the config key, the file and line, the worker, the
extra to install. The command line turns them into one line and exit code 2 (a user
error), never a traceback.
"""

from __future__ import annotations

from pathlib import Path


class ReasonRLError(Exception):
    """Base of the errors below that name a file or a resource, not a config key or data
    line: a damaged checkpoint, a run directory in use, a full disk."""


class CheckpointError(ReasonRLError):
    """A checkpoint that cannot be trusted or read (its manifest disagrees, a file is
    truncated or unreadable, its weights are not finite); the message names the file."""


class NonFiniteWeights(CheckpointError):
    """Weights with NaN or inf values, refused as a checkpoint (written or loaded)."""


class RunLocked(ReasonRLError):
    """Another process holds the run directory's lock; the message names it (pid, host)."""


class StorageError(ReasonRLError):
    """A checkpoint or the run directory could not be written for lack of space or
    permission; the message names the path, and for space the bytes needed and free."""


class ConfigError(ValueError):
    """A bad key or value in the configuration; the message names the key path."""


class DataError(ValueError):
    """Bad task data; the message names the file, line and field."""


class PromptTooLong(DataError):
    """A prompt longer than data.max_prompt_tokens: `where` (file:line) and its `tokens`."""

    def __init__(self, message: str, where: str, tokens: int):
        super().__init__(message)
        self.where, self.tokens = where, tokens


class GroundTruthError(ValueError):
    """A ground truth a verifier cannot read: a data bug, not a model error.

    A subclass of ValueError so reward scoring can let it through while still catching (and
    counting) every other exception a reward component raises.
    """


class ModelLoadError(RuntimeError):
    """A model could not be found or loaded; the message says what to do."""


class MissingExtraError(ImportError):
    """A selected option whose optional dependency (a pip extra) is not installed."""


class WeightSyncError(RuntimeError):
    """The rollout engine does not serve the policy's weights after a push."""


class ProducerError(RuntimeError):
    """The rollout process of asynchronous training (trainer.max_staleness > 0) failed or exited;
    the message holds its traceback."""


class PlacementError(RuntimeError):
    """A worker could not be placed, or did not answer in time; the message names the
    worker, what it was doing and the resources it asks for."""


class ReportError(ValueError):
    """A folder that is not a run directory, or a report that cannot be written."""


class SandboxError(RuntimeError):
    """Tool code cannot be run in the sandbox asked for (bubblewrap missing or refused, no
    interpreter the unprivileged user can run); the message says what to install or set."""


class TrainingAborted(RuntimeError):
    """Training cannot usefully continue (e.g. the loss keeps being non-finite)."""


class TrainingInterrupted(Exception):
    """SIGINT / SIGTERM stopped the run; `checkpoint` is where it can resume from (or None)."""

    def __init__(self, signal_name: str, run_dir: Path, checkpoint: Path | None, step: int,
                 exit_code: int):
        self.signal_name, self.run_dir, self.checkpoint = signal_name, run_dir, checkpoint
        self.step, self.exit_code = step, exit_code
        if checkpoint is None:
            where = "no checkpoint was written yet; the run must start again"
        else:
            where = (f"checkpoint {checkpoint}; resume with: "
                     f"reasonrl train --resume {run_dir}")
        super().__init__(f"stopped by {signal_name} after step {step}: {where}")


class WorkerTimeout(RuntimeError):
    """A call to an isolated worker (a judge in its own process or actor) ran past its deadline:
    the worker was killed (or interrupted), and the next call goes to a fresh one."""


class WorkerCallError(RuntimeError):
    """A call to an isolated worker raised there (or the worker died); the message is what it
    raised, as one line ("RuntimeError: ...")."""
