"""The workers built in this process (placement.mode=local), and `Workers`, what every mode's
builder returns.

`build_local_workers` loops over the role table (`reasonrl.placement.roles`): each role's
`from_config` builds it here, on `placement.device` (auto = the GPU when torch sees one), with
one `shared` dict for the workers of this process (the HF rollout engine shares the policy's
model: a weight sync copies nothing and is verified by checksum; with LoRA the engine holds a
plain copy and receives the merged weights). An isolated role (the judge) runs in a process of
its own (`isolated.ProcessWorker`), each call within its deadline; a role served within
another's worker (the reference, within the policy's) is that worker's view. No weight sync
reaches a frozen model: `WeightSync` moves the policy's weights to the rollout worker alone.
"""

from __future__ import annotations

from collections.abc import Callable

from reasonrl.config import Config, resolve_device
from reasonrl.placement import roles as table
from reasonrl.placement.isolated import ProcessWorker
from reasonrl.placement.roles import Host, Role
from reasonrl.placement.sync import InProcessCopy, SharedMemory, WeightSync


class Workers:
    """What `build_workers` returns: each role's worker (plain objects, Ray proxies or a process
    of its own) by the role's name (`workers.policy`, `workers.judge`: None when the run has no
    such role), the tokenizer, the weight sync from the policy to the rollout engine(s), and how
    asynchronous training splits that sync (`split`: the probe ids -> a `WeightSync` whose pushes
    are a `snapshot` now and a `receive` later)."""

    def __init__(self, workers: dict[str, object], tokenizer=None, sync: WeightSync | None = None,
                 split: Callable[[list[int] | None], WeightSync] | None = None, actors: list | None = None):
        self.workers, self.tokenizer, self.sync, self.split = workers, tokenizer, sync, split
        self.actors = actors or []  # ray mode: the actor handles, for close()

    def __getattr__(self, name: str):
        if name != "workers" and name in {r.name for r in table.ROLES}:
            return self.__dict__.get("workers", {}).get(name)
        raise AttributeError(name)

    def close(self) -> None:
        """Free the workers, the last built first (engines closed: vLLM's memory and process
        state; isolated processes stopped), then the Ray actors. Safe to call twice."""
        workers, self.workers, self.sync = self.workers, {}, None
        try:
            for worker in reversed(list(workers.values())):
                worker.close()
        finally:
            if self.actors:
                from reasonrl.placement.proxies import stop_actors

                stop_actors(self.actors)
                self.actors = []


def local_device(cfg: Config) -> str:
    return resolve_device(cfg.placement.device)


def isolated_worker(role: Role, cfg: Config, host: Host) -> ProcessWorker:
    """`role`'s worker in a process of its own, built now (a model that cannot load: raised here)."""
    return ProcessWorker(role.name, role.build, role.api, cfg, host, role.load_timeout(cfg),
                         role.call_timeout(cfg))


def build_here(cfg: Config, name: str):
    """Role `name`'s worker built in this process, alone (the rollout process of asynchronous
    training builds its engine so), on `placement.device`."""
    return table.role(name).build(cfg, Host(device=local_device(cfg)))


def build_local_workers(cfg: Config, roles: list[tuple[Role, int]]) -> Workers:
    """The run's `roles` (`roles.active`) in this process, in table order (see the module
    docstring)."""
    host = Host(device=local_device(cfg), shared={})
    built: dict[str, object] = {}
    try:
        for role, _ in roles:
            if not role.within:
                built[role.name] = (isolated_worker(role, cfg, Host(device=host.device)) if role.isolated
                                    else role.build(cfg, host))
        table.served_within(roles, built, cfg)
    except BaseException:
        Workers(built).close()
        raise
    policy, rollout = built.get("policy"), built.get("rollout")
    if policy is None or rollout is None:
        return Workers(built)
    sync = WeightSync(policy, rollout, InProcessCopy(policy, rollout))
    return Workers(built, tokenizer=rollout.tokenizer, sync=sync,
                   split=lambda probe: WeightSync(policy, None, SharedMemory(policy), probe))
