"""Ray mode (placement.mode=ray): the workers built inside Ray actors, and the checks that
an actor Ray cannot place fails at start-up with the keys to change.

The same plain classes (`PolicyWorker`, `RolloutWorker`, `CriticWorker`, `TeacherWorker`) are
built inside `WorkerHost` actors with the resources of `placement.policy` / `placement.rollout` /
`placement.critic` / `placement.teacher` (fractional `num_gpus`, `num_cpus`, custom resources),
on the Ray at `placement.address` or on one started for the run. The trainer gets proxies
(`reasonrl.placement.proxies`) with the same methods. Every wait has a timeout and an error
naming the worker and the resources it asks for (an actor Ray cannot place otherwise waits
forever, silently). `placement.policy.ranks=N` makes the policy a group of N data-parallel
ranks (`reasonrl.workers.ranks`: torch.distributed + FSDP2, with or without LoRA), and
`placement.critic.ranks` the critic; `placement.rollout.replicas=N` makes N rollout actors
behind one proxy. Weights go from the policy's actors to the rollout actors through Ray's
object store, never through this process (`sync.StreamedBuckets`, its plan fixed here).
Ray is imported inside the functions that call it: this module loads without the extra.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import socket
import tempfile
import types
from pathlib import Path
from typing import Any

import torch

from reasonrl import console
from reasonrl.config import Config
from reasonrl.errors import ModelLoadError, PlacementError, WorkerCallError, WorkerTimeout
from reasonrl.placement import roles as table
from reasonrl.placement.isolated import hard_deadline
from reasonrl.placement.local import Workers
from reasonrl.placement.proxies import ActorGroup, for_transport, resources_of, stop_actors
from reasonrl.placement.roles import Host, Role
from reasonrl.placement.sync import StreamedBuckets, WeightSync
from reasonrl.registry import ENGINES
from reasonrl.worker_protocols import api_methods, missing_methods

# what every actor process gets in its environment (besides REASONRL_HOME when set here)
ACTOR_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def _device(num_gpus: float) -> str:
    return "cuda" if num_gpus > 0 else "cpu"  # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU


class WorkerHost:
    """Runs inside a Ray actor: builds one plain worker and calls its methods by name."""

    def __init__(self, threads: int):
        import warnings

        torch.set_num_threads(threads)
        # the weights we return are detached, contiguous and not written while in flight;
        # those we receive are only read (copied into the model)
        warnings.filterwarnings("ignore", message="Zero-copy tensor serialization is enabled")
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.worker: Any = None

    def rendezvous(self) -> str:
        """tcp://ip:port of a free port on this actor's machine (rank 0 of a policy group)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def build(self, builder, api: type, *args) -> list[str]:
        """Build the worker (its role's `from_config(cfg, host)`); returns the methods of `api`
        it lacks (none, or start-up fails)."""
        self.worker = builder(*args)
        return missing_methods(self.worker, api)

    def call(self, method: str, args: tuple, kwargs: dict, keep: bool = True):
        import ray

        # object references inside `args` (weights, a batch shared by all ranks) are fetched here
        args = tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args)
        out = getattr(self.worker, method)(*args, **kwargs)
        if isinstance(out, types.GeneratorType):
            out = list(out)
        if not keep:
            return None
        return for_transport(out)

    def call_into_folder(self, method: str, args: tuple, keep: bool = True):
        """`method(folder, *args)` into a temporary folder here; returns (its result, the
        files it wrote) so that the caller's machine gets them, wherever this actor runs."""
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "out"
            result = getattr(self.worker, method)(folder, *args)
            files = ({str(f.relative_to(folder)): f.read_bytes() for f in sorted(folder.rglob("*"))
                      if f.is_file()} if keep and folder.is_dir() else {})
        return result, files


def _connect(p) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs = dict(include_dashboard=False, log_to_driver=True)
    if p.address:
        ray.init(address=p.address, **kwargs)
    else:
        ray.init(num_cpus=p.num_cpus or None, **kwargs)


def _start(role, cfg: Config, env: dict[str, str]) -> Any:
    """A `WorkerHost` actor with the resources of `role` (not waited for here)."""
    import ray

    threads = cfg.trainer.threads or max(1, int(role.num_cpus))
    return ray.remote(WorkerHost).options(
        num_cpus=role.num_cpus, num_gpus=role.num_gpus, resources=dict(role.resources),
        runtime_env={"env_vars": env}).remote(threads)


def _await_start(actors: list[tuple[str, Any, Any]], refs: list, what: str, cfg: Config) -> list:
    """ray.get(refs) within `placement.start_timeout`, else kill the actors and raise
    PlacementError naming the worker(s) not ready and the resources they ask for."""
    import ray

    timeout = cfg.placement.start_timeout
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    if len(ready) < len(refs):
        late = [(name, role) for (name, _, role), ref in zip(actors, refs, strict=True) if ref not in ready]
        available = {k: v for k, v in ray.available_resources().items() if not k.startswith("node:")}
        lines = []
        for name, role in late:
            request = resources_of(role)
            fits = all(available.get(k, 0.0) >= v for k, v in request.items() if v)
            why = ("Ray has these resources free now, so it is starting slowly: raise "
                   "placement.start_timeout" if fits else
                   f"no machine of the Ray cluster offers that; Ray has {available} free")
            lines.append(f"the {name} worker waits for {request} to {what}: {why}")
        stop_actors([actor for _, actor, _ in actors])
        raise PlacementError(f"ray: not ready within {timeout:g} s (placement.start_timeout): "
                             + "; ".join(lines) + ". Lower placement.<worker>.num_cpus / num_gpus / "
                             "resources, or add machines to the cluster")
    try:
        return ray.get(refs)
    except Exception:
        stop_actors([actor for _, actor, _ in actors])
        raise


def check_api(actors: list[tuple[str, Any, Any]], missing: list[list[str]]) -> None:
    """PlacementError (and the actors stopped) when a built worker lacks declared methods."""
    lacking = [f"the {name} worker has no {', '.join(m)}"
               for (name, _, _), m in zip(actors, missing, strict=True) if m]
    if lacking:
        stop_actors([actor for _, actor, _ in actors])
        raise PlacementError("ray: " + "; ".join(lacking) + " (reasonrl.worker_protocols declares them)")


def check_capacity(cfg: Config, roles: list[tuple[Role, int]]) -> None:
    """PlacementError, before any actor starts, when the workers ask for more CPUs or GPUs than
    the Ray cluster has in all, or a rollout replica for more GPUs than any one machine has
    (an actor Ray cannot place would wait for placement.start_timeout): names the keys and
    the resources that exist. Custom resources are left to the start timeout."""
    import ray

    groups = [(role.count_key, n, role.section or role.name, role.placement(cfg)) for role, n in roles]
    total = ray.cluster_resources()
    have = f"{total.get('CPU', 0):g} CPU and {total.get('GPU', 0):g} GPU"
    for resource, attr in (("CPU", "num_cpus"), ("GPU", "num_gpus")):
        asked = sum(count * getattr(section, attr) for _, count, _, section in groups)
        if asked > total.get(resource, 0) + 1e-9:
            parts = " + ".join(f"{key}={count} x placement.{name}.{attr}={getattr(section, attr):g}"
                               for key, count, name, section in groups if getattr(section, attr))
            raise PlacementError(f"ray: the workers ask for {asked:g} {resource} in all ({parts}); the Ray "
                                 f"cluster has {have} in all. Lower placement.rollout.replicas, the ranks or "
                                 f"the workers' {attr}, or add machines (or placement.num_cpus for a Ray "
                                 "started by the run)")
    per_node = [node["Resources"].get("GPU", 0) for node in ray.nodes() if node.get("Alive")]
    need, key = ENGINES[cfg.rollout.engine].machine_gpus(cfg.rollout)
    if max(per_node, default=0) < need:
        raise PlacementError(f"{key}: {need} GPUs per engine on one machine; the Ray cluster's machines "
                             f"have {sorted(per_node, reverse=True)} GPUs")


def _absolute_paths(cfg: Config, roles: list[tuple[Role, int]]) -> Config:
    """`cfg` with the roles' model paths that are folders here made absolute: actors may run
    elsewhere, in another working directory."""
    for role, _ in roles:
        for key in role.paths:
            section, name = key.rsplit(".", 1)
            parent = cfg
            for part in section.split("."):
                parent = getattr(parent, part)
            path = getattr(parent, name)
            if path and Path(path).exists():
                cfg = _replace_key(cfg, key, str(Path(path).resolve()))
    return cfg


def _replace_key(obj, key: str, value):
    head, _, rest = key.partition(".")
    new = value if not rest else _replace_key(getattr(obj, head), rest, value)
    return dataclasses.replace(obj, **{head: new})


def _actor_name(role: Role, n: int, i: int) -> str:
    return role.name if n == 1 else f"{role.name} {role.unit} {i}"


def _backend(cfg: Config, section) -> str:
    p = cfg.placement
    return p.backend if p.backend != "auto" else ("nccl" if section.num_gpus > 0 else "gloo")


class IsolatedActor:
    """An isolated role's worker (the judge) in a Ray actor of its own with the resources of
    `placement.<role>`: each call within the role's deadline; past `hard_deadline` the actor is
    killed (the call raises `WorkerTimeout`) and the next call starts a fresh one, which builds
    the worker again within the role's load timeout. The same interface as `ProcessWorker`."""

    def __init__(self, role: Role, cfg: Config, env: dict[str, str]):
        self.role, self.cfg, self.env = role, cfg, env
        self.actor, self.killed = None, 0
        self._methods = set(api_methods(role.api)) - {"close"}
        self._start()

    def __getattr__(self, method: str):
        if method.startswith("_") or method not in self.__dict__.get("_methods", ()):
            raise AttributeError(method)
        return functools.partial(self.call, method)

    def _start(self) -> None:
        import ray

        role, cfg = self.role, self.cfg
        section = role.placement(cfg)
        self.actor = _start(section, cfg, self.env)
        ref = self.actor.build.remote(role.build, role.api, cfg, Host(device=_device(section.num_gpus)))
        timeout = role.load_timeout(cfg)
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            self.close()
            raise PlacementError(f"ray: the {role.name} worker was not built within {timeout:g} s (it asks "
                                 f"Ray for {resources_of(section)})")
        try:
            missing = ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            self.close()
            cause = getattr(err, "cause", None)
            raise cause if isinstance(cause, ModelLoadError) else ModelLoadError(
                f"the {role.name} worker failed to build: {cause or err}") from None
        if missing:
            self.close()
            raise PlacementError(f"ray: the {role.name} worker has no {', '.join(missing)} "
                                 "(reasonrl.worker_protocols declares them)")

    def call(self, method: str, *args, **kwargs):
        import ray

        if self.actor is None:
            self._start()
        timeout = self.role.call_timeout(self.cfg)
        ref = self.actor.call.remote(method, args, kwargs)
        ready, _ = ray.wait([ref], timeout=hard_deadline(timeout))
        if not ready:
            self.close()
            self.killed += 1
            raise WorkerTimeout(f"the {self.role.name} worker did not answer {method}() within {timeout:g} s")
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as err:
            cause = getattr(err, "cause", None) or err
            raise WorkerCallError(f"{type(cause).__name__}: {cause}"[:2000]) from None
        except ray.exceptions.RayError as err:
            self.close()
            raise WorkerCallError(f"the {self.role.name} actor failed: {err}"[:2000]) from None

    def close(self) -> None:
        if self.actor is not None:
            stop_actors([self.actor])
            self.actor = None


def build_ray_workers(cfg: Config, roles: list[tuple[Role, int]]) -> Workers:
    """Actors for the run's `roles` (`roles.active`; see the module docstring): each
    with its `placement.<role>` resources, a role of several ranks joined in its own process
    group; the proxies over them, an isolated role's actor behind an `IsolatedActor`, and the
    streamed weight sync with its plan (which never reaches a frozen model)."""
    p = cfg.placement
    cfg = _absolute_paths(cfg, roles)
    _connect(p)
    env = dict(ACTOR_ENV)
    if "REASONRL_HOME" in os.environ:
        env["REASONRL_HOME"] = os.environ["REASONRL_HOME"]
    env.update(console.inherited_env())  # the actors' [reasonrl] lines in this run's console mode
    placed = [(role, n) for role, n in roles if not role.within]  # the others start no actor
    check_capacity(cfg, placed)
    grouped = [(role, n) for role, n in placed if not role.isolated]
    actors = [(_actor_name(role, n, i), _start(role.placement(cfg), cfg, {**env, **role.env}),
               role.placement(cfg)) for role, n in grouped for i in range(n)]
    # 1. every actor running (scheduled on a machine with its resources); rank 0 of a role of
    # several ranks offers its group's rendezvous
    rendezvous = _await_start(actors, [a.rendezvous.remote() for _, a, _ in actors], "start", cfg)
    # 2. every worker built (models loaded; ranks joined their process group)
    builds, first = [], 0
    for role, n in grouped:
        section = role.placement(cfg)
        ranks = role.unit == "rank" and n > 1
        for i in range(n):
            host = Host(device=_device(section.num_gpus), rank=i if ranks else 0, world=n if ranks else 1,
                        init_method=rendezvous[first] if ranks else None, backend=_backend(cfg, section))
            builds.append(actors[first + i][1].build.remote(role.builder(host), role.api, cfg, host))
        first += n
    missing = _await_start(actors, builds, "load its model", cfg)
    check_api(actors, missing)

    handles = [a for _, a, _ in actors]
    workers: dict[str, object] = {}
    groups: dict[str, ActorGroup] = {}
    first = 0
    try:
        for role, n in grouped:
            label = role.name if n == 1 or role.unit != "rank" else f"{role.name} ({n} ranks)"
            groups[role.name] = ActorGroup(label, handles[first: first + n],
                                           actor_names(role.name, n, role.unit),
                                           resources_of(role.placement(cfg)), p.call_timeout)
            workers[role.name] = table.proxy_of(role, groups[role.name], cfg)
            first += n
        for role, _ in roles:  # an isolated role: its own actor, restarted past a call's deadline
            if role.isolated:
                workers[role.name] = IsolatedActor(role, cfg, env)
        table.served_within(roles, workers, cfg)  # the reference: the policy's proxy, viewed
    except BaseException:
        Workers(workers, actors=handles).close()
        raise
    policy, rollout = workers.get("policy"), workers.get("rollout")
    if policy is None or rollout is None:
        return Workers(workers, actors=handles)
    try:  # what a sync sends never changes: planned once, here (no communication between ranks)
        plan = policy.sync_plan(int(p.sync_bucket_mb * 2**20))
    except BaseException:
        Workers(workers, actors=handles).close()
        raise
    transport = StreamedBuckets(groups["policy"], groups["rollout"], plan)
    return Workers(workers, tokenizer=rollout._encoder.tokenizer, sync=WeightSync(policy, rollout, transport),
                   split=lambda probe: WeightSync(policy, rollout, transport, probe), actors=handles)


def actor_names(name: str, count: int, unit: str) -> list[str]:
    """How errors name each of a worker's actors: "the rollout worker", "rollout replica 1 (of 2)"."""
    return [f"the {name} worker"] if count == 1 else [f"{name} {unit} {i} (of {count})" for i in range(count)]


def ray_device(cfg: Config, role: str) -> str:
    """The device `role`'s actors compute on: a GPU when placement.<role>.num_gpus > 0, else the
    CPU (an actor without a GPU sees none, whatever placement.device says)."""
    return "cuda" if getattr(cfg.placement, role).num_gpus > 0 else "cpu"
