"""The names inside a checkpoint and the `checkpoints/step_N` folders of a run.

Every other part of the package (writing, verifying, reading, rotating, resuming) agrees on
these names and on what counts as a checkpoint through this module alone, so the layout the
package docstring draws is defined once.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

STATE_FILE = "trainer_state.json"
ADAPTER_DIR = "adapter"
CRITIC_DIR = "critic"
TENSOR_FILE = "state.pt"
MANIFEST = "manifest.json"
FORMAT = 1
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".bin")  # files a loader reads: never unlisted
STEP_DIR = re.compile(r"^step_(\d+)$")


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir()
             if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
             and (p / TENSOR_FILE).is_file()
             and ((p / "huggingface").is_dir() or (p / ADAPTER_DIR).is_dir())]
    return [p for _, p in sorted(found)]


def remove_partial(run_dir: Path) -> None:
    """Delete the temporary folders a killed checkpoint write left behind."""
    folder = Path(run_dir) / "checkpoints"
    if folder.is_dir():
        for p in folder.glob(".step_*"):
            shutil.rmtree(p, ignore_errors=True)


def step_folders(run_dir: Path) -> list[Path]:
    """Every `checkpoints/step_N` folder of a run, complete or not, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]
