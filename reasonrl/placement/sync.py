"""Weight sync: the policy's weights into the rollout engine(s), every push checked.

As verl's `checkpoint_engine`, the sync is its own object with pluggable transports:
`WeightSync.push(version)` asks the policy for what the engine must serve afterwards (its
`weights_checksum`, and the log-probs of a probe sequence when the engine wants one:
`probe_due`) and hands that to a transport, which moves the weights and has the rollout
side load them and run the checks (`RolloutWorker.load_weights`: `WeightSyncError` on a
mismatch; later rollouts carry `version`). The transports:

- `InProcessCopy` (placement.mode=local): the policy's `named_weights` into the rollout
  worker, in this process. The HF engine sharing the policy's model copies nothing.
- `SharedMemory` (placement.mode=local with trainer.max_staleness > 0): the weights into one
  shared-memory buffer per dtype, which the rollout process (`reasonrl.source`) loads from
  without a copy through the pipe.
- `StreamedBuckets` (placement.mode=ray): the plan (`sync_plan`: the weights training
  changes, in buckets of `placement.sync_bucket_mb`) fixed when the workers are built; each
  push gathers one bucket at a time on the policy's rank 0 (`weight_bucket`) and every
  rollout replica loads it through Ray's object store (`load_weight_bucket`, the last with
  the checks), actor to actor, never through the trainer, at most two buckets in flight.

Asynchronous training (`reasonrl.source.Ahead`) splits a push in two, on a `SplitTransport`:
`WeightSync.snapshot(version)` takes the weights and the checks when the version exists (the
next update would change them), and `receive` loads them on the rollout side when the
schedule reaches that version, with the same checks as `push`. Every weight move of a run
goes through this module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

import torch

from reasonrl.errors import WeightSyncError
from reasonrl.worker_protocols import PolicyWorkerAPI, RolloutWorkerAPI

if TYPE_CHECKING:
    from reasonrl.placement.proxies import ActorGroup


class Transport(Protocol):
    def send(self, checks: dict) -> None:
        """Move the policy's weights to the rollout side, which loads them and then runs
        `RolloutWorkerAPI.load_weights`'s checks with `checks` (version, expected_checksum,
        expected_probe)."""
        ...


class SplitTransport(Protocol):
    """A transport whose push can be split in two (`WeightSync.snapshot`, `receive`): the
    shared memory to the rollout process, the streamed buckets to the rollout replicas."""

    def snapshot(self, what: str) -> object:
        """The policy's weights as they are now, in a form `load` takes later (maybe in another
        process): the first half of `send`."""
        ...

    def load(self, payload: object, checks: dict) -> None:
        """A `snapshot` into the rollout side, then the checks: the second half of `send`."""
        ...


class InProcessCopy:
    """The policy's `named_weights` into the rollout worker (both plain objects, or the
    protocols' proxies: then the tensors pass through this process)."""

    def __init__(self, policy: PolicyWorkerAPI, rollout: RolloutWorkerAPI):
        self.policy, self.rollout = policy, rollout

    def send(self, checks: dict) -> None:
        self.rollout.load_weights(self.policy.named_weights(), **checks)


def share_weights(named) -> tuple[dict[str, torch.Tensor], list[tuple[str, str, int, tuple[int, ...]]]]:
    """(one flat shared-memory buffer per dtype, the layout: name, dtype, offset, shape) of the
    (name, tensor) pairs `named`, copied in."""
    tensors = [(name, t.detach()) for name, t in named]
    sizes: dict[str, int] = {}
    layout = []
    for name, t in tensors:
        key = str(t.dtype).removeprefix("torch.")
        layout.append((name, key, sizes.get(key, 0), tuple(t.shape)))
        sizes[key] = sizes.get(key, 0) + t.numel()
    buffers = {key: torch.empty(n, dtype=getattr(torch, key)).share_memory_() for key, n in sizes.items()}
    for (_, key, offset, shape), (_, t) in zip(layout, tensors, strict=True):
        buffers[key][offset: offset + t.numel()].view(shape).copy_(t.reshape(shape))
    return buffers, layout


def unshare_weights(buffers: dict[str, torch.Tensor], layout) -> list[tuple[str, torch.Tensor]]:
    """The (name, tensor) views of `share_weights`' buffers."""
    return [(name, buffers[key][offset: offset + math.prod(shape)].view(shape))
            for name, key, offset, shape in layout]


class SharedMemory:
    """The policy's weights to a rollout worker in another process of this machine: `snapshot`
    copies them into one shared-memory buffer per dtype (in the trainer's process, `policy`
    given), `load` reads them there without a copy (in the rollout process, `rollout` given;
    the buffers cross a `torch.multiprocessing` pipe as handles). The rollout process's copy
    into its engine is the only pause of its generation."""

    def __init__(self, policy: PolicyWorkerAPI | None = None, rollout: RolloutWorkerAPI | None = None):
        self.policy, self.rollout = policy, rollout

    def snapshot(self, what: str) -> tuple[dict[str, torch.Tensor], list]:
        return share_weights(self.policy.named_weights())

    def load(self, payload: tuple[dict[str, torch.Tensor], list], checks: dict) -> None:
        buffers, layout = payload
        self.rollout.load_weights(unshare_weights(buffers, layout), **checks)


class StreamedBuckets:
    """The buckets of `plan` from the policy's actors to every rollout replica's actor: bucket
    i is gathered on the policy's rank 0 (every rank takes part; the others return nothing)
    while the replicas load bucket i - 1, so at most two are in flight; the last bucket goes
    with the checks. A replica that times out, dies or fails its check is named."""

    def __init__(self, policy: ActorGroup, replicas: ActorGroup, plan: list[list[str]]):
        self.policy, self.replicas, self.plan = policy, replicas, plan

    def send(self, checks: dict) -> None:
        what = f"load_weights(version={checks['version']})"
        buckets = self.plan or [[]]
        loading, gathered = [], []  # the replicas' loads of the previous bucket; its other ranks
        for i, names in enumerate(buckets):
            ref, *others = self.policy.start("weight_bucket", (names,), keep="first")
            self.replicas.wait(loading, what, self.replicas.names[: len(loading)])
            self.policy.wait(gathered, f"weight_bucket() for {what}")
            method, kwargs = ("load_weights", checks) if i == len(buckets) - 1 else ("load_weight_bucket", {})
            loading = self.replicas.start(method, (ref,), kwargs, keep="none")
            gathered = others
            del ref  # the bucket leaves the object store once every replica has loaded it
        self.replicas.wait(loading, what, self.replicas.names)
        self.policy.wait(gathered, f"weight_bucket() for {what}")

    def snapshot(self, what: str) -> list:
        """Every bucket of the plan gathered now on the policy's rank 0, as object references
        (not fetched here): the weights as they are at this call. The policy's actors run calls
        in the order they are sent, so a later update cannot reach them; a snapshot stays in the
        object store until its references are dropped. For `load` later (asynchronous training:
        the replicas are generating with an older version now)."""
        refs, others = [], []
        for names in self.plan or [[]]:
            ref, *rest = self.policy.start("weight_bucket", (names,), keep="first")
            refs.append(ref)
            others += rest
        self.policy.ready(refs, f"weight_bucket() for {what}")
        self.policy.wait(others, f"weight_bucket() for {what}")
        return refs

    def load(self, refs: list, checks: dict) -> None:
        """Every replica loads a `snapshot`'s buckets in order, the last with the checks."""
        what = f"load_weights(version={checks['version']})"
        loading, names = [], []
        for i, ref in enumerate(refs):
            method, kwargs = ("load_weights", checks) if i == len(refs) - 1 else ("load_weight_bucket", {})
            loading += self.replicas.start(method, (ref,), kwargs, keep="none")
            names += self.replicas.names
        self.replicas.wait(loading, what, names)


class WeightSync:
    """`push(version)`: the policy's current weights into the rollout engine(s), checked there
    by checksum and, when the engine asks for one, by probe log-probs. `snapshot(version)`:
    the same weights and checks taken now, for `receive` on the rollout side later; the probe's
    log-probs are computed then when `probe` (the probe's token ids) is given, for engines
    that may check a push by them (the rollout side decides which pushes it checks)."""

    def __init__(self, policy: PolicyWorkerAPI, rollout: RolloutWorkerAPI | None,
                 transport: Transport | SplitTransport,
                 probe: list[int] | None = None):
        self.policy, self.rollout, self.transport, self.probe = policy, rollout, transport, probe

    def push(self, version: int) -> dict:
        """The checks the push passed (version, expected_checksum, expected_probe)."""
        probe = self.rollout.probe_due()
        checks = dict(version=version, expected_checksum=self.policy.weights_checksum(),
                      expected_probe=None if probe is None else self.policy.probe_logprobs(probe))
        self.transport.send(checks)
        return checks

    def snapshot(self, version: int) -> tuple[object, dict]:
        """(the transport's snapshot of the policy's weights now, the checks it must pass)."""
        checks = dict(version=version, expected_checksum=self.policy.weights_checksum(),
                      expected_probe=None if self.probe is None else self.policy.probe_logprobs(self.probe))
        return self.transport.snapshot(f"policy version {version}"), checks


def receive(transport: SplitTransport, rollout: RolloutWorkerAPI, payload: object, checks: dict,
            engine: str) -> None:
    """A `WeightSync.snapshot` loaded on the rollout side (`transport`'s receiving half) and
    checked: by checksum, and by the probe's log-probs when `rollout` wants this push probed.
    A probe the engine wants and the snapshot lacks is a `WeightSyncError`, never a skipped
    check."""
    due = rollout.probe_due()
    if due is None:  # this push is not probed
        checks = {**checks, "expected_probe": None}
    elif checks["expected_probe"] is None:
        raise WeightSyncError(f"weight sync to policy version {checks['version']}: the rollout engine "
                              f"wants this push checked by probe log-probs, and the engine's entry "
                              f"(rollout.engine={engine}) says it never probes, so none were computed "
                              "when the version was published")
    transport.load(payload, checks)
