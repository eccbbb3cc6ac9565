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
                         torch CPU and CUDA), and the critic's optimizer state: tensors and
                         plain data only, read back with `torch.load(weights_only=True)`
    manifest.json        written last: every other file's size and sha256

A checkpoint is written into a hidden temporary folder beside it, every file fsynced,
then renamed into place: a folder named `step_N` is complete, a crash leaves at most a
`.step_N.*` temporary folder, which the next resume deletes. Its weights are checked finite
before the rename (`NonFiniteWeights`: no checkpoint). A resume verifies the manifest
(`verify_checkpoint`) before it trusts a checkpoint; `auto` passes over damaged ones to the
newest intact one. A write that fails for lack of space or permission is a `StorageError`
naming the path, the bytes needed and free.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from reasonrl.errors import CheckpointError, ConfigError, NonFiniteWeights, StorageError
from reasonrl.rng import rng_state

STATE_FILE = "trainer_state.json"
ADAPTER_DIR = "adapter"
CRITIC_DIR = "critic"
TENSOR_FILE = "state.pt"
MANIFEST = "manifest.json"
FORMAT = 1
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".bin")  # files a loader reads: never unlisted
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


def _sha256(path: Path, fsync: bool = False) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
        if fsync:
            os.fsync(fh.fileno())
    return digest.hexdigest()


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
        files, folders = {}, []
        for root, _, names in os.walk(tmp):
            folders.append(Path(root))
            for name in sorted(names):
                f = Path(root) / name
                files[f.relative_to(tmp).as_posix()] = {"size": f.stat().st_size,
                                                        "sha256": _sha256(f, fsync=True)}
        with open(tmp / MANIFEST, "w") as fh:
            json.dump({"format": FORMAT, "files": dict(sorted(files.items()))}, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
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


def _plain_rng(state: dict) -> dict:
    """`rng_state()` with numpy's key array as a tensor: loadable with weights_only=True."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
                               float(cached))}


def _numpy_rng(state: dict) -> dict:
    kind, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)}


def non_finite(file: Path) -> str | None:
    """The name of the first floating-point tensor with a NaN or inf in a safetensors file
    (read one tensor at a time), or None."""
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as fh:
        for name in fh.keys():
            t = fh.get_tensor(name)
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return name
    return None


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint (or its temporary folder) a resume loads or
    serves: huggingface/, adapter/, critic/."""
    return sorted(f for sub in ("huggingface", ADAPTER_DIR, CRITIC_DIR)
                  for f in (folder / sub).glob("*.safetensors"))


def _tree_bytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(_tree_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(_tree_bytes(v) for v in tree)
    return 0


def checkpoint_size(path: Path) -> int | None:
    """Bytes of a checkpoint's files, from its manifest (None without one)."""
    try:
        return sum(e["size"] for e in json.loads((Path(path) / MANIFEST).read_text())["files"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


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
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
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


def write_checkpoint(target: Path, policy, tokenizer, trainer_state: dict, merged: bool = True,
                     critic=None) -> None:
    """The policy's HF folder, its optimizer/scheduler state, every RNG and `trainer_state`.
    A LoRA policy writes its adapter, and the merged HF folder only if `merged`; a critic
    its value model (`critic/`) and optimizer state. Weights with a NaN or inf are refused
    (`NonFiniteWeights`, nothing written); a full disk or a permission problem is a
    `StorageError` (the earlier checkpoints stand)."""
    target = Path(target)

    def write(tmp: Path) -> None:
        if not policy.save_adapter(tmp / ADAPTER_DIR) or merged:
            policy.save_pretrained(tmp / "huggingface", tokenizer)
        tensors = {"policy": policy.state_dict(), "rng": _plain_rng(rng_state())}
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


def step_folders(run_dir: Path) -> list[Path]:
    """Every `checkpoints/step_N` folder of a run, complete or not, oldest first."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


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


def set_aside(path: Path, label: str) -> Path:
    """Rename a checkpoint to `step_N.<label>` (`.<label>.2`, ...): kept for a look, out of
    resumes and rotation."""
    for i in range(1, 1000):
        aside = path.with_name(f"{path.name}.{label}" + (f".{i}" if i > 1 else ""))
        if not aside.exists():
            os.rename(path, aside)
            return aside
    raise CheckpointError(f"{path}: too many {label} copies beside it")


def _read_json(path: Path) -> dict:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{path} cannot be read ({type(err).__name__}: {err})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a JSON object, found {type(state).__name__}")
    return state


def _load_tensors(path: Path) -> dict:
    """state.pt through the weights-only unpickler (tensors and plain data, no code)."""
    import pickle

    try:
        tensors = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(f"{path} holds objects other than tensors and plain data; refused "
                              f"(loading it could run code): {str(err).splitlines()[-1][:200]}") from None
    except Exception as err:  # noqa: BLE001 - torch's reader raises RuntimeError, EOFError, ...
        raise CheckpointError(f"{path} cannot be read, truncated or damaged ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from None
    if not isinstance(tensors, dict) or "policy" not in tensors or "rng" not in tensors:
        raise CheckpointError(f"{path}: not a reasonrl state file (no policy and RNG state)")
    return tensors


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        weights = load_file(path)
    except Exception as err:  # noqa: BLE001 - SafetensorError is not an OSError
        raise CheckpointError(f"{path} cannot be read, truncated or damaged ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})") from None
    for name, t in weights.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteWeights(f"{path}: tensor {name} holds NaN or inf; refused")
    return weights


def read_checkpoint(path: Path) -> tuple[dict, dict, dict[str, torch.Tensor]]:
    """(trainer_state, tensor state {policy, rng, critic}, weights by name) of a checkpoint: the
    HF folder's, or a LoRA checkpoint's adapter tensors. A file that cannot be read, or
    weights (the critic's too) with a NaN or inf, is a `CheckpointError` naming the file.
    The manifest is `verify_checkpoint`'s business."""
    path = Path(path)
    state = _read_json(path / STATE_FILE)
    if state.get("format") != FORMAT:
        raise CheckpointError(f"{path / STATE_FILE}: checkpoint format {state.get('format')}, "
                              f"this reasonrl reads {FORMAT}")
    tensors = _load_tensors(path / TENSOR_FILE)
    try:
        tensors["rng"] = _numpy_rng(tensors["rng"])
    except (KeyError, ValueError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{path / TENSOR_FILE}: its RNG state is not reasonrl's ({err})") from None
    weights: dict[str, torch.Tensor] = {}
    folder = path / ADAPTER_DIR if (path / ADAPTER_DIR).is_dir() else path / "huggingface"
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no *.safetensors weights")
    for f in files:
        weights.update(_load_weights(f))
    for f in sorted((path / CRITIC_DIR).glob("*.safetensors")):
        try:
            bad = non_finite(f)
        except Exception as err:  # noqa: BLE001 - SafetensorError
            raise CheckpointError(f"{f} cannot be read, truncated or damaged ({err})") from None
        if bad is not None:
            raise NonFiniteWeights(f"{f}: tensor {bad} holds NaN or inf; refused")
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
