"""Weight sync: the policy's weights into the rollout engine(s), every push checked.

As verl's `checkpoint_engine`, the sync is its own object with pluggable transports:
`WeightSync.push(version)` asks the policy for what the engine must serve afterwards (its
`weights_checksum`, and the log-probs of a probe sequence when the engine wants one:
`probe_due`) and hands that to a transport, which moves the weights and has the rollout
side load them and run the checks (`RolloutWorker.load_weights`: `WeightSyncError` on a
mismatch; later rollouts carry `version`). The transports:

- `InProcessCopy` (placement.mode=local): the policy's `named_weights` into the rollout
  worker, in this process. The HF engine sharing the policy's model copies nothing.
- `StreamedBuckets` (placement.mode=ray): the plan (`sync_plan`: the weights training
  changes, in buckets of `placement.sync_bucket_mb`) fixed when the workers are built; each
  push gathers one bucket at a time on the policy's rank 0 (`weight_bucket`) and every
  rollout replica loads it through Ray's object store (`load_weight_bucket`, the last with
  the checks), actor to actor, never through the trainer, at most two buckets in flight.
  Asynchronous training splits a push in two: `snapshot` (the buckets gathered into the object
  store when the version exists) and `load` (by the replicas, when the schedule reaches it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from reasonrl.workers import PolicyWorkerAPI, RolloutWorkerAPI

if TYPE_CHECKING:
    from reasonrl.placement.proxies import ActorGroup


class Transport(Protocol):
    def send(self, checks: dict) -> None:
        """Move the policy's weights to the rollout side, which loads them and then runs
        `RolloutWorkerAPI.load_weights`'s checks with `checks` (version, expected_checksum,
        expected_probe)."""
        ...


class InProcessCopy:
    """The policy's `named_weights` into the rollout worker (both plain objects, or the
    protocols' proxies: then the tensors pass through this process)."""

    def __init__(self, policy: PolicyWorkerAPI, rollout: RolloutWorkerAPI):
        self.policy, self.rollout = policy, rollout

    def send(self, checks: dict) -> None:
        self.rollout.load_weights(self.policy.named_weights(), **checks)


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
    by checksum and, when the engine asks for one, by probe log-probs."""

    def __init__(self, policy: PolicyWorkerAPI, rollout: RolloutWorkerAPI, transport: Transport):
        self.policy, self.rollout, self.transport = policy, rollout, transport

    def push(self, version: int) -> dict:
        """The checks the push passed (version, expected_checksum, expected_probe)."""
        probe = self.rollout.probe_due()
        checks = dict(version=version, expected_checksum=self.policy.weights_checksum(),
                      expected_probe=None if probe is None else self.policy.probe_logprobs(probe))
        self.transport.send(checks)
        return checks
