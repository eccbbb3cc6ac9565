"""A failed write, told apart: lack of space or of permission becomes a `StorageError` naming
the path, the bytes needed and the bytes free.

Checkpoints are the largest writes of a run, but the run directory's other files (its lock,
config, logs) fail the same ways, so `reasonrl.train.run_dir` words those failures here too. Other
failures are left to propagate as they are.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import torch

from reasonrl.checkpoint.layout import list_checkpoints
from reasonrl.checkpoint.manifest import checkpoint_size
from reasonrl.errors import StorageError


def _tree_bytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tree_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tree_bytes(v) for v in tree)
    return 0


def estimate_size(run_dir: Path, policy, critic=None) -> int | None:
    """Bytes a new checkpoint takes: the newest one's (checkpoints of a run have one size),
    else estimated from the state (the optimizer state, plus weights of about half its size)."""
    for path in reversed(list_checkpoints(run_dir)):
        if (size := checkpoint_size(path)) is not None:
            return size
    try:
        state = _tree_bytes(policy.state_dict()) + (_tree_bytes(critic.state_dict()) if critic else 0)
    except Exception:  # noqa: BLE001 - only for a message
        return None
    return state * 3 // 2 or None


def _size(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _existing(path: Path) -> Path:
    """The nearest folder of `path` that exists (`path` itself if it is one)."""
    path = Path(path).absolute()
    while not path.is_dir() and path != path.parent:
        path = path.parent
    return path


def storage_error(err: BaseException, what: str, path: Path, needed: int | None = None,
                  hint: str = "") -> StorageError | None:
    """A `StorageError` for a write of `what` at `path` that failed for lack of space (ENOSPC,
    EDQUOT, or any failure -- torch reports a full disk as `unexpected pos` -- while the disk has
    less free than `needed`) or of permission (EACCES, EPERM, EROFS); None for other failures."""
    code = getattr(err, "errno", None)
    where = getattr(err, "filename", None) or path
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        reason = "read-only file system" if code == errno.EROFS else "permission denied"
        return StorageError(f"cannot write {what} {path}: {reason} ({where}). Check the permissions of "
                            f"{_existing(path)}, or point trainer.output_dir elsewhere")
    try:
        free = shutil.disk_usage(_existing(path)).free
    except OSError:
        free = None
    text = str(err).lower()
    full = (code in (errno.ENOSPC, errno.EDQUOT) or "no space left" in text or "quota exceeded" in text
            or "storagefull" in text or (needed is not None and free is not None and free < needed))
    if not full:
        return None
    kind = "disk quota exceeded" if code == errno.EDQUOT else "no space left on the device"
    return StorageError(f"{kind} while writing {what} {path}: it needs about {_size(needed)}, "
                        f"{_size(free)} free on {_existing(path)}. Free some space or point "
                        f"trainer.output_dir at a larger disk{hint}")
