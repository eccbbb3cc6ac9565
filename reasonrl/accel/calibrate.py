"""Measured choices, cached per machine: the decoder of `rollout.hf_decoder=auto` and the
precision of `model.precision=auto`.

A fast path that wins on one CPU can lose on another: on an Intel machine the MKL-packed
lean decoder ran ~2x the tokens/s of the transformers modules; on an AMD EPYC it was slower
(103 vs 110 tokens/s) and 1 GiB heavier, because MKL's packed GEMM is tuned per vendor and
instruction set; bf16 matrix products run on AMX / AVX512-BF16 units where a CPU has them and
are emulated, slower than fp32, where it has none. So the choice is measured on the machine
at hand, never assumed from its vendor.

A measurement survives a busy machine: each candidate runs several rounds, the candidates
interleaved round by round (A B C A B C ...) so that a burst of load from another process
falls on all of them alike, and each keeps its least time, the least disturbed run
(`interleaved_minimum`).

The results live in `$REASONRL_HOME/calibration.json` (`cache_file`), one entry per key (the
CPU model, torch version and thread count, device and shapes), each recording with its
choice and seconds the CPU flags that matter for it (`cpu_flags`), the load per core when it
was measured and when. An entry is used as it is (a run reads the same answer as the last,
in every process and Ray actor) unless it no longer describes this machine (`stale_reason`):
the flags differ (a container moved to another host of the same model name), or it was
measured under load (above `BUSY_LOAD` per core) and the machine is quiet now (below
`QUIET_LOAD`), or an older reasonrl wrote it without either; then it is measured again, and
one console line says why. `reasonrl calibrate` lists the entries, `--reset` deletes them.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.nn.functional as F

from reasonrl import console
from reasonrl.accel.decode import FALLBACK, decoder, unavailable
from reasonrl.accel.host import (  # noqa: F401 - CHOICE_FLAGS, flags_in_*: re-exported, where they were
    CHOICE_FLAGS,
    cpu_flags,
    cpu_model,
    flags_in_cpuinfo,
    flags_in_sysctl,
    load_per_core,
)
from reasonrl.cache import reasonrl_home

CANDIDATES = ("lean_mkl", "lean", "modules")
PROMPT_TOKENS = 48  # the synthetic prompt's length
DECODE_ROUNDS = 2  # blocks per decoder, interleaved; each decodes WARMUP_STEPS (not kept) + TIMED_STEPS
WARMUP_STEPS, TIMED_STEPS = 1, 3
BLOCK_SECONDS = 1.0  # a decoder's block stops timing steps once it has spent this long
GIVE_UP = 3.0  # a candidate this many times slower than the best is not measured again

BUSY_LOAD = 1.0  # 1-minute load average per core above which a measurement was taken under load
QUIET_LOAD = BUSY_LOAD / 2  # ... and below which the machine is quiet enough to measure it again

PRECISIONS = ("bf16-mixed", "fp32")
BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")  # the flags of bf16 matrix units (x86 AMX / AVX-512, ARM)
BF16_MARGIN = 1.3  # bf16-mixed when the MLP block runs at least this much faster in bf16
PRECISION_WARMUP, PRECISION_ROUNDS = 1, 4
DEFAULT_SHAPES = {"hidden_size": 576, "intermediate_size": 1536, "tokens": 1024}  # SmolLM2-135M's MLP


def interleaved_minimum(candidates: Mapping[str, Callable[[], float]], rounds: int,
                        warmup: int = 0, give_up: float | None = None) -> dict[str, float]:
    """Each candidate's least seconds over `rounds` kept rounds, the candidates called round
    by round in their order (A B C A B C ...) after `warmup` rounds that are not kept (first
    calls pay for kernel selection, packing, allocation). A candidate is a callable that runs
    it once and returns the seconds that run took (it times itself, so that its setup stays
    outside the figure).

    The minimum, not the mean or the median: another process's load only ever adds time to a
    run, so the least time over several runs is the least disturbed estimate of the cost
    itself; interleaving makes a burst of load hit every candidate's runs, not one
    candidate's whole measurement.

    `give_up`: after each round, a candidate whose least time so far (warm-up rounds included)
    is more than `give_up` times the best candidate's is not run again: it has lost, and a
    candidate many times slower (bf16 emulated on a CPU without bf16 units: ~30x) would
    otherwise spend most of the calibration's time. Its figure is its least time so far."""
    if rounds < 1:
        raise ValueError(f"interleaved_minimum: rounds must be >= 1, got {rounds}")
    best = {name: float("inf") for name in candidates}
    seen = dict(best)  # least time of any round, warm-up included: what `give_up` compares
    running = list(candidates)
    for r in range(warmup + rounds):
        for name in running:
            seconds = candidates[name]()
            seen[name] = min(seen[name], seconds)
            if r >= warmup:
                best[name] = min(best[name], seconds)
        if give_up is not None:
            leader = min(seen[name] for name in running)
            running = [name for name in running if seen[name] <= give_up * leader]
    return {name: best[name] if best[name] < float("inf") else seen[name] for name in candidates}


# ---------------------------------------------------------------------------------- the cache


def cache_file() -> Path:
    return reasonrl_home() / "calibration.json"


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


def entries() -> dict[str, dict]:
    """The cache's entries, by key (what `reasonrl calibrate` lists)."""
    return {key: entry for key, entry in _read().items() if isinstance(entry, dict)}


def reset() -> int:
    """Delete the cache file; the number of entries it held (0 when there was none)."""
    count = len(entries())
    with contextlib.suppress(FileNotFoundError):
        cache_file().unlink()
    return count


def stale_reason(entry: dict, flags: list[str], load: float | None) -> str | None:
    """Why a cached entry no longer describes this machine, given its CPU flags and load per
    core now; None when it still does."""
    if not isinstance(entry.get("flags"), list) or "load" not in entry:
        return "recorded without the CPU flags and load (by an older reasonrl)"
    if sorted(entry["flags"]) != sorted(flags):
        return (f"measured on a CPU with flags [{' '.join(sorted(entry['flags']))}], "
                f"this one has [{' '.join(sorted(flags))}]")
    then = entry["load"]
    if isinstance(then, (int, float)) and then > BUSY_LOAD and load is not None and load < QUIET_LOAD:
        return f"measured under load ({then:.2f} per core), the machine is quiet now ({load:.2f} per core)"
    return None


def _cached(key: str, what: str, valid: Callable[[dict], bool]) -> dict | None:
    """The entry under `key` when it is valid and still describes this machine; else None
    (printing why, when there was an entry)."""
    entry = _read().get(key)
    if not isinstance(entry, dict) or not valid(entry):
        return None
    why = stale_reason(entry, cpu_flags(), load_per_core())
    if why is None:
        return entry
    console.info(f"{what} calibration: {why}: measuring again")
    return None


def _record(key: str, kind: str, load: float | None, **fields) -> dict:
    """Store a new entry: the measurement's fields and the machine's state when it was taken."""
    entry = {"kind": kind, **fields, "flags": cpu_flags(), "load": None if load is None else round(load, 2),
             "measured": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    _write(key, entry)
    return entry


def describe(key: str, entry: dict) -> str:
    """One line for an entry: what it chose, the times, the flags, the load and when."""
    seconds = entry.get("seconds") if isinstance(entry.get("seconds"), dict) else {}
    if entry.get("kind") == "precision":
        what = f"{entry.get('choice')}: " + ", ".join(f"{d} {seconds[d]:.4f} s" for d in ("fp32", "bf16")
                                                       if isinstance(seconds.get(d), (int, float)))
        if seconds.get("bf16"):
            what += f" ({seconds.get('fp32', 0.0) / seconds['bf16']:.2f}x)"
    else:
        what = f"{entry.get('fastest')}: " + ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in seconds.items())
        what += " per step"
    flags = " ".join(entry["flags"]) if isinstance(entry.get("flags"), list) else "not recorded"
    load = entry.get("load")
    load = f"{load:.2f} per core" if isinstance(load, (int, float)) else "not recorded"
    return f"{key}: {what}; flags [{flags}]; load {load}; measured {entry.get('measured', 'not recorded')}"


# ---------------------------------------------------------------------------------- the decoder


def decoder_key(config, dtype: torch.dtype, device: torch.device, rows: int) -> str:
    """The cache key of a decoder measurement: the machine (CPU model or GPU name), torch and its
    threads now, the model's shape and compute dtype, the rows rounded up to a power of two."""
    bucket = 1 << max(0, (max(rows, 1) - 1).bit_length())
    where = cpu_model() if device.type == "cpu" else torch.cuda.get_device_name(device)
    shape = (f"{config.model_type} h{config.hidden_size} l{config.num_hidden_layers} "
             f"v{config.vocab_size} {dtype}")
    return (f"{where} | torch {torch.__version__} x{torch.get_num_threads()} | {device.type} | "
            f"{shape} | rows {bucket}")


def calibration_key(model, rows: int) -> str:
    param = next(model.parameters())
    return decoder_key(model.config, param.dtype, param.device, rows)


@torch.inference_mode()
def _decode_block(model, path: str, prompt: torch.Tensor, tokens: torch.Tensor) -> float:
    """Open decoder `path`, prefill `prompt` (one row) and repeat it to the rows of `tokens`,
    as the engine repeats a prompt for its samples; decode a step per row of `tokens`, the
    first WARMUP_STEPS not kept (MKL packs its weights in the first); the least seconds of
    the others. A block that has spent BLOCK_SECONDS in its steps times no more of them: a
    decoder whose first step alone took that long reports that step (it has lost anyway)."""
    device = prompt.device
    best, first, spent = float("inf"), float("inf"), 0.0
    with decoder(model, PROMPT_TOKENS, len(tokens) + 1, path) as dec:
        dec.prefill(prompt, torch.ones_like(prompt))
        dec.repeat(tokens.shape[1])
        for i, step_tokens in enumerate(tokens):
            start = time.perf_counter()
            dec.step(step_tokens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - start
            spent += seconds
            first = min(first, seconds)
            if i >= WARMUP_STEPS:
                best = min(best, seconds)
            if spent >= BLOCK_SECONDS:
                break
        del dec  # freed before the block's end gives its pages back (`decoder`)
    return best if best < float("inf") else first


def decoder_seconds(model, rows: int) -> dict[str, float]:
    """{decoder: least seconds of one decode step of `rows` rows} over the decoders that can
    run `model` here, in DECODE_ROUNDS interleaved rounds (`interleaved_minimum`), each a
    block of WARMUP_STEPS + TIMED_STEPS steps of one decoder (`_decode_block`).

    One decoder is open at a time (the lean paths copy the weights into their own layouts:
    all three at once would hold three copies), and the prompt is prefilled once per block
    (a fraction of a step's cost at one row). The prompt and tokens are random ids from a
    private generator: the run's random stream is untouched."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (1, PROMPT_TOKENS), generator=gen).to(device)
    tokens = torch.randint(0, vocab, (WARMUP_STEPS + TIMED_STEPS, rows), generator=gen).to(device)
    blocks = {path: functools.partial(_decode_block, model, path, prompt, tokens)
              for path in CANDIDATES if unavailable(model, path) is None}
    was_training = model.training
    model.eval()
    try:
        return interleaved_minimum(blocks, DECODE_ROUNDS, give_up=GIVE_UP)
    finally:
        model.train(was_training)


def measure(model, rows: int) -> dict:
    """{"fastest": path, "seconds": {path: least step seconds}} over the decoders that can
    run `model` here."""
    seconds = decoder_seconds(model, rows)
    return {"fastest": min(seconds, key=seconds.get), "seconds": seconds}


def fastest_for_key(key: str, model: Callable[[], object], rows: int) -> tuple[str, str]:
    """(the fastest decoder under calibration `key`, where the answer came from): the cached
    entry, or a measurement of `model()` (called only then) at `rows` rows, stored and said."""
    entry = _cached(key, "decoder", lambda e: e.get("fastest") in CANDIDATES)
    if entry is not None:
        return entry["fastest"], f"cached {entry.get('measured')} in {cache_file()}"
    load = load_per_core()
    start = time.perf_counter()
    entry = _record(key, "decoder", load, **measure(model(), max(rows, 1)))
    found = ", ".join(f"{p} {s * 1e3:.1f} ms" for p, s in entry["seconds"].items())
    console.info(f"decoder calibration ({key}): {found} per step (least of up to "
          f"{DECODE_ROUNDS * TIMED_STEPS} steps in {DECODE_ROUNDS} interleaved rounds, a decoder "
          f"{GIVE_UP:g}x slower than the best dropped; load {entry['load']} per core; "
          f"{time.perf_counter() - start:.1f} s) -> {entry['fastest']}", key=key, fastest=entry['fastest'])
    return entry["fastest"], "measured now: the line above"


def fastest(model, rows: int) -> str:
    """The fastest decoder for `model` at `rows` rows here (cached; measured on a miss or when
    the entry no longer describes this machine)."""
    return fastest_for_key(calibration_key(model, rows), lambda: model, rows)[0]


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


# ---------------------------------------------------------------------------------- the precision


def bf16_units() -> bool | None:
    """Whether this CPU has bf16 matrix units by its flags (AMX-BF16, AVX512-BF16, ARM's BF16):
    True, False, or None when its flags are unknown (no /proc/cpuinfo or sysctl said nothing)."""
    flags = cpu_flags()
    if not flags:
        return None
    return any(f in flags for f in BF16_FLAGS)


def precision_key(hidden_size: int, intermediate_size: int, tokens: int) -> str:
    bucket = 1 << max(0, (max(tokens, 1) - 1).bit_length())
    return (f"precision | {cpu_model()} | torch {torch.__version__} x{torch.get_num_threads()} | cpu | "
            f"swiglu h{hidden_size} i{intermediate_size} | tokens {bucket}")


def _mlp_pass(hidden_size: int, intermediate_size: int, tokens: int,
              dtype: torch.dtype) -> Callable[[], float]:
    """A callable timing one forward and backward of a Llama-style SwiGLU MLP block in `dtype`
    (Shazeer 2020, "GLU Variants Improve Transformer", eq. 6, as LlamaMLP computes it):
    x [tokens, hidden] -> gate, up = x W_g^T, x W_u^T [tokens, intermediate] ->
    silu(gate) * up -> down [tokens, hidden]; the loss is the output's sum, and the backward
    computes the input's and every weight's gradient (three products forward, six backward).
    Inputs and weights are `dtype`: a bf16 run is how bf16-mixed computes (a bf16 compute copy
    of the weights; the fp32 masters only meet the optimizer)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden_size, generator=gen).to(dtype).requires_grad_()
    gate, up = (torch.randn(intermediate_size, hidden_size, generator=gen).mul_(hidden_size ** -0.5)
                .to(dtype).requires_grad_() for _ in range(2))
    down = torch.randn(hidden_size, intermediate_size, generator=gen).mul_(intermediate_size ** -0.5)
    down = down.to(dtype).requires_grad_()

    def run() -> float:
        start = time.perf_counter()
        out = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)
        out.float().sum().backward()
        seconds = time.perf_counter() - start
        for t in (x, gate, up, down):
            t.grad = None
        return seconds

    return run


def precision_seconds(hidden_size: int, intermediate_size: int, tokens: int) -> dict[str, float]:
    """{"fp32": s, "bf16": s}: the least seconds of the SwiGLU block's forward and backward
    (`_mlp_pass`) in each dtype on this CPU, interleaved (`interleaved_minimum`)."""
    runs = {"fp32": _mlp_pass(hidden_size, intermediate_size, tokens, torch.float32),
            "bf16": _mlp_pass(hidden_size, intermediate_size, tokens, torch.bfloat16)}
    return interleaved_minimum(runs, PRECISION_ROUNDS, PRECISION_WARMUP, give_up=GIVE_UP)


def precision_verdict(seconds: Mapping[str, float]) -> str:
    """bf16-mixed when fp32 / bf16 >= BF16_MARGIN, fp32 otherwise.

    The margin is 1.3, not 1, because the block is the part of a step bf16 speeds up most: a
    model's forward and backward also run attention, norms and the fp32 log-probs and loss,
    and a step adds the optimizer on fp32 masters and the cast of the compute copy from them.
    On the Sapphire Rapids (AMX) this was written on, the block ran 4.5x faster in bf16 and a
    whole SmolLM2-135M forward and backward 1.8x (7.8 s -> 4.3 s): by Amdahl's law
    (1 / 1.8 = (1 - p) + p / 4.5) the block's speed-up reaches a share p = 0.58 of it. At
    that share a 1.3x block gives 1 / (0.42 + 0.58 / 1.3) = 1.15x on the forward and backward,
    less on the step: a gain within the run-to-run spread of a shared machine, not worth
    bf16's 8-bit mantissa. Below 1.3 fp32 stays; a CPU without bf16 units (an AVX2 EPYC)
    emulates bf16 and lands below 1."""
    return "bf16-mixed" if seconds["fp32"] >= BF16_MARGIN * seconds["bf16"] else "fp32"


def _precision_reason(entry: dict, hidden_size: int, intermediate_size: int, tokens: int, source: str) -> str:
    fp32, bf16 = entry["seconds"]["fp32"], entry["seconds"]["bf16"]
    ratio = fp32 / bf16 if bf16 > 0 else float("inf")
    sign = ">=" if entry["choice"] == "bf16-mixed" else "<"
    return (f"a SwiGLU MLP forward+backward (hidden {hidden_size}, intermediate {intermediate_size}, "
            f"{tokens} tokens) took fp32 {fp32:.4f} s, bf16 {bf16:.4f} s: {ratio:.2f}x {sign} "
            f"{BF16_MARGIN} ({source}; CPU flags [{' '.join(entry['flags'])}])")


def calibrate_precision(hidden_size: int, intermediate_size: int, tokens: int) -> tuple[str, str]:
    """Measure the precision choice on this CPU now (tokens rounded up to a power of two, as
    the key), store it, and return (choice, reason)."""
    key = precision_key(hidden_size, intermediate_size, tokens)
    bucket = int(key.rsplit(" ", 1)[1])
    load = load_per_core()
    seconds = precision_seconds(hidden_size, intermediate_size, bucket)
    entry = _record(key, "precision", load, choice=precision_verdict(seconds), seconds=seconds)
    return entry["choice"], _precision_reason(entry, hidden_size, intermediate_size, bucket,
                                              f"measured now, load {entry['load']} per core")


def _precision_entry_ok(entry: dict) -> bool:
    seconds = entry.get("seconds")
    return (entry.get("choice") in PRECISIONS and isinstance(seconds, dict)
            and all(isinstance(seconds.get(d), (int, float)) for d in ("fp32", "bf16")))


def precision_choice(hidden_size: int, intermediate_size: int, tokens: int,
                     device: torch.device | str = "cpu") -> tuple[str, str]:
    """("bf16-mixed" or "fp32", one line saying why) for `model.precision=auto`.

    On a GPU: bf16-mixed where torch says it supports bf16, without measuring. On the CPU: the
    cached measurement for these shapes (`precision_key`), or a new one when there is none
    or it no longer describes this machine (`calibrate_precision`: about a second on 2 cores
    for SmolLM2-135M's shapes). The caller says the line in the console."""
    device = torch.device(device)
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16-mixed", f"{torch.cuda.get_device_name(device)} supports bf16 (not measured)"
        return "fp32", f"{torch.cuda.get_device_name(device)} does not support bf16"
    if device.type != "cpu":
        return "fp32", f"no calibration for device {device.type}: fp32"
    units = bf16_units()
    if units is False:
        return "fp32", (f"this CPU has no bf16 units (flags [{' '.join(cpu_flags())}]: none of "
                        f"{', '.join(BF16_FLAGS)}): bf16 is emulated, slower than fp32 (not measured)")
    key = precision_key(hidden_size, intermediate_size, tokens)
    entry = _cached(key, "precision", _precision_entry_ok)
    if entry is None:
        return calibrate_precision(hidden_size, intermediate_size, tokens)
    bucket = int(key.rsplit(" ", 1)[1])
    return entry["choice"], _precision_reason(entry, hidden_size, intermediate_size, bucket,
                                              f"cached {entry.get('measured')} in {cache_file()}")
