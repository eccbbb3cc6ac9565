"""Checkpoints: written atomically, found again, checked against the config, rotated.

Layout of `runs/<name>/checkpoints/step_N/`:

    huggingface/         the policy as an HF folder (model dtype, loadable by transformers
                         and vLLM; it is also the exact copy the trainer resumes from)
    adapter/             LoRA only: the peft adapter, what a resume loads; huggingface/ then
                         holds the merged weights (absent with model.lora.save_merged=false)
    critic/              critic estimators (PPO) only: the value model (body and head)
    trainer_state.json   step, sampler position, resolved config + its hash, byte offsets of
                         metrics.jsonl and samples.jsonl, eval before training, bad-step count
    state.pt             optimizer, LR scheduler, policy step, RNG states (python, numpy,
                         torch CPU and CUDA), and the critic's optimizer state

A checkpoint is written into a hidden temporary folder beside it, every file fsynced,
then renamed into place: a folder named `step_N` is complete, a crash leaves at most a
`.step_N.*` temporary folder, which the next resume deletes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from reasonrl.errors import ConfigError
from reasonrl.rng import rng_state

STATE_FILE = "trainer_state.json"
ADAPTER_DIR = "adapter"
CRITIC_DIR = "critic"
TENSOR_FILE = "state.pt"
FORMAT = 1
STEP_DIR = re.compile(r"^step_(\d+)$")

# Keys a resumed run may change without asking: they do not change what is computed
# (where the run lives, how often it evaluates or logs, how many checkpoints it keeps).
# `trainer.steps` is not among them: the LR schedule is laid out over it. Extending a
# run is `--allow-config-change trainer.steps` (exact only with a constant schedule).
RESUME_SAFE_KEYS = (
    "trainer.resume", "trainer.allow_config_change", "trainer.progress", "trainer.output_dir",
    "trainer.run_name", "trainer.keep_last", "trainer.max_bad_steps", "trainer.save_every",
    "trainer.eval_every", "trainer.log_samples", "trainer.threads",
)


# ---- writing -------------------------------------------------------------------------


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
    """Write a folder via `write(tmp)`, fsync it, rename it to `target`: complete or absent."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    old = None
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; a checkpoint is an ordinary folder
        write(tmp)
        for root, _, files in os.walk(tmp):
            for f in files:
                with open(Path(root) / f, "rb") as fh:
                    os.fsync(fh.fileno())
            _fsync_dir(Path(root))
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


def write_checkpoint(target: Path, policy, tokenizer, trainer_state: dict, merged: bool = True,
                     critic=None) -> None:
    """The policy's HF folder, its optimizer/scheduler state, every RNG and `trainer_state`.
    A LoRA policy writes its adapter, and the merged HF folder only if `merged`; a critic
    its value model (`critic/`) and optimizer state."""

    def write(tmp: Path) -> None:
        if not policy.save_adapter(tmp / ADAPTER_DIR) or merged:
            policy.save_pretrained(tmp / "huggingface", tokenizer)
        tensors = {"policy": policy.state_dict(), "rng": rng_state()}
        if critic is not None:
            critic.save(tmp / CRITIC_DIR)
            tensors["critic"] = critic.state_dict()
        torch.save(tensors, tmp / TENSOR_FILE)
        (tmp / STATE_FILE).write_text(json.dumps({"format": FORMAT, **trainer_state}, indent=1))

    atomic_save(target, write)


def rotate(run_dir: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` complete checkpoints (0 keeps all)."""
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)


# ---- reading -------------------------------------------------------------------------


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


def find_resume_point(resume: str, output_dir: str, run_name: str) -> tuple[Path, Path | None]:
    """(run folder, newest complete checkpoint or None) for `trainer.resume`.

    `auto` looks in output_dir/run_name and may find nothing (a new run); a run folder or
    a `checkpoints/step_N` folder must hold a complete checkpoint.
    """
    if resume == "auto":
        if not run_name:
            raise ValueError("trainer.resume=auto needs trainer.run_name (the run to continue)")
        run_dir = Path(output_dir) / run_name
        found = list_checkpoints(run_dir)
        return run_dir, found[-1] if found else None
    path = Path(resume)
    if (path / STATE_FILE).is_file():  # a checkpoint folder
        if path not in [p for p in list_checkpoints(path.parent.parent)]:
            raise ValueError(f"trainer.resume: {path} is not a complete checkpoint")
        return path.parent.parent, path
    found = list_checkpoints(path)
    if not found:
        raise ValueError(f"trainer.resume: {path} holds no complete checkpoint "
                         f"(expected {path}/checkpoints/step_N/{STATE_FILE})")
    return path, found[-1]


def read_checkpoint(path: Path) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """(trainer_state, tensor state {policy, rng}, weights by name) of a checkpoint: the HF
    folder's, or a LoRA checkpoint's adapter tensors."""
    from safetensors.torch import load_file

    path = Path(path)
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')}, this reasonrl reads {FORMAT}")
    # our own file (optimizer state, numpy RNG tuples): not loadable with weights_only
    tensors = torch.load(path / TENSOR_FILE, map_location="cpu", weights_only=False)
    weights: dict[str, torch.Tensor] = {}
    folder = path / ADAPTER_DIR if (path / ADAPTER_DIR).is_dir() else path / "huggingface"
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights")
    for f in files:
        weights.update(load_file(f))
    return state, tensors, weights


# ---- config --------------------------------------------------------------------------


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_hash(config: dict) -> str:
    """sha256 of the resolved config without the keys a resume may change."""
    kept = {k: v for k, v in flatten(config).items() if k not in RESUME_SAFE_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_changes(saved: dict, current: dict) -> dict[str, tuple[object, object]]:
    """{dotted key: (saved, current)} for every key that differs, safe keys excluded."""
    a, b = flatten(saved), flatten(current)
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in RESUME_SAFE_KEYS and a.get(k) != b.get(k)}


def check_config_changes(path: Path, saved: dict, current: dict, allowed: list[str]) -> None:
    """ConfigError listing every key that changed since the checkpoint at `path` was written,
    except the keys in `allowed` (`trainer.allow_config_change`)."""
    refused = {k: v for k, v in config_changes(saved, current).items() if k not in allowed}
    if refused:
        listed = "; ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in refused.items())
        raise ConfigError(f"resuming {path}: the config changed ({listed}). Resume with the run's own "
                          f"config, or accept the change with --allow-config-change {','.join(refused)}")


def truncate_log(path: Path, offset: int) -> None:
    """Cut a JSONL log back to `offset` bytes: lines of steps after the checkpoint go."""
    if path.exists():
        size = path.stat().st_size
        if size < offset:
            raise ValueError(f"{path} is shorter ({size} bytes) than at the checkpoint ({offset})")
        with open(path, "r+b") as fh:
            fh.truncate(offset)
