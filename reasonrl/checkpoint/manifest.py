"""A checkpoint's manifest.json: every other file's size and sha256, written last.

The manifest is what makes a checkpoint provable: a resume trusts a folder only if it
verifies (`verify_checkpoint`), and the space a checkpoint takes is read from it
(`checkpoint_size`). Writing and checking it live together so that the two sides cannot
disagree on what is listed and how it is hashed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from reasonrl.checkpoint.layout import (
    ADAPTER_DIR,
    FORMAT,
    MANIFEST,
    STATE_FILE,
    TENSOR_FILE,
    WEIGHT_SUFFIXES,
)


def _sha256(path: Path, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
        if fsync:
            os.fsync(fh.fileno())
    return digest.hexdigest()


def write_manifest(folder: Path) -> list[Path]:
    """fsync every file under `folder` while hashing it, then write `manifest.json` (their
    sizes and sha256, fsynced) into it. Returns the folders walked (`folder` first), for the
    caller to fsync."""
    files, folders = {}, []
    for root, _, names in os.walk(folder):
        folders.append(Path(root))
        for name in sorted(names):
            f = Path(root) / name
            files[f.relative_to(folder).as_posix()] = {"size": f.stat().st_size,
                                                       "sha256": _sha256(f, fsync=True)}
    with open(folder / MANIFEST, "w") as fh:
        json.dump({"format": FORMAT, "files": dict(sorted(files.items()))}, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    return folders


def checkpoint_size(path: Path) -> int | None:
    """Bytes of a checkpoint's files, from its manifest (None without one)."""
    try:
        return sum(e["size"] for e in json.loads((Path(path) / MANIFEST).read_text())["files"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def verify_checkpoint(path: Path) -> str | None:
    """What is wrong with a checkpoint, naming the file, or None: its manifest.json must be
    there and readable, list the state, the trainer state and weights, and every listed file
    must have its size and sha256; no unlisted weight file may lie beside them."""
    path = Path(path)
    manifest = path / MANIFEST
    if not manifest.is_file():
        return f"{manifest} is missing (the write did not finish, or a reasonrl without manifests wrote it)"
    try:
        listed = json.loads(manifest.read_text())["files"]
        entries = {str(rel): (int(e["size"]), str(e["sha256"])) for rel, e in listed.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return f"{manifest} is unreadable ({type(err).__name__}: {err})"
    needed = [STATE_FILE, TENSOR_FILE]
    if not any(rel.endswith(".safetensors") and rel.split("/")[0] in ("huggingface", ADAPTER_DIR)
               for rel in entries):
        needed.append("huggingface/*.safetensors")
    for rel in needed:
        if rel not in entries:
            return f"{manifest} does not list {rel}"
    for rel, (size, _) in entries.items():
        f = path / rel
        if not f.is_file():
            return f"{f} is missing"
        if (actual := f.stat().st_size) != size:
            return f"{f} is {actual} bytes, {MANIFEST} says {size} (truncated or overwritten)"
    for f in sorted(path.rglob("*")):
        if f.suffix in WEIGHT_SUFFIXES and f.is_file() and f.relative_to(path).as_posix() not in entries:
            return f"{f} is not in {MANIFEST} (added after the checkpoint was written)"
    for rel, (_, digest) in entries.items():
        if _sha256(path / rel) != digest:
            return (f"{path / rel} does not match its sha256 in {MANIFEST} (changed or damaged after it "
                    f"was written)")
    return None
