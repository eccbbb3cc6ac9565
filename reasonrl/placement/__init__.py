"""Where the workers live: the only package that decides placement, and the only one that
imports `ray`. `build_workers(cfg)` returns the workers the trainer calls, wherever they run,
and the weight sync between them. One module per job:

- `preflight`: what the config asks of this machine (extras, GPUs, the model's context),
  checked before any model loads;
- `local`: the factories of every worker, and placement.mode=local (plain objects here);
- `actors`: placement.mode=ray (the workers inside Ray actors, capacity and start-up checks);
- `proxies`: the trainer's side of ray mode (the declared worker APIs as remote calls);
- `sync`: weight sync, `WeightSync.push(version)` over a transport (in-process copy, or
  buckets streamed from the policy's actors to the rollout replicas), and its two halves for
  asynchronous training (`snapshot` now, `receive` later; shared memory to the rollout process).
"""

from __future__ import annotations

import dataclasses

from reasonrl import console
from reasonrl.config import Config, resolve_device
from reasonrl.placement.actors import build_ray_workers
from reasonrl.placement.local import (
    Workers,
    build_local_workers,
    critic_lm,
    load_model,
    make_critic,
    make_policy,
    make_rollout,
    make_teacher,
    rollout_process_worker,
    value_model,
)
from reasonrl.placement.preflight import (
    DEFAULT_POSITIONS,
    TINY_POSITIONS,
    check_model_context,
    model_positions,
    preflight,
)
from reasonrl.placement.proxies import RemoteCritic, RemotePolicy, RemoteRollout, RemoteTeacher
from reasonrl.placement.sync import (
    InProcessCopy,
    SharedMemory,
    StreamedBuckets,
    WeightSync,
    receive,
    share_weights,
    unshare_weights,
)
from reasonrl.policy.precision import resolve
from reasonrl.registry import ENGINES
from reasonrl.weights import probe_ids

__all__ = ["DEFAULT_POSITIONS", "TINY_POSITIONS", "InProcessCopy", "RemoteCritic",
           "RemotePolicy", "RemoteRollout", "RemoteTeacher", "SharedMemory", "StreamedBuckets", "WeightSync",
           "Workers", "build_workers", "check_model_context", "critic_lm", "load_model", "make_critic",
           "make_policy", "make_rollout", "make_teacher", "model_positions", "preflight", "receive",
           "rollout_process_worker",
           "precision_decision", "share_weights", "snapshot_sync", "unshare_weights", "value_model",
           "with_precision"]


def precision_decision(cfg: Config) -> tuple[str, str | None]:
    """(the precision `model.precision` resolves to here, why; None when it was not `auto`):
    `reasonrl.policy.precision.resolve` at the policy's device and a micro-batch's positions.
    The only place a config's `auto` is resolved: a run's automatic choices
    (`reasonrl.train.choices`) and `with_precision` both ask it."""
    policy_gpus = cfg.placement.mode == "ray" and cfg.placement.policy.num_gpus > 0
    device = "cuda" if policy_gpus else str(resolve_device(cfg.placement.device))
    rows = cfg.optim.micro_batch_size * (cfg.rollout.max_new_tokens + cfg.data.max_prompt_tokens // 4)
    tokens = max(64, min(2048, rows))  # a micro-batch's positions, about
    return resolve(cfg.model.precision, cfg.model.path, cfg.model.revision, tokens, device)


def with_precision(cfg: Config) -> Config:
    """`cfg` with `model.precision=auto` resolved to the precision a calibration on this machine
    picked (`precision_decision`; said in one console line), before any model loads: every
    worker, actor and rollout process is then given the same answer. A run decides it once, with
    its other automatic choices, and saves it (`reasonrl.train.choices`); here for callers that
    build workers from a config that still says `auto`. Other values: `cfg` unchanged."""
    if cfg.model.precision != "auto":
        return cfg
    precision, why = precision_decision(cfg)
    console.info(f"model.precision=auto -> {precision}: {why}")
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, precision=precision))


def build_workers(cfg: Config) -> Workers:
    """The run's workers, in this process (placement.mode=local) or in Ray actors (ray)."""
    cfg = with_precision(cfg)
    check_model_context(cfg)  # again: `reasonrl probe`'s --max-new-tokens reaches only this config
    if cfg.placement.mode == "ray":
        return build_ray_workers(cfg)
    if cfg.placement.mode != "local":
        raise ValueError(f"placement.mode: unknown mode {cfg.placement.mode!r}; allowed: local, ray")
    return build_local_workers(cfg)


def snapshot_sync(cfg: Config, workers: Workers) -> WeightSync:
    """The weight sync of asynchronous training, whose pushes are split in two (`snapshot`,
    `receive`): to the rollout process through shared memory (placement.mode=local), or to the
    rollout replicas through Ray's object store (ray: the streamed buckets of `workers.sync`).
    Snapshots carry the probe's log-probs when the engine may check a push by them."""
    probes = ENGINES[cfg.rollout.engine].info["probes"](cfg.rollout)
    probe = probe_ids(workers.tokenizer) if probes else None
    if cfg.placement.mode == "ray":
        return WeightSync(workers.policy, workers.rollout, workers.sync.transport, probe)
    return WeightSync(workers.policy, None, SharedMemory(workers.policy), probe)
