"""Writing a checkpoint: into a hidden temporary folder, every file fsynced, the manifest last,
then renamed into place.

A folder named `step_N` is therefore complete, and a crash leaves at most a `.step_N.*`
temporary folder (`remove_partial` deletes it). The weights are read back and checked finite
before the rename, so a NaN never becomes a checkpoint; a failure for lack of space or
permission is worded by `reasonrl.checkpoint.storage`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from reasonrl.checkpoint.layout import ADAPTER_DIR, CRITIC_DIR, FORMAT, STATE_FILE, TENSOR_FILE
from reasonrl.checkpoint.manifest import write_manifest
from reasonrl.checkpoint.read import non_finite
from reasonrl.checkpoint.storage import estimate_size, storage_error
from reasonrl.errors import CheckpointError, NonFiniteWeights
from reasonrl.rng import rng_state


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # some platforms cannot open folders
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_save(target: Path, write: Callable[[Path], None]) -> None:
    """Write a folder via `write(tmp)`, fsync every file, add `manifest.json` (their sizes and
    sha256, written last), rename it to `target`: complete and provable, or absent."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    old = None
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
        write(tmp)
        folders = write_manifest(tmp)
        for folder in folders:
            _fsync_dir(folder)
        if target.exists():  # move the old one aside first: never a moment with neither
            old = target.parent / f".{target.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(target, old)
        os.rename(tmp, target)
        _fsync_dir(target.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def plain_rng(state: dict) -> dict:
    """`rng_state()` with numpy's key array as a tensor: loadable with weights_only=True."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                               float(cached))}


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint (or its temporary folder) a resume loads or
    serves: huggingface/, adapter/, critic/."""
    return sorted(f for sub in ("huggingface", ADAPTER_DIR, CRITIC_DIR)
                  for f in (folder / sub).glob("*.safetensors"))


def write_checkpoint(target: Path, policy, tokenizer, trainer_state: dict, merged: bool = True,
                     critic=None, extra: dict | None = None) -> None:
    """The policy's HF folder, its optimizer/scheduler state, every RNG and `trainer_state`.
    A LoRA policy writes its adapter, and the merged HF folder only if `merged`; a critic
    its value model (`critic/`) and optimizer state. Weights with a NaN or inf are refused
    (`NonFiniteWeights`, nothing written); a full disk or a permission problem is a
    `StorageError` (the earlier checkpoints stand). `extra`: more tensor state (tensors and plain
    data, e.g. the batches in flight of asynchronous training), kept in state.pt under its keys."""
    target = Path(target)

    def write(tmp: Path) -> None:
        if not policy.save_adapter(tmp / ADAPTER_DIR) or merged:
            policy.save_pretrained(tmp / "huggingface", tokenizer)
        tensors = {**(extra or {}), "policy": policy.state_dict(), "rng": plain_rng(rng_state())}
        if critic is not None:
            critic.save(tmp / CRITIC_DIR)
            tensors["critic"] = critic.state_dict()
        for f in _weight_files(tmp):
            if (name := non_finite(f)) is not None:
                raise NonFiniteWeights(f"step {trainer_state.get('step')}: tensor {name} of "
                                       f"{f.relative_to(tmp)} holds NaN or inf; no checkpoint written")
        torch.save(tensors, tmp / TENSOR_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({"format": FORMAT, **trainer_state}, indent=1))

    try:
        atomic_save(target, write)
    except CheckpointError:
        raise
    except Exception as err:
        needed = estimate_size(target.parent.parent, policy, critic)
        problem = storage_error(err, "checkpoint", target, needed, "; the earlier checkpoints are intact")
        if problem is None:
            raise
        raise problem from err
