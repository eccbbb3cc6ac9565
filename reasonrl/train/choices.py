"""The run's automatic choices: made once, at the start of a new run, and saved with it.

Some settings leave their value to the machine (`auto`, or 0 = auto). Each of these changes the
numbers a run computes: another decoder, precision, micro-batch layout or thread count rounds
differently, and one flipped sampled token sends the run down another trajectory. So each is
decided once, before any model loads, written into the run's `config.yaml` and checkpoints as
a plain value (shown in one console line at start), and a resume takes the checkpoint's value
instead of deciding again: a resume after the calibration cache changed (a re-measurement on a
quieter machine, `reasonrl calibrate --reset`) computes what the straight run would have, and
`reasonrl train runs/<name>/config.yaml` repeats the run with its choices.

| key | auto means | decided by |
|---|---|---|
| `model.precision` | `auto` | the CPU's flags and a measurement (`calibrate.precision_choice`) |
| `rollout.hf_decoder` | `auto` | each decoder measured on the model (`calibrate.fastest_for_key`) |
| `optim.max_tokens_per_micro_batch` | `0` | the model's shape, the device's memory (`policy.budget`) |
| `trainer.threads` | `0` | the cores (`os.cpu_count()`) |
| `rollout.threads` | `0` | half the cores (asynchronous training's rollout process) |

A value set by the user is kept as it is. The kernels (`optim.lean_kernels`) are not automatic:
they are on unless set off, whatever the machine. Where a choice cannot be made in this process
(a rollout or policy on a GPU that this process does not see) it is left to the worker, and the
line says so.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

import torch

from reasonrl import console
from reasonrl.checkpoint.config_check import UNDECIDED
from reasonrl.config import Config
from reasonrl.placement import precision_decision, role_device, side_beside
from reasonrl.source import source_name

# the keys decided here, in the order they are decided (the precision first: the others read it)
AUTOMATIC = tuple(UNDECIDED)


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _set(cfg: Config, key: str, value) -> Config:
    section, name = key.split(".")
    return dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **{name: value})})


def saved_value(saved: Mapping | None, key: str):
    """The value a checkpoint's saved config holds for `key`; None when it has none or it is
    undecided (a run saved by a reasonrl that did not decide it)."""
    node = saved
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return None if node == UNDECIDED[key] else node


def model_config(cfg: Config):
    """The policy model's transformers config, from its files alone (the tiny model's is built)."""
    from reasonrl.model.load import TINY, build_tiny_model, resolve_model_dir

    if cfg.model.path == TINY:
        return build_tiny_model()[0].config
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(resolve_model_dir(cfg.model.path, cfg.model.revision)))


def rollout_device(cfg: Config) -> str:
    return role_device(cfg, "rollout")


def policy_device(cfg: Config) -> str:
    return role_device(cfg, "policy")


def rollout_threads(cfg: Config) -> int:
    """The torch threads the HF engine generates with: the rollout process's in asynchronous
    local training, else the trainer's (`reasonrl.source.trainer_threads`)."""
    from reasonrl.source import trainer_threads
    from reasonrl.source.schedule import split_threads

    if side_beside(cfg):
        return split_threads(cfg.trainer.threads, cfg.rollout.threads)[1]
    return trainer_threads(cfg)


def decide_decoder(cfg: Config) -> tuple[str | None, str]:
    """(`rollout.hf_decoder` for this run, why): the decoder measured fastest for the policy's
    model at a step's rows (`trainer.batch_size`) on the rollout's device and threads, from the
    calibration cache or measured now (the model is loaded for it only on a cache miss). None
    when the rollout's GPU is not visible here: its worker decides."""
    from reasonrl.accel import calibrate
    from reasonrl.model.colocate import load_model
    from reasonrl.model.precision import cast_for_compute, compute_dtype

    device = rollout_device(cfg)
    if device.startswith("cuda") and not torch.cuda.is_available():
        return None, "the rollout's GPU is not visible in this process: each rollout worker measures it"
    rows = cfg.trainer.batch_size
    threads = torch.get_num_threads()
    torch.set_num_threads(rollout_threads(cfg))
    try:
        config = model_config(cfg)
        key = calibrate.decoder_key(config, compute_dtype(cfg.model.precision), torch.device(device), rows)

        def model():
            loaded, _ = load_model(cfg, device)
            return cast_for_compute(loaded, cfg.model.precision).eval()

        choice, source = calibrate.fastest_for_key(key, model, rows)
    finally:
        torch.set_num_threads(threads)
    return choice, source


def decide_budget(cfg: Config) -> tuple[int | None, str]:
    """(`optim.max_tokens_per_micro_batch` for this run, why): the auto budget of
    `reasonrl.model.budget` for the policy's model in the dtype its learner computes in, on the
    policy's device. None when that device is a GPU this process does not see."""
    from reasonrl.model.budget import auto_budget

    device = policy_device(cfg)
    if device.startswith("cuda") and not torch.cuda.is_available():
        return None, "the policy's GPU is not visible in this process: each policy worker sizes it"
    precision = cfg.model.precision
    ranks = cfg.placement.policy.ranks  # 1 in local placement (config rules)
    # the learner's model: bf16 for pure bf16 and for bf16-mixed's compute copy in one process;
    # data-parallel ranks keep fp32 parameters (FSDP2 casts in its mixed-precision policy)
    bf16 = precision == "bf16" or (precision == "bf16-mixed" and ranks == 1)
    dtype = torch.bfloat16 if bf16 else torch.float32
    budget = auto_budget(model_config(cfg), dtype, torch.device(device))
    name = str(dtype).removeprefix("torch.")
    return budget, f"the model's activations per position in {name} and the {device}'s memory"


def decide(cfg: Config, saved: Mapping | None = None) -> Config:
    """`cfg` with every automatic choice (module docstring) made: the checkpoint's saved value
    when resuming (`saved`: the checkpoint's config) and it has one, else decided now. One
    console line lists what was decided and how."""
    lines = []
    for key in AUTOMATIC:
        if _get(cfg, key) != UNDECIDED[key]:
            continue
        if key == "rollout.threads" and source_name(cfg) != "ahead":
            continue  # read by asynchronous training's rollout process alone
        if key == "rollout.hf_decoder" and cfg.rollout.engine != "hf":
            continue
        value, why = saved_value(saved, key), "the resumed checkpoint's"
        if value is None:
            value, why = _decide(cfg, key)
        if value is None:
            lines.append(f"{key}=auto left to the workers ({why})")
            continue
        cfg = _set(cfg, key, value)
        lines.append(f"{key}={value} ({why})")
    if lines:
        console.info("automatic choices, saved with the run: " + "; ".join(lines))
    return cfg


def _decide(cfg: Config, key: str):
    if key == "model.precision":
        return precision_decision(cfg)
    if key == "rollout.hf_decoder":
        return decide_decoder(cfg)
    if key == "optim.max_tokens_per_micro_batch":
        return decide_budget(cfg)
    if key == "trainer.threads":
        return os.cpu_count() or 1, "one per core"
    from reasonrl.source.schedule import split_threads

    return split_threads(cfg.trainer.threads, 0)[1], "half the cores"


# bf16 matrix products emulated on a CPU without bf16 units, against fp32 (docs/performance.md): a
# [4096 x 576] @ [576 x 1536] product ~30x slower on an AVX2 AMD EPYC; its decode step 42x (11.5 s
# against 0.275 s for fp32's lean_mkl decoder)
EXPECTED_BF16_SLOWDOWN = "about 30x (42x for a decode step, measured on an AVX2 AMD EPYC)"


def measured_bf16_ratio() -> float | None:
    """fp32 / bf16 seconds of the newest precision calibration of this CPU and torch in the
    cache (below 1: bf16 slower), None when there is none."""
    from reasonrl.accel import calibrate

    found = [e for k, e in calibrate.entries().items() if e.get("kind") == "precision"
             and f"| {calibrate.cpu_model()} | torch {torch.__version__} " in k
             and isinstance(e.get("seconds"), dict) and e["seconds"].get("bf16")]
    if not found:
        return None
    newest = max(found, key=lambda e: str(e.get("measured", "")))
    return newest["seconds"]["fp32"] / newest["seconds"]["bf16"]


def warn_slow_precision(cfg: Config) -> bool:
    """An explicit bf16 precision (`bf16-mixed`, `bf16`) on a CPU whose flags name no bf16 units
    makes every matrix product emulated, the run many times slower: said at once, before any
    calibration or model load, with the measured ratio where the calibration cache has one (else
    the expected one) and what to set instead. True when it warned."""
    from reasonrl.accel import calibrate

    p = cfg.model.precision
    on_cpu = policy_device(cfg) == "cpu" or rollout_device(cfg) == "cpu"
    if p not in ("bf16", "bf16-mixed") or not on_cpu or calibrate.bf16_units() is not False:
        return False
    ratio = measured_bf16_ratio()
    slower = (f"measured here {1 / ratio:.1f}x slower than fp32" if ratio and ratio < 1
              else f"expected {EXPECTED_BF16_SLOWDOWN} slower than fp32")
    console.warning(f"model.precision={p} on a CPU without bf16 units (flags "
                    f"[{' '.join(calibrate.cpu_flags())}]: none of {', '.join(calibrate.BF16_FLAGS)}): "
                    f"its bf16 matrix products are emulated, {slower}. model.precision=auto picks fp32 "
                    "on this CPU; model.precision=fp32 says so")
    return True
