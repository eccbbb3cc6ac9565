"""Where the workers live: the only package that decides placement, and the only one that
imports `ray`. `build_workers(cfg)` returns the workers the trainer calls, wherever they run,
and the weight sync between them. One module per job:

- `roles`: the role table (each role's protocol, count, `placement.<role>` section, how it is
  built: a `from_config` in the worker's own module), which every builder loops over;
- `preflight`: what the config asks of this machine (extras, GPUs, the model's context),
  checked before any model loads;
- `local`: placement.mode=local (the workers in this process; an isolated role, the judge, in
  a process of its own: `isolated`), and `Workers`, what every mode returns;
- `actors`: placement.mode=ray (the workers inside Ray actors, capacity and start-up checks);
- `proxies`: the trainer's side of ray mode (the declared worker APIs as remote calls);
- `sync`: weight sync, `WeightSync.push(version)` over a transport (in-process copy, or
  buckets streamed from the policy's actors to the rollout replicas), and its two halves for
  asynchronous training (`snapshot` now, `receive` later; shared memory to the rollout process).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from reasonrl import console
from reasonrl.config import Config, resolve_device
from reasonrl.model.precision import resolve
from reasonrl.placement.actors import build_ray_workers, ray_device
from reasonrl.placement.local import Workers, build_here, build_local_workers
from reasonrl.placement.preflight import (
    DEFAULT_POSITIONS,
    TINY_POSITIONS,
    check_model_context,
    model_positions,
    preflight,
)
from reasonrl.placement.proxies import RemoteCritic, RemotePolicy, RemoteRollout, RemoteTeacher
from reasonrl.placement.roles import ROLES, Host, Role, active
from reasonrl.placement.sync import (
    InProcessCopy,
    SharedMemory,
    StreamedBuckets,
    WeightSync,
    receive,
    share_weights,
    unshare_weights,
)
from reasonrl.registry import ENGINES
from reasonrl.weights import probe_ids

__all__ = ["DEFAULT_POSITIONS", "MODES", "ROLES", "TINY_POSITIONS", "Host", "InProcessCopy", "RemoteCritic",
           "RemotePolicy", "RemoteRollout", "RemoteTeacher", "Role", "SharedMemory", "StreamedBuckets",
           "WeightSync", "Workers", "build_here", "build_workers", "check_model_context", "model_positions",
           "precision_decision", "preflight", "receive", "role_device", "share_weights", "side_beside",
           "side_workers", "snapshot_sync", "unshare_weights",
           "with_precision"]


@dataclasses.dataclass(frozen=True)
class Mode:
    """A placement.mode: how it builds the workers (every role of the table, or those named),
    the device a role's worker computes on, and whether asynchronous training's rollout side is
    a process beside the trainer on this machine (then the two share its cores, and that process
    builds the roles only it uses: `side_workers`). Modules above
    ask these instead of branching on the mode (tests/test_architecture.py checks that none does)."""

    build: Callable[..., Workers]
    device: Callable[[Config, str], str]
    side_beside: bool


MODES = {"local": Mode(build_local_workers, lambda cfg, role: resolve_device(cfg.placement.device),
                       side_beside=True),
         "ray": Mode(build_ray_workers, ray_device, side_beside=False)}


def role_device(cfg: Config, role: str) -> str:
    """The device `role`'s worker computes on where placement.mode puts it."""
    return str(MODES[cfg.placement.mode].device(cfg, role))


def side_beside(cfg: Config) -> bool:
    """Asynchronous training (trainer.max_staleness > 0) with its rollout side in a process on
    this machine (placement.mode=local): the trainer's and the side's torch threads share the cores."""
    return cfg.trainer.max_staleness > 0 and MODES[cfg.placement.mode].side_beside


def precision_decision(cfg: Config) -> tuple[str, str | None]:
    """(the precision `model.precision` resolves to here, why; None when it was not `auto`):
    `reasonrl.model.precision.resolve` at the policy's device and a micro-batch's positions.
    The only place a config's `auto` is resolved: a run's automatic choices
    (`reasonrl.train.choices`) and `with_precision` both ask it."""
    device = role_device(cfg, "policy")
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


def build_workers(cfg: Config, roles: tuple[str, ...] | None = None) -> Workers:
    """The run's workers, every role of the table the config turns on (`roles`: only those, as
    `reasonrl reward` builds its judge), in this process (placement.mode=local) or in Ray actors
    (ray). Some roles alone (a judge) are built as they are: the policy's precision and context
    are the whole run's business. Where asynchronous training's rollout side is a process beside
    this one (`side_beside`), the roles only it uses (`Role.side`: the judge) are left to it
    (`side_workers`): `Workers.judge` is None here."""
    running = active(cfg, roles)  # the role counts, asked once
    if roles is None:
        cfg = with_precision(cfg)
        # again: `reasonrl probe`'s --max-new-tokens reaches only this config
        check_model_context(cfg, running)
        if side_beside(cfg):
            running = [(role, n) for role, n in running if not role.side]
    return MODES[cfg.placement.mode].build(cfg, running)


def side_workers(cfg: Config) -> Workers:
    """The workers of the roles only the rollout side uses (`Role.side`: the judge, when the run
    has one), built by the rollout process beside the trainer for itself (local placement,
    asynchronous training: `build_workers` left them out of the trainer's process), as
    `build_local_workers` builds them (an isolated role in a process of its own)."""
    return build_local_workers(cfg, active(cfg, tuple(role.name for role in ROLES if role.side)))


def snapshot_sync(cfg: Config, workers: Workers) -> WeightSync:
    """The weight sync of asynchronous training, whose pushes are split in two (`snapshot`,
    `receive`): to the rollout process through shared memory (placement.mode=local), or to the
    rollout replicas through Ray's object store (ray: the streamed buckets of `workers.sync`).
    Snapshots carry the probe's log-probs when the engine may check a push by them."""
    probes = ENGINES[cfg.rollout.engine].probes(cfg.rollout)
    return workers.split(probe_ids(workers.tokenizer) if probes else None)
