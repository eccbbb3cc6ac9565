"""Reading a checkpoint back: its trainer state, its tensor state and its weights.

Everything read is distrusted: state.pt goes through torch's weights-only unpickler (a
checkpoint cannot run code), and every file that cannot be read, or weights with a NaN or
inf, is a `CheckpointError` (or `NonFiniteWeights`) naming the file. Whether the files are
the ones written is the manifest's question (`reasonrl.checkpoint.manifest`), asked first.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from reasonrl.checkpoint.layout import ADAPTER_DIR, CRITIC_DIR, FORMAT, STATE_FILE, TENSOR_FILE
from reasonrl.errors import CheckpointError, NonFiniteWeights


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


def numpy_rng(state: dict) -> dict:
    """The inverse of the writer's `plain_rng`: numpy's key array back from a tensor."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": (kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached)}


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
        tensors["rng"] = numpy_rng(tensors["rng"])
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
