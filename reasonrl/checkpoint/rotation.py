"""Which checkpoints a run keeps: the newest `keep_last`, and always the last good one.

A checkpoint written after a bad step (a non-finite update: `bad_steps` > 0 in its trainer
state) counts among the newest, but never pushes out the newest good one: that is the
checkpoint a run aborted after bad steps names to go back to. Checkpoints a resume passes
over (damaged, or newer than the one resumed) are set aside under another name, not deleted.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from reasonrl.checkpoint.layout import MANIFEST, STATE_FILE, list_checkpoints
from reasonrl.errors import CheckpointError


def is_good(path: Path) -> bool:
    """A checkpoint (by its manifest's presence, not its checksums) written after a step that
    was not bad: `bad_steps` 0 in its trainer_state.json."""
    path = Path(path)
    try:
        return (path / MANIFEST).is_file() and json.loads((path / STATE_FILE).read_text())["bad_steps"] == 0
    except (OSError, ValueError, KeyError, TypeError):
        return False


def rotate(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (0 keeps all) and the newest
    good one (`is_good`): steps with a non-finite update never push out the last good one."""
    if keep_last > 0:
        found = list_checkpoints(run_dir)
        keep = set(found[-keep_last:])
        keep.update(next(([p] for p in reversed(found) if is_good(p)), []))
        for old in found:
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)


def set_aside(path: Path, label: str) -> Path:
    """Rename a checkpoint to `step_N.<label>` (`.<label>.2`, ...): kept for a look, out of
    resumes and rotation."""
    for i in range(1, 1000):
        aside = path.with_name(f"{path.name}.{label}" + (f".{i}" if i > 1 else ""))
        if not aside.exists():
            os.rename(path, aside)
            return aside
    raise CheckpointError(f"{path}: too many {label} copies beside it")
