"""The trainer's side of ray mode: proxies with exactly the declared worker APIs
(`reasonrl.worker_protocols`), each method one remote call on the worker's actors (`ActorGroup`),
within `placement.call_timeout`, with errors naming the worker and the resources it holds.
Ray is imported inside the functions that call it: this module loads without the extra.
"""

from __future__ import annotations

from pathlib import Path

import torch

from reasonrl.batch import Rollouts
from reasonrl.errors import PlacementError, WeightSyncError
from reasonrl.rollout import RolloutWorker, prompt_seeds
from reasonrl.worker_protocols import (
    CriticWorkerAPI,
    PolicyWorkerAPI,
    RolloutWorkerAPI,
    TeacherWorkerAPI,
    api_methods,
)


def resources_of(role) -> dict[str, float]:
    """What a `placement.<worker>` section asks Ray for, as Ray names it."""
    out = {"CPU": role.num_cpus, **role.resources}
    if role.num_gpus:
        out["GPU"] = role.num_gpus
    return out


def for_transport(tree):
    """`tree` as its tensors should cross between processes: on the CPU (the receiver, the
    trainer, may have no GPU) and each with a storage of its own. Ray pickles a tensor together
    with its whole storage, once per tensor: the AdamW moments laid out as views of two flat
    buffers (`reasonrl.accel.memory`) would carry both buffers once per parameter, 540 MB for
    the tiny model's critic state instead of 24 MB (and the full buffer times ~270 parameters
    for SmolLM2-135M), enough to fill Ray's object store and spill to disk. Other values pass
    through as they are (not copied)."""

    def one(x):
        if not isinstance(x, torch.Tensor):
            return x
        if x.device.type != "cpu":
            return x.cpu()  # a copy of the tensor alone
        if x.layout == torch.strided and x.untyped_storage().nbytes() > x.numel() * x.element_size():
            return x.clone(memory_format=torch.contiguous_format)
        return x

    return torch.utils._pytree.tree_map(one, tree)


def stop_actors(actors: list) -> None:
    import ray

    for actor in actors:
        ray.kill(actor)


class ActorGroup:
    """The actors of one worker: its data-parallel ranks (every rank gets every call, in the
    same order; the answer is rank 0's) or its rollout replicas. `names`: one per actor, for
    the errors that name the actor that failed; `request`: what each asks of Ray."""

    def __init__(self, name: str, actors: list, names: list[str], request: dict[str, float], timeout: float):
        self.name, self.actors, self.names, self.request, self.timeout = name, actors, names, request, timeout

    def start(self, method: str, args: tuple = (), kwargs: dict | None = None, keep: str = "all") -> list:
        """`method(*args, **kwargs)` on every actor's worker, not waited for: the references to
        the results. `keep`: whose results come back ("all", "first": rank 0's, "none")."""
        kept = {"all": lambda rank: True, "first": lambda rank: rank == 0, "none": lambda rank: False}[keep]
        args, kwargs = for_transport((tuple(args), kwargs or {}))
        return [a.call.remote(method, args, kwargs, kept(rank)) for rank, a in enumerate(self.actors)]

    def ready(self, refs: list, what: str, names: list[str] | None = None) -> None:
        """Wait, within placement.call_timeout, until `refs` are computed, without fetching
        them here (a snapshot's weights stay in the object store); the late ones' actors are
        named (`names`: whose each ref is), or the worker. A call that failed is raised by
        whoever gets its result (a replica loading a snapshot: named by its `wait`)."""
        import ray

        _, late = ray.wait(refs, num_returns=len(refs), timeout=self.timeout, fetch_local=False)
        if late:
            who = (f"the {self.name} worker" if names is None else
                   ", ".join(n for n, r in zip(names, refs, strict=True) if r in late))
            holds = "it holds" if names is None else "each holds"
            raise PlacementError(f"ray: {who} did not finish {what} within {self.timeout:g} s "
                                 f"(placement.call_timeout); {holds} {self.request}. Raise "
                                 "placement.call_timeout if the work is just slow")

    def wait(self, refs: list, what: str, names: list[str] | None = None) -> list:
        """ray.get(refs) within placement.call_timeout. `names`: whose each ref is (a rollout
        replica), for the errors: the ones that time out or die are named, and a
        `WeightSyncError` says which replica's check failed."""
        import warnings

        import ray

        timeout = self.timeout
        if names is not None:
            self.ready(refs, what, names)
        try:
            with warnings.catch_warnings():  # tensors from the policy arrive read-only: we only read them
                warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
                if names is None:
                    return ray.get(refs, timeout=timeout)
                out = []
                for name, ref in zip(names, refs, strict=True):
                    try:
                        out.append(ray.get(ref, timeout=timeout))
                    except ray.exceptions.ActorDiedError as err:
                        raise PlacementError(f"ray: {name} died during {what} (it holds {self.request}): "
                                             f"{err}") from None
                    except WeightSyncError as err:  # Ray's RayTaskError is also the cause's class
                        raise WeightSyncError(f"{name}: {getattr(err, 'cause', err)}") from None
                return out
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(
                f"ray: the {self.name} worker did not finish {what} within {timeout:g} s "
                f"(placement.call_timeout); it holds {self.request}. Raise placement.call_timeout "
                "if the work is just slow") from None
        except ray.exceptions.ActorDiedError as err:
            raise PlacementError(f"ray: the {self.name} worker died during {what} (it holds "
                                 f"{self.request}): {err}") from None


class RemoteWorker:
    """A worker (or a group of data-parallel ranks) in Ray actors, called like the plain
    object. Every rank gets every call, in the same order; the answer is rank 0's."""

    def __init__(self, group: ActorGroup):
        self._group = group

    def _args(self, args: tuple) -> tuple:
        if len(self._group.actors) == 1:
            return args
        import ray

        return tuple(ray.put(for_transport(a)) for a in args)  # one copy in the object store for all ranks

    def _call(self, method: str, *args, **kwargs):
        refs = self._group.start(method, self._args(args), kwargs, keep="first")
        return self._group.wait(refs, f"{method}()")[0]

    def _into_folder(self, method: str, path, *args):
        group = self._group
        result, files = group.wait([a.call_into_folder.remote(method, args, rank == 0)
                                    for rank, a in enumerate(group.actors)], f"{method}()")[0]
        for name, data in files.items():
            target = Path(path) / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return result


class RemotePolicy(RemoteWorker):
    """`PolicyWorkerAPI` over the policy's actors (see `_forward_api`). A weight sync does not
    go through it: `sync.StreamedBuckets` moves the weights actor to actor."""

    def save_pretrained(self, path, tokenizer=None) -> None:
        self._into_folder("save_pretrained", path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)

    def save_adapter(self, path) -> bool:
        return self._into_folder("save_adapter", path)


class RemoteCritic(RemoteWorker):
    """`CriticWorkerAPI` over the critic's actor (see `_forward_api`)."""

    def save(self, folder) -> None:
        self._into_folder("save", folder)


class RemoteTeacher(RemoteWorker):
    """`TeacherWorkerAPI` over the teacher's actor (see `_forward_api`): scoring only; no weight
    sync goes to it."""


class RemoteRollout(RemoteWorker):
    """`RolloutWorkerAPI` over the rollout replicas' actors (`placement.rollout.replicas`), one
    engine each (see `_forward_api`): one rollout worker to the trainer. A rollout splits the
    prompts into contiguous shares (whole groups: each prompt's n samples stay on one replica),
    with the seeds drawn here in prompt order (`prompt_seeds`), and merges the replicas'
    `Rollouts` in the original order; weights reach every replica and each checks them.
    A replica that dies, times out or fails its check is named."""

    def __init__(self, group: ActorGroup, encoder: RolloutWorker):
        super().__init__(group)
        self._encoder = encoder

    def encode(self, example, whole: bool = False) -> list[int]:
        """Rendered here (the same code, no engine needed): no round trip per prompt."""
        return self._encoder.encode(example, whole)

    def rollout(self, examples, params, seeds: list[int] | None = None) -> Rollouts:
        """The replicas' shares of `examples`, merged in order. The seeds are drawn here, from
        the trainer's RNG, one per prompt: the samples are those of one worker (local mode, or
        one replica) whatever the number of replicas, and a resumed run draws them again."""
        if seeds is None and not params.greedy:
            seeds = prompt_seeds(len(examples))
        group = self._group
        shares = [s.tolist() for s in torch.arange(len(examples)).tensor_split(len(group.actors))]
        calls = [(name, actor, rows)
                 for name, actor, rows in zip(group.names, group.actors, shares, strict=True) if rows]
        refs = [actor.call.remote("rollout", ([examples[i] for i in rows], params,
                                              None if seeds is None else [seeds[i] for i in rows]), {})
                for _, actor, rows in calls]
        parts = group.wait(refs, f"rollout() of {len(examples)} prompts", [name for name, _, _ in calls])
        versions = {part.policy_version for part in parts}
        if len(versions) > 1:
            raise WeightSyncError("rollout replicas serve different policy versions: " + ", ".join(
                f"{name}: {part.policy_version}" for (name, _, _), part in zip(calls, parts, strict=True)))
        first = 0
        for part, (_, _, rows) in zip(parts, calls, strict=True):
            part.group = part.group + first  # each replica numbered its groups from 0
            first += len(rows)
        return Rollouts.concat(parts)

    def probe_due(self) -> list[int] | None:
        """The probe ids if any replica's engine wants the coming push verified (they count the
        same pushes)."""
        due = self._group.wait(self._group.start("probe_due"), "probe_due()", self._group.names)
        return next((ids for ids in due if ids is not None), None)

    def load_weights(self, named_tensors, version: int | None = None, expected_checksum: float | None = None,
                     expected_probe: torch.Tensor | None = None) -> None:
        """Every replica loads the weights (from this process: put in the object store once
        for all replicas) and checks them (checksum, probe), then serves `version`."""
        import ray

        checks = dict(version=version, expected_checksum=expected_checksum, expected_probe=expected_probe)
        refs = self._group.start("load_weights", (ray.put(list(named_tensors)),), checks, keep="none")
        self._group.wait(refs, f"load_weights(version={version})", self._group.names)


def _forward(method: str):
    def call(self, *args, **kwargs):
        return self._call(method, *args, **kwargs)

    call.__name__ = method
    return call


def _forward_api(cls: type, api: type) -> None:
    """Give `cls` every method of `api` it does not define itself, each one a remote call
    (`RemoteWorker._call`): the proxy has exactly the declared API, nothing by accident."""
    for method in api_methods(api):
        if method not in vars(cls):
            setattr(cls, method, _forward(method))


_REMOTE: dict[type, type] = {}


def remote_class(api: type) -> type:
    """A `RemoteWorker` with exactly `api`'s methods, each one remote call: the proxy of a role
    whose table row names no proxy of its own (a frozen model's)."""
    if api not in _REMOTE:
        cls = type(f"Remote{api.__name__.removesuffix('WorkerAPI').removesuffix('API')}", (RemoteWorker,),
                   {"__doc__": f"`{api.__name__}` over its role's actors."})
        _forward_api(cls, api)
        _REMOTE[api] = cls
    return _REMOTE[api]


_forward_api(RemotePolicy, PolicyWorkerAPI)
_forward_api(RemoteRollout, RolloutWorkerAPI)
_forward_api(RemoteCritic, CriticWorkerAPI)
_forward_api(RemoteTeacher, TeacherWorkerAPI)
_REMOTE[TeacherWorkerAPI] = RemoteTeacher
