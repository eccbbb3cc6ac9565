"""`rollout.hf_decoder=auto`: the fastest decoder on this machine, measured once.

A fast path that wins on one CPU can lose on another: on an Intel machine the MKL-packed
lean decoder ran ~2x the tokens/s of the transformers modules; on an AMD EPYC it was slower
(103 vs 110 tokens/s) and 1 GiB heavier, because MKL's packed GEMM is tuned per vendor and
instruction set. So the choice is measured, not assumed: each decoder that can run the
model decodes a few steps of the run's own batch size (random prompt ids from a private
generator: the run's random stream is untouched), and the fastest median step wins.

The result is cached in `$REASONRL_HOME/calibration.json` under a key of the CPU model
(`/proc/cpuinfo`'s model name, or the platform's processor), torch version and thread
count, device, the model's shapes and dtype, and the batch rows rounded up to a power of
two: a run pays for it once per machine and shape (about a second per decoder on the
135M model), and every later run, process and Ray actor reads the same answer.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from reasonrl.accel.decode import FALLBACK, decoder, unavailable
from reasonrl.cache import reasonrl_home

CANDIDATES = ("lean_mkl", "lean", "modules")
PROMPT_TOKENS = 48  # the synthetic prompt's length
WARMUP_STEPS, TIMED_STEPS = 2, 6


def cpu_model() -> str:
    """The CPU's model name as `lscpu` prints it ("AMD EPYC", "Intel(R) Xeon(R) ...")."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cache_file() -> Path:
    return reasonrl_home() / "calibration.json"


def calibration_key(model, rows: int) -> str:
    config = model.config
    device = next(model.parameters()).device
    bucket = 1 << max(0, (max(rows, 1) - 1).bit_length())
    where = cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device)
    shape = (f"{config.model_type} h{config.hidden_size} l{config.num_hidden_layers} "
             f"v{config.vocab_size} {next(model.parameters()).dtype}")
    return (f"{where} | torch {torch.__version__} x{torch.get_num_threads()} | {device.type} | "
            f"{shape} | rows {bucket}")


def _read() -> dict:
    try:
        data = json.loads(cache_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(key: str, entry: dict) -> None:
    """Add one entry (read, update, atomic rename: a reader never sees half a file)."""
    path = cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {**_read(), key: entry}
    fd, tmp = tempfile.mkstemp(prefix=".calibration.", dir=path.parent)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


@torch.inference_mode()
def step_seconds(model, path: str, rows: int) -> float:
    """Median seconds of one decode step of `rows` rows through decoder `path`."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (rows, PROMPT_TOKENS), generator=gen).to(device)
    tokens = torch.randint(0, vocab, (WARMUP_STEPS + TIMED_STEPS, rows), generator=gen).to(device)
    was_training = model.training
    model.eval()
    times = []
    try:
        with decoder(model, PROMPT_TOKENS, len(tokens) + 1, path) as dec:
            dec.prefill(ids, torch.ones_like(ids))
            for i, step_tokens in enumerate(tokens):
                t = time.perf_counter()
                dec.step(step_tokens)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if i >= WARMUP_STEPS:
                    times.append(time.perf_counter() - t)
    finally:
        model.train(was_training)
    return statistics.median(times)


def measure(model, rows: int) -> dict:
    """{"fastest": path, "seconds": {path: median step seconds}} over the decoders that can
    run `model` here."""
    seconds = {path: step_seconds(model, path, rows) for path in CANDIDATES
               if unavailable(model, path) is None}
    return {"fastest": min(seconds, key=seconds.get), "seconds": seconds}


def fastest(model, rows: int) -> str:
    """The fastest decoder for `model` at `rows` rows here (cached; measured on a miss)."""
    key = calibration_key(model, rows)
    entry = _read().get(key)
    if entry is None or entry.get("fastest") not in CANDIDATES:
        entry = measure(model, max(rows, 1))
        _write(key, entry)
        found = ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in entry["seconds"].items())
        print(f"[reasonrl] decoder calibration ({key}): {found} per step -> {entry['fastest']}", flush=True)
    return entry["fastest"]


def choose(model, requested: str, rows: int = 0) -> tuple[str, str | None]:
    """(the decoder to use, why it is not the one asked for, or None).

    `auto` asks for the fastest path measured on this machine at these rows (`calibrate`);
    a path that cannot run `model` here falls back (`lean_mkl` -> `lean` -> `modules`)."""
    if requested == "auto":
        requested = fastest(model, rows)
    path, why = requested, None
    while (reason := unavailable(model, path)) is not None:
        why = why or f"{requested}: {reason}"
        path = FALLBACK[path]
    return path, why
