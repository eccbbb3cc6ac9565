"""Where a resume starts: the run folder and checkpoint `trainer.resume` names, the newest
intact checkpoint, and the logs cut back to it.

A resume trusts a checkpoint only once its manifest verifies; `auto` passes over damaged ones
to the newest intact one and reports what it passed over. The run's logs are then cut back to
the byte offsets the checkpoint recorded, so a step logged after it is redone, not duplicated.
"""

from __future__ import annotations

from pathlib import Path

from reasonrl.checkpoint.layout import STATE_FILE, STEP_DIR, step_folders
from reasonrl.checkpoint.manifest import verify_checkpoint
from reasonrl.errors import CheckpointError


def resume_target(resume: str, output_dir: str, run_name: str) -> tuple[Path, Path | None]:
    """(run folder, the checkpoint `trainer.resume` names, or None for the newest intact one).

    `auto` is output_dir/run_name; a `checkpoints/step_N` folder (or any folder holding a
    trainer_state.json) names a checkpoint; any other path is a run folder."""
    if resume == "auto":
        if not run_name:
            raise ValueError("trainer.resume=auto needs trainer.run_name (the run to continue)")
        return Path(output_dir) / run_name, None
    path = Path(resume)
    if (path / STATE_FILE).is_file() or (STEP_DIR.match(path.name) and path.parent.name == "checkpoints"):
        return path.parent.parent, path
    return path, None


def find_resume_point(run_dir: Path, named: Path | None,
                      auto: bool) -> tuple[Path | None, list[tuple[Path, str]]]:
    """(checkpoint to resume from, [(newer checkpoint passed over, what is wrong with it)]).

    A `named` checkpoint must verify (`CheckpointError` otherwise, naming the file). Else the
    newest `step_N` of `run_dir` whose manifest verifies: damaged ones are passed over;
    none intact is a `CheckpointError`; no checkpoint at all is a new run for `auto` (None),
    a ValueError for a run folder."""
    if named is not None:
        if not named.is_dir():
            raise ValueError(f"trainer.resume: {named} is not a checkpoint folder")
        if (problem := verify_checkpoint(named)) is not None:
            raise CheckpointError(f"checkpoint {named} cannot be resumed: {problem}. Resume from an earlier "
                                  f"checkpoint in {named.parent}, or with --resume {named.parent.parent} "
                                  f"(the newest intact one)")
        return named, []
    skipped: list[tuple[Path, str]] = []
    for path in reversed(step_folders(run_dir)):
        if (problem := verify_checkpoint(path)) is None:
            return path, skipped
        skipped.append((path, problem))
    if skipped:
        listed = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise CheckpointError(f"{run_dir} holds no intact checkpoint ({listed}). Move "
                              f"{run_dir / 'checkpoints'} aside to start the run over")
    if auto:
        return None, []
    raise ValueError(f"trainer.resume: {run_dir} holds no complete checkpoint "
                     f"(expected {run_dir}/checkpoints/step_N/{STATE_FILE})")


def check_logs(run_dir: Path, offsets: dict[str, int], checkpoint: Path | None = None) -> None:
    """Before a resume changes anything: every log of `offsets` ({file name: its size when the
    checkpoint was written}) is at least that long. A shorter one lost lines the checkpoint
    counts on (cut or replaced since): a `CheckpointError` naming both sizes and the two ways
    on (restore the file, or move it aside: a missing log is started afresh after the resumed
    step, `truncate_log`, and said so, `missing_logs`)."""
    for name, offset in offsets.items():
        path = Path(run_dir) / name
        size = path.stat().st_size if path.exists() else offset
        if size < offset:
            at = f"checkpoint {checkpoint} was" if checkpoint is not None else "the checkpoint was"
            raise CheckpointError(
                f"cannot resume: {path} is shorter ({size} bytes) than when {at} written ({offset} bytes), "
                f"so some of its lines up to that step are gone (the file was cut or replaced since). "
                f"Restore it from a copy, or move it aside (mv {path} {path}.old) to resume with a {name} "
                f"that starts after that step")


def missing_logs(run_dir: Path, offsets: dict[str, int], checkpoint: Path | None = None,
                 step: int | None = None) -> list[str]:
    """One line for each log of `offsets` that is gone though it held lines when the checkpoint
    (of `step`) was written: deleted, or moved aside as `check_logs` suggests for a cut one. A
    resume goes on with it (`truncate_log` leaves it missing; the run writes a new one that
    starts after that step), but not silently: the run's log then lacks every earlier row, and
    a deletion the user did not mean is seen while the file can still be put back. A log that
    is there but shorter is `check_logs`' refusal: it lost lines, which nothing made plain."""
    notes = []
    at = f"checkpoint {checkpoint} was" if checkpoint is not None else "the checkpoint was"
    after = f"step {step}" if step is not None else "that step"
    for name, offset in offsets.items():
        path = Path(run_dir) / name
        if offset > 0 and not path.exists():
            notes.append(f"{path} is missing: it held {offset} bytes when {at} written, 0 are there now. "
                         f"The run goes on and writes a new {name} that starts after {after}, without "
                         f"the earlier rows; to keep them, stop the run, put the file back and resume again")
    return notes


def truncate_log(path: Path, offset: int) -> None:
    """Cut a JSONL log back to `offset` bytes: lines of steps after the checkpoint go (a missing
    log stays missing: it starts afresh). Shorter than `offset`: `check_logs`' error."""
    if path.exists():
        check_logs(path.parent, {path.name: offset})
        with open(path, "r+b") as fh:
            fh.truncate(offset)
